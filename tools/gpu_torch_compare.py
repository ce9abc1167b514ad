#!/usr/bin/env python3
# Chapter 02 — the PyTorch half of the GPU report: reads what gpu_ops_dump
# wrote (inputs, this project's kernel outputs and times), runs the same
# operations through PyTorch on the same device, and prints one line per
# operation: bits that agree, what differs and why it may, both times.
# Depends on: Python 3 and torch with CUDA (numpy is not needed); without
# them it says so and exits 0 (the report then says PyTorch was not there).
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
        ours = meta["ours_ms"].get(ours_key)
        ratio = f"{torch_ms / ours:.2f}" if ours else "-"
        rows.append((op, f"{equal}/{total}", note, f"{ours:.4f}" if ours else "-", f"{torch_ms:.4f}", ratio))

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

    widths = [max(len(r[i]) for r in rows + [("op", "bits equal", "note", "ours ms", "torch ms", "torch/ours")])
              for i in range(6)]
    header = ("op", "bits equal", "note", "ours ms", "torch ms", "torch/ours")
    for r in [header] + rows:
        print("  ".join(r[i].ljust(widths[i]) if i in (0, 2) else r[i].rjust(widths[i]) for i in range(6)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
