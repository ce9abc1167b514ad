// All chapters — the GPU side of the PyTorch comparison in tools/gpu_report.sh:
// runs this project's kernels on deterministic inputs and writes inputs,
// outputs and kernel times to a folder, for tools/gpu_torch_compare.py to
// run the same operations through PyTorch and compare bits and times.
// Depends on: the kernels' host-only headers (formats, nn, amp, fp8),
// bench_inputs.hpp, cuda_timing.hpp, the CUDA runtime.
//
//   gpu_ops_dump DIR [N]     N elements for the casts and the unscale (default 2^24)
//
// Files (raw little-endian arrays; meta.json says what is where):
//   x.f32             the cast inputs: specials first, then fill_wide_range
//   fp16.u16 bf16.u16 e4m3.u8 e5m2.u8   our casts of x (FP8 saturating)
//   fp8q_{e4m3,e5m2}_{sat,nosat}.u8       our per-tensor FP8 quantize of x × 0.37
//                     (Chapter 7; amax and counts in meta.json's "fp8")
//   mx_e4m3_{floor,rceil}.u8 and .e8m0    our MX quantize of the first
//                     n / 1024 rows of 1024 values of x: codes, E8M0 codes
//   grads.f32         the unscale input (an inf at index 1000003 % N)
//   unscaled.f32      our unscale_and_check of grads by inv_scale, in place
//   scale.f32 tracker.i32   update_scale after each step of meta's flags
//   a.u16 b.u16       fp16 GEMM operands [M, K] and [K, N]
//   c32.f32 c16.u16   our tiled gemm_fp16: FP32 and fp16 outputs
//   ln_*              LayerNorm (Chapter 3), fp16 x [rows, cols] with f32 γ, β:
//                     ln_x.u16 ln_dy.u16 ln_w.f32 ln_b.f32 in; ln_y.u16
//                     ln_mean.f32 ln_rstd.f32 ln_dx.u16 ln_dw.f32 ln_db.f32 ours
//   bn_*              BatchNorm2d training, fp16 x [N, C, H, W], f32 γ = 1.5,
//                     β = 0.25, running estimates 0 and 1: bn_x.u16 bn_dy.u16
//                     in; bn_y.u16 bn_rm.f32 bn_rv.f32 (after one update)
//                     bn_dx.u16 bn_dw.f32 bn_db.f32 ours
//   ce_*              cross-entropy (Chapter 4), fp16 logits, mean, label
//                     smoothing 0.1: ce_logits.u16 ce_targets.i32 in;
//                     ce_losses.f32 ce_loss.f32 ce_grad.u16 ours
//   ms_*              masked softmax, fp16 scores [heads·L, L]: ms_scores.u16
//                     in, ms_causal.u16 ours (causal); ms_mask.u8 and
//                     ms_special.u16 in (row 0 fully masked, a +inf kept in
//                     row 1, a NaN kept in row 2), ms_masked.u16 ours
//   meta.json         sizes, parameters, found_inf, and our times in ms
// Every kernel runs its fast version (the defaults).
// Exits 77 without a usable GPU, like the GPU tests.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "bench_inputs.hpp"
#include "cuda_timing.hpp"
#include "kernels/amp/amp_kernels.hpp"
#include "kernels/formats/formats_kernels.hpp"
#include "kernels/fp8/fp8_kernels.hpp"
#include "kernels/nn/nn_kernels.hpp"

namespace {

using bench::Buffer;
using bench::check;
using bench::median_ms;

template <class T>
void write_file(const std::string& path, const std::vector<T>& v) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(v.data(), sizeof(T), v.size(), f) != v.size()) {
    std::fprintf(stderr, "gpu_ops_dump: cannot write %s\n", path.c_str());
    std::exit(1);
  }
  std::fclose(f);
}

