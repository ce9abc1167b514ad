// Chapter 03 — GPU benchmark of the BatchNorm and LayerNorm kernels.
// Depends on: kernels/nn/nn_kernels.hpp and kernels/formats/formats_kernels.hpp
// (mpt::kernels), bench_inputs.hpp, cuda_timing.hpp, the CUDA runtime.
//
// Times each kernel with CUDA events (median of 21 after two warm-ups) on
// shapes typical of CNNs and transformers (a ResNet-50 stage [32, 64, 56, 56]
// and its last [32, 512, 7, 7], a BatchNorm1d over [4096, 1024], GPT-2
// small's LayerNorm over [8192, 768] and a long row of 8192), f16 activations with f32 parameters
// (autocast's layout) and all-f32. Each figure is an effective bandwidth:
// the bytes an ideal kernel must move (x read once and y written once for a
// forward; x and dy read once and dx written once for a backward; the
// per-channel arrays are negligible) divided by the time, beside a
// device-to-device cudaMemcpy of the same activation bytes measured in the
// same run (memory-bound kernels cannot beat it). Each kernel runs in both
// versions (NormVersion): the simple one-block-per-channel BatchNorm reads x
// twice (statistics, then y) and has only C blocks, the fast one splits a
// channel over many blocks; the fast LayerNorm moves 16 bytes per access.
// The ratio shows what each costs. Not a test: nothing is asserted. Exits
// 77 without a usable GPU.
//
//   bench_ch03_norms_cuda [N]   N below 2^20: tiny shapes (the CTest smoke
//                               run); otherwise, or without N, the shapes above
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_inputs.hpp"
#include "cuda_timing.hpp"
#include "kernels/formats/formats_kernels.hpp"
#include "kernels/nn/nn_kernels.hpp"

namespace {

using bench::Buffer;
using bench::check;
using bench::median_ms;
using mpt::cuda::NormVersion;

struct Shape {
  const char* name;
  std::int64_t outer, channels, inner;  // BatchNorm: N, C, H·W; LayerNorm: 1, rows, cols
  std::int64_t numel() const { return outer * channels * inner; }
};

/// The version, for a row's name.
const char* version_tag(NormVersion v) { return v == NormVersion::simple ? " simple" : " fast"; }

/// One timed kernel: its name, its time, its minimum traffic, and the
/// memcpy of the same bytes for the ratio.
void report(const std::string& name, float ms, double bytes, const std::function<void()>& copy) {
  bench::report_vs_copy(name, ms, bytes, copy, 68);
}

}  // namespace

