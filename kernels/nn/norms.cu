// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the CUDA
// kernels, forward and backward, FP16, BF16 or FP32 in and out.
// Depends on: mpt/nn/layers/welford.hpp (Welford's update and Chan's merge, the CPU
// layers' own functions), mpt/nn/layers/norm_math.hpp (the per-element formulas),
// mpt/formats/round_element.hpp (decode, and the rounding of every stored
// result in the simple versions), mpt/formats/codes.hpp (Fp16Code, Bf16Code),
// kernels/nn/nn_kernels.hpp (the host API), cuda_check.cuh, cuda_fp16.h and
// cuda_bf16.h (the hardware conversions of the fast versions).
//
// The simplest correct versions first, llm.c style (NormVersion::simple):
// one thread block per BatchNorm channel, one warp per LayerNorm row, one
// thread per LayerNorm column for the weight's gradient; the faster ones
// (NormVersion::fast) after them, each with its reason. No arithmetic of
// their own: the statistics are welford_add per thread, then welford_merge
// across the warp (shuffles), the block (shared memory) and, in the fast
// BatchNorm, the blocks of a channel (a second kernel); everything
// element-wise is norm_math.hpp's MPT_HD functions. The file is compiled
// with -fmad=false (kernels/CMakeLists.txt) so that x̂·γ + β and the terms
// of dx stay two roundings, as on the CPU, instead of one FMA: given the
// same statistics the kernels' outputs are the CPU layer's bits (NaN
// payloads aside in the fast versions), which the GPU test checks.
//
// Why one block per channel for the simple BatchNorm: the whole reduction
// of a channel then lives in one block, so the statistics, the running
// update and the normalization are one launch with no scratch memory and no
// second pass over partial results, and the reduction order is fixed (the
// same bits on every run). The price is parallelism: C blocks, so a layer
// with fewer channels than the GPU has SMs (C = 64 on a 132-SM H200) leaves
// part of the GPU idle and each channel's M values are read by only 256
// threads. The fast version splits each channel over several blocks (see
// its section); the benchmark (tests/bench/bench_ch03_norms_cuda.cpp)
// measures both beside a device-to-device copy.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/formats/cuda_check.cuh"
#include "kernels/nn/nn_kernels.hpp"
#include "mpt/formats/codes.hpp"
#include "mpt/formats/round_element.hpp"
#include "mpt/nn/layers/norm_math.hpp"
#include "mpt/nn/layers/welford.hpp"

namespace mpt::cuda {
namespace {

constexpr int kThreads = 256;  // per block, every kernel of this file
constexpr int kWarp = 32;
constexpr int kWarps = kThreads / kWarp;
constexpr unsigned int kFullMask = 0xffffffffu;

// --- storage types ----------------------------------------------------------------
//
// Io<T> for each API element type: the raw type the kernels move (float, or
// the code's uint16_t), its exact widening to float and the one rounding of
// a float result into it (nearest-even, overflow to inf, subnormals kept:
// what mpt's Tensor writes do). The format is copied into a compile-time
// constant inside each device function: device code may not read the host
// variables mpt::formats::fp16 and bf16.

template <class T>
struct Io;

template <>
struct Io<float> {
  using Raw = float;
  __device__ static float load(float v) { return v; }
  __device__ static float store(float v) { return v; }
};

struct Fp16Format {
  static constexpr FormatSpec spec = formats::fp16;
};
struct Bf16Format {
  static constexpr FormatSpec spec = formats::bf16;
};

template <class Format>
struct Io16 {
  using Raw = std::uint16_t;
  __device__ static float load(std::uint16_t c) {
    constexpr FormatSpec f = Format::spec;
    return decode(c, f);
  }
  __device__ static std::uint16_t store(float v) {
    constexpr FormatSpec f = Format::spec;
    return static_cast<std::uint16_t>(encode_exact(
        round_to_format(v, f, RoundingMode::nearest_even, OverflowMode::infinity, SubnormalMode::keep), f));
  }
};
template <>
struct Io<Fp16Code> : Io16<Fp16Format> {};
template <>
struct Io<Bf16Code> : Io16<Bf16Format> {};

// The one place where typed codes become raw integers: each code type is a
// standard-layout struct whose only member is its uint16_t, with that
// integer's size and alignment (codes.hpp asserts it, and so does this), so
// an array of codes is an array of integers.
template <class T>
constexpr bool raw_compatible() {
  using R = typename Io<T>::Raw;
  return sizeof(T) == sizeof(R) && alignof(T) == alignof(R) && std::is_standard_layout_v<T> &&
         std::is_trivially_copyable_v<T>;
}
static_assert(raw_compatible<float>() && raw_compatible<Fp16Code>() && raw_compatible<Bf16Code>(),
              "a norm storage type must be exactly its raw type");

template <class T>
const typename Io<T>::Raw* raw(const T* p) {
  return reinterpret_cast<const typename Io<T>::Raw*>(p);
}
template <class T>
typename Io<T>::Raw* raw(T* p) {
  return reinterpret_cast<typename Io<T>::Raw*>(p);
}

// IoHw<T>: Io<T>'s two conversions by the GPU's own instructions, for the
// fast versions. fp16 and bf16 → f32 are exact either way; f32 → fp16
// (cvt.rn.f16.f32) and f32 → bf16 (cvt.rn.bf16.f32) round to nearest even
// with overflow to ±inf and subnormals kept, as round_to_format does, so
// every non-NaN result has Io<T>'s bits. A NaN is stored as the hardware's
// canonical NaN, 0x7FFF in both formats, where Io<T> keeps the NaN's sign
// and writes 0x7E00 (fp16) or 0x7FC0 (bf16): still a NaN, another payload
// (the GPU test compares NaNs by class, not by bits).
template <class T>
struct IoHw;
template <>
struct IoHw<float> : Io<float> {};
template <>
struct IoHw<Fp16Code> {
  using Raw = std::uint16_t;
  __device__ static float load(std::uint16_t c) { return __half2float(__ushort_as_half(c)); }
  __device__ static std::uint16_t store(float v) { return __half_as_ushort(__float2half_rn(v)); }
};
template <>
struct IoHw<Bf16Code> {
  using Raw = std::uint16_t;
  __device__ static float load(std::uint16_t c) { return __bfloat162float(__ushort_as_bfloat16(c)); }
  __device__ static std::uint16_t store(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};

/// Elements of T per 16-byte access: 8 codes or 4 floats.
template <class T>
constexpr int kVec = static_cast<int>(16 / sizeof(typename Io<T>::Raw));

/// N elements of T at p (aligned to the min(16, N·size) bytes they span),
/// widened by IoHw: one 16-byte load per 16 bytes, or one 8-byte load for
/// 4 codes (a P array beside float activations).
template <class T, int N>
__device__ __forceinline__ void load_vec(const typename Io<T>::Raw* __restrict__ p, float (&v)[N]) {
  using Raw = typename Io<T>::Raw;
  constexpr int kBytes = N * static_cast<int>(sizeof(Raw));
  static_assert(kBytes == 8 || kBytes % 16 == 0, "a vector spans 8 bytes or whole 16-byte words");
  alignas(16) Raw buf[N];
  if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(buf) = *reinterpret_cast<const uint2*>(p);
  } else {
    for (int k = 0; k < kBytes / 16; ++k)
      reinterpret_cast<uint4*>(buf)[k] = reinterpret_cast<const uint4*>(p)[k];
  }
  for (int k = 0; k < N; ++k) v[k] = IoHw<T>::load(buf[k]);
}

/// N floats rounded into T by IoHw and stored at p with 16-byte stores.
template <class T, int N>
__device__ __forceinline__ void store_vec(typename Io<T>::Raw* __restrict__ p, const float (&v)[N]) {
  using Raw = typename Io<T>::Raw;
  constexpr int kBytes = N * static_cast<int>(sizeof(Raw));
  static_assert(kBytes % 16 == 0, "activations are stored in whole 16-byte words");
  alignas(16) Raw buf[N];
  for (int k = 0; k < N; ++k) buf[k] = IoHw<T>::store(v[k]);
  for (int k = 0; k < kBytes / 16; ++k)
    reinterpret_cast<uint4*>(p)[k] = reinterpret_cast<const uint4*>(buf)[k];
}

/// N parameters of P for columns i, i + 1, ... (16-byte loads), or `fill`
/// each where the array is nullptr.
template <class P, int N>
__device__ __forceinline__ void load_params(const typename Io<P>::Raw* __restrict__ p, long long i,
                                            float fill, float (&v)[N]) {
  if (p == nullptr) {
    for (int k = 0; k < N; ++k) v[k] = fill;
  } else {
    load_vec<P, N>(p + i, v);
  }
}

// --- reductions ---------------------------------------------------------------------

// Welford statistics travel between lanes as their three fields.
__device__ __forceinline__ Welford<float> shfl_down(const Welford<float>& s, int offset) {
  Welford<float> o;
  o.count = __shfl_down_sync(kFullMask, static_cast<long long>(s.count), offset);
  o.mean = __shfl_down_sync(kFullMask, s.mean, offset);
  o.m2 = __shfl_down_sync(kFullMask, s.m2, offset);
  return o;
}

// The statistics of the whole warp, in lane 0 (the other lanes hold partial
// merges): a tree of Chan merges, lane l taking lane l + offset for offset
// 16, 8, 4, 2, 1. A lane with nothing is {0, 0, 0}, which welford_merge
// passes through exactly.
__device__ __forceinline__ Welford<float> warp_merge(Welford<float> s) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) s = welford_merge(s, shfl_down(s, offset));
  return s;
}

