// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the formulas.
// Depends on: welford.hpp (the statistics), format_spec.hpp (MPT_HD).
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
// Forward: mean and biased variance by Welford (welford.hpp), then
// x̂ = (x − mean)·invstd with invstd = 1/√(var + eps) (eps inside the square
// root, as torch.nn.BatchNorm and torch.nn.LayerNorm), y = x̂·γ + β.
//
// The statistics of one (n, c) run of `inner` values follow a fixed order,
// the one the vectorized CPU path takes (run_statistics): 8 lanes, value i
// of each block of 64 going to lane i mod 8; a lane's 8 values of a block
// combined by a fixed tree of Welford updates and Chan merges whose
// divisions are all by constants (a compiler folds them: no division per
// value); each block merged into its lane (one division per 64 values); the
// lanes merged pairwise; the last (inner mod 64) values added one at a
// time. A run shorter than 64 is Welford's update, one value after the
// other. In exact arithmetic every order gives the same mean and M2; in
// floating point the order is part of the result, so it is written once,
// here, for the layers, their AVX2 path and the double-precision tests
// alike. Welford's update on every value costs a division each, the slowest
// operation of a CPU core's vector units, which then sets the speed of the
// statistics; the tree leaves one division per 64 values. (PyTorch's CPU
// kernels, too, take a row in SIMD lanes and merge partial Welford results:
// aten/src/ATen/native/cpu/moments_utils.h.)
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
#include <cstdint>

#include "mpt/formats/format_spec.hpp"
#include "mpt/nn/welford.hpp"

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

/// Lanes of run_statistics: the 8 floats of an AVX2 register.
inline constexpr int kRunLanes = 8;
/// Values one lane takes from each block of run_statistics.
inline constexpr int kLaneBlock = 8;
/// Values of one block: kRunLanes · kLaneBlock = 64.
inline constexpr std::int64_t kRunBlock = std::int64_t{kRunLanes} * kLaneBlock;

/// The statistics of the 8 values value(0), …, value(7), in a fixed tree:
/// Welford's update on the pairs (0, 1), (2, 3), (4, 5), (6, 7), then Chan's
/// merge of the pairs and of the two quads. Every division is by a constant
/// (δ/1 and δ/2 in the updates, the merge factors 2/4 and 4/8), and exact.
/// T may be a SIMD type holding one value per lane (the AVX2 path runs this
/// very function on 8 lanes at once).
template <class T, class Value>
inline Welford<T> lane_block_statistics(const Value& value) {
  Welford<T> p0, p1, p2, p3;
  welford_add(p0, value(0));
  welford_add(p0, value(1));
  welford_add(p1, value(2));
  welford_add(p1, value(3));
  welford_add(p2, value(4));
  welford_add(p2, value(5));
  welford_add(p3, value(6));
  welford_add(p3, value(7));
  return welford_merge(welford_merge(p0, p1), welford_merge(p2, p3));
}

/// The lanes' part of run_statistics over the first `blocks` blocks of x:
/// lane k takes x[64·b + 8·t + k], t = 0..7, of every block b, as one
/// lane_block_statistics merged into lanes[k] after the blocks before it.
/// lanes has kRunLanes entries and is added to.
template <class T>
void run_lane_statistics(const T* x, std::int64_t blocks, Welford<T>* lanes) {
  for (std::int64_t b = 0; b < blocks; ++b)
    for (int k = 0; k < kRunLanes; ++k) {
      const T* p = x + b * kRunBlock + k;
      lanes[k] =
          welford_merge(lanes[k], lane_block_statistics<T>([p](std::int64_t t) { return p[t * kRunLanes]; }));
    }
}

/// The rest of run_statistics once the lanes hold a run's full blocks: the
/// lanes merged pairwise, ((0 1)(2 3))((4 5)(6 7)), then the `count` values
/// after the blocks, rest[0..count), added one at a time.
template <class T>
Welford<T> run_statistics_finish(const Welford<T>* lanes, const T* rest, std::int64_t count) {
  Welford<T> s =
      welford_merge(welford_merge(welford_merge(lanes[0], lanes[1]), welford_merge(lanes[2], lanes[3])),
                    welford_merge(welford_merge(lanes[4], lanes[5]), welford_merge(lanes[6], lanes[7])));
  for (std::int64_t i = 0; i < count; ++i) welford_add(s, rest[i]);
  return s;
}

/// The Welford statistics of one run x[0..n), in the order described at the
/// top of this file: its full blocks of 64 in 8 lanes
/// (run_lane_statistics), then run_statistics_finish.
template <class T>
Welford<T> run_statistics(const T* x, std::int64_t n) {
  Welford<T> lanes[kRunLanes];
  const std::int64_t blocks = n / kRunBlock;
  run_lane_statistics(x, blocks, lanes);
  return run_statistics_finish(lanes, x + blocks * kRunBlock, n - blocks * kRunBlock);
}

/// The Welford statistics of every channel: each (n, c) run of `inner`
/// values by run_statistics, the runs merged over n in order (Chan et al.),
/// the shape of a parallel reduction. stats has l.channels entries.
template <class T>
void statistics(const T* x, const Layout& l, Welford<T>* stats) {
  for (std::int64_t c = 0; c < l.channels; ++c) {
    Welford<T> total;
    for (std::int64_t n = 0; n < l.outer; ++n)
      total = welford_merge(total, run_statistics(x + l.offset(n, c, 0), l.inner));
    stats[c] = total;
  }
}

/// mean[c] and invstd[c] = 1/√(biased var + eps) from the statistics.
template <class T>
void mean_invstd(const Welford<T>* stats, std::int64_t channels, T eps, T* mean, T* invstd) {
  for (std::int64_t c = 0; c < channels; ++c) {
    mean[c] = stats[c].mean;
    invstd[c] = inverse_std(welford_variance_biased(stats[c]), eps);
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
