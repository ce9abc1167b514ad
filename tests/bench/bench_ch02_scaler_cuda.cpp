// Chapter 02 — GPU benchmark of the GradScaler kernels and the fp16 GEMM.
// Depends on: kernels/amp/amp_kernels.hpp and kernels/nn/nn_kernels.hpp (mpt::kernels), cuda_timing.hpp, the
// CUDA runtime.
//
// Times with CUDA events (median of 21 after two warm-ups), each figure next
// to its roofline measured or derived in the same run:
//  - fused multi-tensor unscale_and_check over N floats (default 64M) split
//    into tensors of mixed sizes, both versions: effective bandwidth (each
//    element read and written once: 8 bytes) against a device-to-device
//    cudaMemcpy of the same N floats (also 8 bytes an element);
//  - update_scale: the cost of one queued one-thread kernel;
//  - gemm_fp16, naive and tiled, on the MLP's three products and a square
//    case: FLOP/s (2 M N K per product) against the FP32 FMA roofline
//    SMs x FP32 lanes per SM x 2 x peak clock (lanes: 64 on sm_80, 128 on
//    sm_86/89/90 and later — these kernels use FMA units, not tensor cores).
// Not a test: nothing is asserted. Exits 77 without a usable GPU.
//
//   bench_ch02_scaler_cuda [N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_inputs.hpp"
#include "cuda_timing.hpp"
#include "kernels/amp/amp_kernels.hpp"
#include "kernels/nn/nn_kernels.hpp"

namespace {

using bench::check;
using bench::median_ms;

/// FP32 lanes per SM by compute capability (CUDA programming guide,
/// "Arithmetic instructions" throughput table: 64 for 8.0, 128 for 8.6+).
int fp32_lanes_per_sm(int major, int minor) { return major == 8 && minor == 0 ? 64 : 128; }

}  // namespace