// Lane 0's statistics, for every lane of the warp.
__device__ __forceinline__ Welford<float> warp_broadcast(const Welford<float>& s) {
  Welford<float> o;
  o.count = __shfl_sync(kFullMask, static_cast<long long>(s.count), 0);
  o.mean = __shfl_sync(kFullMask, s.mean, 0);
  o.m2 = __shfl_sync(kFullMask, s.m2, 0);
  return o;
}

// The statistics of the whole block, for every thread: each warp merges its
// lanes, warp 0 merges the warps' results (in warp order), and the result
// goes through shared memory. Call once per kernel: the shared slots are not
// reused. (Shared memory holds plain arrays: a __shared__ Welford, whose
// members have initializers, may not be declared.)
__device__ Welford<float> block_merge(Welford<float> s) {
  __shared__ long long counts[kWarps];
  __shared__ float means[kWarps], m2s[kWarps];
  __shared__ long long total_count;
  __shared__ float total_mean, total_m2;
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  s = warp_merge(s);
  if (lane == 0) {
    counts[warp] = s.count;
    means[warp] = s.mean;
    m2s[warp] = s.m2;
  }
  __syncthreads();
  if (warp == 0) {
    Welford<float> w;
    if (lane < kWarps) {
      w.count = counts[lane];
      w.mean = means[lane];
      w.m2 = m2s[lane];
    }
    w = warp_merge(w);
    if (lane == 0) {
      total_count = w.count;
      total_mean = w.mean;
      total_m2 = w.m2;
    }
  }
  __syncthreads();
  Welford<float> r;
  r.count = total_count;
  r.mean = total_mean;
  r.m2 = total_m2;
  return r;
}

// A pair of FP32 sums over the warp, in lane 0 (tree order as warp_merge).
__device__ __forceinline__ void warp_sum2(float& a, float& b) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    a += __shfl_down_sync(kFullMask, a, offset);
    b += __shfl_down_sync(kFullMask, b, offset);
  }
}

// A pair of FP32 sums over the block, for every thread (as block_merge: once
// per kernel).
__device__ void block_sum2(float& a, float& b) {
  __shared__ float as[kWarps], bs[kWarps];
  __shared__ float total_a, total_b;
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  warp_sum2(a, b);
  if (lane == 0) {
    as[warp] = a;
    bs[warp] = b;
  }
  __syncthreads();
  if (warp == 0) {
    float x = lane < kWarps ? as[lane] : 0.0f, y = lane < kWarps ? bs[lane] : 0.0f;
    warp_sum2(x, y);
    if (lane == 0) {
      total_a = x;
      total_b = y;
    }
  }
  __syncthreads();
  a = total_a;
  b = total_b;
}

// --- walking one BatchNorm channel ------------------------------------------------
//
// Thread t of a block visits values j = t, t + kThreads, t + 2·kThreads, ...
// of channel c, value j being element (n, i) = (j / inner, j % inner) at
// (n·channels + c)·inner + i. The division happens once per thread; each
// step adds kThreads = q·inner + r as "n += q, i += r, carry".
struct ChannelWalk {
  long long n, i, dn, di, inner, stride;  // stride: channels·inner, one n further
  long long base;                         // offset of (0, c, 0)
  __device__ ChannelWalk(long long channels, long long inner_, long long c, long long t)
      : n(t / inner_),
        i(t % inner_),
        dn(kThreads / inner_),
        di(kThreads % inner_),
        inner(inner_),
        stride(channels * inner_),
        base(c * inner_) {}
  __device__ long long offset() const { return base + n * stride + i; }
  __device__ void next() {
    n += dn;
    i += di;
    if (i >= inner) {
      i -= inner;
      ++n;
    }
  }
};

// --- BatchNorm ----------------------------------------------------------------------

// Training forward. x, y: (outer, channels, inner) raw X; weight, bias,
// running_mean, running_var: (channels,) raw P or nullptr; mean, invstd:
// (channels,) f32. Block c: pass 1 folds the thread's values with
// welford_add, block_merge gives every thread the channel's statistics;
// thread 0 writes mean, invstd and the running update; pass 2 writes y.
template <class X, class P>
__global__ void batch_norm_train_kernel(long long outer, long long channels, long long inner,
                                        const typename Io<X>::Raw* __restrict__ x,
                                        const typename Io<P>::Raw* __restrict__ weight,
                                        const typename Io<P>::Raw* __restrict__ bias,
                                        typename Io<P>::Raw* __restrict__ running_mean,
                                        typename Io<P>::Raw* __restrict__ running_var, float momentum,
                                        float eps, typename Io<X>::Raw* __restrict__ y,
                                        float* __restrict__ mean_out, float* __restrict__ invstd_out) {
  const long long c = blockIdx.x, m = outer * inner;
  Welford<float> s;
  {
    ChannelWalk w(channels, inner, c, threadIdx.x);
    for (long long j = threadIdx.x; j < m; j += kThreads, w.next())
      welford_add(s, Io<X>::load(x[w.offset()]));
  }
  s = block_merge(s);
  const float mean = s.mean, invstd = norm_math::inverse_std(welford_variance_biased(s), eps);
  if (threadIdx.x == 0) {
    mean_out[c] = mean;
    invstd_out[c] = invstd;
    if (running_mean != nullptr) {
      running_mean[c] = Io<P>::store(norm_math::running_update(Io<P>::load(running_mean[c]), mean, momentum));
      running_var[c] = Io<P>::store(
          norm_math::running_update(Io<P>::load(running_var[c]), welford_variance_unbiased(s), momentum));
    }
  }
  const float g = weight != nullptr ? Io<P>::load(weight[c]) : 1.0f;
  const float b = bias != nullptr ? Io<P>::load(bias[c]) : 0.0f;
  ChannelWalk w(channels, inner, c, threadIdx.x);
  for (long long j = threadIdx.x; j < m; j += kThreads, w.next()) {
    const long long e = w.offset();
    y[e] = Io<X>::store(norm_math::scale_shift(norm_math::normalize(Io<X>::load(x[e]), mean, invstd), g, b));
  }
}

// Eval forward: block c normalizes its channel with the running estimates.
template <class X, class P>
__global__ void batch_norm_eval_kernel(long long outer, long long channels, long long inner,
                                       const typename Io<X>::Raw* __restrict__ x,
                                       const typename Io<P>::Raw* __restrict__ weight,
                                       const typename Io<P>::Raw* __restrict__ bias,
                                       const typename Io<P>::Raw* __restrict__ running_mean,
                                       const typename Io<P>::Raw* __restrict__ running_var, float eps,
                                       typename Io<X>::Raw* __restrict__ y) {
  const long long c = blockIdx.x, m = outer * inner;
  const float mean = Io<P>::load(running_mean[c]);
  const float invstd = norm_math::inverse_std(Io<P>::load(running_var[c]), eps);
  const float g = weight != nullptr ? Io<P>::load(weight[c]) : 1.0f;
  const float b = bias != nullptr ? Io<P>::load(bias[c]) : 0.0f;
  ChannelWalk w(channels, inner, c, threadIdx.x);
  for (long long j = threadIdx.x; j < m; j += kThreads, w.next()) {
    const long long e = w.offset();
    y[e] = Io<X>::store(norm_math::scale_shift(norm_math::normalize(Io<X>::load(x[e]), mean, invstd), g, b));
  }
}

