// Chapter 07 — FP8 training: the fp8 tier's kernels — per-tensor amax,
// quantize with the amax and the counts fused in, MX block quantize with
// E8M0 scales (FLOOR and RCEIL), dequantize — each in a simple and a faster
// version that give the same bits.
// Depends on: mpt/fp8/fp8_math.hpp and e8m0.hpp (quantize_element,
// amax_step, mx_scale_code, e8m0_reciprocal, e8m0_to_float: the code the CPU
// reference runs), kernels/fp8/fp8_kernels.hpp, cuda_check.cuh.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/formats/cuda_check.cuh"
#include "kernels/fp8/fp8_kernels.hpp"
#include "mpt/fp8/e8m0.hpp"
#include "mpt/fp8/fp8_math.hpp"

namespace mpt::cuda {
namespace {

using fp8::Fp8Element;
using fp8::Fp8Outcome;

constexpr unsigned int kThreads = 256;
constexpr unsigned int kWarps = kThreads / 32;
constexpr std::size_t kMxBlock = 32;  // mpt::fp8::kMxBlockSize (quantize.hpp is not host-and-device)
// The vectorized kernels stride over the array with at most this many
// blocks: enough to fill any current GPU many times over, few enough that
// the per-block atomics (amax, counts) stay negligible.
constexpr std::size_t kMaxBlocks = 8192;

// The two element formats as compile-time constants (a host variable is not
// addressable on the device; casts.cu does the same).
struct E4m3 {
  static constexpr FormatSpec spec = formats::e4m3;
};
struct E5m2 {
  static constexpr FormatSpec spec = formats::e5m2;
};

// --- small device helpers -------------------------------------------------------

/// amax = max(amax, a) for a non-negative, non-NaN a, as one atomic on the
/// fp32 bits: such floats order exactly as their bit patterns (0x7f800000,
/// +inf, included), and the max is the same in any order.
__device__ __forceinline__ void atomic_amax(float* amax, float a) {
  if (a > 0.0f) atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(a));
}

/// Per-thread counts of the outcomes that are counted.
struct LocalCounts {
  unsigned int saturated = 0, overflowed = 0, nan = 0, flushed = 0;
  __device__ void add(Fp8Outcome o) {
    saturated += o == Fp8Outcome::saturated;
    overflowed += o == Fp8Outcome::overflowed;
    nan += o == Fp8Outcome::nan;
    flushed += o == Fp8Outcome::flushed;
  }
};

/// Add one thread's (or warp's) counts to the device totals; zeros cost no atomic.
__device__ __forceinline__ void flush_counts(Fp8DeviceCounts* c, const LocalCounts& l) {
  if (l.saturated) atomicAdd(&c->saturated, static_cast<unsigned long long>(l.saturated));
  if (l.overflowed) atomicAdd(&c->overflowed, static_cast<unsigned long long>(l.overflowed));
  if (l.nan) atomicAdd(&c->nan, static_cast<unsigned long long>(l.nan));
  if (l.flushed) atomicAdd(&c->flushed, static_cast<unsigned long long>(l.flushed));
}

__device__ __forceinline__ unsigned int warp_sum(unsigned int v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

/// The amax over a warp by a fixed butterfly; every lane gets it.
__device__ __forceinline__ float warp_amax(float a) {
  for (int off = 16; off > 0; off /= 2) a = fp8::amax_step(a, __shfl_xor_sync(0xffffffffu, a, off));
  return a;
}

/// A block's amax and counts, reduced through shared memory in a fixed
/// order (warps, then warp 0), then one atomic each from thread 0.
__device__ void block_flush(float a, LocalCounts l, float* amax, Fp8DeviceCounts* counts) {
  __shared__ float s_amax[kWarps];
  __shared__ unsigned int s_counts[4][kWarps];
  const unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  a = warp_amax(a);
  l.saturated = warp_sum(l.saturated);
  l.overflowed = warp_sum(l.overflowed);
  l.nan = warp_sum(l.nan);
  l.flushed = warp_sum(l.flushed);
  if (lane == 0) {
    s_amax[warp] = a;
    s_counts[0][warp] = l.saturated;
    s_counts[1][warp] = l.overflowed;
    s_counts[2][warp] = l.nan;
    s_counts[3][warp] = l.flushed;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    LocalCounts total;
    float m = 0.0f;
    for (unsigned int w = 0; w < kWarps; ++w) {
      m = fp8::amax_step(m, s_amax[w]);
      total.saturated += s_counts[0][w];
      total.overflowed += s_counts[1][w];
      total.nan += s_counts[2][w];
      total.flushed += s_counts[3][w];
    }
    if (amax != nullptr) atomic_amax(amax, m);
    if (counts != nullptr) flush_counts(counts, total);
  }
}

template <class F>
__device__ __forceinline__ Fp8Element quantize_one(float x, float scale, bool saturate) {
  constexpr FormatSpec f = F::spec;
  return fp8::quantize_element(x, scale, f, saturate);
}

// --- amax -----------------------------------------------------------------------------

// Version 1. x: (n,) fp32 -> amax: (1,) fp32. One block: thread t folds
// elements t, t + 256, ... with amax_step, then a fixed tree in shared
// memory halves the 256 partial results down to one, written plainly (no
// atomic). Correct and deterministic; one SM only, so slow.
__global__ void amax_simple(const float* __restrict__ x, std::size_t n, float* __restrict__ amax) {
  __shared__ float s[kThreads];
  float a = 0.0f;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) a = fp8::amax_step(a, x[i]);
  s[threadIdx.x] = a;
  __syncthreads();
  for (unsigned int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) s[threadIdx.x] = fp8::amax_step(s[threadIdx.x], s[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) *amax = s[0];
}

// Version 2. x: (n,) fp32 read as float4s (+ a tail) by a strided grid of
// blocks; each block reduces in a fixed order (block_flush) and meets the
// others in one atomicMax on the bits of *amax, which the host zeroed.
// Faster because every SM reads, with 16-byte loads, and one atomic per
// block is all that the blocks share.
__global__ void amax_vec4(const float* __restrict__ x, std::size_t n, float* amax) {
  const std::size_t n4 = n / 4, stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float a = 0.0f;
  for (std::size_t i = t; i < n4; i += stride) {
    const float4 v = reinterpret_cast<const float4*>(x)[i];
    a = fp8::amax_step(fp8::amax_step(fp8::amax_step(fp8::amax_step(a, v.x), v.y), v.z), v.w);
  }
  if (t < n - 4 * n4) a = fp8::amax_step(a, x[4 * n4 + t]);
  block_flush(a, LocalCounts{}, amax, nullptr);
}

// --- per-tensor quantize, amax and counts fused ------------------------------------------

// Version 1. x: (n,) fp32, scale: (1,) fp32 -> codes: (n,) u8, amax: (1,)
// fp32, counts: 4 u64 (both zeroed by the host). Thread i quantizes element
// i and adds to the amax and the counts with atomics of its own.
template <class F>
__global__ void quantize_tensor_simple(const float* __restrict__ x, std::size_t n,
                                       const float* __restrict__ scale, bool saturate,
                                       std::uint8_t* __restrict__ codes, float* amax,
                                       Fp8DeviceCounts* counts) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  const Fp8Element e = quantize_one<F>(v, *scale, saturate);
  codes[i] = e.code;
  atomic_amax(amax, fp8::amax_step(0.0f, v));
  LocalCounts l;
  l.add(e.outcome);
  flush_counts(counts, l);
}

// Version 2. The same, four elements per thread (one float4 in, four codes
// out as one 4-byte word) over a strided grid, the amax and counts reduced
// in the block before one atomic each. Faster because the pass is
// bandwidth-bound: wide accesses, and no atomic traffic per element.
template <class F>
__global__ void quantize_tensor_vec4(const float* __restrict__ x, std::size_t n,
                                     const float* __restrict__ scale, bool saturate,
                                     std::uint8_t* __restrict__ codes, float* amax, Fp8DeviceCounts* counts) {
  const std::size_t n4 = n / 4, stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const float s = *scale;
  float a = 0.0f;
  LocalCounts l;
  for (std::size_t i = t; i < n4; i += stride) {
    const float4 v = reinterpret_cast<const float4*>(x)[i];
    const Fp8Element e0 = quantize_one<F>(v.x, s, saturate), e1 = quantize_one<F>(v.y, s, saturate),
                     e2 = quantize_one<F>(v.z, s, saturate), e3 = quantize_one<F>(v.w, s, saturate);
    reinterpret_cast<unsigned int*>(codes)[i] = e0.code | (static_cast<unsigned int>(e1.code) << 8) |
                                                (static_cast<unsigned int>(e2.code) << 16) |
                                                (static_cast<unsigned int>(e3.code) << 24);
    a = fp8::amax_step(fp8::amax_step(fp8::amax_step(fp8::amax_step(a, v.x), v.y), v.z), v.w);
    l.add(e0.outcome);
    l.add(e1.outcome);
    l.add(e2.outcome);
    l.add(e3.outcome);
  }
  if (t < n - 4 * n4) {
    const float v = x[4 * n4 + t];
    const Fp8Element e = quantize_one<F>(v, s, saturate);
    codes[4 * n4 + t] = e.code;
    a = fp8::amax_step(a, v);
    l.add(e.outcome);
  }
  block_flush(a, l, amax, counts);
}

// --- MX block quantize ------------------------------------------------------------------

// Version 1. x: (rows, cols) fp32 -> codes: (rows, cols) u8, e8m0 and
// block_amax (optional): (rows, bpr), bpr = ceil(cols / 32); counts zeroed
// by the host. Thread k owns MX block k (row k / bpr, block k % bpr): its
// amax over its (up to) 32 values, its E8M0 code, then its values — the CPU
// loop, one block per thread.
template <class F>
__global__ void quantize_mx_simple(const float* __restrict__ x, std::size_t rows, std::size_t cols,
                                   std::size_t bpr, fp8::MxScaleRule rule, bool saturate,
                                   std::uint8_t* __restrict__ codes, std::uint8_t* __restrict__ e8m0,
                                   float* __restrict__ block_amax, Fp8DeviceCounts* counts) {
  const std::size_t k = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= rows * bpr) return;
  const std::size_t r = k / bpr, b = k % bpr;
  const std::size_t begin = r * cols + b * kMxBlock;
  const std::size_t count = cols - b * kMxBlock < kMxBlock ? cols - b * kMxBlock : kMxBlock;
  float a = 0.0f;
  for (std::size_t i = begin; i < begin + count; ++i) a = fp8::amax_step(a, x[i]);
  constexpr FormatSpec f = F::spec;
  const std::uint8_t code = fp8::mx_scale_code(a, f, rule);
  const float scale = fp8::e8m0_reciprocal(code);
  e8m0[k] = code;
  if (block_amax != nullptr) block_amax[k] = a;
  LocalCounts l;
  for (std::size_t i = begin; i < begin + count; ++i) {
    const Fp8Element e = quantize_one<F>(x[i], scale, saturate);
    codes[i] = e.code;
    l.add(e.outcome);
  }
  flush_counts(counts, l);
}

