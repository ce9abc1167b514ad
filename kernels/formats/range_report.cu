// Chapter 01 — floating-point formats and their limits: the range report
// (how many values would overflow, go subnormal, flush to zero, ...) as a
// GPU reduction.
// Depends on: mpt/range_classify.hpp (the per-element classifier, shared
// with the CPU report), kernels/formats/formats_kernels.hpp (the host API), cuda_check.cuh.
#include <algorithm>
#include <stdexcept>

#include "kernels/formats/cuda_check.cuh"
#include "kernels/formats/formats_kernels.hpp"
#include "mpt/formats/range_classify.hpp"

namespace mpt::cuda {
namespace {

// The device counters are a RangeCounts laid out flat: by_class[7] then
// log2_hist[277], 284 uint64 in all, so one cudaMemcpy fills the struct.
constexpr int kCounters = kRangeClassCount + kLog2BinCount;
static_assert(sizeof(RangeCounts) == kCounters * sizeof(unsigned long long),
              "RangeCounts must be two packed uint64 arrays");
static_assert(sizeof(std::uint64_t) == sizeof(unsigned long long), "atomicAdd needs 64 bits");

constexpr unsigned int kThreads = 256;

__device__ __forceinline__ void count_one(float x, const FormatSpec& f, unsigned long long* counters) {
  atomicAdd(&counters[static_cast<int>(classify(x, f))], 1ull);
  const int k = log2_bin(x);
  if (k != kLog2BinNone) atomicAdd(&counters[kRangeClassCount + (k - kLog2BinMin)], 1ull);
}

// Version 1. x: (n,) fp32; counters: (284,) uint64 in global memory, zeroed.
// Thread i classifies element i and adds to the global counters directly.
__global__ void range_counts_simple(const float* __restrict__ x, std::size_t n, FormatSpec f,
                                    unsigned long long* counters) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) count_one(x[i], f, counters);
}

// Version 2. Same shapes; a grid-stride loop over float4s (scalar loads when
// x is not 16-byte aligned), counting into block-private shared counters that
// are added to the global ones once per block at the end. Faster because
// real data piles into a few bins (most values 'exact' or 'rounded', a few
// exponents): global atomics on one address serialise across the whole GPU,
// shared-memory atomics stay on the SM, and global memory then sees at most
// 284 adds per block instead of two per element.
template <bool kVec4>
__global__ void range_counts_shared(const float* __restrict__ x, std::size_t n, FormatSpec f,
                                    unsigned long long* counters) {
  __shared__ unsigned long long local[kCounters];
  for (int j = threadIdx.x; j < kCounters; j += blockDim.x) local[j] = 0;
  __syncthreads();

  const std::size_t start = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  if (kVec4) {
    const std::size_t n4 = n / 4;
    for (std::size_t i = start; i < n4; i += stride) {
      const float4 v = reinterpret_cast<const float4*>(x)[i];
      count_one(v.x, f, local);
      count_one(v.y, f, local);
      count_one(v.z, f, local);
      count_one(v.w, f, local);
    }
    if (start < n - 4 * n4) count_one(x[4 * n4 + start], f, local);
  } else {
    for (std::size_t i = start; i < n; i += stride) count_one(x[i], f, local);
  }
  __syncthreads();

  for (int j = threadIdx.x; j < kCounters; j += blockDim.x) {
    if (local[j] != 0) atomicAdd(&counters[j], local[j]);
  }
}

// Enough blocks to fill every SM a few times over; more only adds flushes.
unsigned int resident_blocks() {
  int device = 0;
  int sms = 0;
  detail::check(cudaGetDevice(&device), "range_counts");
  detail::check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "range_counts");
  return static_cast<unsigned int>(std::max(sms, 1)) * 8u;
}

}  // namespace

DeviceRangeCounts::DeviceRangeCounts() {
  detail::check(cudaMalloc(&d_counters_, sizeof(RangeCounts)), "DeviceRangeCounts: cudaMalloc");
  try {
    detail::check(cudaMemset(d_counters_, 0, sizeof(RangeCounts)), "DeviceRangeCounts: cudaMemset");
  } catch (...) {
    cudaFree(d_counters_);
    throw;
  }
}

DeviceRangeCounts::~DeviceRangeCounts() { cudaFree(d_counters_); }

void DeviceRangeCounts::clear() {
  detail::check(cudaMemsetAsync(d_counters_, 0, sizeof(RangeCounts)), "DeviceRangeCounts::clear");
}

RangeCounts DeviceRangeCounts::download() const {
  RangeCounts result;
  detail::check(cudaMemcpy(&result, d_counters_, sizeof(RangeCounts), cudaMemcpyDeviceToHost),
                "range_counts: kernel or copy back");
  return result;
}

void range_counts_into(const float* d_x, std::size_t n, const FormatSpec& f, DeviceRangeCounts& counters,
                       KernelVersion v) {
  const char* where = "range_counts";
  if (v != KernelVersion::simple && v != KernelVersion::vectorized) {
    throw std::invalid_argument(
        "mpt::cuda::range_counts: unknown KernelVersion (choices: simple, vectorized)");
  }
  if (n == 0) return;
  auto* c = static_cast<unsigned long long*>(counters.d_counters());
  if (v == KernelVersion::simple) {
    range_counts_simple<<<detail::blocks_for(n, kThreads, where), kThreads>>>(d_x, n, f, c);
  } else {
    const bool vec4 = detail::aligned(d_x, sizeof(float4));
    const std::size_t work = vec4 ? std::max(n / 4, n % 4) : n;
    const unsigned int blocks = std::min(detail::blocks_for(work, kThreads, where), resident_blocks());
    if (vec4) {
      range_counts_shared<true><<<blocks, kThreads>>>(d_x, n, f, c);
    } else {
      range_counts_shared<false><<<blocks, kThreads>>>(d_x, n, f, c);
    }
  }
  detail::check_launch(where);
}

RangeCounts range_counts(const float* d_x, std::size_t n, const FormatSpec& f, KernelVersion v) {
  if (v != KernelVersion::simple && v != KernelVersion::vectorized) {
    throw std::invalid_argument(
        "mpt::cuda::range_counts: unknown KernelVersion (choices: simple, vectorized)");
  }
  if (n == 0) return RangeCounts{};
  DeviceRangeCounts counters;  // zeroed
  range_counts_into(d_x, n, f, counters, v);
  return counters.download();
}

}  // namespace mpt::cuda