// Backward. x, dy, dx: (outer, channels, inner) raw X; mean, invstd:
// (channels,) f32; weight: (channels,) raw P or nullptr; dweight, dbias:
// (channels,) f32 or nullptr. Block c: pass 1 sums dy and dy·x̂ (FP32, per
// thread then block_sum2), thread 0 writes them; pass 2 writes dx from
// Σg = γ·Σdy and Σg·x̂ = γ·Σdy·x̂.
template <class X, class P>
__global__ void batch_norm_backward_kernel(long long outer, long long channels, long long inner,
                                           const typename Io<X>::Raw* __restrict__ x,
                                           const typename Io<X>::Raw* __restrict__ dy,
                                           const float* __restrict__ mean, const float* __restrict__ invstd,
                                           const typename Io<P>::Raw* __restrict__ weight,
                                           bool batch_statistics, typename Io<X>::Raw* __restrict__ dx,
                                           float* __restrict__ dweight, float* __restrict__ dbias) {
  const long long c = blockIdx.x, m = outer * inner;
  const float mc = mean[c], ic = invstd[c];
  float sum_dy = 0.0f, sum_dy_xhat = 0.0f;
  {
    ChannelWalk w(channels, inner, c, threadIdx.x);
    for (long long j = threadIdx.x; j < m; j += kThreads, w.next()) {
      const long long e = w.offset();
      const float d = Io<X>::load(dy[e]);
      sum_dy += d;
      sum_dy_xhat += d * norm_math::normalize(Io<X>::load(x[e]), mc, ic);
    }
  }
  block_sum2(sum_dy, sum_dy_xhat);
  if (threadIdx.x == 0) {
    if (dweight != nullptr) dweight[c] = sum_dy_xhat;
    if (dbias != nullptr) dbias[c] = sum_dy;
  }
  if (dx == nullptr) return;
  const float g_c = weight != nullptr ? Io<P>::load(weight[c]) : 1.0f;
  const float sum_g = g_c * sum_dy, sum_g_xhat = g_c * sum_dy_xhat, count = static_cast<float>(m);
  ChannelWalk w(channels, inner, c, threadIdx.x);
  for (long long j = threadIdx.x; j < m; j += kThreads, w.next()) {
    const long long e = w.offset();
    const float g = g_c * Io<X>::load(dy[e]);
    const float v = batch_statistics ? norm_math::input_grad_batch(
                                           ic, count, g, sum_g,
                                           norm_math::normalize(Io<X>::load(x[e]), mc, ic), sum_g_xhat)
                                     : norm_math::input_grad_fixed(g, ic);
    dx[e] = Io<X>::store(v);
  }
}

// --- BatchNorm, version 2 (NormVersion::fast): a channel over several blocks ----------
//
// Why faster: version 1 runs C blocks, so a layer with fewer channels than
// the GPU has SMs leaves SMs idle, each channel's M = outer·inner values are
// read by 256 threads, and the [N, C] layout (inner 1) is read with a stride
// of C elements, every 2- or 4-byte load in a 32-byte sector of its own.
// Version 2 splits the work in three kernels:
//  1. partial statistics (or, backward, partial sums): the values of a
//     channel in chunks, one block per (channel, chunk), each writing its
//     Welford state (count, mean, M2) or its two FP32 sums to scratch
//     memory. For [N, C] a block takes 32 neighbouring channels and a chunk
//     of rows, each warp reading 32 channels of one row (64 or 128
//     consecutive bytes: coalesced), the 8 warps merged in warp order.
//  2. the combine: one warp per channel, lane l merging chunks l, l + 32, ...
//     in order, then the warp's tree (welford_merge, or FP32 additions);
//     lane 0 writes the statistics and the running update (or dweight and
//     dbias), exactly as version 1's thread 0 does from its block's result.
//  3. the element-wise pass (y, or dx), one thread per 8 codes or 4 floats
//     with 16-byte loads and stores and the hardware conversions (IoHw),
//     every element of the tensor at once: no block waits for a channel.
//     It needs x, y (dy, dx) 16-byte aligned; otherwise the host runs
//     version 1 for the call.
// The chunks depend on the shape alone and every merge order is fixed: the
// same bits on every run and every GPU (not version 1's bits: the order of
// the reductions differs).

constexpr long long kBnChunk = 4096;    // values of a channel per block (16 per thread), inner > 1
constexpr long long kBnRowChunk = 256;  // rows per block for [N, C] (32 per warp)
constexpr long long kMaxGridY = 65535;  // the grid's y limit: chunks of one channel

/// How a channel's values are split: `chunks` chunks of `chunk` values (or,
/// for [N, C], rows), the last one possibly short.
struct BnSplit {
  bool rows;  ///< the [N, C] layout (inner == 1): blocks of 32 channels × chunk rows
  long long chunk, chunks;
};

BnSplit bn_split(long long outer, long long inner) {
  const bool rows = inner == 1;
  const long long m = outer * inner, base = rows ? kBnRowChunk : kBnChunk;
  const long long least = m / kMaxGridY + (m % kMaxGridY != 0 ? 1 : 0);
  const long long chunk = least > base ? least : base;
  return {rows, chunk, m / chunk + (m % chunk != 0 ? 1 : 0)};
}

/// A Welford state read from the three partial arrays at p.
__device__ __forceinline__ Welford<float> partial_at(const long long* __restrict__ counts,
                                                     const float* __restrict__ means,
                                                     const float* __restrict__ m2s, long long p) {
  Welford<float> w;
  w.count = counts[p];
  w.mean = means[p];
  w.m2 = m2s[p];
  return w;
}

/// Kernel 1 of the training forward, inner > 1: block (c, k) folds values
/// k·chunk, ... of channel c (thread t: every 256th from k·chunk + t, by
/// welford_add), merges the block (block_merge) and writes partial k·C + c.
template <class X>
__global__ void bn_stats_partial_kernel(long long outer, long long channels, long long inner, long long chunk,
                                        const typename Io<X>::Raw* __restrict__ x,
                                        long long* __restrict__ counts, float* __restrict__ means,
                                        float* __restrict__ m2s) {
  const long long c = blockIdx.x, k = blockIdx.y, m = outer * inner;
  const long long first = k * chunk, end = first + chunk < m ? first + chunk : m;
  Welford<float> s;
  ChannelWalk w(channels, inner, c, first + threadIdx.x);
  for (long long j = first + threadIdx.x; j < end; j += kThreads, w.next())
    welford_add(s, IoHw<X>::load(x[w.offset()]));
  s = block_merge(s);
  if (threadIdx.x == 0) {
    const long long p = k * channels + c;
    counts[p] = s.count;
    means[p] = s.mean;
    m2s[p] = s.m2;
  }
}

/// Kernel 1 of the training forward for [N, C]: block (b, k) takes
/// channels b·32 + lane and rows k·chunk + warp, + 8, ...: each warp reads
/// 32 neighbouring channels of a row. The 8 warps' states of a channel are
/// merged in warp order through shared memory.
template <class X>
__global__ void bn_stats_partial_rows_kernel(long long outer, long long channels, long long chunk,
                                             const typename Io<X>::Raw* __restrict__ x,
                                             long long* __restrict__ counts, float* __restrict__ means,
                                             float* __restrict__ m2s) {
  __shared__ long long sc[kWarps][kWarp];
  __shared__ float sm[kWarps][kWarp], sq[kWarps][kWarp];
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const long long c = static_cast<long long>(blockIdx.x) * kWarp + lane, k = blockIdx.y;
  const long long first = k * chunk, end = first + chunk < outer ? first + chunk : outer;
  Welford<float> s;
  if (c < channels)
    for (long long n = first + warp; n < end; n += kWarps) welford_add(s, IoHw<X>::load(x[n * channels + c]));
  sc[warp][lane] = s.count;
  sm[warp][lane] = s.mean;
  sq[warp][lane] = s.m2;
  __syncthreads();
  if (warp != 0 || c >= channels) return;
  Welford<float> t;
  for (int w = 0; w < kWarps; ++w) {
    Welford<float> o;
    o.count = sc[w][lane];
    o.mean = sm[w][lane];
    o.m2 = sq[w][lane];
    t = welford_merge(t, o);
  }
  const long long p = k * channels + c;
  counts[p] = t.count;
  means[p] = t.mean;
  m2s[p] = t.m2;
}

/// Kernel 2 of the training forward: warp threadIdx.x / 32 of block b takes
/// channel b·8 + warp, merges its chunks (lane l: l, l + 32, ... in order,
/// then warp_merge), and lane 0 writes mean, invstd and the running update
/// as version 1's thread 0 does.
template <class P>
__global__ void bn_stats_finalize_kernel(long long channels, long long chunks,
                                         const long long* __restrict__ counts,
                                         const float* __restrict__ means, const float* __restrict__ m2s,
                                         typename Io<P>::Raw* __restrict__ running_mean,
                                         typename Io<P>::Raw* __restrict__ running_var, float momentum,
                                         float eps, float* __restrict__ mean_out,
                                         float* __restrict__ invstd_out) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const long long c =
      static_cast<long long>(blockIdx.x) * kWarps + static_cast<long long>(threadIdx.x) / kWarp;
  if (c >= channels) return;  // whole warps leave together
  Welford<float> s;
  for (long long k = lane; k < chunks; k += kWarp)
    s = welford_merge(s, partial_at(counts, means, m2s, k * channels + c));
  s = warp_merge(s);
  if (lane != 0) return;
  const float mean = s.mean, invstd = norm_math::inverse_std(welford_variance_biased(s), eps);
  mean_out[c] = mean;
  invstd_out[c] = invstd;
  if (running_mean != nullptr) {
    running_mean[c] = Io<P>::store(norm_math::running_update(Io<P>::load(running_mean[c]), mean, momentum));
    running_var[c] = Io<P>::store(
        norm_math::running_update(Io<P>::load(running_var[c]), welford_variance_unbiased(s), momentum));
  }
}

