// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the formulas.
// Depends on: welford.hpp (the statistics' type and merge), format_spec.hpp (MPT_HD).
//
// BatchNorm and LayerNorm are one computation seen through two layouts. An
// input is read as (outer, channels, inner) with element (n, c, i) at
// (n·channels + c)·inner + i, and the statistics of channel c are taken over
// every (n, i):
//
//   BatchNorm on [N, C], [N, C, L], [N, C, H, W]:  {N, C, 1}, {N, C, L}, {N, C, H·W}
//   LayerNorm on R rows of D normalized elements:   {1, R, D}
//
// The only difference left is which index the affine weight and bias use:
// the channel (BatchNorm's γ[c]) or the inner position (LayerNorm's γ[i]).
//
// Forward: the mean and the biased variance of each channel (statistics()
// below: two passes with double sums on the CPU, Welford's update in FP32
// on the GPU), then x̂ = (x − mean)·invstd with invstd = 1/√(var + eps) (eps
// inside the square root, as torch.nn.BatchNorm and torch.nn.LayerNorm),
// y = x̂·γ + β, all in FP32.
//
// The sums of one channel follow a fixed order, the one the vectorized CPU
// path takes: value i of each (n, c) run goes to lane i mod 16, the runs in
// the order of n, and the 16 lanes are added in a fixed tree at the end. In
// exact arithmetic every order gives the same sums; in floating point the
// order is part of the result, so it is written once, here, for the layers,
// their AVX2 path and the double-precision tests alike.
//
// Backward with batch statistics, M values per channel and g = γ·dy:
//
//   dx = invstd/M · (M·g − Σg − x̂·Σ(g·x̂)),   dγ = Σ dy·x̂,   dβ = Σ dy,
//
// the sums over the channel's M values for dx, over everything that shares
// one γ for dγ and dβ. With fixed statistics (BatchNorm in eval mode) mean
// and invstd do not depend on x and dx = g·invstd.
//
// Templated on the scalar: the layers run it in float, the tests in double
// (against central finite differences). The per-element pieces are small
// host-and-device functions so that a CUDA kernel reuses exactly these.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "mpt/formats/format_spec.hpp"
#include "mpt/nn/layers/welford.hpp"