// Version 2. The same outputs; warp w of the grid (strided) owns MX block w,
// lane j its value j. The block's amax is a fixed butterfly of shuffles
// that leaves it in every lane, so every lane derives the same E8M0 code;
// lane 0 writes it. The counts are ballots (a popcount per outcome), one
// atomic per warp and outcome only where the count is not zero. Faster
// because a warp's 32 loads are one 128-byte transaction and its 32 code
// stores one 32-byte one, where version 1's threads each walk 128 bytes of
// their own, 128 bytes apart.
template <class F>
__global__ void quantize_mx_warp(const float* __restrict__ x, std::size_t rows, std::size_t cols,
                                 std::size_t bpr, fp8::MxScaleRule rule, bool saturate,
                                 std::uint8_t* __restrict__ codes, std::uint8_t* __restrict__ e8m0,
                                 float* __restrict__ block_amax, Fp8DeviceCounts* counts) {
  const unsigned int lane = threadIdx.x % 32;
  const std::size_t total = rows * bpr;
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * (blockDim.x / 32);
  LocalCounts l;  // lane 0's: the warp's totals
  for (std::size_t w = (static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < total;
       w += warps) {
    const std::size_t r = w / bpr, b = w % bpr;
    const std::size_t c = b * kMxBlock + lane;
    const bool in = c < cols;
    const std::size_t i = r * cols + c;
    const float v = in ? x[i] : 0.0f;  // a padding zero changes no amax
    const float a = warp_amax(fp8::amax_step(0.0f, v));
    constexpr FormatSpec f = F::spec;
    const std::uint8_t code = fp8::mx_scale_code(a, f, rule);
    const Fp8Element e = quantize_one<F>(v, fp8::e8m0_reciprocal(code), saturate);
    if (in) codes[i] = e.code;
    const Fp8Outcome o = in ? e.outcome : Fp8Outcome::in_range;
    const unsigned int sat = __popc(__ballot_sync(0xffffffffu, o == Fp8Outcome::saturated));
    const unsigned int ovf = __popc(__ballot_sync(0xffffffffu, o == Fp8Outcome::overflowed));
    const unsigned int nan = __popc(__ballot_sync(0xffffffffu, o == Fp8Outcome::nan));
    const unsigned int flu = __popc(__ballot_sync(0xffffffffu, o == Fp8Outcome::flushed));
    if (lane == 0) {
      e8m0[w] = code;
      if (block_amax != nullptr) block_amax[w] = a;
      l.saturated += sat;
      l.overflowed += ovf;
      l.nan += nan;
      l.flushed += flu;
    }
  }
  if (lane == 0) flush_counts(counts, l);
}

// --- dequantize -------------------------------------------------------------------------

// Version 1. codes: (n,) u8, scale: (1,) fp32 -> out: (n,) fp32; thread i
// decodes element i times 1 / scale (an IEEE division, rounded once, as
// the CPU's 1.0f / scale).
template <class F>
__global__ void dequant_tensor_simple(const std::uint8_t* __restrict__ codes, std::size_t n,
                                      const float* __restrict__ scale, float* __restrict__ out) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  constexpr FormatSpec f = F::spec;
  if (i < n) out[i] = fp8::dequantize_element(codes[i], 1.0f / *scale, f);
}