/// The eval forward's statistics, one thread per channel: version 1's
/// mean = running_mean[c] and invstd = 1/√(running_var[c] + eps), into
/// f32 arrays for the element-wise kernel.
template <class P>
__global__ void bn_eval_stats_kernel(long long channels, const typename Io<P>::Raw* __restrict__ running_mean,
                                     const typename Io<P>::Raw* __restrict__ running_var, float eps,
                                     float* __restrict__ mean, float* __restrict__ invstd) {
  const long long c = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= channels) return;
  mean[c] = Io<P>::load(running_mean[c]);
  invstd[c] = norm_math::inverse_std(Io<P>::load(running_var[c]), eps);
}

/// The channel of element e and its position i within its (n, c) run,
/// walked one element at a time (no division per element).
struct ElementChannel {
  long long i, c, inner, channels;
  __device__ ElementChannel(long long e, long long inner_, long long channels_)
      : inner(inner_), channels(channels_) {
    const long long q = e / inner_;
    i = e - q * inner_;
    c = q % channels_;
  }
  __device__ void next() {
    if (++i == inner) {
      i = 0;
      if (++c == channels) c = 0;
    }
  }
};

/// Kernel 3 of the forwards: y = x̂·γ + β for every element, x̂ from the
/// channel's mean and invstd (f32 [channels]). Thread t takes element
/// vectors t, t + gridDim·256, ... of kVec<X> elements (16-byte loads and
/// stores: x and y 16-byte aligned, which the host checks); the tail past
/// the last whole vector one element per thread.
template <class X, class P>
__global__ void bn_normalize_kernel(long long n, long long channels, long long inner,
                                    const typename Io<X>::Raw* __restrict__ x, const float* __restrict__ mean,
                                    const float* __restrict__ invstd,
                                    const typename Io<P>::Raw* __restrict__ weight,
                                    const typename Io<P>::Raw* __restrict__ bias,
                                    typename Io<X>::Raw* __restrict__ y) {
  constexpr int V = kVec<X>;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads, vectors = n / V;
  auto one = [&](float xv, const ElementChannel& ec) {
    const float g = weight != nullptr ? IoHw<P>::load(weight[ec.c]) : 1.0f;
    const float b = bias != nullptr ? IoHw<P>::load(bias[ec.c]) : 0.0f;
    return norm_math::scale_shift(norm_math::normalize(xv, mean[ec.c], invstd[ec.c]), g, b);
  };
  for (long long v = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; v < vectors; v += stride) {
    float xv[V], yv[V];
    load_vec<X, V>(x + v * V, xv);
    ElementChannel ec(v * V, inner, channels);
    for (int k = 0; k < V; ++k, ec.next()) yv[k] = one(xv[k], ec);
    store_vec<X, V>(y + v * V, yv);
  }
  const long long e = vectors * V + static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (e < n) y[e] = IoHw<X>::store(one(IoHw<X>::load(x[e]), ElementChannel(e, inner, channels)));
}

/// Kernel 1 of the backward, inner > 1: block (c, k) sums dy and dy·x̂ over
/// values k·chunk, ... of channel c (FP32, per thread then block_sum2) into
/// partials k·C + c.
template <class X>
__global__ void bn_backward_partial_kernel(long long outer, long long channels, long long inner,
                                           long long chunk, const typename Io<X>::Raw* __restrict__ x,
                                           const typename Io<X>::Raw* __restrict__ dy,
                                           const float* __restrict__ mean, const float* __restrict__ invstd,
                                           float* __restrict__ part_dy, float* __restrict__ part_dy_xhat) {
  const long long c = blockIdx.x, k = blockIdx.y, m = outer * inner;
  const long long first = k * chunk, end = first + chunk < m ? first + chunk : m;
  const float mc = mean[c], ic = invstd[c];
  float sum_dy = 0.0f, sum_dy_xhat = 0.0f;
  ChannelWalk w(channels, inner, c, first + threadIdx.x);
  for (long long j = first + threadIdx.x; j < end; j += kThreads, w.next()) {
    const long long e = w.offset();
    const float d = IoHw<X>::load(dy[e]);
    sum_dy += d;
    sum_dy_xhat += d * norm_math::normalize(IoHw<X>::load(x[e]), mc, ic);
  }
  block_sum2(sum_dy, sum_dy_xhat);
  if (threadIdx.x == 0) {
    part_dy[k * channels + c] = sum_dy;
    part_dy_xhat[k * channels + c] = sum_dy_xhat;
  }
}

/// Kernel 1 of the backward for [N, C]: bn_stats_partial_rows_kernel's
/// blocks, each thread summing dy and dy·x̂ of its channel over its rows,
/// the 8 warps' sums added in warp order.
template <class X>
__global__ void bn_backward_partial_rows_kernel(long long outer, long long channels, long long chunk,
                                                const typename Io<X>::Raw* __restrict__ x,
                                                const typename Io<X>::Raw* __restrict__ dy,
                                                const float* __restrict__ mean,
                                                const float* __restrict__ invstd, float* __restrict__ part_dy,
                                                float* __restrict__ part_dy_xhat) {
  __shared__ float sa[kWarps][kWarp], sb[kWarps][kWarp];
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const long long c = static_cast<long long>(blockIdx.x) * kWarp + lane, k = blockIdx.y;
  const long long first = k * chunk, end = first + chunk < outer ? first + chunk : outer;
  float sum_dy = 0.0f, sum_dy_xhat = 0.0f;
  if (c < channels) {
    const float mc = mean[c], ic = invstd[c];
    for (long long n = first + warp; n < end; n += kWarps) {
      const float d = IoHw<X>::load(dy[n * channels + c]);
      sum_dy += d;
      sum_dy_xhat += d * norm_math::normalize(IoHw<X>::load(x[n * channels + c]), mc, ic);
    }
  }
  sa[warp][lane] = sum_dy;
  sb[warp][lane] = sum_dy_xhat;
  __syncthreads();
  if (warp != 0 || c >= channels) return;
  float a = 0.0f, b = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    a += sa[w][lane];
    b += sb[w][lane];
  }
  part_dy[k * channels + c] = a;
  part_dy_xhat[k * channels + c] = b;
}

/// Kernel 2 of the backward: one warp per channel adds its chunks' sums
/// (lane l: chunks l, l + 32, ... in order, then the warp's tree); lane 0
/// writes Σdy and Σdy·x̂ for kernel 3 and into dbias and dweight.
__global__ void bn_backward_combine_kernel(long long channels, long long chunks,
                                           const float* __restrict__ part_dy,
                                           const float* __restrict__ part_dy_xhat, float* __restrict__ sums,
                                           float* __restrict__ dweight, float* __restrict__ dbias) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const long long c =
      static_cast<long long>(blockIdx.x) * kWarps + static_cast<long long>(threadIdx.x) / kWarp;
  if (c >= channels) return;  // whole warps leave together
  float a = 0.0f, b = 0.0f;
  for (long long k = lane; k < chunks; k += kWarp) {
    a += part_dy[k * channels + c];
    b += part_dy_xhat[k * channels + c];
  }
  warp_sum2(a, b);
  if (lane != 0) return;
  sums[c] = a;
  sums[channels + c] = b;
  if (dbias != nullptr) dbias[c] = a;
  if (dweight != nullptr) dweight[c] = b;
}