namespace mpt {

/// The formulas of BatchNorm and LayerNorm, forward and backward, templated on
/// the scalar (float in the layers, double in the tests) over one
/// (outer, channels, inner) layout; the per-element pieces are host-and-device.
namespace norm_math {

/// How a norm reads its input: element (n, c, i) at (n·channels + c)·inner + i;
/// statistics per channel c over all (n, i).
struct Layout {
  std::int64_t outer = 1;     ///< N for BatchNorm, 1 for LayerNorm
  std::int64_t channels = 1;  ///< C for BatchNorm, the rows for LayerNorm
  std::int64_t inner = 1;     ///< L or H·W for BatchNorm (1 for [N, C]), D for LayerNorm
  /// Values per channel, M = outer·inner.
  MPT_HD constexpr std::int64_t count() const { return outer * inner; }
  /// Elements of the whole input.
  MPT_HD constexpr std::int64_t numel() const { return outer * channels * inner; }
  /// Offset of element (n, c, i).
  MPT_HD constexpr std::int64_t offset(std::int64_t n, std::int64_t c, std::int64_t i) const {
    return (n * channels + c) * inner + i;
  }
};

/// Which index the affine weight and bias are read with.
enum class AffineAxis : std::uint8_t {
  channel,  ///< γ[c], β[c]: BatchNorm, one pair per channel
  inner,    ///< γ[i], β[i]: LayerNorm, one pair per normalized element
};

/// Elements of the weight for `axis` (channels or inner).
MPT_HD constexpr std::int64_t affine_size(const Layout& l, AffineAxis axis) {
  return axis == AffineAxis::channel ? l.channels : l.inner;
}

// --- per element (host and device) ---------------------------------------------

/// 1/√(var + eps): eps inside the square root, as PyTorch's norms.
template <class T>
MPT_HD inline T inverse_std(T var, T eps) {
  using std::sqrt;
  return T(1) / sqrt(var + eps);
}

/// x̂ = (x − mean)·invstd.
template <class T>
MPT_HD inline T normalize(T x, T mean, T invstd) {
  return (x - mean) * invstd;
}

/// y = x̂·γ + β.
template <class T>
MPT_HD inline T scale_shift(T xhat, T weight, T bias) {
  return xhat * weight + bias;
}

/// The running estimate after one batch: (1 − m)·running + m·batch
/// (torch.nn.BatchNorm's momentum convention: m weighs the new value).
template <class T>
MPT_HD inline T running_update(T running, T batch, T momentum) {
  return (T(1) - momentum) * running + momentum * batch;
}

/// dx of one value normalized with batch statistics: invstd/M·(M·g − Σg −
/// x̂·Σ(g·x̂)), g = γ·dy of this value, the sums over its channel's M values.
template <class T>
MPT_HD inline T input_grad_batch(T invstd, T count, T g, T sum_g, T xhat, T sum_g_xhat) {
  return invstd / count * (count * g - sum_g - xhat * sum_g_xhat);
}

/// dx of one value normalized with fixed statistics (BatchNorm in eval
/// mode): g·invstd, g = γ·dy.
template <class T>
MPT_HD inline T input_grad_fixed(T g, T invstd) {
  return g * invstd;
}

// --- whole tensors (host) ----------------------------------------------------------

/// The statistics of a channel as the CPU layers take them: the count, and
/// the mean and M2 = Σ(x − mean)² in double. Chan's merge (welford_merge)
/// combines two, as SyncBatchNorm combines the ranks'.
using Statistics = Welford<double>;

/// Lanes of the statistics' sums: value i of a run goes to lane i mod 16,
/// the four 4-double vectors an AVX2 loop keeps.
inline constexpr int kSumLanes = 16;

/// Adds value i of x[0..n) (widened to double) into lanes[i mod kSumLanes],
/// one after the other: the first pass of statistics().
template <class T>
void add_run_sums(const T* x, std::int64_t n, double* lanes) {
  for (std::int64_t i = 0; i < n; ++i) lanes[i % kSumLanes] += static_cast<double>(x[i]);
}

/// Adds (x[i] − mean)², in double, into lanes[i mod kSumLanes]: the second
/// pass of statistics().
template <class T>
void add_run_squares(const T* x, std::int64_t n, double mean, double* lanes) {
  for (std::int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - mean;
    lanes[i % kSumLanes] += d * d;
  }
}

/// The lanes added in a fixed tree: neighbours first, (0+1)+(2+3), …, up to
/// the one total.
inline double lanes_total(const double* lanes) {
  double q[kSumLanes / 4];
  for (std::ptrdiff_t k = 0; k < kSumLanes / 4; ++k)
    q[k] = (lanes[4 * k] + lanes[4 * k + 1]) + (lanes[4 * k + 2] + lanes[4 * k + 3]);
  return (q[0] + q[1]) + (q[2] + q[3]);
}

/// The statistics of every channel, in two passes with double sums: the mean
/// Σx/M, then M2 = Σ(x − mean)² from that mean (both sums over the
/// channel's runs in the order of n, each run's values in kSumLanes lanes).
/// PyTorch's CPU BatchNorm takes the same two passes with sums in double
/// (aten/src/ATen/native/cpu/batch_norm_kernel.cpp,
/// batch_norm_cpu_collect_stats_contiguous_impl); it forms x − mean and its
/// square in float, this in double. The terms of M2 are never negative, so
/// their sum is off by at most about M double roundings of itself, and the
/// mean's own error enters M2 only squared: for a channel of fewer than 2^23
/// values that is below M·2^-53 < 2^-30 relative, far below FP32's 2^-24, so the
/// mean and the variances rounded once into FP32 (mean_invstd,
/// variance_biased, variance_unbiased) carry little more than that one
/// rounding. Welford's update
/// (welford.hpp) in FP32, one value at a time, is what the GPU kernels run;
/// its error grows with mean/std (Chapter 3's accuracy table). stats has
/// l.channels entries.
template <class T>
void statistics(const T* x, const Layout& l, Statistics* stats) {
  for (std::int64_t c = 0; c < l.channels; ++c) {
    double lanes[kSumLanes] = {};
    for (std::int64_t n = 0; n < l.outer; ++n) add_run_sums(x + l.offset(n, c, 0), l.inner, lanes);
    Statistics s;
    s.count = l.count();
    s.mean = s.count > 0 ? lanes_total(lanes) / static_cast<double>(s.count) : 0.0;
    double squares[kSumLanes] = {};
    for (std::int64_t n = 0; n < l.outer; ++n)
      add_run_squares(x + l.offset(n, c, 0), l.inner, s.mean, squares);
    s.m2 = lanes_total(squares);
    stats[c] = s;
  }
}

/// The biased variance M2/M rounded once into T (what normalization
/// divides by); 0 for an empty set.
template <class T, class S>
T variance_biased(const Welford<S>& s) {
  return static_cast<T>(welford_variance_biased(s));
}

/// The unbiased variance M2/(M − 1) rounded once into T (what BatchNorm
/// folds into its running variance).
template <class T, class S>
T variance_unbiased(const Welford<S>& s) {
  return static_cast<T>(welford_variance_unbiased(s));
}

/// mean[c] and invstd[c] = 1/√(biased var + eps) from the statistics,
/// computed in the statistics' own scalar S (double for the CPU layers'
/// Statistics, as PyTorch's CPU BatchNorm computes its invstd in double;
/// float for the GPU's Welford states) and rounded once into T.
template <class T, class S>
void mean_invstd(const Welford<S>* stats, std::int64_t channels, T eps, T* mean, T* invstd) {
  for (std::int64_t c = 0; c < channels; ++c) {
    mean[c] = static_cast<T>(stats[c].mean);
    invstd[c] = static_cast<T>(inverse_std(welford_variance_biased(stats[c]), static_cast<S>(eps)));
  }
}

/// y = x̂·γ + β for every element, with the per-channel mean and invstd;
/// weight and bias have affine_size(l, axis) entries, or are nullptr (γ = 1,
/// β = 0: no affine).
template <class T>
void forward(const T* x, const Layout& l, const T* mean, const T* invstd, const T* weight, const T* bias,
             AffineAxis axis, T* y) {
  for (std::int64_t n = 0; n < l.outer; ++n)
    for (std::int64_t c = 0; c < l.channels; ++c)
      for (std::int64_t i = 0; i < l.inner; ++i) {
        const std::int64_t e = l.offset(n, c, i), a = axis == AffineAxis::channel ? c : i;
        const T xhat = normalize(x[e], mean[c], invstd[c]);
        y[e] = scale_shift(xhat, weight ? weight[a] : T(1), bias ? bias[a] : T(0));
      }
}

/// The backward of forward(). x, mean and invstd are the forward's (x̂ is
/// recomputed from them, the same operations, so the same values);
/// `batch_statistics` says whether mean and invstd came from x itself
/// (training) or were fixed (eval: running estimates). Writes dx (numel;
/// skipped when nullptr) and dweight, dbias (affine_size entries; skipped
/// when nullptr). weight nullptr means γ = 1.
template <class T>
void backward(const T* x, const T* dy, const Layout& l, const T* mean, const T* invstd, const T* weight,
              AffineAxis axis, bool batch_statistics, T* dx, T* dweight, T* dbias) {
  const std::int64_t na = affine_size(l, axis);
  if (dweight)
    for (std::int64_t a = 0; a < na; ++a) dweight[a] = T(0);
  if (dbias)
    for (std::int64_t a = 0; a < na; ++a) dbias[a] = T(0);
  const T count = static_cast<T>(l.count());
  for (std::int64_t c = 0; c < l.channels; ++c) {
    // First pass: Σg and Σg·x̂ over the channel (for dx), Σdy·x̂ and Σdy
    // into the weight's gradient.
    T sum_g = T(0), sum_g_xhat = T(0);
    for (std::int64_t n = 0; n < l.outer; ++n)
      for (std::int64_t i = 0; i < l.inner; ++i) {
        const std::int64_t e = l.offset(n, c, i), a = axis == AffineAxis::channel ? c : i;
        const T xhat = normalize(x[e], mean[c], invstd[c]);
        const T g = weight ? weight[a] * dy[e] : dy[e];
        sum_g += g;
        sum_g_xhat += g * xhat;
        if (dweight) dweight[a] += dy[e] * xhat;
        if (dbias) dbias[a] += dy[e];
      }
    if (!dx) continue;
    // Second pass: dx of every value of the channel.
    for (std::int64_t n = 0; n < l.outer; ++n)
      for (std::int64_t i = 0; i < l.inner; ++i) {
        const std::int64_t e = l.offset(n, c, i), a = axis == AffineAxis::channel ? c : i;
        const T g = weight ? weight[a] * dy[e] : dy[e];
        dx[e] = batch_statistics ? input_grad_batch(invstd[c], count, g, sum_g,
                                                    normalize(x[e], mean[c], invstd[c]), sum_g_xhat)
                                 : input_grad_fixed(g, invstd[c]);
      }
  }
}

}  // namespace norm_math

}  // namespace mpt