/// The scale-inverse of element i: per tensor (e8m0 null) the shared one,
/// MX the E8M0 value of its block.
__device__ __forceinline__ float inverse_of(std::size_t i, float tensor_inv, const std::uint8_t* e8m0,
                                            std::size_t cols, std::size_t bpr) {
  return e8m0 == nullptr ? tensor_inv : fp8::e8m0_to_float(e8m0[(i / cols) * bpr + (i % cols) / kMxBlock]);
}

// Version 1, MX. codes: (rows, cols) u8, e8m0: (rows, bpr) -> out: (rows,
// cols) fp32; thread i decodes element i times its block's 2^e.
template <class F>
__global__ void dequant_mx_simple(const std::uint8_t* __restrict__ codes,
                                  const std::uint8_t* __restrict__ e8m0, std::size_t n, std::size_t cols,
                                  std::size_t bpr, float* __restrict__ out) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  constexpr FormatSpec f = F::spec;
  if (i < n) out[i] = fp8::dequantize_element(codes[i], inverse_of(i, 0.0f, e8m0, cols, bpr), f);
}

// Version 2, both kinds. Thread i decodes codes 4i..4i+3 (one 4-byte load,
// one float4 store); the host sends MX here only when cols % 4 == 0, so
// the four share a row and a block of 32. Faster for the reason of the
// quantize's version 2: fewer, wider memory transactions.
template <class F>
__global__ void dequant_vec4(const std::uint8_t* __restrict__ codes, const std::uint8_t* __restrict__ e8m0,
                             std::size_t n, std::size_t cols, std::size_t bpr,
                             const float* __restrict__ scale, float* __restrict__ out) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  constexpr FormatSpec f = F::spec;
  const float tensor_inv = e8m0 == nullptr ? 1.0f / *scale : 0.0f;
  const std::size_t n4 = n / 4;
  if (i < n4) {
    const unsigned int w = reinterpret_cast<const unsigned int*>(codes)[i];
    const float inv = inverse_of(4 * i, tensor_inv, e8m0, cols, bpr);
    reinterpret_cast<float4*>(out)[i] =
        make_float4(fp8::dequantize_element(static_cast<std::uint8_t>(w), inv, f),
                    fp8::dequantize_element(static_cast<std::uint8_t>(w >> 8), inv, f),
                    fp8::dequantize_element(static_cast<std::uint8_t>(w >> 16), inv, f),
                    fp8::dequantize_element(static_cast<std::uint8_t>(w >> 24), inv, f));
  }
  if (i < n - 4 * n4) {
    const std::size_t j = 4 * n4 + i;
    out[j] = fp8::dequantize_element(codes[j], inverse_of(j, tensor_inv, e8m0, cols, bpr), f);
  }
}

