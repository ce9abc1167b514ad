// Chapter 02 — sizes past 2^31 on the GPU: a cast of 2^31 + 21 elements and
// a GEMM with N = INT_MAX, where 32-bit index or grid arithmetic would wrap.
// Depends on: mpt (rounding.hpp: encode_array, the CPU reference), the
// kernels of the formats and nn tiers, gpu_test_support.hpp.
//
// About 17 GB of device memory and a minute of work: it runs only when
// MPT_GPU_LARGE=1 is set and the device has the memory (tools/gpu_report.sh
// sets it); otherwise it says why and exits 77 (CTest: Skipped).
#define DOCTEST_CONFIG_IMPLEMENT
#include "gpu_test_support.hpp"
#include "kernels/nn/nn_kernels.hpp"

#include <cuda_fp16.h>

#include <climits>
#include <cstdlib>

#include "mpt/formats/format.hpp"
#include "mpt/formats/rounding.hpp"
#include "sweep_values.hpp"

namespace {

using mpt::cuda::GemmVersion;
using mpt::cuda::KernelVersion;
using mpt::cuda::Trans;
using mpt::test::DeviceArray;

constexpr std::size_t kCastN = (std::size_t{1} << 31) + 21;  // past 2^31, not a multiple of 4
constexpr int kGemmN = INT_MAX;                              // the largest N the API takes
constexpr double kNeedBytes = 17.5e9;                        // the biggest case below, with room

/// Input i of the large cast, the same on host and device: a hash of i made
/// into a float spread over fp16's range and beyond (finite, both signs).
__host__ __device__ inline float large_input(std::size_t i) {
  std::uint64_t h = (i + 1) * 0x9e3779b97f4a7c15ull;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  const float mantissa = 1.0f + static_cast<float>(h & 0xffffffu) / 16777216.0f;
  const int exponent = static_cast<int>((h >> 24) % 48) - 30;  // 2^-30 .. 2^17
  const float sign = (h >> 40) & 1u ? -1.0f : 1.0f;
  return sign * ldexpf(mantissa, exponent);
}

__global__ void fill_large_input(float* x, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = large_input(i);
}

/// B[0][j] of the large GEMM: the fp16 code of the small integer j % 61 - 30
/// (exact), and the fp16 code of A's one value 3.
__host__ __device__ inline float gemm_b(std::size_t j) {
  return static_cast<float>(static_cast<int>(j % 61) - 30);
}

__global__ void fill_gemm_b(std::uint16_t* b, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride)
    b[j] = __half_as_ushort(__float2half_rn(gemm_b(j)));  // small integers: exact in fp16
}

/// Counts C[j] != 3 * gemm_b(j) over the whole output (the products are
/// exact integers, so any skipped, misplaced or wrapped store is a mismatch).
__global__ void count_gemm_mismatches(const float* c, std::size_t n, unsigned long long* bad) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned long long local = 0;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride)
    local += c[j] != 3.0f * gemm_b(j);
  if (local) atomicAdd(bad, local);
}

/// The host's fp16 codes for inputs [first, first + count), by encode_array.
std::vector<std::uint32_t> expected_codes(std::size_t first, std::size_t count) {
  std::vector<float> in(count);
  for (std::size_t k = 0; k < count; ++k) in[k] = large_input(first + k);
  std::vector<std::uint32_t> codes(count);
  mpt::encode_array(in.data(), codes.data(), count, mpt::format_named("fp16"));
  return codes;
}

}  // namespace