/// Kernel 3 of the backward: dx of every element (bn_normalize_kernel's
/// walk), from the channel's Σdy and Σdy·x̂ (sums: [2, channels]) with
/// version 1's formula: Σg = γ·Σdy, Σg·x̂ = γ·Σdy·x̂.
template <class X, class P>
__global__ void bn_dx_kernel(long long n, long long channels, long long inner, float count,
                             const typename Io<X>::Raw* __restrict__ x,
                             const typename Io<X>::Raw* __restrict__ dy, const float* __restrict__ mean,
                             const float* __restrict__ invstd, const typename Io<P>::Raw* __restrict__ weight,
                             const float* __restrict__ sums, bool batch_statistics,
                             typename Io<X>::Raw* __restrict__ dx) {
  constexpr int V = kVec<X>;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads, vectors = n / V;
  auto one = [&](float xv, float dyv, const ElementChannel& ec) {
    const long long c = ec.c;
    const float g_c = weight != nullptr ? IoHw<P>::load(weight[c]) : 1.0f;
    const float g = g_c * dyv, ic = invstd[c];
    if (!batch_statistics) return norm_math::input_grad_fixed(g, ic);
    const float sum_g = g_c * sums[c], sum_g_xhat = g_c * sums[channels + c];
    return norm_math::input_grad_batch(ic, count, g, sum_g, norm_math::normalize(xv, mean[c], ic),
                                       sum_g_xhat);
  };
  for (long long v = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; v < vectors; v += stride) {
    float xv[V], dyv[V], dxv[V];
    load_vec<X, V>(x + v * V, xv);
    load_vec<X, V>(dy + v * V, dyv);
    ElementChannel ec(v * V, inner, channels);
    for (int k = 0; k < V; ++k, ec.next()) dxv[k] = one(xv[k], dyv[k], ec);
    store_vec<X, V>(dx + v * V, dxv);
  }
  const long long e = vectors * V + static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (e < n)
    dx[e] =
        IoHw<X>::store(one(IoHw<X>::load(x[e]), IoHw<X>::load(dy[e]), ElementChannel(e, inner, channels)));
}

// --- LayerNorm ----------------------------------------------------------------------

// Forward. x, y: (rows, cols) raw X; weight, bias: (cols,) raw P or nullptr;
// mean, rstd: (rows,) f32. Warp k of block b takes row b·kWarps + k: its
// lanes fold columns lane, lane + 32, ... with welford_add, warp_merge and
// warp_broadcast give every lane the row's statistics, lane 0 writes them,
// and the lanes write y. A whole warp leaves together when its row is past
// the end, so the full-mask shuffles always see 32 lanes.
template <class X, class P>
__global__ void layer_norm_forward_kernel(long long rows, long long cols,
                                          const typename Io<X>::Raw* __restrict__ x,
                                          const typename Io<P>::Raw* __restrict__ weight,
                                          const typename Io<P>::Raw* __restrict__ bias, float eps,
                                          typename Io<X>::Raw* __restrict__ y, float* __restrict__ mean_out,
                                          float* __restrict__ rstd_out) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const long long r =
      static_cast<long long>(blockIdx.x) * kWarps + static_cast<long long>(threadIdx.x) / kWarp;
  if (r >= rows) return;
  const typename Io<X>::Raw* xr = x + r * cols;
  Welford<float> s;
  for (long long i = lane; i < cols; i += kWarp) welford_add(s, Io<X>::load(xr[i]));
  s = warp_broadcast(warp_merge(s));
  const float mean = s.mean, rstd = norm_math::inverse_std(welford_variance_biased(s), eps);
  if (lane == 0) {
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
  typename Io<X>::Raw* yr = y + r * cols;
  for (long long i = lane; i < cols; i += kWarp) {
    const float g = weight != nullptr ? Io<P>::load(weight[i]) : 1.0f;
    const float b = bias != nullptr ? Io<P>::load(bias[i]) : 0.0f;
    yr[i] = Io<X>::store(norm_math::scale_shift(norm_math::normalize(Io<X>::load(xr[i]), mean, rstd), g, b));
  }
}

// Backward, dx. One warp per row as the forward: the lanes sum g = γ[i]·dy
// and g·x̂ over their columns, the warp's tree sums go to every lane, and
// the lanes write dx.
template <class X, class P>
__global__ void layer_norm_dx_kernel(long long rows, long long cols,
                                     const typename Io<X>::Raw* __restrict__ x,
                                     const typename Io<X>::Raw* __restrict__ dy,
                                     const float* __restrict__ mean, const float* __restrict__ rstd,
                                     const typename Io<P>::Raw* __restrict__ weight,
                                     typename Io<X>::Raw* __restrict__ dx) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const long long r =
      static_cast<long long>(blockIdx.x) * kWarps + static_cast<long long>(threadIdx.x) / kWarp;
  if (r >= rows) return;
  const long long row = r * cols;
  const float mr = mean[r], ir = rstd[r];
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (long long i = lane; i < cols; i += kWarp) {
    const float g = (weight != nullptr ? Io<P>::load(weight[i]) : 1.0f) * Io<X>::load(dy[row + i]);
    sum_g += g;
    sum_g_xhat += g * norm_math::normalize(Io<X>::load(x[row + i]), mr, ir);
  }
  warp_sum2(sum_g, sum_g_xhat);
  sum_g = __shfl_sync(kFullMask, sum_g, 0);
  sum_g_xhat = __shfl_sync(kFullMask, sum_g_xhat, 0);
  const float count = static_cast<float>(cols);
  for (long long i = lane; i < cols; i += kWarp) {
    const float g = (weight != nullptr ? Io<P>::load(weight[i]) : 1.0f) * Io<X>::load(dy[row + i]);
    const float xhat = norm_math::normalize(Io<X>::load(x[row + i]), mr, ir);
    dx[row + i] = Io<X>::store(norm_math::input_grad_batch(ir, count, g, sum_g, xhat, sum_g_xhat));
  }
}

// Forward and dx, version 2 (NormVersion::fast): the same warp per row, the
// same FP32 operations on each element, but each lane moves 16 bytes per
// access (8 codes or 4 floats: lane l takes vectors l, l + 32, ...) and
// converts with the GPU's instructions (IoHw); γ and β come in vectors too.
// Why faster: version 1 issues one 2-byte load per element and decodes and
// rounds each in software (a few dozen instructions each), so it is
// bound by instructions, not by memory; here one load instruction brings 8
// codes and one cvt converts each. Requires cols a multiple of the vector
// and 16-byte aligned arrays (γ and β: aligned to what one vector of them
// spans); the host runs version 1 otherwise. The order of the row's
// reductions changes (lanes take vectors, not single elements), so the
// statistics and sums are not version 1's bits; given them, every element is.
/// Forward, version 2: layer_norm_forward_kernel's two passes over the row, in vectors.
template <class X, class P>
__global__ void layer_norm_forward_vec_kernel(long long rows, long long cols,
                                              const typename Io<X>::Raw* __restrict__ x,
                                              const typename Io<P>::Raw* __restrict__ weight,
                                              const typename Io<P>::Raw* __restrict__ bias, float eps,
                                              typename Io<X>::Raw* __restrict__ y,
                                              float* __restrict__ mean_out, float* __restrict__ rstd_out) {
  constexpr int V = kVec<X>;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const long long r =
      static_cast<long long>(blockIdx.x) * kWarps + static_cast<long long>(threadIdx.x) / kWarp;
  if (r >= rows) return;  // whole warps leave together
  const long long vectors = cols / V;
  const typename Io<X>::Raw* xr = x + r * cols;
  Welford<float> s;
  for (long long v = lane; v < vectors; v += kWarp) {
    float xv[V];
    load_vec<X, V>(xr + v * V, xv);
    for (float a : xv) welford_add(s, a);
  }
  s = warp_broadcast(warp_merge(s));
  const float mean = s.mean, rstd = norm_math::inverse_std(welford_variance_biased(s), eps);
  if (lane == 0) {
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
  typename Io<X>::Raw* yr = y + r * cols;
  for (long long v = lane; v < vectors; v += kWarp) {
    float xv[V], g[V], b[V], out[V];
    load_vec<X, V>(xr + v * V, xv);
    load_params<P, V>(weight, v * V, 1.0f, g);
    load_params<P, V>(bias, v * V, 0.0f, b);
    for (int k = 0; k < V; ++k)
      out[k] = norm_math::scale_shift(norm_math::normalize(xv[k], mean, rstd), g[k], b[k]);
    store_vec<X, V>(yr + v * V, out);
  }
}

/// dx, version 2: layer_norm_dx_kernel's two passes over the row, in vectors.
template <class X, class P>
__global__ void layer_norm_dx_vec_kernel(long long rows, long long cols,
                                         const typename Io<X>::Raw* __restrict__ x,
                                         const typename Io<X>::Raw* __restrict__ dy,
                                         const float* __restrict__ mean, const float* __restrict__ rstd,
                                         const typename Io<P>::Raw* __restrict__ weight,
                                         typename Io<X>::Raw* __restrict__ dx) {
  constexpr int V = kVec<X>;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const long long r =
      static_cast<long long>(blockIdx.x) * kWarps + static_cast<long long>(threadIdx.x) / kWarp;
  if (r >= rows) return;  // whole warps leave together
  const long long row = r * cols, vectors = cols / V;
  const float mr = mean[r], ir = rstd[r];
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (long long v = lane; v < vectors; v += kWarp) {
    float xv[V], dyv[V], w[V];
    load_vec<X, V>(x + row + v * V, xv);
    load_vec<X, V>(dy + row + v * V, dyv);
    load_params<P, V>(weight, v * V, 1.0f, w);
    for (int k = 0; k < V; ++k) {
      const float g = w[k] * dyv[k];
      sum_g += g;
      sum_g_xhat += g * norm_math::normalize(xv[k], mr, ir);
    }
  }
  warp_sum2(sum_g, sum_g_xhat);
  sum_g = __shfl_sync(kFullMask, sum_g, 0);
  sum_g_xhat = __shfl_sync(kFullMask, sum_g_xhat, 0);
  const float count = static_cast<float>(cols);
  for (long long v = lane; v < vectors; v += kWarp) {
    float xv[V], dyv[V], w[V], out[V];
    load_vec<X, V>(x + row + v * V, xv);
    load_vec<X, V>(dy + row + v * V, dyv);
    load_params<P, V>(weight, v * V, 1.0f, w);
    for (int k = 0; k < V; ++k) {
      const float g = w[k] * dyv[k];
      out[k] =
          norm_math::input_grad_batch(ir, count, g, sum_g, norm_math::normalize(xv[k], mr, ir), sum_g_xhat);
    }
    store_vec<X, V>(dx + row + v * V, out);
  }
}

// Backward, dweight and dbias, version 1 (NormVersion::simple): thread i
// adds dy·x̂ and dy of column i over the rows in order, as the CPU's loop
// does: the same FP32 sums, bit for bit. Reads are coalesced (neighbouring
// threads, neighbouring columns). But there are only ⌈cols / 256⌉ blocks —
// 3 for GPT-2's 768 columns on a 132-SM GPU — each walking every row.
template <class X>
__global__ void layer_norm_dweight_kernel(long long rows, long long cols,
                                          const typename Io<X>::Raw* __restrict__ x,
                                          const typename Io<X>::Raw* __restrict__ dy,
                                          const float* __restrict__ mean, const float* __restrict__ rstd,
                                          float* __restrict__ dweight, float* __restrict__ dbias) {
  const long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= cols) return;
  float sum_w = 0.0f, sum_b = 0.0f;
  for (long long r = 0; r < rows; ++r) {
    const float d = Io<X>::load(dy[r * cols + i]);
    sum_w += d * norm_math::normalize(Io<X>::load(x[r * cols + i]), mean[r], rstd[r]);
    sum_b += d;
  }
  if (dweight != nullptr) dweight[i] = sum_w;
  if (dbias != nullptr) dbias[i] = sum_b;
}

