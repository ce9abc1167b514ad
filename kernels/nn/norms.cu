// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the CUDA
// kernels, forward and backward, FP16, BF16 or FP32 in and out.
// Depends on: mpt/nn/welford.hpp (Welford's update and Chan's merge, the CPU
// layers' own functions), mpt/nn/norm_math.hpp (the per-element formulas),
// mpt/formats/round_element.hpp (decode, and the rounding of every stored
// result), mpt/formats/codes.hpp (Fp16Code, Bf16Code), kernels/nn/nn_kernels.hpp
// (the host API), cuda_check.cuh.
//
// The simplest correct versions first, llm.c style (NormVersion::simple):
// one thread block per BatchNorm channel, one warp per LayerNorm row, one
// thread per LayerNorm column for the weight's gradient; the faster ones
// (NormVersion::fast) after them, each with its reason. No arithmetic of
// their own: the statistics are
// welford_add per thread, then welford_merge across the warp (shuffles) and
// across the block (shared memory); everything element-wise is
// norm_math.hpp's MPT_HD functions. The file is compiled with -fmad=false
// (kernels/CMakeLists.txt) so that x̂·γ + β and the terms of dx stay two
// roundings, as on the CPU, instead of one FMA: given the same statistics
// the kernels' outputs are the CPU layer's bits, which the GPU test checks.
//
// Why one block per channel for BatchNorm: the whole reduction of a channel
// then lives in one block, so the statistics, the running update and the
// normalization are one launch with no scratch memory and no second pass
// over partial results, and the reduction order is fixed (the same bits on
// every run). The price is parallelism: C blocks, so a layer with fewer
// channels than the GPU has SMs (C = 64 on a 132-SM H200) leaves part of
// the GPU idle and each channel's M values are read by only 256 threads. A
// faster version would split each channel over several blocks (partial
// Welford statistics in a workspace, merged by a second kernel); the
// benchmark (tests/bench/bench_ch03_norms_cuda.cpp) measures how far this one
// is from a device-to-device copy.
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
#include "mpt/nn/norm_math.hpp"
#include "mpt/nn/welford.hpp"

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
// reads. Deterministic: the chunks depend on `rows` alone, and the combine
// kernel below adds the partials of a column in chunk order.
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
    const float d = Io<X>::load(dy[r * cols + i]);
    sum_w += d * norm_math::normalize(Io<X>::load(x[r * cols + i]), mean[r], rstd[r]);
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

 private:
  void* p_ = nullptr;
};

}  // namespace

// --- host API ----------------------------------------------------------------------------

namespace detail {

/// The definition of mpt::cuda::batch_norm_forward_train (see nn_kernels.hpp), for every
/// pair of storage types.
template <class X, class P>
void batch_norm_forward_train(std::int64_t outer, std::int64_t channels, std::int64_t inner, const X* d_x,
                              const P* d_weight, const P* d_bias, P* d_running_mean, P* d_running_var,
                              float momentum, float eps, X* d_y, float* d_mean, float* d_invstd) {
  const char* where = "batch_norm_forward_train";
  checked_numel(outer, channels, inner, where);
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
  batch_norm_train_kernel<X, P><<<channel_blocks(channels, where), kThreads>>>(
      outer, channels, inner, raw(d_x), raw(d_weight), raw(d_bias), raw(d_running_mean), raw(d_running_var),
      momentum, eps, raw(d_y), d_mean, d_invstd);
  check_launch(where);
}

/// The definition of mpt::cuda::batch_norm_forward_eval (see nn_kernels.hpp), for every
/// pair of storage types.
template <class X, class P>
void batch_norm_forward_eval(std::int64_t outer, std::int64_t channels, std::int64_t inner, const X* d_x,
                             const P* d_weight, const P* d_bias, const P* d_running_mean,
                             const P* d_running_var, float eps, X* d_y) {
  const char* where = "batch_norm_forward_eval";
  const long long n = checked_numel(outer, channels, inner, where);
  check_eps(eps, where);
  if (channels == 0) return;
  require(
      d_running_mean != nullptr && d_running_var != nullptr, where,
      "eval mode normalizes with the running estimates: running_mean and running_var must not be nullptr");
  if (n == 0) return;
  require(d_x != nullptr && d_y != nullptr, where, "x and y must be device pointers, not nullptr");
  batch_norm_eval_kernel<X, P><<<channel_blocks(channels, where), kThreads>>>(
      outer, channels, inner, raw(d_x), raw(d_weight), raw(d_bias), raw(d_running_mean), raw(d_running_var),
      eps, raw(d_y));
  check_launch(where);
}

/// The definition of mpt::cuda::batch_norm_backward (see nn_kernels.hpp), for every
/// pair of storage types.
template <class X, class P>
void batch_norm_backward(std::int64_t outer, std::int64_t channels, std::int64_t inner, const X* d_x,
                         const X* d_dy, const float* d_mean, const float* d_invstd, const P* d_weight,
                         bool batch_statistics, X* d_dx, float* d_dweight, float* d_dbias) {
  const char* where = "batch_norm_backward";
  checked_numel(outer, channels, inner, where);
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
  batch_norm_backward_kernel<X, P><<<channel_blocks(channels, where), kThreads>>>(
      outer, channels, inner, raw(d_x), raw(d_dy), d_mean, d_invstd, raw(d_weight), batch_statistics,
      raw(d_dx), d_dweight, d_dbias);
  check_launch(where);
}

/// The definition of mpt::cuda::layer_norm_forward (see nn_kernels.hpp), for every
/// pair of storage types.
template <class X, class P>
void layer_norm_forward(std::int64_t rows, std::int64_t cols, const X* d_x, const P* d_weight,
                        const P* d_bias, float eps, X* d_y, float* d_mean, float* d_rstd) {
  const char* where = "layer_norm_forward";
  require(rows >= 0 && cols >= 1, where,
          "rows must be >= 0 and cols >= 1, got rows = " + std::to_string(rows) +
              ", cols = " + std::to_string(cols));
  checked_numel(rows, cols, 1, where);
  check_eps(eps, where);
  if (rows == 0) return;
  require(d_x != nullptr && d_y != nullptr && d_mean != nullptr && d_rstd != nullptr, where,
          "x, y, mean and rstd must be device pointers, not nullptr");
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
    layer_norm_dx_kernel<X, P><<<row_blocks(rows, where), kThreads>>>(rows, cols, raw(d_x), raw(d_dy), d_mean,
                                                                      d_rstd, raw(d_weight), raw(d_dx));
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
                                               const P*, P*, P*, float, float, X*, float*, float*);          \
  template void batch_norm_forward_eval<X, P>(std::int64_t, std::int64_t, std::int64_t, const X*, const P*,  \
                                              const P*, const P*, const P*, float, X*);                      \
  template void batch_norm_backward<X, P>(std::int64_t, std::int64_t, std::int64_t, const X*, const X*,      \
                                          const float*, const float*, const P*, bool, X*, float*, float*);   \
  template void layer_norm_forward<X, P>(std::int64_t, std::int64_t, const X*, const P*, const P*, float,    \
                                         X*, float*, float*);                                                \
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
