// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the CPU forward
// both layers run, one channel at a time.
// Depends on: norm_cpu.hpp, norm_math.hpp, welford.hpp; cpu_dispatch.hpp
// (the AVX2-or-portable choice); Chapter 2's tensor conversions (load_from,
// store_as: the rounding every Tensor write goes through).
#include "mpt/nn/norm_cpu.hpp"

#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/formats/cpu_dispatch.hpp"
#include "mpt/nn/norm_math.hpp"
#include "mpt/nn/welford.hpp"

namespace mpt::norm_cpu {
namespace {

using norm_math::AffineAxis;
using norm_math::Layout;

bool use_avx2(Implementation impl) {
  return detail::use_avx2(impl,
                          "norm_cpu: the AVX2 norm path is not available on this CPU/build; use "
                          "Implementation::portable or automatic");
}

// The statistics of one run of n values at x (f32, or fp16 codes when
// `f16`), in run_statistics' order: the lanes by the AVX2 loop or the
// portable one, then the lanes merged and the values after the last full
// block added (widened first when they are codes).
Welford<float> run_statistics_of(const void* x, bool f16, std::int64_t n, bool avx2) {
  const std::int64_t blocks = n / norm_math::kRunBlock, done = blocks * norm_math::kRunBlock;
  if (!avx2) return norm_math::run_statistics(static_cast<const float*>(x), n);
  Welford<float> lanes[norm_math::kRunLanes];
  float rest[norm_math::kRunBlock];
#if defined(MPT_HAVE_AVX2_PATH)
  if (f16) {
    const auto* codes = static_cast<const std::uint16_t*>(x);
    detail::run_lane_statistics_avx2(codes, blocks, lanes);
    load_from(DType::f16, codes + done, rest, static_cast<std::size_t>(n - done));
    return norm_math::run_statistics_finish(lanes, rest, n - done);
  }
  const auto* values = static_cast<const float*>(x);
  detail::run_lane_statistics_avx2(values, blocks, lanes);
  return norm_math::run_statistics_finish(lanes, values + done, n - done);
#else
  (void)f16;
  (void)rest;
  (void)done;
  return norm_math::run_statistics(static_cast<const float*>(x), n);
#endif
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

// The whole-tensor formulas as they are written, for runs too short for the
// channel-by-channel loop to pay (a BatchNorm on [N, C] has runs of one).
Tensor forward_whole(const Tensor& x, const Layout& l, AffineAxis axis, const float* weight,
                     const float* bias, float eps, DType out, Welford<float>* stats, float* mean,
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

Welford<float> run_statistics(const float* x, std::int64_t n, Implementation impl) {
  return run_statistics_of(x, false, n, use_avx2(impl));
}

Tensor forward(const Tensor& x, const norm_math::Layout& l, norm_math::AffineAxis axis, const float* weight,
               const float* bias, float eps, DType out, Welford<float>* stats, float* mean, float* invstd,
               Implementation impl) {
  if (x.numel() != l.numel())
    throw std::invalid_argument("norm_cpu::forward: x has " + std::to_string(x.numel()) +
                                " elements but the layout (" + std::to_string(l.outer) + ", " +
                                std::to_string(l.channels) + ", " + std::to_string(l.inner) + ") has " +
                                std::to_string(l.numel()));
  const bool avx2 = use_avx2(impl);
  if (l.inner < norm_math::kRunBlock)
    return forward_whole(x, l, axis, weight, bias, eps, out, stats, mean, invstd);

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
  // C·H·W apart, which they follow badly (reading x twice in memory order
  // measured faster than once a channel at a time). So a BatchNorm in
  // training makes two passes: every run's statistics, merged per channel in
  // the order of n as norm_math::statistics merges them, then every run's
  // normalization. A LayerNorm row is a channel of its own: its statistics
  // and its normalization follow each other, and the second reads the row
  // from the L1 cache.
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
  const bool two_passes = stats && l.outer > 1;
  if (two_passes) {
    std::vector<Welford<float>> runs(static_cast<std::size_t>(l.outer * l.channels));
    for (std::int64_t n = 0; n < l.outer; ++n)
      for (std::int64_t c = 0; c < l.channels; ++c)
        runs[static_cast<std::size_t>(n * l.channels + c)] =
            run_statistics_of(run_x(n, c), x_f16, l.inner, avx2);
    for (std::int64_t c = 0; c < l.channels; ++c) {
      Welford<float> total;
      for (std::int64_t n = 0; n < l.outer; ++n)
        total = welford_merge(total, runs[static_cast<std::size_t>(n * l.channels + c)]);
      stats[c] = total;
      norm_math::mean_invstd(&stats[c], 1, eps, &mean[c], &invstd[c]);
    }
  }
  for (std::int64_t n = 0; n < l.outer; ++n)
    for (std::int64_t c = 0; c < l.channels; ++c) {
      const void* src = run_x(n, c);
      if (stats && !two_passes) {
        // One run per channel: norm_math::statistics' merge of it into the
        // empty set is the run itself.
        stats[c] = run_statistics_of(src, x_f16, l.inner, avx2);
        norm_math::mean_invstd(&stats[c], 1, eps, &mean[c], &invstd[c]);
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
