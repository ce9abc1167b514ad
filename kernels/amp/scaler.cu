// Chapter 02 — loss scaling and FP32 master weights: the GradScaler's GPU
// kernels (fused multi-tensor unscale-and-check, the inverse scale, the
// scale update), none of which makes the host wait.
// Depends on: mpt/scaler_math.hpp (the per-element and per-step math, shared
// with the CPU GradScaler and src/mpt/unscale.*), kernels/amp/amp_kernels.hpp, cuda_check.cuh.
#include <stdexcept>
#include <vector>

#include "kernels/amp/amp_kernels.hpp"
#include "kernels/formats/cuda_check.cuh"
#include "mpt/amp/scaler_math.hpp"

namespace mpt::cuda {
namespace {

// --- the tensor table --------------------------------------------------------
//
// How one launch finds its way through tensors of different sizes. PyTorch's
// multi_tensor_apply packs chunk metadata (tensor pointers, sizes, and a
// block -> (tensor, chunk) map) into a fixed-size struct passed as the
// kernel's *argument* (room for a few dozen tensors and a few hundred
// chunks) and launches again whenever it is full, so a long list takes
// several launches and the host rebuilds the metadata every step. Here the
// table lives in device memory instead: per non-empty tensor its pointer, its
// size, and prefix sums of elements and of chunks. It is built and uploaded
// once (DeviceTensorList) because gradient buffers never move during
// training; every step is then exactly one launch with no host-to-device
// copy, for any number of tensors. The price: each block (or, in the simple
// version, each thread) binary-searches the prefix sums, log2(#tensors)
// loads that stay in L1/L2 — negligible next to a chunk of 8192 elements.

struct TensorEntry {
  float* data;
  unsigned long long n;
  unsigned long long first_element;  ///< prefix sum of n over earlier entries
  unsigned long long first_chunk;    ///< prefix sum of ceil(n / kChunk)
};

constexpr unsigned int kThreads = 256;
// Elements per chunk (= per block) in the vectorized version: 256 threads x
// 8 float4s. Big enough that the block's table search and launch cost vanish,
// small enough that a 1M-element tensor still spreads over 128 blocks.
constexpr unsigned long long kChunk = kThreads * 4 * 8;

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<unsigned long long>(p) & 15u) == 0;
}

/// The last entry whose `first` (first_element or first_chunk) is <= key.
/// Entries are non-empty, so their `first`s strictly increase.
template <unsigned long long TensorEntry::*First>
__device__ __forceinline__ int find_entry(const TensorEntry* __restrict__ table, int count,
                                          unsigned long long key) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table[mid].*First <= key) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// --- unscale and check ---------------------------------------------------------

// Version 1. The list seen as one array of `total` elements (the tensors
// concatenated); thread i finds its tensor by binary search over the element
// prefix sums and unscales one element. found_inf: (1,) fp32; inv_scale: (1,) fp32.
// Every thread that saw a non-finite value stores 1.0f: the stores race, but
// all write the same value, so no atomic is needed (PyTorch does the same).
__global__ void unscale_check_simple(const TensorEntry* __restrict__ table, int count,
                                     unsigned long long total, const float* __restrict__ inv_scale,
                                     float* found_inf) {
  const unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const TensorEntry e = table[find_entry<&TensorEntry::first_element>(table, count, i)];
  if (mpt::unscale_and_check(e.data[i - e.first_element], *inv_scale)) *found_inf = 1.0f;
}

// Version 2. Block b handles chunk b of the chunk prefix sums: elements
// [c*kChunk, min(n, (c+1)*kChunk)) of one tensor (a chunk never spans two
// tensors, so each tensor's own alignment decides its loads). Threads stride
// through the chunk in float4s — one 16-byte load and store per four
// elements — when the tensor is 16-byte aligned, else in floats. Faster
// because the work is purely bandwidth-bound: the table search happens once
// per 8192 elements instead of once per element, and wide accesses need a
// quarter of the memory instructions. Each thread stores the flag at most
// once, at the end.
__global__ void unscale_check_chunked(const TensorEntry* __restrict__ table, int count,
                                      const float* __restrict__ inv_scale, float* found_inf) {
  const unsigned long long b = blockIdx.x;
  const TensorEntry e = table[find_entry<&TensorEntry::first_chunk>(table, count, b)];
  const unsigned long long start = (b - e.first_chunk) * kChunk;
  const unsigned long long len = e.n - start < kChunk ? e.n - start : kChunk;
  float* __restrict__ g = e.data + start;
  const float inv = *inv_scale;
  const bool write = inv != 1.0f;  // as the element function: no multiply, no store
  bool bad = false;
  if (aligned16(g)) {
    float4* g4 = reinterpret_cast<float4*>(g);
    const unsigned long long n4 = len / 4;
    for (unsigned long long j = threadIdx.x; j < n4; j += blockDim.x) {
      float4 v = g4[j];
      bad |= mpt::unscale_and_check(v.x, inv);
      bad |= mpt::unscale_and_check(v.y, inv);
      bad |= mpt::unscale_and_check(v.z, inv);
      bad |= mpt::unscale_and_check(v.w, inv);
      if (write) g4[j] = v;
    }
    for (unsigned long long j = 4 * n4 + threadIdx.x; j < len; j += blockDim.x)
      bad |= mpt::unscale_and_check(g[j], inv);
  } else {
    for (unsigned long long j = threadIdx.x; j < len; j += blockDim.x)
      bad |= mpt::unscale_and_check(g[j], inv);
  }
  if (bad) *found_inf = 1.0f;
}