int main(int argc, char** argv) {
  bench::program_name = "bench_ch03_norms_cuda";
  std::string why;
  if (!mpt::cuda::device_available(&why)) {
    std::printf("SKIPPED bench_ch03_norms_cuda: %s\n", why.c_str());
    return 77;
  }
  const std::size_t scale = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 0;
  const bool small = scale > 0 && scale < (std::size_t{1} << 20);  // the CTest smoke run
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");

  const std::vector<Shape> bn_shapes =
      small ? std::vector<Shape>{{"BatchNorm2d [4, 8, 7, 7]", 4, 8, 49}, {"BatchNorm1d [64, 16]", 64, 16, 1}}
            : std::vector<Shape>{{"BatchNorm2d [32, 64, 56, 56]", 32, 64, std::int64_t{56} * 56},
                                 {"BatchNorm2d [32, 512, 7, 7]", 32, 512, 49},
                                 {"BatchNorm1d [4096, 1024]", 4096, 1024, 1}};
  const std::vector<Shape> ln_shapes = small ? std::vector<Shape>{{"LayerNorm [33, 40]", 1, 33, 40}}
                                             : std::vector<Shape>{{"LayerNorm [8192, 768]", 1, 8192, 768},
                                                                  {"LayerNorm [1024, 8192]", 1, 1024, 8192}};
  std::int64_t most = 0, most_c = 0;
  for (const Shape& s : bn_shapes) most = std::max(most, s.numel()), most_c = std::max(most_c, s.channels);
  for (const Shape& s : ln_shapes)
    most = std::max(most, s.numel()), most_c = std::max({most_c, s.channels, s.inner});
  const auto n = static_cast<std::size_t>(most), nc = static_cast<std::size_t>(most_c);

  // Inputs: gradient-like values (bench_inputs.hpp), f32 and rounded to f16
  // on the device; parameters 1 and 0, running estimates 0 and 1.
  std::vector<float> host(n);
  bench::fill_gradients(host);
  Buffer x32(n * 4), dy32(n * 4), y32(n * 4), dx32(n * 4), x16(n * 2), dy16(n * 2), y16(n * 2), dx16(n * 2);
  Buffer source(n * 6), copy(n * 6);  // the largest yardstick: 1.5 f32 arrays each way
  Buffer w(nc * 4), b(nc * 4), rm(nc * 4), rv(nc * 4), mean(nc * 4), invstd(nc * 4), dw(nc * 4), db(nc * 4);
  check(cudaMemcpy(x32.p, host.data(), n * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  std::reverse(host.begin(), host.end());
  check(cudaMemcpy(dy32.p, host.data(), n * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  mpt::cuda::cast_fp32_to_fp16(x32.as<float>(), x16.as<mpt::Fp16Code>(), n);
  mpt::cuda::cast_fp32_to_fp16(dy32.as<float>(), dy16.as<mpt::Fp16Code>(), n);
  const std::vector<float> ones(nc, 1.0f), zeros(nc, 0.0f);
  check(cudaMemcpy(w.p, ones.data(), nc * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(b.p, zeros.data(), nc * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(rm.p, zeros.data(), nc * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(rv.p, ones.data(), nc * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemset(source.p, 0x3c, n * 6), "cudaMemset");
  check(cudaDeviceSynchronize(), "inputs");

  std::printf("device %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  std::printf("each GB/s counts the bytes an ideal kernel moves; x memcpy: against a device-to-device\n");
  std::printf("cudaMemcpy of the same bytes, timed in this run\n\n");
  std::printf("%-68s %9s %9s %9s\n", "kernel", "ms", "GB/s", "x memcpy");
  const float* wf = w.as<float>();
  const float* bf = b.as<float>();
  for (const Shape& s : bn_shapes) {
    const auto e = static_cast<std::size_t>(s.numel());
    for (const bool half : {true, false})
      for (const NormVersion v : {NormVersion::simple, NormVersion::fast}) {
        const std::size_t xb = half ? 2 : 4;  // bytes per activation
        const std::string tag = std::string(s.name) + (half ? " f16" : " f32") + version_tag(v);
        auto copy_bytes = [&](std::size_t bytes) {
          return
              [&, bytes] { check(cudaMemcpy(copy.p, source.p, bytes, cudaMemcpyDeviceToDevice), "memcpy"); };
        };
        const float train_ms = median_ms([&] {
          if (half)
            mpt::cuda::batch_norm_forward_train(
                s.outer, s.channels, s.inner, x16.as<mpt::Fp16Code>(), wf, bf, rm.as<float>(), rv.as<float>(),
                0.1f, 1e-5f, y16.as<mpt::Fp16Code>(), mean.as<float>(), invstd.as<float>(), v);
          else
            mpt::cuda::batch_norm_forward_train(s.outer, s.channels, s.inner, x32.as<float>(), wf, bf,
                                                rm.as<float>(), rv.as<float>(), 0.1f, 1e-5f, y32.as<float>(),
                                                mean.as<float>(), invstd.as<float>(), v);
        });
        report("batch_norm_forward_train " + tag, train_ms, 2.0 * xb * e, copy_bytes(2 * xb * e / 2));
        const float eval_ms = median_ms([&] {
          if (half)
            mpt::cuda::batch_norm_forward_eval(s.outer, s.channels, s.inner, x16.as<mpt::Fp16Code>(), wf, bf,
                                               rm.as<float>(), rv.as<float>(), 1e-5f, y16.as<mpt::Fp16Code>(),
                                               v);
          else
            mpt::cuda::batch_norm_forward_eval(s.outer, s.channels, s.inner, x32.as<float>(), wf, bf,
                                               rm.as<float>(), rv.as<float>(), 1e-5f, y32.as<float>(), v);
        });
        report("batch_norm_forward_eval " + tag, eval_ms, 2.0 * xb * e, copy_bytes(xb * e));
        const float back_ms = median_ms([&] {
          if (half)
            mpt::cuda::batch_norm_backward(s.outer, s.channels, s.inner, x16.as<mpt::Fp16Code>(),
                                           dy16.as<mpt::Fp16Code>(), mean.as<float>(), invstd.as<float>(), wf,
                                           true, dx16.as<mpt::Fp16Code>(), dw.as<float>(), db.as<float>(), v);
          else
            mpt::cuda::batch_norm_backward(s.outer, s.channels, s.inner, x32.as<float>(), dy32.as<float>(),
                                           mean.as<float>(), invstd.as<float>(), wf, true, dx32.as<float>(),
                                           dw.as<float>(), db.as<float>(), v);
        });
        // Three activation arrays; the memcpy moves 1.5 of them each way.
        report("batch_norm_backward " + tag, back_ms, 3.0 * xb * e, copy_bytes(3 * xb * e / 2));
      }
  }
  for (const Shape& s : ln_shapes) {
    const auto e = static_cast<std::size_t>(s.numel());
    for (const bool half : {true, false})
      for (const NormVersion v : {NormVersion::simple, NormVersion::fast}) {
        const std::size_t xb = half ? 2 : 4;
        const std::string tag = std::string(s.name) + (half ? " f16" : " f32") + version_tag(v);
        auto copy_bytes = [&](std::size_t bytes) {
          return
              [&, bytes] { check(cudaMemcpy(copy.p, source.p, bytes, cudaMemcpyDeviceToDevice), "memcpy"); };
        };
        const float fwd_ms = median_ms([&] {
          if (half)
            mpt::cuda::layer_norm_forward(s.channels, s.inner, x16.as<mpt::Fp16Code>(), wf, bf, 1e-5f,
                                          y16.as<mpt::Fp16Code>(), mean.as<float>(), invstd.as<float>(), v);
          else
            mpt::cuda::layer_norm_forward(s.channels, s.inner, x32.as<float>(), wf, bf, 1e-5f,
                                          y32.as<float>(), mean.as<float>(), invstd.as<float>(), v);
        });
        report("layer_norm_forward " + tag, fwd_ms, 2.0 * xb * e, copy_bytes(xb * e));
        const float back_ms = median_ms([&] {
          if (half)
            mpt::cuda::layer_norm_backward(s.channels, s.inner, x16.as<mpt::Fp16Code>(),
                                           dy16.as<mpt::Fp16Code>(), mean.as<float>(), invstd.as<float>(), wf,
                                           dx16.as<mpt::Fp16Code>(), dw.as<float>(), db.as<float>(), v);
          else
            mpt::cuda::layer_norm_backward(s.channels, s.inner, x32.as<float>(), dy32.as<float>(),
                                           mean.as<float>(), invstd.as<float>(), wf, dx32.as<float>(),
                                           dw.as<float>(), db.as<float>(), v);
        });
        report("layer_norm_backward " + tag, back_ms, 3.0 * xb * e, copy_bytes(3 * xb * e / 2));
      }
  }
  check(cudaDeviceSynchronize(), "kernels");
  return 0;
}