// --- host side -------------------------------------------------------------------------

void check_version(KernelVersion v, const char* where) {
  if (v != KernelVersion::simple && v != KernelVersion::vectorized)
    throw std::invalid_argument(std::string("mpt::cuda::") + where +
                                ": unknown KernelVersion (choices: simple, vectorized)");
}

/// Call fn(E4m3{}) or fn(E5m2{}) for the dtype; std::invalid_argument for any other.
template <class Fn>
void with_format(DType dtype, const char* where, Fn&& fn) {
  if (dtype == DType::e4m3) {
    fn(E4m3{});
  } else if (dtype == DType::e5m2) {
    fn(E5m2{});
  } else {
    throw std::invalid_argument(std::string("mpt::cuda::") + where + ": dtype " +
                                std::string(dtype_name(dtype)) + " is not an FP8 format; valid: e4m3, e5m2");
  }
}

unsigned int strided_blocks(std::size_t work, const char* where) {
  return std::min(detail::blocks_for(work, kThreads, where), static_cast<unsigned int>(kMaxBlocks));
}

void reset(float* d_amax, Fp8DeviceCounts* d_counts, const char* where) {
  if (d_amax != nullptr) detail::check(cudaMemsetAsync(d_amax, 0, sizeof(float)), where);
  if (d_counts != nullptr) detail::check(cudaMemsetAsync(d_counts, 0, sizeof(Fp8DeviceCounts)), where);
}

}  // namespace