// Backward, dweight and dbias, version 2 (NormVersion::fast): the rows are
// split into chunks of `chunk` rows (layer_norm_dweight_chunk_rows), the
// grid's second dimension; block (bx, k) adds rows k·chunk, ... of columns
// bx·256, ... in order into FP32 partial sums, as version 1 does for all
// rows, and writes them to partial_w[k][i], partial_b[k][i] (or, with one
// chunk, straight to dweight and dbias). Why faster: ⌈rows / chunk⌉ times
// the blocks (8192 rows of 768 columns: 384 instead of 3), so every SM
// reads (and the codes are widened by the hardware, IoHw: exact, so the
// same terms). Deterministic: the chunks depend on `rows` alone, and the
// combine kernel below adds the partials of a column in chunk order.
template <class X>
__global__ void layer_norm_dweight_partial_kernel(
    long long rows, long long cols, long long chunk, const typename Io<X>::Raw* __restrict__ x,
    const typename Io<X>::Raw* __restrict__ dy, const float* __restrict__ mean,
    const float* __restrict__ rstd, float* __restrict__ partial_w, float* __restrict__ partial_b) {
  const long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= cols) return;
  const long long k = blockIdx.y, first = k * chunk, end = first + chunk < rows ? first + chunk : rows;
  float sum_w = 0.0f, sum_b = 0.0f;
  for (long long r = first; r < end; ++r) {
    const float d = IoHw<X>::load(dy[r * cols + i]);
    sum_w += d * norm_math::normalize(IoHw<X>::load(x[r * cols + i]), mean[r], rstd[r]);
    sum_b += d;
  }
  if (partial_w != nullptr) partial_w[k * cols + i] = sum_w;
  if (partial_b != nullptr) partial_b[k * cols + i] = sum_b;
}

// The combine: thread i adds the `chunks` partial sums of column i in chunk
// order 0, 1, ... (starting from 0, as the CPU's sum does).
__global__ void layer_norm_dweight_combine_kernel(long long cols, long long chunks,
                                                  const float* __restrict__ partial_w,
                                                  const float* __restrict__ partial_b,
                                                  float* __restrict__ dweight, float* __restrict__ dbias) {
  const long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= cols) return;
  float sum_w = 0.0f, sum_b = 0.0f;
  for (long long k = 0; k < chunks; ++k) {
    if (partial_w != nullptr) sum_w += partial_w[k * cols + i];
    if (partial_b != nullptr) sum_b += partial_b[k * cols + i];
  }
  if (dweight != nullptr) dweight[i] = sum_w;
  if (dbias != nullptr) dbias[i] = sum_b;
}

// --- host-side checks ------------------------------------------------------------------

[[noreturn]] void bad(const char* where, const std::string& what) {
  throw std::invalid_argument(std::string("mpt::cuda::") + where + ": " + what);
}

void require(bool ok, const char* where, const std::string& what) {
  if (!ok) bad(where, what);
}

std::string sizes(long long a, long long b, long long c) {
  return "(" + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c) + ")";
}

// Sizes >= 0 whose product fits in 63 bits; returns the element count.
long long checked_numel(std::int64_t a, std::int64_t b, std::int64_t c, const char* where) {
  require(a >= 0 && b >= 0 && c >= 0, where,
          "sizes must be >= 0, got (outer, channels, inner) = " + sizes(a, b, c));
  if (a == 0 || b == 0 || c == 0) return 0;
  constexpr std::int64_t kMax = INT64_MAX;
  if (a > kMax / b || a * b > kMax / c)
    throw std::length_error(std::string("mpt::cuda::") + where + ": " + sizes(a, b, c) +
                            " has more elements than 64-bit offsets hold");
  return a * b * c;
}

void check_version(NormVersion v, const char* where) {
  require(v == NormVersion::simple || v == NormVersion::fast, where,
          "version must be NormVersion::simple or fast, got " + std::to_string(static_cast<int>(v)));
}

void check_eps(float eps, const char* where) {
  require(std::isfinite(eps) && eps >= 0.0f, where,
          "eps must be finite and >= 0, got " + std::to_string(eps));
}

// One block per channel: grid x holds 2^31 - 1 of them.
unsigned int channel_blocks(std::int64_t channels, const char* where) {
  if (channels > 0x7fffffffLL)
    throw std::length_error(std::string("mpt::cuda::") + where + ": " + std::to_string(channels) +
                            " channels need more blocks than a 1-D grid holds (2^31 - 1)");
  return static_cast<unsigned int>(channels);
}

// One warp per row, kWarps rows per block.
unsigned int row_blocks(std::int64_t rows, const char* where) {
  const std::int64_t blocks = rows / kWarps + (rows % kWarps != 0 ? 1 : 0);
  if (blocks > 0x7fffffffLL)
    throw std::length_error(std::string("mpt::cuda::") + where + ": " + std::to_string(rows) +
                            " rows need more blocks than a 1-D grid holds");
  return static_cast<unsigned int>(blocks);
}

