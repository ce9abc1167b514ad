#!/usr/bin/env python3
# Chapter 02 — the PyTorch half of the GPU report: reads what gpu_ops_dump
# wrote (inputs, this project's kernel outputs and times), runs the same
# operations through PyTorch on the same device, and prints one line per
# operation: bits that agree, what differs and why it may, both times.
# Depends on: Python 3 and torch with CUDA (numpy is not needed); without
# them it says so and exits 0 (the report then says PyTorch was not there).
#
# Chapter 2's ops (casts, unscale, scale update, GEMM), Chapter 7's FP8
# quantize (per tensor and MX, against torch.float8_e4m3fn / float8_e5m2
# casts, saturation semantics checked) and Chapters 3 and 4's
# (LayerNorm, BatchNorm2d training, the fused cross-entropy, the masked
# softmax): for each, how many output bits agree with PyTorch's, how far the
# rest are apart (fp16 ulps, or relative error for FP32 results), and each
# side's error against the same op in float64 — two FP32 implementations
# that sum in different orders need not agree bit for bit, but neither may
# be much further from the exact answer than the other. NaN outputs agree by
# class (any NaN), not by payload.
#
#   tools/gpu_torch_compare.py DUMP_DIR
import json
import os
import sys


def main():
    if len(sys.argv) != 2:
        print("usage: gpu_torch_compare.py DUMP_DIR", file=sys.stderr)
        return 2
    d = sys.argv[1]
    try:
        import torch
    except Exception as e:  # torch is optional on the GPU machine
        print(f"torch not importable ({e.__class__.__name__}: {e}); no PyTorch comparison")
        return 0
    if not torch.cuda.is_available():
        print("torch sees no CUDA device; no PyTorch comparison")
        return 0
    meta = json.load(open(os.path.join(d, "meta.json")))
    n = meta["n"]
    dev = "cuda"
    # The comparisons are about one rounding of FP32 accumulation: no TF32,
    # no reduced-precision reductions inside cuBLAS.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False

    def load(name, dtype, count):
        return torch.from_file(os.path.join(d, name), shared=False, size=count, dtype=dtype).to(dev)

    def ms(f, reps=21):
        f()
        f()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            start.record()
            f()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[reps // 2]

    rows = []

    def row(op, equal, total, note, ours_key, torch_ms):
        # ours_key: one timed kernel of gpu_ops_dump, or a list of them (their sum)
        keys = ours_key if isinstance(ours_key, list) else [ours_key]
        times = [meta["ours_ms"].get(k) for k in keys]
        ours = sum(times) if all(t is not None for t in times) else None
        # torch_ms None: a row of the same op's further outputs, timed on its first row
        ratio = f"{torch_ms / ours:.2f}" if ours and torch_ms is not None else "-"
        rows.append((op, f"{equal}/{total}", note, f"{ours:.4f}" if ours else "-",
                     f"{torch_ms:.4f}" if torch_ms is not None else "-", ratio))

    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device {torch.cuda.get_device_name(0)}, n = {n}")
    x = load("x.f32", torch.float32, n)
    nan_in = torch.isnan(x)

    # Casts. NaN payloads differ by design (mpt: canonical quiet NaN with the
    # sign kept; CUDA's intrinsics: 0x7fff/0x7fc0), so NaN inputs are
    # counted apart: they must be NaN codes on both sides.
    def compare_cast(op, ours_file, raw_dtype, mask, convert, ours_key, is_nan_code):
        count = n
        ours = load(ours_file, raw_dtype, count)
        theirs = convert(x).view(raw_dtype)
        same = (ours == theirs) & ~nan_in
        both_nan = is_nan_code(ours) & is_nan_code(theirs) & nan_in
        equal = int((same | both_nan).sum())
        diff = count - equal
        note = "all equal (NaN inputs: NaN codes on both sides)" if diff == 0 else f"{diff} differ"
        if diff:
            i = int((~(same | both_nan)).nonzero()[0])
            note += f"; first at [{i}]: x={float(x[i])!r} ours={int(ours[i]) & mask:#x} torch={int(theirs[i]) & mask:#x}"
        row(op, equal, count, note, ours_key, ms(lambda: convert(x)))

    i16, u8 = torch.int16, torch.uint8
    nan16 = lambda c: ((c & 0x7C00) == 0x7C00) & ((c & 0x03FF) != 0)
    nanbf = lambda c: ((c & 0x7F80) == 0x7F80) & ((c & 0x007F) != 0)
    nane4 = lambda c: (c & 0x7F) == 0x7F
    nane5 = lambda c: ((c & 0x7C) == 0x7C) & ((c & 0x03) != 0)
    compare_cast("fp32 -> fp16 (x.half())", "fp16.u16", i16, 0xFFFF, lambda t: t.half(), "fp32_to_fp16", nan16)
    compare_cast("fp32 -> bf16 (x.bfloat16())", "bf16.u16", i16, 0xFFFF, lambda t: t.bfloat16(), "fp32_to_bf16", nanbf)
    if hasattr(torch, "float8_e4m3fn"):
        # torch's cast to e4m3fn does not saturate (out of range -> NaN);
        # clamping first gives the saturating cast Transformer Engine uses.
        compare_cast("fp32 -> e4m3 (clamp, .to)", "e4m3.u8", u8, 0xFF,
                     lambda t: t.clamp(-448, 448).to(torch.float8_e4m3fn), "fp32_to_e4m3", nane4)
        compare_cast("fp32 -> e5m2 (clamp, .to)", "e5m2.u8", u8, 0xFF,
                     lambda t: t.clamp(-57344, 57344).to(torch.float8_e5m2), "fp32_to_e5m2", nane5)
    else:
        print("this torch has no float8 dtypes: FP8 casts not compared")

    # Chapter 7: the FP8 quantize kernels against PyTorch's casts of the same
    # x × scale (one fp32 multiply on both sides). PyTorch's .to(float8_*)
    # does not saturate: a finite value beyond the format's max becomes NaN
    # in e4m3fn (it has no inf) and ±inf in e5m2, and ±inf stays ±inf (NaN
    # in e4m3fn) — the script counts this below instead of assuming it. Our
    # saturating kernels are compared with clamp(-max, max) then .to() (what
    # Transformer Engine's casts do), our non-saturating ones with the plain
    # .to(). NaN codes agree by class.
    if hasattr(torch, "float8_e4m3fn") and "fp8" in meta:
        P = meta["fp8"]
        xs = x * torch.tensor(P["scale"], dtype=torch.float32, device=dev)
        finite_beyond = {}
        for fmt, tdt, fmax, tie, is_nan in (("e4m3", torch.float8_e4m3fn, 448.0, 464.0, nane4),
                                            ("e5m2", torch.float8_e5m2, 57344.0, 61440.0, nane5)):
            plain = xs.to(tdt).view(u8)
            beyond = torch.isfinite(xs) & (xs.abs() > tie)  # past the tie between max and the next step
            back = plain[beyond].view(tdt).float()
            finite_beyond[fmt] = (int(beyond.sum()), int(torch.isnan(back).sum()), int(torch.isinf(back).sum()))
            for sat in (True, False):
                name = f"fp8q_{fmt}_{'sat' if sat else 'nosat'}"
                ours = load(name + ".u8", u8, n)
                theirs = (xs.clamp(-fmax, fmax).to(tdt) if sat else xs.to(tdt)).view(u8)
                same = ((ours == theirs) & ~nan_in) | (is_nan(ours) & is_nan(theirs))
                equal = int(same.sum())
                m = P[name]
                note = (f"amax {m['amax']:g}, saturated {m['saturated']}, overflowed {m['overflowed']}, "
                        f"NaN {m['nan']}, flushed {m['flushed']}; ")
                note += "all equal" if equal == n else f"{n - equal} differ"
                if equal != n:
                    i = int((~same).nonzero()[0])
                    note += f"; first at [{i}]: x*s={float(xs[i])!r} ours={int(ours[i]):#x} torch={int(theirs[i]):#x}"
                how = "clamp, .to" if sat else ".to, no clamp"
                row(f"quantize x*{P['scale']:g} -> {fmt} ({how})", equal, n, note, name if sat else None,
                    ms((lambda t=tdt, f=fmax: (x * P["scale"]).clamp(-f, f).to(t))) if sat else None)
        for fmt, (count, to_nan, to_inf) in finite_beyond.items():
            print(f"torch .to({fmt}) of {count} finite values beyond max: {to_nan} became NaN, {to_inf} became inf "
                  f"(a saturating cast would give {count} x ±max)")
        # MX blocks of 32 along rows: the block amax with NaN ignored, the
        # E8M0 code by each rule (bit arithmetic, as the OCP MX spec and
        # Transformer Engine define them), then clamp and cast.
        R, Cm = P["mx_rows"], P["mx_cols"]
        xb = x[: R * Cm].reshape(R, Cm // 32, 32)
        amax = torch.where(torch.isnan(xb), torch.zeros_like(xb), xb.abs()).amax(-1)
        bits = amax.view(torch.int32)
        for rule in ("floor", "rceil"):
            if rule == "floor":
                e = (((bits >> 23) & 0xFF) - 127 - 8).clamp(-127, 127)
                code = e + 127
            else:
                r = (amax * torch.tensor(1.0 / 448.0, dtype=torch.float32, device=dev)).view(torch.int32)
                ex, ma = r >> 23, r & 0x7FFFFF
                up = (ma > 0) & (ex != 0xFE) & ~((ex == 0) & (ma <= 0x400000))
                code = torch.where(r == 0x7F800000, torch.full_like(r, 0xFE), ex + up.int())
            sbits = ((254 - code) << 23)
            sbits = torch.where(code == 254, torch.full_like(sbits, 0x00400000), sbits)  # 2^-127
            scale = sbits.view(torch.float32)
            theirs = (xb * scale[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(u8).reshape(-1)
            ours = load(f"mx_e4m3_{rule}.u8", u8, R * Cm)
            ours_e = load(f"mx_e4m3_{rule}.e8m0", u8, R * Cm // 32)
            nan_b = torch.isnan(xb).reshape(-1)
            same = ((ours == theirs) & ~nan_b) | (nane4(ours) & nane4(theirs))
            e_equal = int((ours_e.int() == code.reshape(-1)).sum())
            row(f"MX e4m3 {rule.upper()} [{R}, {Cm}], blocks of 32 (amax, E8M0, clamp, .to)", int(same.sum()), R * Cm,
                f"E8M0 codes equal {e_equal}/{R * Cm // 32}", f"mx_e4m3_{rule}", None)

    # Unscale and check: torch._amp_foreach_non_finite_check_and_unscale_.
    g0 = load("grads.f32", torch.float32, n)
    ours_g = load("unscaled.f32", torch.float32, n)
    inv = torch.full((1,), meta["inv_scale"], dtype=torch.float32, device=dev)
    found = torch.zeros(1, dtype=torch.float32, device=dev)
    g = g0.clone()
    torch._amp_foreach_non_finite_check_and_unscale_([g], found, inv)
    gi, oi = g.view(torch.int32), ours_g.view(torch.int32)
    same = (gi == oi) | (torch.isnan(g) & torch.isnan(ours_g))
    equal = int(same.sum())
    note = f"found_inf ours {meta['found_inf']:g}, torch {float(found):g}"
    if equal != n:
        note += f"; {n - equal} values differ"
    elif float(found) != meta["found_inf"]:
        note += "; the flags differ"
    one = torch.ones(1, dtype=torch.float32, device=dev)
    row("unscale_and_check (_amp_foreach_non_finite_check_and_unscale_)", equal, n, note, "unscale_and_check",
        ms(lambda: torch._amp_foreach_non_finite_check_and_unscale_([g], found, one)))

    # The scale update: torch._amp_update_scale_, step after step.
    flags = meta["flags"]
    ours_s = torch.from_file(os.path.join(d, "scale.f32"), shared=False, size=len(flags), dtype=torch.float32)
    ours_t = torch.from_file(os.path.join(d, "tracker.i32"), shared=False, size=len(flags), dtype=torch.int32)
    scale = torch.full((1,), meta["init_scale"], dtype=torch.float32, device=dev)
    tracker = torch.zeros(1, dtype=torch.int32, device=dev)
    equal = 0
    first = None
    for s, f in enumerate(flags):
        fi = torch.full((1,), float(f), dtype=torch.float32, device=dev)
        torch._amp_update_scale_(scale, tracker, fi, meta["growth_factor"], meta["backoff_factor"],
                                 meta["growth_interval"])
        ok = scale.cpu().view(torch.int32)[0] == ours_s.view(torch.int32)[s] and int(tracker) == int(ours_t[s])
        equal += bool(ok)
        if not ok and first is None:
            first = f"step {s + 1}: ours {float(ours_s[s])!r}/{int(ours_t[s])}, torch {float(scale)!r}/{int(tracker)}"
    note = (f"growth {meta['growth_factor']}, backoff {meta['backoff_factor']}, interval "
            f"{meta['growth_interval']}: " + ("every step equal" if first is None else "first difference " + first))
    fz = torch.zeros(1, dtype=torch.float32, device=dev)
    row("update_scale (_amp_update_scale_)", equal, len(flags), note, "update_scale",
        ms(lambda: torch._amp_update_scale_(scale, tracker, fz, 2.0, 0.5, 2000)))

    # The fp16 GEMM: cuBLAS sums in another order (and on tensor cores), so
    # bits may differ; what must hold is the dot-product error bound.
    M, N, K = meta["gemm"]["M"], meta["gemm"]["N"], meta["gemm"]["K"]
    a = load("a.u16", i16, M * K).view(torch.float16).reshape(M, K)
    b = load("b.u16", i16, K * N).view(torch.float16).reshape(K, N)
    ours32 = load("c32.f32", torch.float32, M * N).reshape(M, N)
    ours16 = load("c16.u16", i16, M * N).reshape(M, N)
    exact = a.double() @ b.double()
    bound = K * 2.0 ** -23 * (a.double().abs() @ b.double().abs())
    t32 = a.float() @ b.float()
    ours_err = float(((ours32.double() - exact).abs() / bound.clamp_min(1e-300)).max())
    torch_err = float(((t32.double() - exact).abs() / bound.clamp_min(1e-300)).max())
    row("gemm fp16 in, FP32 out (a.float() @ b.float())", int((ours32 == t32).sum()), M * N,
        f"max |err|/bound: ours {ours_err:.3g}, torch {torch_err:.3g} (both must be <= 1)", None,
        ms(lambda: a.float() @ b.float()))
    t16 = (a @ b).view(i16)
    ulps = (ours16.int() - t16.int()).abs()
    row("gemm fp16 in, fp16 out (a @ b)", int((ours16 == t16).sum()), M * N,
        f"largest difference {int(ulps.max())} fp16 ulp(s) (summation order)", "gemm_fp16_tiled",
        ms(lambda: a @ b))

    # --- Chapters 3 and 4: norms, cross-entropy, masked softmax -------------------------------
    import torch.nn.functional as F

    f16, f32, f64 = torch.float16, torch.float32, torch.float64

    def ordered(c):
        # fp16 codes (int16 view) as integers in the order of their values: neighbours differ by 1
        c = c.int()
        return torch.where(c < 0, -(c + 32768), c)

    def compare16(ours, theirs):
        # (codes equal, the largest distance in fp16 ulps where neither is NaN, NaN class mismatches)
        no, nt = nan16(ours), nan16(theirs)
        equal = int(((ours == theirs) | (no & nt)).sum())
        both = ~(no | nt)
        d = (ordered(ours) - ordered(theirs)).abs()[both]
        return equal, (int(d.max()) if d.numel() else 0), int((no != nt).sum())

    def err16(codes, exact):
        # the largest error of fp16 codes against float64 values, in fp16 ulps of the exact value
        v = codes.view(f16).double()
        ok = torch.isfinite(exact) & torch.isfinite(v)
        e = torch.floor(torch.log2(exact.abs().clamp_min(2.0 ** -14)))
        err = (v - exact).abs() / torch.pow(2.0, e - 10)
        return float(err[ok].max()) if bool(ok.any()) else 0.0

    def rel(a, exact):
        # the largest relative error of an FP32 result against float64 (absolute where exact is 0)
        d = (a.double() - exact).abs() / exact.abs().clamp_min(1e-30)
        return float(d.max())

    def bits32(a, b):
        return int(((a.view(torch.int32) == b.view(torch.int32)) | (torch.isnan(a) & torch.isnan(b))).sum())

    def note16(dmax, cls, eo, et):
        n = f"at most {dmax} fp16 ulp apart; max error vs float64: ours {eo:.2f}, torch {et:.2f} ulp"
        return n + (f"; {cls} NaN class mismatches" if cls else "")

    if "layer_norm" in meta:
        L = meta["layer_norm"]
        R, C, eps = L["rows"], L["cols"], L["eps"]
        x = load("ln_x.u16", i16, R * C).view(f16).reshape(R, C)
        dy = load("ln_dy.u16", i16, R * C).view(f16).reshape(R, C)
        w, b = load("ln_w.f32", f32, C), load("ln_b.f32", f32, C)
        # PyTorch's autocast runs layer_norm in FP32: x.float() in, fp16 out.
        xr, wr, br = x.float().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
        y = F.layer_norm(xr, (C,), wr, br, eps)
        y.backward(dy.float())
        xd, wd, bd = x.double().requires_grad_(), w.double().requires_grad_(), b.double().requires_grad_()
        yd = F.layer_norm(xd, (C,), wd, bd, eps)
        yd.backward(dy.double())
        ours_y = load("ln_y.u16", i16, R * C).reshape(R, C)
        torch_y = y.detach().half().view(i16)
        eq, dmax, cls = compare16(ours_y, torch_y)
        xh, wh, bh, dyh = x.clone(), w.half(), b.half(), dy.clone()
        row(f"layer_norm fp16 [{R}, {C}], f32 weight: y (F.layer_norm(x.float()))", eq, R * C,
            note16(dmax, cls, err16(ours_y, yd.detach()), err16(torch_y, yd.detach())), "layer_norm_forward",
            ms(lambda: F.layer_norm(xh, (C,), wh, bh, eps)))
        ours_mean, ours_rstd = load("ln_mean.f32", f32, R), load("ln_rstd.f32", f32, R)
        md = x.double().mean(-1)
        rd = 1 / torch.sqrt(x.double().var(-1, unbiased=False) + eps)
        _, tm, tr = torch.native_layer_norm(x.float(), (C,), w, b, eps)
        row("layer_norm: mean and rstd (FP32)", bits32(ours_mean, tm.reshape(R)) + bits32(ours_rstd, tr.reshape(R)),
            2 * R, f"max rel. error vs float64: mean ours {rel(ours_mean, md):.2e} torch {rel(tm.reshape(R), md):.2e}, "
            f"rstd ours {rel(ours_rstd, rd):.2e} torch {rel(tr.reshape(R), rd):.2e}", None, None)
        ours_dx = load("ln_dx.u16", i16, R * C).reshape(R, C)
        torch_dx = xr.grad.half().view(i16)
        eq, dmax, cls = compare16(ours_dx, torch_dx)
        _, mh, rh = torch.native_layer_norm(xh, (C,), wh, bh, eps)
        row("layer_norm backward: dx (fp16; native_layer_norm_backward timed)", eq, R * C,
            note16(dmax, cls, err16(ours_dx, xd.grad), err16(torch_dx, xd.grad)), "layer_norm_backward",
            ms(lambda: torch.ops.aten.native_layer_norm_backward(dyh, xh, [C], mh, rh, wh, bh, [True, True, True])))
        ours_dw, ours_db = load("ln_dw.f32", f32, C), load("ln_db.f32", f32, C)
        row("layer_norm backward: dweight, dbias (FP32)", bits32(ours_dw, wr.grad) + bits32(ours_db, br.grad), 2 * C,
            f"max rel. error vs float64: dweight ours {rel(ours_dw, wd.grad):.2e} torch {rel(wr.grad, wd.grad):.2e}, "
            f"dbias ours {rel(ours_db, bd.grad):.2e} torch {rel(br.grad, bd.grad):.2e}", None, None)

    if "batch_norm" in meta:
        B = meta["batch_norm"]
        N, C, HW, eps, mom = B["N"], B["C"], B["HW"], B["eps"], B["momentum"]
        x = load("bn_x.u16", i16, N * C * HW).view(f16).reshape(N, C, HW)
        dy = load("bn_dy.u16", i16, N * C * HW).view(f16).reshape(N, C, HW)
        w0 = torch.full((C,), B["weight"], dtype=f32, device=dev)
        b0 = torch.full((C,), B["bias"], dtype=f32, device=dev)

        def torch_bn(dtype):
            # BatchNorm in training mode, fp16 x with FP32 parameters (cuDNN's mixed layout), or all float64
            xx = (x if dtype == f16 else x.to(dtype)).clone().requires_grad_()
            pd = f32 if dtype == f16 else dtype
            ww, bb = w0.to(pd).clone().requires_grad_(), b0.to(pd).clone().requires_grad_()
            rm, rv = torch.zeros(C, dtype=pd, device=dev), torch.ones(C, dtype=pd, device=dev)
            yy = F.batch_norm(xx, rm, rv, ww, bb, training=True, momentum=mom, eps=eps)
            yy.backward(dy.to(yy.dtype))
            return yy.detach(), rm, rv, xx.grad, ww.grad, bb.grad

        y, rm, rv, dx, dw, db = torch_bn(f16)
        yd, rmd, rvd, dxd, dwd, dbd = torch_bn(f64)
        ours_y = load("bn_y.u16", i16, N * C * HW).reshape(N, C, HW)
        eq, dmax, cls = compare16(ours_y, y.view(i16))
        xt, wt, bt = x.clone().requires_grad_(), w0.clone().requires_grad_(), b0.clone().requires_grad_()
        rmt, rvt = torch.zeros(C, dtype=f32, device=dev), torch.ones(C, dtype=f32, device=dev)
        row(f"batch_norm2d train fp16 [{N}, {C}, {HW}], f32 weight: y (F.batch_norm)", eq, N * C * HW,
            note16(dmax, cls, err16(ours_y, yd), err16(y.view(i16), yd)), "batch_norm_forward_train",
            ms(lambda: F.batch_norm(x, rmt, rvt, w0, b0, training=True, momentum=mom, eps=eps)))
        ours_rm, ours_rv = load("bn_rm.f32", f32, C), load("bn_rv.f32", f32, C)
        row("batch_norm2d: running_mean, running_var after one step (FP32)", bits32(ours_rm, rm) + bits32(ours_rv, rv),
            2 * C, f"max rel. error vs float64: mean ours {rel(ours_rm, rmd):.2e} torch {rel(rm, rmd):.2e}, "
            f"var ours {rel(ours_rv, rvd):.2e} torch {rel(rv, rvd):.2e}", None, None)
        ours_dx = load("bn_dx.u16", i16, N * C * HW).reshape(N, C, HW)
        eq, dmax, cls = compare16(ours_dx, dx.view(i16))

        def bn_step():
            yy = F.batch_norm(xt, rmt, rvt, wt, bt, training=True, momentum=mom, eps=eps)
            torch.autograd.grad(yy, (xt, wt, bt), dy)

        row("batch_norm2d backward: dx (fp16; both sides timed forward + backward)", eq, N * C * HW,
            note16(dmax, cls, err16(ours_dx, dxd), err16(dx.view(i16), dxd)),
            ["batch_norm_forward_train", "batch_norm_backward"], ms(bn_step))
        ours_dw, ours_db = load("bn_dw.f32", f32, C), load("bn_db.f32", f32, C)
        # ours are Σdy·x̂ and Σdy; PyTorch's weight.grad and bias.grad are the same sums
        row("batch_norm2d backward: dweight, dbias (FP32)", bits32(ours_dw, dw) + bits32(ours_db, db), 2 * C,
            f"max rel. error vs float64: dweight ours {rel(ours_dw, dwd):.2e} torch {rel(dw, dwd):.2e}, "
            f"dbias ours {rel(ours_db, dbd):.2e} torch {rel(db, dbd):.2e}", None, None)

    if "cross_entropy" in meta:
        E = meta["cross_entropy"]
        R, K, eps = E["rows"], E["classes"], E["label_smoothing"]
        z = load("ce_logits.u16", i16, R * K).view(f16).reshape(R, K)
        t = load("ce_targets.i32", torch.int32, R).long()

        def torch_ce(dtype):
            zz = z.to(dtype).requires_grad_()
            loss = F.cross_entropy(zz, t, label_smoothing=eps, reduction="none")
            loss.mean().backward()
            return loss.detach(), zz.grad

        losses, grad = torch_ce(f32)
        lossd, gradd = torch_ce(f64)
        ours_losses, ours_loss = load("ce_losses.f32", f32, R), load("ce_loss.f32", f32, 1)
        row(f"cross_entropy fp16 logits [{R}, {K}], mean, smoothing {eps}: losses (FP32)",
            bits32(ours_losses, losses), R,
            f"max rel. error vs float64: ours {rel(ours_losses, lossd):.2e}, torch {rel(losses, lossd):.2e}; mean: "
            f"ours {rel(ours_loss, lossd.mean().reshape(1)):.2e}, torch {rel(losses.mean().reshape(1), lossd.mean().reshape(1)):.2e}",
            None, 0.0)
        ours_grad = load("ce_grad.u16", i16, R * K).reshape(R, K)
        torch_grad = grad.half().view(i16)
        eq, dmax, cls = compare16(ours_grad, torch_grad)

        def ce_step():
            zz = z.float().requires_grad_()
            F.cross_entropy(zz, t, label_smoothing=eps).backward()
            return zz.grad.half()

        row("cross_entropy: gradient (fp16; torch: autocast's z.float(), loss, backward, .half())", eq, R * K,
            note16(dmax, cls, err16(ours_grad, gradd), err16(torch_grad, gradd)), "softmax_cross_entropy", ms(ce_step))

    if "masked_softmax" in meta:
        M = meta["masked_softmax"]
        H, L = M["heads"], M["L"]
        s = load("ms_scores.u16", i16, H * L * L).view(f16).reshape(H, L, L)
        causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
        p = torch.softmax(s.float().masked_fill(~causal, float("-inf")), -1)
        pd = torch.softmax(s.double().masked_fill(~causal, float("-inf")), -1)
        ours = load("ms_causal.u16", i16, H * L * L).reshape(H, L, L)
        eq, dmax, cls = compare16(ours, p.half().view(i16))
        row(f"masked_softmax causal fp16 [{H}·{L}, {L}] (masked_fill(-inf), softmax)", eq, H * L * L,
            note16(dmax, cls, err16(ours, pd), err16(p.half().view(i16), pd)), "masked_softmax_causal",
            ms(lambda: torch.softmax(s.masked_fill(~causal, float("-inf")), -1)))
        # Special rows against scaled_dot_product_attention's math backend: softmax after −inf at
        # masked positions, then _safe_softmax's zeros for rows with nothing kept.
        s2 = load("ms_special.u16", i16, H * L * L).view(f16).reshape(H * L, L)
        keep = load("ms_mask.u8", u8, H * L * L).reshape(H * L, L).bool()
        t2 = s2.float().masked_fill(~keep, float("-inf"))
        safe = getattr(torch.ops.aten, "_safe_softmax", None)
        if safe is not None:
            p2, how = safe(t2, -1), "aten._safe_softmax"
        else:
            p2, how = torch.softmax(t2, -1).masked_fill(~keep.any(-1, keepdim=True), 0.0), "softmax, 0 where none kept"
        ours2 = load("ms_masked.u16", i16, H * L * L).reshape(H * L, L)
        eq, dmax, cls = compare16(ours2, p2.half().view(i16))
        special = [f"row {r}: ours {'NaN' if bool(nan16(ours2[r]).all()) else 'zeros' if bool((ours2[r] == 0).all()) else 'mixed'}"
                   f", torch {'NaN' if bool(torch.isnan(p2[r]).all()) else 'zeros' if bool((p2[r] == 0).all()) else 'mixed'}"
                   for r in range(3)]
        row(f"masked_softmax boolean mask, special rows ({how})", eq, H * L * L,
            f"at most {dmax} fp16 ulp apart, {cls} NaN class mismatches; " + "; ".join(special), None, None)

    widths = [max(len(r[i]) for r in rows + [("op", "bits equal", "note", "ours ms", "torch ms", "torch/ours")])
              for i in range(6)]
    header = ("op", "bits equal", "note", "ours ms", "torch ms", "torch/ours")
    for r in [header] + rows:
        print("  ".join(r[i].ljust(widths[i]) if i in (0, 2) else r[i].rjust(widths[i]) for i in range(6)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