template <class T>
T* device_copy(const std::vector<T>& host) {
  T* d = nullptr;
  check(cudaMalloc(&d, host.size() * sizeof(T)), "cudaMalloc");
  check(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return d;
}

template <class T>
std::vector<T> host_copy(const T* d, std::size_t n) {
  std::vector<T> host(n);
  check(cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
  return host;
}

/// The raw codes of a typed code buffer.
template <class Raw, class Code>
std::vector<Raw> raw_codes(const Code* d, std::size_t n) {
  static_assert(sizeof(Raw) == sizeof(Code), "one code, one raw integer");
  std::vector<Raw> out(n);
  check(cudaMemcpy(out.data(), d, n * sizeof(Code), cudaMemcpyDeviceToHost), "download codes");
  return out;
}

/// n values uniform in [lo, hi) from a fixed LCG (the same inputs everywhere).
std::vector<float> uniform(std::size_t n, float lo, float hi, std::uint64_t seed) {
  std::vector<float> v(n);
  std::uint64_t s = seed;
  for (float& x : v) {
    s = bench::lcg_next(s);
    x = lo + (hi - lo) * static_cast<float>(s >> 40) / 16777216.0f;
  }
  return v;
}

/// Floats to fp16 codes on the device (the library's cast: RNE), into `out`,
/// and their codes written to `path`.
void upload_f16(const std::vector<float>& v, const Buffer& out, const std::string& path) {
  const Buffer f32(v.size() * 4);
  check(cudaMemcpy(f32.p, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "upload");
  mpt::cuda::cast_fp32_to_fp16(f32.as<float>(), out.as<mpt::Fp16Code>(), v.size());
  write_file(path, raw_codes<std::uint16_t>(out.as<mpt::Fp16Code>(), v.size()));
}

/// Floats to the device as they are, and written to `path`.
void upload_f32(const std::vector<float>& v, const Buffer& out, const std::string& path) {
  check(cudaMemcpy(out.p, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "upload");
  write_file(path, v);
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  bench::program_name = "gpu_ops_dump";
  if (argc < 2) {
    std::fprintf(stderr, "usage: gpu_ops_dump DIR [N]\n");
    return 2;
  }
  std::string why;
  if (!mpt::cuda::device_available(&why)) {
    std::printf("SKIPPED gpu_ops_dump: %s\n", why.c_str());
    return 77;
  }
  const std::string dir = argv[1];
  std::error_code made;
  std::filesystem::create_directories(dir, made);
  if (made) {
    std::fprintf(stderr, "gpu_ops_dump: cannot create %s: %s\n", dir.c_str(), made.message().c_str());
    return 2;
  }
  const std::size_t n = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (std::size_t{1} << 24);
  if (n < 64) {
    std::fprintf(stderr, "gpu_ops_dump: N must be at least 64\n");
    return 2;
  }
  using V = mpt::cuda::KernelVersion;
  std::string times;  // "name": ms, ... for meta.json
  const auto timed = [&](const char* name, const std::function<void()>& f) {
    const float ms = median_ms(f);
    times += std::string(times.empty() ? "" : ", ") + "\"" + name + "\": " + num(ms);
  };

  // --- casts ------------------------------------------------------------------
  std::vector<float> x(n);
  bench::fill_wide_range(x);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {0.0f,     -0.0f,    inf,      -inf,     nan,      -nan,      65504.0f, 65519.0f,
                            65520.0f, 448.0f,   464.0f,   57344.0f, 61440.0f, 0x1p-24f,  0x1p-25f, 0x1.8p-25f,
                            0x1p-9f,  0x1p-10f, 0x1p-17f, 1e30f,    -1e30f,   0x1p-149f, 3.0e38f,  1.0f};
  for (std::size_t i = 0; i < sizeof specials / sizeof specials[0]; ++i) x[i] = specials[i];
  write_file(dir + "/x.f32", x);
  float* d_x = device_copy(x);
  mpt::Fp16Code* d_h = nullptr;
  mpt::Bf16Code* d_b = nullptr;
  mpt::Fp8E4M3* d_e4 = nullptr;
  mpt::Fp8E5M2* d_e5 = nullptr;
  check(cudaMalloc(&d_h, n * 2), "cudaMalloc");
  check(cudaMalloc(&d_b, n * 2), "cudaMalloc");
  check(cudaMalloc(&d_e4, n), "cudaMalloc");
  check(cudaMalloc(&d_e5, n), "cudaMalloc");
  timed("fp32_to_fp16", [&] { mpt::cuda::cast_fp32_to_fp16(d_x, d_h, n, V::vectorized); });
  timed("fp32_to_bf16", [&] { mpt::cuda::cast_fp32_to_bf16(d_x, d_b, n, V::vectorized); });
  timed("fp32_to_e4m3", [&] { mpt::cuda::cast_fp32_to_e4m3_sat(d_x, d_e4, n, V::vectorized); });
  timed("fp32_to_e5m2", [&] { mpt::cuda::cast_fp32_to_e5m2_sat(d_x, d_e5, n, V::vectorized); });
  write_file(dir + "/fp16.u16", raw_codes<std::uint16_t>(d_h, n));
  write_file(dir + "/bf16.u16", raw_codes<std::uint16_t>(d_b, n));
  write_file(dir + "/e4m3.u8", raw_codes<std::uint8_t>(d_e4, n));
  write_file(dir + "/e5m2.u8", raw_codes<std::uint8_t>(d_e5, n));

  // --- FP8 quantize (Chapter 7): x × scale, both formats, saturating or not;
  // MX blocks of 32 along rows of 1024 (the first n / 1024 rows of x) ----------
  const float fp8_scale = 0.37f;  // not a power of two: the multiply's rounding shows
  float* d_fp8_scale = device_copy(std::vector<float>{fp8_scale});
  std::string fp8_meta;
  {
    const Buffer q(n), amax(4), counts(sizeof(mpt::cuda::Fp8DeviceCounts));
    for (const mpt::DType d : {mpt::DType::e4m3, mpt::DType::e5m2})
      for (const bool sat : {true, false}) {
        const std::string name =
            std::string("fp8q_") + (d == mpt::DType::e4m3 ? "e4m3" : "e5m2") + (sat ? "_sat" : "_nosat");
        auto run = [&] {
          mpt::cuda::fp8_quantize_per_tensor(d_x, n, d, d_fp8_scale, sat, q.as<std::uint8_t>(),
                                             amax.as<float>(), counts.as<mpt::cuda::Fp8DeviceCounts>());
        };
        run();
        write_file(dir + "/" + name + ".u8", host_copy(q.as<std::uint8_t>(), n));
        const mpt::cuda::Fp8DeviceCounts c = host_copy(counts.as<mpt::cuda::Fp8DeviceCounts>(), 1)[0];
        fp8_meta += std::string(fp8_meta.empty() ? "" : ", ") + "\"" + name +
                    "\": {\"amax\": " + num(host_copy(amax.as<float>(), 1)[0]) +
                    ", \"saturated\": " + std::to_string(c.saturated) +
                    ", \"overflowed\": " + std::to_string(c.overflowed) +
                    ", \"nan\": " + std::to_string(c.nan) + ", \"flushed\": " + std::to_string(c.flushed) +
                    "}";
        if (sat) timed(name.c_str(), run);
      }
    const std::size_t mx_cols = 1024, mx_rows = n / mx_cols;
    const Buffer e8m0(mx_rows * mx_cols / 32 + 1);
    for (const mpt::fp8::MxScaleRule rule : {mpt::fp8::MxScaleRule::floor, mpt::fp8::MxScaleRule::rceil}) {
      const std::string name = rule == mpt::fp8::MxScaleRule::floor ? "mx_e4m3_floor" : "mx_e4m3_rceil";
      auto run = [&] {
        mpt::cuda::fp8_quantize_mx(d_x, mx_rows, mx_cols, mpt::DType::e4m3, rule, true, q.as<std::uint8_t>(),
                                   e8m0.as<std::uint8_t>(), nullptr, counts.as<mpt::cuda::Fp8DeviceCounts>());
      };
      run();
      write_file(dir + "/" + name + ".u8", host_copy(q.as<std::uint8_t>(), mx_rows * mx_cols));
      write_file(dir + "/" + name + ".e8m0", host_copy(e8m0.as<std::uint8_t>(), mx_rows * mx_cols / 32));
      timed(name.c_str(), run);
    }
    fp8_meta += ", \"scale\": " + num(fp8_scale) + ", \"mx_rows\": " + std::to_string(mx_rows) +
                ", \"mx_cols\": " + std::to_string(mx_cols);
  }

  // --- unscale_and_check ---------------------------------------------------------
  std::vector<float> g(n);
  bench::fill_gradients(g);
  g[1000003 % n] = inf;
  write_file(dir + "/grads.f32", g);
  const float scale = 65536.0f;
  const float inv_scale = static_cast<float>(1.0 / static_cast<double>(scale));
  float* d_g = device_copy(g);
  float* d_params = device_copy(std::vector<float>{inv_scale, 0.0f, 1.0f});  // inv, found, identity
  const mpt::cuda::DeviceTensorList list(std::vector<mpt::cuda::DeviceTensor>{{d_g, n}});
  mpt::cuda::reset_found_inf(d_params + 1);
  mpt::cuda::unscale_and_check(list, d_params, d_params + 1);  // the one run whose bits are compared
  write_file(dir + "/unscaled.f32", host_copy(d_g, n));
  const float found_inf = host_copy(d_params + 1, 1)[0];
  // Timed with an inverse scale of 1 (the kernel still reads, checks and
  // writes every element), so the data stays what was compared.
  timed("unscale_and_check", [&] { mpt::cuda::unscale_and_check(list, d_params + 2, d_params + 1); });

  // --- update_scale ------------------------------------------------------------------
  const double growth = 1.7, backoff = 0.3;  // not FP32 values: a float on the way would show
  const int interval = 3;
  const float init = 65536.0f;
  std::vector<float> flags;
  for (int s = 0; s < 40; ++s) flags.push_back((s % 7 == 2 || s % 11 == 5) ? 1.0f : 0.0f);
  float* d_flags = device_copy(flags);
  float* d_scale = device_copy(std::vector<float>{init});
  std::int32_t* d_tracker = device_copy(std::vector<std::int32_t>{0});
  std::vector<float> scales;
  std::vector<std::int32_t> trackers;
  for (std::size_t s = 0; s < flags.size(); ++s) {
    mpt::cuda::update_scale(d_scale, d_tracker, d_flags + s, growth, backoff, interval);
    scales.push_back(host_copy(d_scale, 1)[0]);
    trackers.push_back(host_copy(d_tracker, 1)[0]);
  }
  write_file(dir + "/scale.f32", scales);
  write_file(dir + "/tracker.i32", trackers);
  float* d_scratch_scale = device_copy(std::vector<float>{init});
  std::int32_t* d_scratch_tracker = device_copy(std::vector<std::int32_t>{0});
  timed("update_scale", [&] {
    mpt::cuda::update_scale(d_scratch_scale, d_scratch_tracker, d_flags, growth, backoff, interval);
  });

  // --- gemm_fp16 --------------------------------------------------------------------------
  const int M = 512, N = 384, K = 640;
  std::vector<float> af(static_cast<std::size_t>(M) * K), bf(static_cast<std::size_t>(K) * N);
  bench::fill_gradients(af);  // |x| in [2^-20, 2^4): the fp16 values below are all finite
  bench::fill_gradients(bf);
  for (float& v : bf) v = std::ldexp(v, 2);
  float* d_af = device_copy(af);
  float* d_bf = device_copy(bf);
  mpt::Fp16Code *d_a = nullptr, *d_bb = nullptr;
  check(cudaMalloc(&d_a, af.size() * 2), "cudaMalloc");
  check(cudaMalloc(&d_bb, bf.size() * 2), "cudaMalloc");
  mpt::cuda::cast_fp32_to_fp16(d_af, d_a, af.size());
  mpt::cuda::cast_fp32_to_fp16(d_bf, d_bb, bf.size());
  write_file(dir + "/a.u16", raw_codes<std::uint16_t>(d_a, af.size()));
  write_file(dir + "/b.u16", raw_codes<std::uint16_t>(d_bb, bf.size()));
  float* d_c32 = nullptr;
  mpt::Fp16Code* d_c16 = nullptr;
  const std::size_t mn = static_cast<std::size_t>(M) * N;
  check(cudaMalloc(&d_c32, mn * 4), "cudaMalloc");
  check(cudaMalloc(&d_c16, mn * 2), "cudaMalloc");
  using mpt::cuda::Trans;
  mpt::cuda::gemm_fp16(Trans::no, Trans::no, M, N, K, d_a, d_bb, d_c32, mpt::cuda::GemmVersion::tiled);
  mpt::cuda::gemm_fp16(Trans::no, Trans::no, M, N, K, d_a, d_bb, d_c16, mpt::cuda::GemmVersion::tiled);
  write_file(dir + "/c32.f32", host_copy(d_c32, mn));
  write_file(dir + "/c16.u16", raw_codes<std::uint16_t>(d_c16, mn));
  timed("gemm_fp16_tiled", [&] {
    mpt::cuda::gemm_fp16(Trans::no, Trans::no, M, N, K, d_a, d_bb, d_c16, mpt::cuda::GemmVersion::tiled);
  });

  // --- LayerNorm (Chapter 3): fp16 activations, f32 γ and β --------------------------------
  const bool small = n < (std::size_t{1} << 20);  // the CTest smoke run
  using mpt::Fp16Code;
  const std::int64_t ln_rows = small ? 33 : 4096, ln_cols = small ? 40 : 768;
  const float ln_eps = 1e-5f;
  const auto ln_n = static_cast<std::size_t>(ln_rows * ln_cols), ln_r = static_cast<std::size_t>(ln_rows),
             ln_c = static_cast<std::size_t>(ln_cols);
  const Buffer ln_x(ln_n * 2), ln_dy(ln_n * 2), ln_y(ln_n * 2), ln_dx(ln_n * 2), ln_w(ln_c * 4),
      ln_b(ln_c * 4), ln_mean(ln_r * 4), ln_rstd(ln_r * 4), ln_dw(ln_c * 4), ln_db(ln_c * 4);
  upload_f16(uniform(ln_n, -3.0f, 5.0f, 11), ln_x, dir + "/ln_x.u16");
  upload_f16(uniform(ln_n, -1.0f, 1.0f, 12), ln_dy, dir + "/ln_dy.u16");
  upload_f32(uniform(ln_c, 0.5f, 1.5f, 13), ln_w, dir + "/ln_w.f32");
  upload_f32(uniform(ln_c, -0.5f, 0.5f, 14), ln_b, dir + "/ln_b.f32");
  auto ln_forward = [&] {
    mpt::cuda::layer_norm_forward(ln_rows, ln_cols, ln_x.as<Fp16Code>(), ln_w.as<float>(), ln_b.as<float>(),
                                  ln_eps, ln_y.as<Fp16Code>(), ln_mean.as<float>(), ln_rstd.as<float>());
  };
  auto ln_backward = [&] {
    mpt::cuda::layer_norm_backward(ln_rows, ln_cols, ln_x.as<Fp16Code>(), ln_dy.as<Fp16Code>(),
                                   ln_mean.as<float>(), ln_rstd.as<float>(), ln_w.as<float>(),
                                   ln_dx.as<Fp16Code>(), ln_dw.as<float>(), ln_db.as<float>());
  };
  ln_forward();
  ln_backward();
  write_file(dir + "/ln_y.u16", raw_codes<std::uint16_t>(ln_y.as<Fp16Code>(), ln_n));
  write_file(dir + "/ln_mean.f32", host_copy(ln_mean.as<float>(), ln_r));
  write_file(dir + "/ln_rstd.f32", host_copy(ln_rstd.as<float>(), ln_r));
  write_file(dir + "/ln_dx.u16", raw_codes<std::uint16_t>(ln_dx.as<Fp16Code>(), ln_n));
  write_file(dir + "/ln_dw.f32", host_copy(ln_dw.as<float>(), ln_c));
  write_file(dir + "/ln_db.f32", host_copy(ln_db.as<float>(), ln_c));
  timed("layer_norm_forward", ln_forward);  // the same outputs again: deterministic
  timed("layer_norm_backward", ln_backward);

  // --- BatchNorm2d training (Chapter 3): fp16 [N, C, H, W], f32 parameters and estimates ---------
  const std::int64_t bn_n = small ? 4 : 32, bn_c = small ? 8 : 64, bn_hw = small ? 25 : 28 * 28;
  const float bn_eps = 1e-5f, bn_momentum = 0.1f;
  const auto bn_e = static_cast<std::size_t>(bn_n * bn_c * bn_hw), bn_cs = static_cast<std::size_t>(bn_c);
  const Buffer bn_x(bn_e * 2), bn_dy(bn_e * 2), bn_y(bn_e * 2), bn_dx(bn_e * 2), bn_w(bn_cs * 4),
      bn_b(bn_cs * 4), bn_rm(bn_cs * 4), bn_rv(bn_cs * 4), bn_mean(bn_cs * 4), bn_invstd(bn_cs * 4),
      bn_dw(bn_cs * 4), bn_db(bn_cs * 4);
  upload_f16(uniform(bn_e, 2.0f, 4.0f, 21), bn_x, dir + "/bn_x.u16");  // mean 3: the statistics matter
  upload_f16(uniform(bn_e, -1.0f, 1.0f, 22), bn_dy, dir + "/bn_dy.u16");
  const std::vector<float> w15(bn_cs, 1.5f), b025(bn_cs, 0.25f), zeros(bn_cs, 0.0f), ones(bn_cs, 1.0f);
  check(cudaMemcpy(bn_w.p, w15.data(), bn_cs * 4, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(bn_b.p, b025.data(), bn_cs * 4, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(bn_rm.p, zeros.data(), bn_cs * 4, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(bn_rv.p, ones.data(), bn_cs * 4, cudaMemcpyHostToDevice), "upload");
  auto bn_forward = [&] {
    mpt::cuda::batch_norm_forward_train(bn_n, bn_c, bn_hw, bn_x.as<Fp16Code>(), bn_w.as<float>(),
                                        bn_b.as<float>(), bn_rm.as<float>(), bn_rv.as<float>(), bn_momentum,
                                        bn_eps, bn_y.as<Fp16Code>(), bn_mean.as<float>(),
                                        bn_invstd.as<float>());
  };
  auto bn_backward = [&] {
    mpt::cuda::batch_norm_backward(bn_n, bn_c, bn_hw, bn_x.as<Fp16Code>(), bn_dy.as<Fp16Code>(),
                                   bn_mean.as<float>(), bn_invstd.as<float>(), bn_w.as<float>(), true,
                                   bn_dx.as<Fp16Code>(), bn_dw.as<float>(), bn_db.as<float>());
  };
  bn_forward();
  bn_backward();
  write_file(dir + "/bn_y.u16", raw_codes<std::uint16_t>(bn_y.as<Fp16Code>(), bn_e));
  write_file(dir + "/bn_rm.f32", host_copy(bn_rm.as<float>(), bn_cs));
  write_file(dir + "/bn_rv.f32", host_copy(bn_rv.as<float>(), bn_cs));
  write_file(dir + "/bn_dx.u16", raw_codes<std::uint16_t>(bn_dx.as<Fp16Code>(), bn_e));
  write_file(dir + "/bn_dw.f32", host_copy(bn_dw.as<float>(), bn_cs));
  write_file(dir + "/bn_db.f32", host_copy(bn_db.as<float>(), bn_cs));
  timed("batch_norm_forward_train", bn_forward);  // moves the running estimates on: written above
  timed("batch_norm_backward", bn_backward);

  // --- cross-entropy (Chapter 4): fp16 logits, mean, label smoothing 0.1 -------------------------
  const std::int64_t ce_rows = small ? 8 : 512, ce_classes = small ? 4104 : 32768;
  const auto ce_n = static_cast<std::size_t>(ce_rows * ce_classes), ce_r = static_cast<std::size_t>(ce_rows);
  const Buffer ce_logits(ce_n * 2), ce_grad(ce_n * 2), ce_targets(ce_r * 4), ce_losses(ce_r * 4), ce_loss(4);
  upload_f16(uniform(ce_n, -8.0f, 8.0f, 31), ce_logits, dir + "/ce_logits.u16");
  std::vector<std::int32_t> targets(ce_r);
  for (std::size_t i = 0; i < ce_r; ++i)
    targets[i] = static_cast<std::int32_t>((i * 7919) % static_cast<std::size_t>(ce_classes));
  check(cudaMemcpy(ce_targets.p, targets.data(), ce_r * 4, cudaMemcpyHostToDevice), "upload");
  write_file(dir + "/ce_targets.i32", targets);
  mpt::cuda::CrossEntropyOptions ce_options;
  ce_options.label_smoothing = 0.1f;
  auto ce_step = [&] {
    mpt::cuda::softmax_cross_entropy(ce_rows, ce_classes, ce_logits.as<Fp16Code>(),
                                     ce_targets.as<std::int32_t>(), 1.0f, ce_options, ce_losses.as<float>(),
                                     ce_loss.as<float>(), ce_grad.as<Fp16Code>());
  };
  ce_step();
  write_file(dir + "/ce_losses.f32", host_copy(ce_losses.as<float>(), ce_r));
  write_file(dir + "/ce_loss.f32", host_copy(ce_loss.as<float>(), 1));
  write_file(dir + "/ce_grad.u16", raw_codes<std::uint16_t>(ce_grad.as<Fp16Code>(), ce_n));
  timed("softmax_cross_entropy", ce_step);

  // --- masked softmax (Chapter 4): fp16 scores, causal, and a boolean mask with special rows ------
  const std::int64_t ms_l = small ? 40 : 512, ms_heads = small ? 2 : 16, ms_rows = ms_heads * ms_l;
  const auto ms_n = static_cast<std::size_t>(ms_rows * ms_l), ms_lz = static_cast<std::size_t>(ms_l);
  const Buffer ms_scores(ms_n * 2), ms_causal(ms_n * 2), ms_special(ms_n * 2), ms_masked(ms_n * 2),
      ms_mask(ms_n);
  std::vector<float> scores = uniform(ms_n, -8.0f, 8.0f, 41);
  upload_f16(scores, ms_scores, dir + "/ms_scores.u16");
  auto ms_causal_run = [&] {
    mpt::cuda::masked_softmax(ms_rows, ms_l, ms_scores.as<Fp16Code>(), nullptr, true,
                              ms_causal.as<Fp16Code>());
  };
  ms_causal_run();
  write_file(dir + "/ms_causal.u16", raw_codes<std::uint16_t>(ms_causal.as<Fp16Code>(), ms_n));
  timed("masked_softmax_causal", ms_causal_run);
  std::vector<std::uint8_t> keep(ms_n);
  std::uint64_t state = 51;
  for (std::uint8_t& k : keep) {
    state = bench::lcg_next(state);
    k = (state >> 40) % 5 != 0 ? 1 : 0;  // 80% kept
  }
  std::fill(keep.begin(), keep.begin() + static_cast<std::ptrdiff_t>(ms_lz), std::uint8_t{0});  // row 0: none
  keep[ms_lz + 3] = 1;
  scores[ms_lz + 3] = inf;  // row 1: a kept +inf
  keep[2 * ms_lz + 5] = 1;
  scores[2 * ms_lz + 5] = nan;  // row 2: a kept NaN
  upload_f16(scores, ms_special, dir + "/ms_special.u16");
  check(cudaMemcpy(ms_mask.p, keep.data(), ms_n, cudaMemcpyHostToDevice), "upload");
  write_file(dir + "/ms_mask.u8", keep);
  mpt::cuda::masked_softmax(ms_rows, ms_l, ms_special.as<Fp16Code>(), ms_mask.as<bool>(), false,
                            ms_masked.as<Fp16Code>());
  write_file(dir + "/ms_masked.u16", raw_codes<std::uint16_t>(ms_masked.as<Fp16Code>(), ms_n));

  // --- meta.json ----------------------------------------------------------------------------------
  std::string flag_list;
  for (float f : flags) flag_list += std::string(flag_list.empty() ? "" : ", ") + (f != 0 ? "1" : "0");
  const std::string meta =
      "{\n  \"n\": " + std::to_string(n) + ",\n  \"inv_scale\": " + num(inv_scale) +
      ",\n  \"found_inf\": " + num(found_inf) + ",\n  \"init_scale\": " + num(init) +
      ",\n  \"growth_factor\": " + num(growth) + ",\n  \"backoff_factor\": " + num(backoff) +
      ",\n  \"growth_interval\": " + std::to_string(interval) + ",\n  \"flags\": [" + flag_list +
      "],\n  \"gemm\": {\"M\": " + std::to_string(M) + ", \"N\": " + std::to_string(N) +
      ", \"K\": " + std::to_string(K) + "},\n  \"layer_norm\": {\"rows\": " + std::to_string(ln_rows) +
      ", \"cols\": " + std::to_string(ln_cols) + ", \"eps\": " + num(ln_eps) +
      "},\n  \"batch_norm\": {\"N\": " + std::to_string(bn_n) + ", \"C\": " + std::to_string(bn_c) +
      ", \"HW\": " + std::to_string(bn_hw) + ", \"eps\": " + num(bn_eps) +
      ", \"momentum\": " + num(bn_momentum) + ", \"weight\": 1.5, \"bias\": 0.25}" +
      ",\n  \"cross_entropy\": {\"rows\": " + std::to_string(ce_rows) +
      ", \"classes\": " + std::to_string(ce_classes) +
      ", \"label_smoothing\": " + num(ce_options.label_smoothing) + "},\n  \"fp8\": {" + fp8_meta +
      "},\n  \"masked_softmax\": {\"heads\": " + std::to_string(ms_heads) +
      ", \"L\": " + std::to_string(ms_l) + "},\n  \"ours_ms\": {" + times + "}\n}\n";
  std::FILE* f = std::fopen((dir + "/meta.json").c_str(), "w");
  if (!f || std::fputs(meta.c_str(), f) < 0) {
    std::fprintf(stderr, "gpu_ops_dump: cannot write %s/meta.json\n", dir.c_str());
    return 1;
  }
  std::fclose(f);
  for (void* p :
       {static_cast<void*>(d_x), static_cast<void*>(d_h), static_cast<void*>(d_b), static_cast<void*>(d_e4),
        static_cast<void*>(d_e5), static_cast<void*>(d_g), static_cast<void*>(d_params),
        static_cast<void*>(d_flags), static_cast<void*>(d_scale), static_cast<void*>(d_tracker),
        static_cast<void*>(d_scratch_scale), static_cast<void*>(d_scratch_tracker), static_cast<void*>(d_af),
        static_cast<void*>(d_bf), static_cast<void*>(d_a), static_cast<void*>(d_bb),
        static_cast<void*>(d_c32), static_cast<void*>(d_c16), static_cast<void*>(d_fp8_scale)})
    cudaFree(p);
  std::printf("gpu_ops_dump: wrote %s (n = %zu, found_inf %g)\n", dir.c_str(), n, found_inf);
  return 0;
}