void fp8_amax(const float* d_x, std::size_t n, float* d_amax, KernelVersion v) {
  const char* where = "fp8_amax";
  check_version(v, where);
  if (v == KernelVersion::simple) {
    amax_simple<<<1, kThreads>>>(d_x, n, d_amax);  // writes *d_amax, also for n = 0
  } else {
    reset(d_amax, nullptr, where);
    if (n == 0) return;
    if (!detail::aligned(d_x, 16)) {
      amax_simple<<<1, kThreads>>>(d_x, n, d_amax);
    } else {
      amax_vec4<<<strided_blocks(std::max(n / 4, n % 4), where), kThreads>>>(d_x, n, d_amax);
    }
  }
  detail::check_launch(where);
}

void fp8_quantize_per_tensor(const float* d_x, std::size_t n, DType dtype, const float* d_scale,
                             bool saturate, std::uint8_t* d_codes, float* d_amax, Fp8DeviceCounts* d_counts,
                             KernelVersion v) {
  const char* where = "fp8_quantize_per_tensor";
  check_version(v, where);
  with_format(dtype, where, [&](auto format) {
    using F = decltype(format);
    reset(d_amax, d_counts, where);
    if (n == 0) return;
    if (v == KernelVersion::vectorized && detail::aligned(d_x, 16) && detail::aligned(d_codes, 4)) {
      quantize_tensor_vec4<F><<<strided_blocks(std::max(n / 4, n % 4), where), kThreads>>>(
          d_x, n, d_scale, saturate, d_codes, d_amax, d_counts);
    } else {
      quantize_tensor_simple<F><<<detail::blocks_for(n, kThreads, where), kThreads>>>(
          d_x, n, d_scale, saturate, d_codes, d_amax, d_counts);
    }
    detail::check_launch(where);
  });
}

