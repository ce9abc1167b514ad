// Chapter 01 — GPU benchmark of the cast kernels and the range reduction.
// Depends on: kernels/formats/formats_kernels.hpp (mpt::kernels), cuda_timing.hpp, the
// CUDA runtime.
//
// Times every kernel version on N floats (default 64M) with CUDA events and
// prints its effective bandwidth (bytes read + written per second) beside a
// device-to-device cudaMemcpy of the same input measured in the same run,
// the bandwidth roofline for these memory-bound kernels. Not a test: nothing
// is asserted. Exits 77 without a usable GPU.
//
//   bench_ch01_casts_cuda [N]
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
#include "kernels/formats/formats_kernels.hpp"

namespace {

using bench::check;
using bench::median_ms;

}  // namespace

int main(int argc, char** argv) {
  bench::program_name = "bench_ch01_casts_cuda";
  std::string why;
  if (!mpt::cuda::device_available(&why)) {
    std::printf("SKIPPED bench_ch01_casts_cuda: %s\n", why.c_str());
    return 77;
  }
  const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (std::size_t{1} << 26);
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");

  // Inputs spread over 48 binades as in the CPU benchmark, made on the host.
  std::vector<float> host(n);
  bench::fill_wide_range(host);
  float *d_in = nullptr, *d_copy = nullptr;
  // One buffer per code type (the API types them: bf16 codes are not fp16's).
  mpt::Fp16Code* d_fp16 = nullptr;
  mpt::Bf16Code* d_bf16 = nullptr;
  mpt::Fp8E4M3* d_e4m3 = nullptr;
  mpt::Fp8E5M2* d_e5m2 = nullptr;
  check(cudaMalloc(&d_in, n * 4), "cudaMalloc");
  check(cudaMalloc(&d_copy, n * 4), "cudaMalloc");
  check(cudaMalloc(&d_fp16, n * sizeof(mpt::Fp16Code)), "cudaMalloc");
  check(cudaMalloc(&d_bf16, n * sizeof(mpt::Bf16Code)), "cudaMalloc");
  check(cudaMalloc(&d_e4m3, n * sizeof(mpt::Fp8E4M3)), "cudaMalloc");
  check(cudaMalloc(&d_e5m2, n * sizeof(mpt::Fp8E5M2)), "cudaMalloc");
  check(cudaMemcpy(d_in, host.data(), n * 4, cudaMemcpyHostToDevice), "cudaMemcpy");

  const float memcpy_ms =
      median_ms([&] { check(cudaMemcpy(d_copy, d_in, n * 4, cudaMemcpyDeviceToDevice), "memcpy"); });
  const double memcpy_gbps = 2.0 * n * 4 / (memcpy_ms * 1e6);
  std::printf("device %s, n = %zu floats\n", prop.name, n);
  std::printf("cudaMemcpy device-to-device: %.1f GB/s (read + write)\n\n", memcpy_gbps);
  std::printf("%-24s %-10s %9s %9s %9s\n", "kernel", "version", "ms", "GB/s", "x memcpy");

  using V = mpt::cuda::KernelVersion;
  // The range report's counters live on the device for the whole run: what
  // is timed is the counting kernel, not an allocation and copy per call.
  mpt::cuda::DeviceRangeCounts counters;
  struct Case {
    const char* name;
    double bytes_per_elem;
    std::function<void(V)> run;
  };
  const std::vector<Case> cases{
      {"fp32 -> fp16", 6, [&](V v) { mpt::cuda::cast_fp32_to_fp16(d_in, d_fp16, n, v); }},
      {"fp16 -> fp32", 6, [&](V v) { mpt::cuda::cast_fp16_to_fp32(d_fp16, d_copy, n, v); }},
      {"fp32 -> bf16", 6, [&](V v) { mpt::cuda::cast_fp32_to_bf16(d_in, d_bf16, n, v); }},
      {"bf16 -> fp32", 6, [&](V v) { mpt::cuda::cast_bf16_to_fp32(d_bf16, d_copy, n, v); }},
      {"fp32 -> e4m3 (sat)", 5, [&](V v) { mpt::cuda::cast_fp32_to_e4m3_sat(d_in, d_e4m3, n, v); }},
      {"e4m3 -> fp32", 5, [&](V v) { mpt::cuda::cast_e4m3_to_fp32(d_e4m3, d_copy, n, v); }},
      {"fp32 -> e5m2 (sat)", 5, [&](V v) { mpt::cuda::cast_fp32_to_e5m2_sat(d_in, d_e5m2, n, v); }},
      {"range_counts fp16", 4,
       [&](V v) { mpt::cuda::range_counts_into(d_in, n, mpt::formats::fp16, counters, v); }},
  };
  for (const Case& c : cases)
    for (V v : {V::simple, V::vectorized}) {
      const float ms = median_ms([&] { c.run(v); });
      const double gbps = c.bytes_per_elem * n / (ms * 1e6);
      std::printf("%-24s %-10s %9.3f %9.1f %9.2f\n", c.name, v == V::simple ? "simple" : "vectorized", ms,
                  gbps, gbps / memcpy_gbps);
    }
  cudaFree(d_in);
  cudaFree(d_copy);
  cudaFree(d_fp16);
  cudaFree(d_bf16);
  cudaFree(d_e4m3);
  cudaFree(d_e5m2);
  return 0;
}