int main(int argc, char** argv) {
  bench::program_name = "bench_ch02_scaler_cuda";
  std::string why;
  if (!mpt::cuda::device_available(&why)) {
    std::printf("SKIPPED bench_ch02_scaler_cuda: %s\n", why.c_str());
    return 77;
  }
  const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (std::size_t{1} << 26);
  const bool small = n < (std::size_t{1} << 20);  // the CTest smoke run: tiny GEMMs too
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int clock_khz = 0;
  check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "cudaDeviceGetAttribute");

  // --- unscale_and_check ------------------------------------------------------
  std::vector<float> host(n);
  bench::fill_gradients(host);  // finite gradients, |x| in [2^-20, 2^4)
  float *d_g = nullptr, *d_copy = nullptr, *d_params = nullptr;
  std::int32_t* d_tracker = nullptr;
  check(cudaMalloc(&d_g, n * sizeof(float)), "cudaMalloc");
  check(cudaMalloc(&d_copy, n * sizeof(float)), "cudaMalloc");
  check(cudaMalloc(&d_params, 4 * sizeof(float)), "cudaMalloc");
  check(cudaMalloc(&d_tracker, 4), "cudaMalloc");
  check(cudaMemcpy(d_g, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  // d_params: inverse scales 2^-10 and 2^+10 (alternated so the data stays
  // put), found_inf, scale.
  const float params[4] = {0x1p-10f, 0x1p+10f, 0.0f, 65536.0f};
  check(cudaMemcpy(d_params, params, sizeof params, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemset(d_tracker, 0, 4), "cudaMemset");

  // Mixed sizes as in the CPU benchmark: weights, biases, odd shapes.
  std::vector<mpt::cuda::DeviceTensor> tensors;
  std::size_t at = 0;
  for (std::size_t size : bench::mixed_tensor_sizes(n)) {
    tensors.push_back({d_g + at, size});
    at += size;
  }
  const mpt::cuda::DeviceTensorList list(tensors);

  const float memcpy_ms =
      median_ms([&] { check(cudaMemcpy(d_copy, d_g, n * 4, cudaMemcpyDeviceToDevice), "memcpy"); });
  const double memcpy_gbps = 2.0 * n * 4 / (memcpy_ms * 1e6);
  std::printf("device %s (sm_%d%d, %d SMs, %.0f MHz), n = %zu floats in %zu tensors\n", prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, clock_khz / 1e3, n, tensors.size());
  std::printf("cudaMemcpy device-to-device: %.1f GB/s (read + write)\n\n", memcpy_gbps);
  std::printf("%-28s %-10s %9s %9s %9s\n", "kernel", "version", "ms", "GB/s", "x memcpy");
  using V = mpt::cuda::KernelVersion;
  for (V v : {V::simple, V::vectorized}) {
    int flip = 0;
    const float ms =
        median_ms([&] { mpt::cuda::unscale_and_check(list, d_params + (flip ^= 1), d_params + 2, v); });
    const double gbps = 8.0 * n / (ms * 1e6);
    std::printf("%-28s %-10s %9.3f %9.1f %9.2f\n", "unscale_and_check (fused)",
                v == V::simple ? "simple" : "vectorized", ms, gbps, gbps / memcpy_gbps);
  }
  {
    constexpr int kLaunches = 1000;
    const float ms = median_ms(
        [&] {
          for (int i = 0; i < kLaunches; ++i)
            mpt::cuda::update_scale(d_params + 3, d_tracker, d_params + 2, 2.0, 0.5, 2000);
        },
        5);
    std::printf("%-28s %-10s %9.4f   (per launch, %d queued back to back)\n", "update_scale", "-",
                ms / kLaunches, kLaunches);
  }

  // --- gemm_fp16 --------------------------------------------------------------
  const double peak_tflops = static_cast<double>(prop.multiProcessorCount) *
                             fp32_lanes_per_sm(prop.major, prop.minor) * 2.0 * clock_khz * 1e3 / 1e12;
  std::printf("\nFP32 FMA roofline: %d SMs x %d lanes x 2 x %.0f MHz = %.1f TFLOP/s\n",
              prop.multiProcessorCount, fp32_lanes_per_sm(prop.major, prop.minor), clock_khz / 1e3,
              peak_tflops);
  std::printf("%-32s %-6s %9s %9s %9s\n", "gemm_fp16 (fp32 out)", "kernel", "ms", "TFLOP/s", "x peak");
  using mpt::cuda::Trans;
  struct Case {
    const char* name;
    Trans ta, tb;
    int M, N, K;
  };
  const int batch = small ? 8 : 512, in = small ? 16 : 1024, out = small ? 24 : 4096;
  const int sq = small ? 32 : 4096;
  const std::vector<Case> cases{
      {"MLP forward  y = x W^T", Trans::no, Trans::yes, batch, out, in},
      {"MLP backward dx = dy W", Trans::no, Trans::no, batch, in, out},
      {"MLP backward dW = dy^T x", Trans::yes, Trans::no, out, in, batch},
      {"square", Trans::no, Trans::no, sq, sq, sq},
  };
  std::size_t most = 0;
  for (const Case& c : cases)
    most = std::max({most, static_cast<std::size_t>(c.M) * c.K, static_cast<std::size_t>(c.K) * c.N,
                     static_cast<std::size_t>(c.M) * c.N});
  mpt::Fp16Code *d_a = nullptr, *d_b = nullptr;
  float* d_c = nullptr;
  check(cudaMalloc(&d_a, most * 2), "cudaMalloc");
  check(cudaMalloc(&d_b, most * 2), "cudaMalloc");
  check(cudaMalloc(&d_c, most * 4), "cudaMalloc");
  check(cudaMemset(d_a, 0x3c, most * 2), "cudaMemset");  // 0x3c3c: fp16 1.0586
  check(cudaMemset(d_b, 0x3c, most * 2), "cudaMemset");
  for (const Case& c : cases) {
    char label[96];
    std::snprintf(label, sizeof label, "%s %dx%dx%d", c.name, c.M, c.N, c.K);
    for (auto v : {mpt::cuda::GemmVersion::naive, mpt::cuda::GemmVersion::tiled}) {
      const float ms = median_ms([&] { mpt::cuda::gemm_fp16(c.ta, c.tb, c.M, c.N, c.K, d_a, d_b, d_c, v); },
                                 small ? 3 : 7);
      const double tflops = 2.0 * c.M * c.N * c.K / (ms * 1e9);
      std::printf("%-32s %-6s %9.3f %9.2f %9.3f\n", label,
                  v == mpt::cuda::GemmVersion::naive ? "naive" : "tiled", ms, tflops, tflops / peak_tflops);
    }
  }
  check(cudaDeviceSynchronize(), "kernels");
  cudaFree(d_g);
  cudaFree(d_copy);
  cudaFree(d_params);
  cudaFree(d_tracker);
  cudaFree(d_a);
  cudaFree(d_b);
  cudaFree(d_c);
  return 0;
}