TEST_CASE("cast_fp32_to_fp16 over 2^31 + 21 elements: every window checked against the CPU") {
  DeviceArray<float> d_in(kCastN);
  fill_large_input<<<4096, 256>>>(d_in.get(), kCastN);
  mpt::test::cuda_ok(cudaGetLastError(), "fill_large_input");
  DeviceArray<mpt::Fp16Code> d_out(kCastN);
  for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized}) {
    CAPTURE(mpt::test::version_name(v));
    d_out.poison(mpt::test::kPoisonFinite);
    mpt::cuda::cast_fp32_to_fp16(d_in.get(), d_out.get(), kCastN, v);
    mpt::cuda::synchronize();
    // The start, the windows around 2^31 (where a 32-bit index wraps), and the tail.
    const std::size_t window = 4096;
    for (std::size_t first : {std::size_t{0}, (std::size_t{1} << 31) - window / 2, kCastN - window}) {
      std::vector<mpt::Fp16Code> got(window);
      mpt::test::cuda_ok(
          cudaMemcpy(got.data(), d_out.get() + first, window * sizeof(mpt::Fp16Code), cudaMemcpyDeviceToHost),
          "download window");
      const std::vector<std::uint32_t> want = expected_codes(first, window);
      std::size_t bad = 0;
      for (std::size_t k = 0; k < window; ++k)
        if (got[k].bits != want[k] && bad++ == 0)
          std::printf("large cast (%s): [%zu] expected %#x got %#x\n", mpt::test::version_name(v), first + k,
                      want[k], got[k].bits);
      CHECK_MESSAGE(bad == 0, "window at ", first, ": ", bad, " mismatches");
    }
  }
}

TEST_CASE("gemm_fp16 with N = INT_MAX: the last column block passes INT_MAX, every output is checked") {
  // C [1, N] = A [1, 1] (the value 3) times B [1, N] (small integers), K = 1.
  const std::size_t n = static_cast<std::size_t>(kGemmN);
  DeviceArray<mpt::Fp16Code> d_a(std::vector<mpt::Fp16Code>{mpt::Fp16Code{0x4200}});  // 3.0 in fp16
  DeviceArray<mpt::Fp16Code> d_b(n);
  fill_gemm_b<<<4096, 256>>>(reinterpret_cast<std::uint16_t*>(d_b.get()), n);
  mpt::test::cuda_ok(cudaGetLastError(), "fill_gemm_b");
  DeviceArray<float> d_c(n + 16);  // 16 guard elements after C
  DeviceArray<unsigned long long> d_bad(1);
  for (GemmVersion v : {GemmVersion::naive, GemmVersion::tiled}) {
    CAPTURE(static_cast<int>(v));
    d_c.poison(mpt::test::kPoisonFinite);
    mpt::test::cuda_ok(cudaMemset(d_bad.get(), 0, sizeof(unsigned long long)), "clear count");
    mpt::cuda::gemm_fp16(Trans::no, Trans::no, 1, kGemmN, 1, d_a.get(), d_b.get(), d_c.get(), v);
    count_gemm_mismatches<<<4096, 256>>>(d_c.get(), n, d_bad.get());
    mpt::test::cuda_ok(cudaGetLastError(), "count_gemm_mismatches");
    CHECK(d_bad.download()[0] == 0);
    std::vector<float> guard(16);
    mpt::test::cuda_ok(cudaMemcpy(guard.data(), d_c.get() + n, sizeof(float) * 16, cudaMemcpyDeviceToHost),
                       "download guards");
    for (float g : guard)
      CHECK(mpt::test::bits_from_float(g) ==
            mpt::test::bits_from_float(mpt::test::poison_value<float>(mpt::test::kPoisonFinite)));
  }
}

int main(int argc, char** argv) {
  // The GPU first: without one this is a GPU test skipped for want of a GPU
  // (a failure with MPT_REQUIRE_GPU=ON); the two skips after it are asked for
  // or forced by memory, and stay Skipped (tests/cuda/CMakeLists.txt).
  std::string why;
  if (!mpt::cuda::device_available(&why)) {
    std::printf("SKIPPED: no usable CUDA device (%s)\n", why.c_str());
    return 77;
  }
  const char* on = std::getenv("MPT_GPU_LARGE");
  if (!on || std::string(on) != "1") {
    std::printf(
        "SKIPPED: set MPT_GPU_LARGE=1 to run the 2^31-element cases (about %.0f GB of device memory)\n",
        kNeedBytes / 1e9);
    return 77;
  }
  std::size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess || static_cast<double>(free_bytes) < kNeedBytes) {
    std::printf("SKIPPED: the large cases need %.1f GB of device memory, %.1f GB are free\n",
                kNeedBytes / 1e9, static_cast<double>(free_bytes) / 1e9);
    return 77;
  }
  return mpt::test::gpu_test_main(argc, argv);
}