// --- one-thread kernels -------------------------------------------------------

// scale: (1,) fp32 -> inv_scale: (1,) fp32. Double division is IEEE-exact on
// the GPU (no fast-math here), then one rounding to float: the bits the host
// computes with the same expression.
__global__ void inverse_scale_kernel(const float* __restrict__ scale, float* __restrict__ inv) {
  *inv = mpt::inverse_scale(*scale);
}

// scale: (1,) fp32, growth_tracker: (1,) int32, found_inf: (1,) fp32. One
// thread: the update is one scalar's worth of work, and doing it on the GPU
// is what spares the host from reading found_inf back every step. The
// factors stay doubles all the way into mpt::update_scale (kernel arguments
// may be doubles; the one double multiply per step costs nothing here).
__global__ void update_scale_kernel(float* scale, std::int32_t* growth_tracker,
                                    const float* __restrict__ found_inf, double growth_factor,
                                    double backoff_factor, std::int32_t growth_interval) {
  mpt::update_scale(*scale, *growth_tracker, *found_inf != 0.0f, growth_factor, backoff_factor,
                    growth_interval);
}

}  // namespace

// --- host side -----------------------------------------------------------------

DeviceTensorList::DeviceTensorList(const std::vector<DeviceTensor>& tensors) {
  std::vector<TensorEntry> table;
  for (const DeviceTensor& t : tensors) {
    if (t.n == 0) continue;
    if (t.d_data == nullptr)
      throw std::invalid_argument("mpt::cuda::DeviceTensorList: a tensor of " + std::to_string(t.n) +
                                  " elements has a null pointer");
    table.push_back({t.d_data, t.n, elements_, chunks_});
    elements_ += t.n;
    chunks_ += (t.n + kChunk - 1) / kChunk;
  }
  count_ = table.size();
  if (count_ > 0x7fffffffu) throw std::length_error("mpt::cuda::DeviceTensorList: more than 2^31-1 tensors");
  if (count_ == 0) return;
  const std::size_t bytes = table.size() * sizeof(TensorEntry);
  detail::check(cudaMalloc(&d_table_, bytes), "DeviceTensorList: cudaMalloc");
  const cudaError_t err = cudaMemcpy(d_table_, table.data(), bytes, cudaMemcpyHostToDevice);
  if (err != cudaSuccess) {
    cudaFree(d_table_);
    d_table_ = nullptr;
    detail::check(err, "DeviceTensorList: upload");
  }
}

DeviceTensorList::~DeviceTensorList() { cudaFree(d_table_); }

void reset_found_inf(float* d_found_inf) {
  detail::check(cudaMemsetAsync(d_found_inf, 0, sizeof(float)), "reset_found_inf");
}

void inverse_scale(const float* d_scale, float* d_inv_scale) {
  inverse_scale_kernel<<<1, 1>>>(d_scale, d_inv_scale);
  detail::check_launch("inverse_scale");
}

void unscale_and_check(const DeviceTensorList& grads, const float* d_inv_scale, float* d_found_inf,
                       KernelVersion v) {
  const char* where = "unscale_and_check";
  if (v != KernelVersion::simple && v != KernelVersion::vectorized)
    throw std::invalid_argument(
        "mpt::cuda::unscale_and_check: unknown KernelVersion (choices: simple, vectorized)");
  if (grads.tensors() == 0) return;
  const auto* table = static_cast<const TensorEntry*>(grads.d_table());
  const int count = static_cast<int>(grads.tensors());
  if (v == KernelVersion::simple) {
    unscale_check_simple<<<detail::blocks_for(grads.elements(), kThreads, where), kThreads>>>(
        table, count, grads.elements(), d_inv_scale, d_found_inf);
  } else {
    if (grads.chunks() > 0x7fffffffu)
      throw std::length_error("mpt::cuda::unscale_and_check: more chunks than a 1-D grid holds");
    unscale_check_chunked<<<static_cast<unsigned int>(grads.chunks()), kThreads>>>(table, count, d_inv_scale,
                                                                                   d_found_inf);
  }
  detail::check_launch(where);
}

void update_scale(float* d_scale, std::int32_t* d_growth_tracker, const float* d_found_inf,
                  double growth_factor, double backoff_factor, std::int32_t growth_interval) {
  update_scale_kernel<<<1, 1>>>(d_scale, d_growth_tracker, d_found_inf, growth_factor, backoff_factor,
                                growth_interval);
  detail::check_launch("update_scale");
}

}  // namespace mpt::cuda