// Scratch device memory for one call, in stream order: allocated from CUDA's
// memory pool on the default stream (cudaMallocAsync) and given back the
// same way when it goes out of scope, after the kernels queued before that
// have used it; the call stays asynchronous, and after the first call the
// pool serves it without a system allocation.
class Workspace {
 public:
  Workspace(std::size_t bytes, const char* where) {
    if (bytes > 0) detail::check(cudaMallocAsync(&p_, bytes, cudaStreamLegacy), where);
  }
  ~Workspace() {
    if (p_ != nullptr) cudaFreeAsync(p_, cudaStreamLegacy);  // nothing to report from a destructor
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  /// The memory as floats, from float `offset` on.
  float* floats(std::size_t offset = 0) const { return static_cast<float*>(p_) + offset; }
  /// The memory as T, from byte `offset` on (a multiple of alignof(T)).
  template <class T>
  T* at(std::size_t offset) const {
    return reinterpret_cast<T*>(static_cast<unsigned char*>(p_) + offset);
  }

 private:
  void* p_ = nullptr;
};

/// Blocks for an element-wise grid-stride kernel over `work` items of one
/// thread each (at least 1 block, at most 2^20: the threads then stride).
unsigned int elementwise_blocks(long long work) {
  const long long blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(blocks < 1 ? 1 : blocks > (1LL << 20) ? (1LL << 20) : blocks);
}

/// Whether a P array beside X activations can be read in vectors of kVec<X>:
/// nullptr, or aligned to the bytes such a vector spans (at most 16).
template <class X, class P>
bool params_vector_ok(const P* p) {
  const std::size_t span = static_cast<std::size_t>(kVec<X>) * sizeof(typename Io<P>::Raw);
  return p == nullptr || detail::aligned(p, span < 16 ? span : 16);
}

/// BatchNorm version 2's element-wise forward (kernel 3) over all n
/// elements (x and y 16-byte aligned).
template <class X, class P>
void launch_bn_normalize(long long n, long long channels, long long inner, const X* x, const float* mean,
                         const float* invstd, const P* weight, const P* bias, X* y, const char* where) {
  bn_normalize_kernel<X, P><<<elementwise_blocks(n / kVec<X>), kThreads>>>(
      n, channels, inner, raw(x), mean, invstd, raw(weight), raw(bias), raw(y));
  detail::check_launch(where);
}

/// The grid of BatchNorm version 2's kernel 1: (channels, chunks), or for
/// [N, C] (⌈channels / 32⌉, chunks).
dim3 bn_partial_grid(const BnSplit& sp, long long channels, const char* where) {
  const long long x = sp.rows ? (channels + kWarp - 1) / kWarp : channels;
  if (x > 0x7fffffffLL)
    throw std::length_error(std::string("mpt::cuda::") + where + ": " + std::to_string(channels) +
                            " channels need more blocks than a grid holds in x (2^31 - 1)");
  return dim3(static_cast<unsigned int>(x), static_cast<unsigned int>(sp.chunks));
}

/// Blocks of one warp per channel (kernel 2), 8 channels per block.
unsigned int channel_warp_blocks(long long channels) {
  return static_cast<unsigned int>((channels + kWarps - 1) / kWarps);
}

}  // namespace

// --- host API ----------------------------------------------------------------------------

