// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the CPU forward
// both layers run, one channel at a time.
// Depends on: norm_cpu.hpp, norm_math.hpp; cpu_dispatch.hpp
// (the AVX2-or-portable choice); Chapter 2's tensor conversions (load_from,
// store_as: the rounding every Tensor write goes through).
#include "mpt/nn/cpu/norm_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/formats/cpu_dispatch.hpp"
#include "mpt/nn/layers/norm_math.hpp"

namespace mpt::norm_cpu {
namespace {

using norm_math::AffineAxis;
using norm_math::Layout;

bool use_avx2(Implementation impl) {
  return detail::use_avx2(impl,
                          "norm_cpu: the AVX2 norm path is not available on this CPU/build; use "
                          "Implementation::portable or automatic");
}

// The two passes' sums over one run of n values at x (f32, or fp16 codes
// when `f16`), added into lanes (norm_math::kSumLanes doubles) in
// add_run_sums' and add_run_squares' order: the full groups of 16 by the
// AVX2 loop when `avx2`, everything else by the portable loop (fp16 codes
// widened first).
template <class Avx2, class Portable>
void add_run(const void* x, bool f16, std::int64_t n, bool avx2, Avx2 avx2_loop, Portable portable_loop) {
  std::int64_t done = 0;
#if defined(MPT_HAVE_AVX2_PATH)
  if (avx2)
    done =
        f16 ? avx2_loop(static_cast<const std::uint16_t*>(x), n) : avx2_loop(static_cast<const float*>(x), n);
#else
  (void)avx2;
  (void)avx2_loop;
#endif
  if (done == n) return;
  if (!f16) {
    portable_loop(static_cast<const float*>(x) + done, n - done, done);
    return;
  }
  float rest[norm_math::kSumLanes];
  for (std::int64_t i = done; i < n; i += norm_math::kSumLanes) {
    const std::int64_t m = std::min<std::int64_t>(norm_math::kSumLanes, n - i);
    load_from(DType::f16, static_cast<const std::uint16_t*>(x) + i, rest, static_cast<std::size_t>(m));
    portable_loop(rest, m, i);
  }
}

// Σx of one run into lanes (value i of the run into lane i mod 16).
void add_sums(const void* x, bool f16, std::int64_t n, bool avx2, double* lanes) {
  add_run(
      x, f16, n, avx2,
      [lanes](const auto* p, std::int64_t m) { return detail::add_run_sums_avx2(p, m, lanes); },
      [lanes](const float* p, std::int64_t m, std::int64_t first) {
        // first is a multiple of 16 (the AVX2 loop and the fp16 chunks take
        // whole groups), so value first + i still goes to lane i mod 16.
        (void)first;
        norm_math::add_run_sums(p, m, lanes);
      });
}

// Σ(x − mean)² of one run into lanes.
void add_squares(const void* x, bool f16, std::int64_t n, bool avx2, double mean, double* lanes) {
  add_run(
      x, f16, n, avx2,
      [lanes, mean](const auto* p, std::int64_t m) {
        return detail::add_run_squares_avx2(p, m, mean, lanes);
      },
      [lanes, mean](const float* p, std::int64_t m, std::int64_t first) {
        (void)first;
        norm_math::add_run_squares(p, m, mean, lanes);
      });
}

// y[i] = x̂·γ + β for i in [0, n), the values at position first + i of their
// run: norm_math::forward's operations on each element.
void normalize_portable(const float* x, float* y, std::int64_t n, const detail::NormalizeRun& r,
                        std::int64_t first) {
  for (std::int64_t i = 0; i < n; ++i)
    y[i] = norm_math::scale_shift(norm_math::normalize(x[i], r.mean, r.invstd),
                                  r.weight ? r.weight[first + i] : r.weight_all,
                                  r.bias ? r.bias[first + i] : r.bias_all);
}

// One run of n values of y from x (f32, or fp16 codes when x_f16), written
// to dst in `out` (f32 values, or fp16 codes) when dst is not null, else to
// the FP32 buffer ys for the caller to round. The AVX2 loop takes the full
// groups of 8 and the portable loop the rest.
void normalize_into(const void* x, bool x_f16, std::int64_t n, const detail::NormalizeRun& r, bool avx2,
                    DType out, void* dst, float* ys) {
  float* y = dst == nullptr ? ys : out == DType::f32 ? static_cast<float*>(dst) : nullptr;
  auto* y16 = dst != nullptr && out == DType::f16 ? static_cast<std::uint16_t*>(dst) : nullptr;
  const auto* x16 = x_f16 ? static_cast<const std::uint16_t*>(x) : nullptr;
  const auto* xf = x_f16 ? nullptr : static_cast<const float*>(x);
  std::int64_t done = 0;
#if defined(MPT_HAVE_AVX2_PATH)
  if (avx2) {
    if (x16 && y16) done = detail::normalize_run_avx2(x16, y16, n, r);
    else if (x16) done = detail::normalize_run_avx2(x16, y, n, r);
    else if (y16) done = detail::normalize_run_avx2(xf, y16, n, r);
    else done = detail::normalize_run_avx2(xf, y, n, r);
  }
#else
  (void)avx2;
#endif
  if (done == n) return;
  // The rest: all of the run without AVX2 (then x is f32 and y is not fp16
  // codes), fewer than 8 values after the AVX2 loop.
  const auto rest = static_cast<std::size_t>(n - done);
  float wide[8], rounded[8];
  const float* xr = xf ? xf + done : wide;
  if (x16) load_from(DType::f16, x16 + done, wide, rest);
  if (y16) {
    normalize_portable(xr, rounded, n - done, r, done);
    store_as(DType::f16, rounded, y16 + done, rest);
  } else {
    normalize_portable(xr, y + done, n - done, r, done);
  }
}

// Runs shorter than this take the whole-tensor formulas as they are written:
// the channel-by-channel loop does not pay for them (a BatchNorm on [N, C]
// has runs of one).
constexpr std::int64_t kShortRun = 64;

// The whole-tensor formulas as they are written, for short runs.
Tensor forward_whole(const Tensor& x, const Layout& l, AffineAxis axis, const float* weight,
                     const float* bias, float eps, DType out, norm_math::Statistics* stats, float* mean,
                     float* invstd) {
  std::vector<float> xf(static_cast<std::size_t>(x.numel()));
  x.to_f32(xf.data());
  if (stats) {
    norm_math::statistics(xf.data(), l, stats);
    norm_math::mean_invstd(stats, l.channels, eps, mean, invstd);
  }
  std::vector<float> y(xf.size());
  norm_math::forward(xf.data(), l, mean, invstd, weight, bias, axis, y.data());
  return Tensor::from_f32(y.data(), x.shape(), out);
}

}  // namespace

norm_math::Statistics run_statistics(const float* x, std::int64_t n, Implementation impl) {
  const bool avx2 = use_avx2(impl);
  double lanes[norm_math::kSumLanes] = {}, squares[norm_math::kSumLanes] = {};
  add_sums(x, false, n, avx2, lanes);
  norm_math::Statistics s;
  s.count = n;
  s.mean = n > 0 ? norm_math::lanes_total(lanes) / static_cast<double>(n) : 0.0;
  add_squares(x, false, n, avx2, s.mean, squares);
  s.m2 = norm_math::lanes_total(squares);
  return s;
}

Tensor forward(const Tensor& x, const norm_math::Layout& l, norm_math::AffineAxis axis, const float* weight,
               const float* bias, float eps, DType out, norm_math::Statistics* stats, float* mean,
               float* invstd, Implementation impl) {
  if (x.numel() != l.numel())
    throw std::invalid_argument("norm_cpu::forward: x has " + std::to_string(x.numel()) +
                                " elements but the layout (" + std::to_string(l.outer) + ", " +
                                std::to_string(l.channels) + ", " + std::to_string(l.inner) + ") has " +
                                std::to_string(l.numel()));
  const bool avx2 = use_avx2(impl);
  if (l.inner < kShortRun) return forward_whole(x, l, axis, weight, bias, eps, out, stats, mean, invstd);

  Tensor y = Tensor::uninitialized(out, x.shape());
  // y is new and its buffer its own (no copy shares it yet): its codes are
  // written run by run with store_as, the conversion Tensor::assign and
  // from_f32 round with (or by the AVX2 loop that gives store_as's bits),
  // so y holds what from_f32 of the whole FP32 result would hold.
  auto* y_codes = static_cast<unsigned char*>(const_cast<void*>(y.raw()));
  float* y_f32 = out == DType::f32 ? y.f32_data() : nullptr;
  const DType xd = x.dtype();
  const auto* x_codes = static_cast<const unsigned char*>(x.raw());
  const std::size_t x_bytes = bytes_per_element(xd), y_bytes = bytes_per_element(out);
  const auto inner = static_cast<std::size_t>(l.inner);
  const std::optional<float> scale = x.scale();
  // The AVX2 loops read f32 values and fp16 codes where they lie and write
  // f32 and fp16 in place; anything else goes through FP32 scratch.
  const bool x_in_place = avx2 && !scale && (xd == DType::f32 || xd == DType::f16);
  const bool x_f16 = x_in_place && xd == DType::f16;
  const bool y_in_place = out == DType::f32 || (avx2 && out == DType::f16);

  // One run at a time, in memory order: the hardware prefetchers follow
  // that, where a BatchNorm channel alone is N stretches of H·W values,
  // C·H·W apart, which they follow badly (reading x more often in memory
  // order measured faster than once a channel at a time). So a BatchNorm in
  // training makes three passes: every run's Σx into its channel's lanes,
  // in the order of n as norm_math::statistics adds them, then every run's
  // Σ(x − mean)², then every run's normalization. A LayerNorm row is a
  // channel of its own: its two sums and its normalization follow each
  // other, and the later ones read the row from the L1 cache.
  std::vector<float> xs(x_in_place ? 0 : inner);  // one run, widened
  std::vector<float> ys(y_in_place ? 0 : inner);  // one run of y in FP32
  // Run (n, c) where the loops read it: in x itself, or widened into xs as
  // Tensor::to_f32 widens (exactly, then the scale undone).
  const auto run_x = [&](std::int64_t n, std::int64_t c) -> const void* {
    const unsigned char* codes = x_codes + static_cast<std::size_t>(l.offset(n, c, 0)) * x_bytes;
    if (x_in_place) return codes;
    load_from(xd, codes, xs.data(), inner);
    if (scale) {
      const float inv_scale = 1.0f / *scale;
      for (float& v : xs) v *= inv_scale;
    }
    return xs.data();
  };
  // Channel c's M2 from its lanes (its count and mean are set), then its
  // mean and invstd in FP32.
  const auto finish = [&](std::int64_t c, const double* squares) {
    stats[c].m2 = norm_math::lanes_total(squares);
    norm_math::mean_invstd(&stats[c], 1, eps, &mean[c], &invstd[c]);
  };
  const bool two_passes = stats && l.outer > 1;
  if (two_passes) {
    constexpr int kL = norm_math::kSumLanes;
    std::vector<double> lanes(static_cast<std::size_t>(l.channels) * kL, 0.0);
    for (std::int64_t n = 0; n < l.outer; ++n)
      for (std::int64_t c = 0; c < l.channels; ++c)
        add_sums(run_x(n, c), x_f16, l.inner, avx2, &lanes[static_cast<std::size_t>(c) * kL]);
    for (std::int64_t c = 0; c < l.channels; ++c) {
      stats[c].count = l.count();
      stats[c].mean =
          norm_math::lanes_total(&lanes[static_cast<std::size_t>(c) * kL]) / static_cast<double>(l.count());
    }
    std::fill(lanes.begin(), lanes.end(), 0.0);
    for (std::int64_t n = 0; n < l.outer; ++n)
      for (std::int64_t c = 0; c < l.channels; ++c)
        add_squares(run_x(n, c), x_f16, l.inner, avx2, stats[c].mean,
                    &lanes[static_cast<std::size_t>(c) * kL]);
    for (std::int64_t c = 0; c < l.channels; ++c) finish(c, &lanes[static_cast<std::size_t>(c) * kL]);
  }
  for (std::int64_t n = 0; n < l.outer; ++n)
    for (std::int64_t c = 0; c < l.channels; ++c) {
      const void* src = run_x(n, c);
      if (stats && !two_passes) {
        // One run per channel: its two sums, then its normalization, while
        // the run is in the L1 cache.
        double sums[norm_math::kSumLanes] = {}, squares[norm_math::kSumLanes] = {};
        add_sums(src, x_f16, l.inner, avx2, sums);
        stats[c].count = l.inner;
        stats[c].mean = norm_math::lanes_total(sums) / static_cast<double>(l.inner);
        add_squares(src, x_f16, l.inner, avx2, stats[c].mean, squares);
        finish(c, squares);
      }
      detail::NormalizeRun r;
      r.mean = mean[c];
      r.invstd = invstd[c];
      // A NaN in x makes its channel's batch statistics NaN: with finite
      // ones from x, no y of the run is a NaN with a payload.
      r.nan_payloads = !(stats && std::isfinite(r.mean) && std::isfinite(r.invstd));
      if (axis == AffineAxis::channel) {
        r.weight_all = weight ? weight[c] : 1.0f;
        r.bias_all = bias ? bias[c] : 0.0f;
      } else {
        r.weight = weight;
        r.bias = bias;
      }
      const auto at = static_cast<std::size_t>(l.offset(n, c, 0));
      normalize_into(src, x_f16, l.inner, r, avx2, out,
                     y_f32        ? static_cast<void*>(y_f32 + at)
                     : y_in_place ? static_cast<void*>(y_codes + at * y_bytes)
                                  : nullptr,
                     ys.data());
      if (!y_in_place) store_as(out, ys.data(), y_codes + at * y_bytes, inner);
    }
  return y;
}

}  // namespace mpt::norm_cpu