void fp8_quantize_mx(const float* d_x, std::size_t rows, std::size_t cols, DType dtype, fp8::MxScaleRule rule,
                     bool saturate, std::uint8_t* d_codes, std::uint8_t* d_e8m0, float* d_block_amax,
                     Fp8DeviceCounts* d_counts, KernelVersion v) {
  const char* where = "fp8_quantize_mx";
  check_version(v, where);
  if (rule != fp8::MxScaleRule::floor && rule != fp8::MxScaleRule::rceil)
    throw std::invalid_argument("mpt::cuda::fp8_quantize_mx: unknown MxScaleRule (choices: floor, rceil)");
  with_format(dtype, where, [&](auto format) {
    using F = decltype(format);
    reset(nullptr, d_counts, where);
    const std::size_t bpr = (cols + kMxBlock - 1) / kMxBlock, blocks = rows * bpr;
    if (blocks == 0) return;
    if (v == KernelVersion::simple) {
      quantize_mx_simple<F><<<detail::blocks_for(blocks, kThreads, where), kThreads>>>(
          d_x, rows, cols, bpr, rule, saturate, d_codes, d_e8m0, d_block_amax, d_counts);
    } else {
      quantize_mx_warp<F><<<strided_blocks((blocks + kWarps - 1) / kWarps * kThreads, where), kThreads>>>(
          d_x, rows, cols, bpr, rule, saturate, d_codes, d_e8m0, d_block_amax, d_counts);
    }
    detail::check_launch(where);
  });
}

void fp8_dequantize_per_tensor(const std::uint8_t* d_codes, std::size_t n, DType dtype, const float* d_scale,
                               float* d_out, KernelVersion v) {
  const char* where = "fp8_dequantize_per_tensor";
  check_version(v, where);
  with_format(dtype, where, [&](auto format) {
    using F = decltype(format);
    if (n == 0) return;
    if (v == KernelVersion::vectorized && detail::aligned(d_codes, 4) && detail::aligned(d_out, 16)) {
      dequant_vec4<F><<<detail::blocks_for(std::max(n / 4, n % 4), kThreads, where), kThreads>>>(
          d_codes, nullptr, n, 1, 1, d_scale, d_out);
    } else {
      dequant_tensor_simple<F>
          <<<detail::blocks_for(n, kThreads, where), kThreads>>>(d_codes, n, d_scale, d_out);
    }
    detail::check_launch(where);
  });
}

void fp8_dequantize_mx(const std::uint8_t* d_codes, const std::uint8_t* d_e8m0, std::size_t rows,
                       std::size_t cols, DType dtype, float* d_out, KernelVersion v) {
  const char* where = "fp8_dequantize_mx";
  check_version(v, where);
  with_format(dtype, where, [&](auto format) {
    using F = decltype(format);
    const std::size_t n = rows * cols, bpr = (cols + kMxBlock - 1) / kMxBlock;
    if (n == 0) return;
    if (v == KernelVersion::vectorized && cols % 4 == 0 && detail::aligned(d_codes, 4) &&
        detail::aligned(d_out, 16)) {
      dequant_vec4<F><<<detail::blocks_for(n / 4, kThreads, where), kThreads>>>(d_codes, d_e8m0, n, cols, bpr,
                                                                                nullptr, d_out);
    } else {
      dequant_mx_simple<F>
          <<<detail::blocks_for(n, kThreads, where), kThreads>>>(d_codes, d_e8m0, n, cols, bpr, d_out);
    }
    detail::check_launch(where);
  });
}

}  // namespace mpt::cuda