namespace detail {

/// The definition of mpt::cuda::batch_norm_forward_train (see nn_kernels.hpp), for every
/// pair of storage types.
template <class X, class P>
void batch_norm_forward_train(std::int64_t outer, std::int64_t channels, std::int64_t inner, const X* d_x,
                              const P* d_weight, const P* d_bias, P* d_running_mean, P* d_running_var,
                              float momentum, float eps, X* d_y, float* d_mean, float* d_invstd,
                              NormVersion v) {
  const char* where = "batch_norm_forward_train";
  check_version(v, where);
  const long long n = checked_numel(outer, channels, inner, where);
  if (channels == 0) return;
  require(outer * inner >= 2, where,
          "expected more than 1 value per channel when training, got outer·inner = " +
              std::to_string(outer * inner) +
              " for (outer, channels, inner) = " + sizes(outer, channels, inner));
  require((d_running_mean == nullptr) == (d_running_var == nullptr), where,
          "running_mean and running_var must both be given or both be nullptr");
  require(momentum >= 0.0f && momentum <= 1.0f, where,
          "momentum must be in [0, 1], got " + std::to_string(momentum));
  check_eps(eps, where);
  require(d_x != nullptr && d_y != nullptr && d_mean != nullptr && d_invstd != nullptr, where,
          "x, y, mean and invstd must be device pointers, not nullptr");
  // The fast element-wise kernel moves 16 bytes at a time: x and y aligned.
  if (v == NormVersion::simple || !aligned(d_x, 16) || !aligned(d_y, 16)) {
    batch_norm_train_kernel<X, P><<<channel_blocks(channels, where), kThreads>>>(
        outer, channels, inner, raw(d_x), raw(d_weight), raw(d_bias), raw(d_running_mean), raw(d_running_var),
        momentum, eps, raw(d_y), d_mean, d_invstd);
    check_launch(where);
    return;
  }
  const BnSplit sp = bn_split(outer, inner);
  const dim3 grid = bn_partial_grid(sp, channels, where);
  const auto parts = static_cast<std::size_t>(sp.chunks) * static_cast<std::size_t>(channels);
  const Workspace ws(parts * (sizeof(long long) + 2 * sizeof(float)), where);
  long long* counts = ws.at<long long>(0);
  float* means = ws.at<float>(parts * sizeof(long long));
  float* m2s = means + parts;
  if (sp.rows)
    bn_stats_partial_rows_kernel<X>
        <<<grid, kThreads>>>(outer, channels, sp.chunk, raw(d_x), counts, means, m2s);
  else
    bn_stats_partial_kernel<X>
        <<<grid, kThreads>>>(outer, channels, inner, sp.chunk, raw(d_x), counts, means, m2s);
  check_launch(where);
  bn_stats_finalize_kernel<P><<<channel_warp_blocks(channels), kThreads>>>(
      channels, sp.chunks, counts, means, m2s, raw(d_running_mean), raw(d_running_var), momentum, eps, d_mean,
      d_invstd);
  check_launch(where);
  launch_bn_normalize(n, channels, inner, d_x, d_mean, d_invstd, d_weight, d_bias, d_y, where);
}

/// The definition of mpt::cuda::batch_norm_forward_eval (see nn_kernels.hpp), for every
/// pair of storage types.
template <class X, class P>
void batch_norm_forward_eval(std::int64_t outer, std::int64_t channels, std::int64_t inner, const X* d_x,
                             const P* d_weight, const P* d_bias, const P* d_running_mean,
                             const P* d_running_var, float eps, X* d_y, NormVersion v) {
  const char* where = "batch_norm_forward_eval";
  check_version(v, where);
  const long long n = checked_numel(outer, channels, inner, where);
  check_eps(eps, where);
  if (channels == 0) return;
  require(
      d_running_mean != nullptr && d_running_var != nullptr, where,
      "eval mode normalizes with the running estimates: running_mean and running_var must not be nullptr");
  if (n == 0) return;
  require(d_x != nullptr && d_y != nullptr, where, "x and y must be device pointers, not nullptr");
  if (v == NormVersion::simple || !aligned(d_x, 16) || !aligned(d_y, 16)) {
    batch_norm_eval_kernel<X, P><<<channel_blocks(channels, where), kThreads>>>(
        outer, channels, inner, raw(d_x), raw(d_weight), raw(d_bias), raw(d_running_mean), raw(d_running_var),
        eps, raw(d_y));
    check_launch(where);
    return;
  }
  const Workspace stats(2 * static_cast<std::size_t>(channels) * sizeof(float), where);
  float* mean = stats.floats();
  float* invstd = stats.floats(static_cast<std::size_t>(channels));
  bn_eval_stats_kernel<P><<<elementwise_blocks(channels), kThreads>>>(channels, raw(d_running_mean),
                                                                      raw(d_running_var), eps, mean, invstd);
  check_launch(where);
  launch_bn_normalize(n, channels, inner, d_x, mean, invstd, d_weight, d_bias, d_y, where);
}

/// The definition of mpt::cuda::batch_norm_backward (see nn_kernels.hpp), for every
/// pair of storage types.
template <class X, class P>
void batch_norm_backward(std::int64_t outer, std::int64_t channels, std::int64_t inner, const X* d_x,
                         const X* d_dy, const float* d_mean, const float* d_invstd, const P* d_weight,
                         bool batch_statistics, X* d_dx, float* d_dweight, float* d_dbias, NormVersion v) {
  const char* where = "batch_norm_backward";
  check_version(v, where);
  const long long n = checked_numel(outer, channels, inner, where);
  if (channels == 0) return;
  if (outer == 0 || inner == 0) {
    // Channels without values: their sums are 0, and there is no dx.
    const auto bytes = static_cast<std::size_t>(channels) * sizeof(float);
    if (d_dweight != nullptr) check(cudaMemsetAsync(d_dweight, 0, bytes), where);
    if (d_dbias != nullptr) check(cudaMemsetAsync(d_dbias, 0, bytes), where);
    return;
  }
  require(d_x != nullptr && d_dy != nullptr && d_mean != nullptr && d_invstd != nullptr, where,
          "x, dy, mean and invstd must be device pointers, not nullptr");
  if (v == NormVersion::simple ||
      (d_dx != nullptr && (!aligned(d_x, 16) || !aligned(d_dy, 16) || !aligned(d_dx, 16)))) {
    batch_norm_backward_kernel<X, P><<<channel_blocks(channels, where), kThreads>>>(
        outer, channels, inner, raw(d_x), raw(d_dy), d_mean, d_invstd, raw(d_weight), batch_statistics,
        raw(d_dx), d_dweight, d_dbias);
    check_launch(where);
    return;
  }
  const BnSplit sp = bn_split(outer, inner);
  const bool need_sums = d_dweight != nullptr || d_dbias != nullptr || (d_dx != nullptr && batch_statistics);
  const auto parts = static_cast<std::size_t>(sp.chunks) * static_cast<std::size_t>(channels);
  const auto c = static_cast<std::size_t>(channels);
  const Workspace ws(need_sums ? (2 * parts + 2 * c) * sizeof(float) : 0, where);
  float* part_dy = need_sums ? ws.floats() : nullptr;
  float* part_dy_xhat = need_sums ? ws.floats(parts) : nullptr;
  float* sums = need_sums ? ws.floats(2 * parts) : nullptr;  // Σdy [channels], then Σdy·x̂ [channels]
  if (need_sums) {
    const dim3 grid = bn_partial_grid(sp, channels, where);
    if (sp.rows)
      bn_backward_partial_rows_kernel<X><<<grid, kThreads>>>(outer, channels, sp.chunk, raw(d_x), raw(d_dy),
                                                             d_mean, d_invstd, part_dy, part_dy_xhat);
    else
      bn_backward_partial_kernel<X><<<grid, kThreads>>>(outer, channels, inner, sp.chunk, raw(d_x), raw(d_dy),
                                                        d_mean, d_invstd, part_dy, part_dy_xhat);
    check_launch(where);
    bn_backward_combine_kernel<<<channel_warp_blocks(channels), kThreads>>>(
        channels, sp.chunks, part_dy, part_dy_xhat, sums, d_dweight, d_dbias);
    check_launch(where);
  }
  if (d_dx == nullptr) return;
  const auto count = static_cast<float>(outer * inner);
  bn_dx_kernel<X, P><<<elementwise_blocks(n / kVec<X>), kThreads>>>(
      n, channels, inner, count, raw(d_x), raw(d_dy), d_mean, d_invstd, raw(d_weight), sums, batch_statistics,
      raw(d_dx));
  check_launch(where);
}

/// The definition of mpt::cuda::layer_norm_forward (see nn_kernels.hpp), for every
/// pair of storage types.
template <class X, class P>
void layer_norm_forward(std::int64_t rows, std::int64_t cols, const X* d_x, const P* d_weight,
                        const P* d_bias, float eps, X* d_y, float* d_mean, float* d_rstd, NormVersion v) {
  const char* where = "layer_norm_forward";
  check_version(v, where);
  require(rows >= 0 && cols >= 1, where,
          "rows must be >= 0 and cols >= 1, got rows = " + std::to_string(rows) +
              ", cols = " + std::to_string(cols));
  checked_numel(rows, cols, 1, where);
  check_eps(eps, where);
  if (rows == 0) return;
  require(d_x != nullptr && d_y != nullptr && d_mean != nullptr && d_rstd != nullptr, where,
          "x, y, mean and rstd must be device pointers, not nullptr");
  const bool vec = v == NormVersion::fast && cols % kVec<X> == 0 && aligned(d_x, 16) && aligned(d_y, 16) &&
                   params_vector_ok<X>(d_weight) && params_vector_ok<X>(d_bias);
  if (vec)
    layer_norm_forward_vec_kernel<X, P><<<row_blocks(rows, where), kThreads>>>(
        rows, cols, raw(d_x), raw(d_weight), raw(d_bias), eps, raw(d_y), d_mean, d_rstd);
  else
    layer_norm_forward_kernel<X, P><<<row_blocks(rows, where), kThreads>>>(
        rows, cols, raw(d_x), raw(d_weight), raw(d_bias), eps, raw(d_y), d_mean, d_rstd);
  check_launch(where);
}

/// The definition of mpt::cuda::layer_norm_backward (see nn_kernels.hpp), for every
/// pair of storage types.
template <class X, class P>
void layer_norm_backward(std::int64_t rows, std::int64_t cols, const X* d_x, const X* d_dy,
                         const float* d_mean, const float* d_rstd, const P* d_weight, X* d_dx,
                         float* d_dweight, float* d_dbias, NormVersion v) {
  const char* where = "layer_norm_backward";
  check_version(v, where);
  require(rows >= 0 && cols >= 1, where,
          "rows must be >= 0 and cols >= 1, got rows = " + std::to_string(rows) +
              ", cols = " + std::to_string(cols));
  checked_numel(rows, cols, 1, where);
  if (rows == 0 && d_dweight == nullptr && d_dbias == nullptr) return;
  require(rows == 0 || (d_x != nullptr && d_dy != nullptr && d_mean != nullptr && d_rstd != nullptr), where,
          "x, dy, mean and rstd must be device pointers, not nullptr");
  if (d_dx != nullptr && rows > 0) {
    const bool vec = v == NormVersion::fast && cols % kVec<X> == 0 && aligned(d_x, 16) && aligned(d_dy, 16) &&
                     aligned(d_dx, 16) && params_vector_ok<X>(d_weight);
    if (vec)
      layer_norm_dx_vec_kernel<X, P><<<row_blocks(rows, where), kThreads>>>(
          rows, cols, raw(d_x), raw(d_dy), d_mean, d_rstd, raw(d_weight), raw(d_dx));
    else
      layer_norm_dx_kernel<X, P><<<row_blocks(rows, where), kThreads>>>(
          rows, cols, raw(d_x), raw(d_dy), d_mean, d_rstd, raw(d_weight), raw(d_dx));
    check_launch(where);
  }
  if (d_dweight == nullptr && d_dbias == nullptr) return;
  const unsigned int col_blocks = blocks_for(static_cast<std::size_t>(cols), kThreads, where);
  const long long chunk = layer_norm_dweight_chunk_rows(rows);
  const long long chunks = rows / chunk + (rows % chunk != 0 ? 1 : 0);
  if (v == NormVersion::simple || chunks <= 1) {
    // One chunk is version 1's order: the simple kernel's sums, bit for bit.
    layer_norm_dweight_kernel<X>
        <<<col_blocks, kThreads>>>(rows, cols, raw(d_x), raw(d_dy), d_mean, d_rstd, d_dweight, d_dbias);
    check_launch(where);
    return;
  }
  const auto per_array = static_cast<std::size_t>(chunks) * static_cast<std::size_t>(cols);
  const Workspace partials(per_array * sizeof(float) * ((d_dweight != nullptr) + (d_dbias != nullptr)),
                           where);
  float* partial_w = d_dweight != nullptr ? partials.floats() : nullptr;
  float* partial_b = d_dbias != nullptr ? partials.floats(d_dweight != nullptr ? per_array : 0) : nullptr;
  layer_norm_dweight_partial_kernel<X><<<dim3(col_blocks, static_cast<unsigned int>(chunks)), kThreads>>>(
      rows, cols, chunk, raw(d_x), raw(d_dy), d_mean, d_rstd, partial_w, partial_b);
  check_launch(where);
  layer_norm_dweight_combine_kernel<<<col_blocks, kThreads>>>(cols, chunks, partial_w, partial_b, d_dweight,
                                                              d_dbias);
  check_launch(where);
}

// Every pair of storage types: X the activations', P the parameters'.
#define MPT_NORMS_INSTANTIATE(X, P)                                                                          \
  template void batch_norm_forward_train<X, P>(std::int64_t, std::int64_t, std::int64_t, const X*, const P*, \
                                               const P*, P*, P*, float, float, X*, float*, float*,           \
                                               NormVersion);                                                 \
  template void batch_norm_forward_eval<X, P>(std::int64_t, std::int64_t, std::int64_t, const X*, const P*,  \
                                              const P*, const P*, const P*, float, X*, NormVersion);         \
  template void batch_norm_backward<X, P>(std::int64_t, std::int64_t, std::int64_t, const X*, const X*,      \
                                          const float*, const float*, const P*, bool, X*, float*, float*,    \
                                          NormVersion);                                                      \
  template void layer_norm_forward<X, P>(std::int64_t, std::int64_t, const X*, const P*, const P*, float,    \
                                         X*, float*, float*, NormVersion);                                   \
  template void layer_norm_backward<X, P>(std::int64_t, std::int64_t, const X*, const X*, const float*,      \
                                          const float*, const P*, X*, float*, float*, NormVersion);
#define MPT_NORMS_INSTANTIATE_X(X)   \
  MPT_NORMS_INSTANTIATE(X, float)    \
  MPT_NORMS_INSTANTIATE(X, Fp16Code) \
  MPT_NORMS_INSTANTIATE(X, Bf16Code)
MPT_NORMS_INSTANTIATE_X(float)
MPT_NORMS_INSTANTIATE_X(Fp16Code)
MPT_NORMS_INSTANTIATE_X(Bf16Code)
#undef MPT_NORMS_INSTANTIATE_X
#undef MPT_NORMS_INSTANTIATE

}  // namespace detail

}  // namespace mpt::cuda
