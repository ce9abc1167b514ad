// Chapter 03 — pitfall bn-variance-fp16: the variance E[x²] − E[x]² in fp16 overflows
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/formats/format.hpp (limits_of), mpt/nn/layers/norm_math.hpp (Layout);
// <algorithm>, <cmath>, <cstddef>, <cstdint>, <limits>, <string>,
// <utility>, <vector>.
//
// The textbook single pass keeps Σx and Σx² and takes var = E[x²] − E[x]².
// With every intermediate stored in fp16 (largest value 65504), x² is inf
// for |x| ≥ 256, so Σx² is inf: a channel whose mean is small gets
// var = inf and 1/√(var + eps) = 0, which maps all its outputs to 0; a
// channel whose mean is large squares its mean past 65504 too, and
// inf − inf = NaN makes all its outputs NaN.
//
// Two things could be blamed: where the intermediates are stored (fp16) and
// the formula (E[x²] − E[x]² squares the raw values). The two runs differ in
// the first only: the same single pass, its intermediates stored in fp16
// (broken) or kept in FP32 (fixed). FP32 alone cures the overflow. Each run
// also measures the other formula, Welford's M2 = Σ(x − mean)², with its own
// storage: in fp16 it overflows too (a channel with std 200 has M2 ≈ 64·200²,
// far past 65504), so the formula alone does not cure this batch. The
// formula's own failure, cancellation when the mean is far above the spread,
// is in FP32 and is the next pitfall, variance-cancellation. The library's
// norms do both: FP32 statistics, the mean subtracted before squaring.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/nn/layers/norm_math.hpp"

namespace mpt::ch03 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace bn_variance_fp16 {

// ---------------------------------------------------------------------------
// The batch both runs normalize, and what a run measures.

constexpr std::int64_t kBatch = 64;
constexpr std::int64_t kChannels = 3;
constexpr double kEps = 1e-5;  // torch.nn.BatchNorm's default
/// Each channel's mean and spread: an ordinary one, a wide one around 0 and
/// one sitting around 400 (the outputs of a layer nothing normalized yet).
constexpr double kChannelMean[kChannels] = {0, 0, 400};
constexpr double kChannelStd[kChannels] = {1, 200, 20};

norm_math::Layout layout() {
  norm_math::Layout l;
  l.outer = kBatch;
  l.channels = kChannels;
  return l;
}

/// The activations, [N, C] row-major, already fp16 values (a half model's
/// activations): the same for both runs.
const std::vector<float>& activations() {
  static const std::vector<float> x = [] {
    std::vector<float> v(static_cast<std::size_t>(kBatch * kChannels));
    for (std::int64_t c = 0; c < kChannels; ++c) {
      const std::vector<float> col =
          normal_values(kBatch, kChannelMean[c], kChannelStd[c], 301 + static_cast<std::uint64_t>(c));
      for (std::int64_t n = 0; n < kBatch; ++n)
        v[static_cast<std::size_t>(n * kChannels + c)] = h(col[static_cast<std::size_t>(n)]);
    }
    return v;
  }();
  return x;
}

/// Where a kernel stores each intermediate value: h (rounded to fp16) or
/// fp32 (kept as the FP32 arithmetic computed it).
using Store = float (*)(float);
float fp32(float x) { return x; }

/// What one normalization of activations() gave.
struct Normalized {
  std::vector<float> y;       ///< the outputs, rounded once into fp16 (an fp16 model's output)
  std::vector<float> invstd;  ///< 1/√(var + eps) per channel
  std::vector<float> mean;    ///< the mean per channel
  double squares_inf = 0;     ///< squares the pass formed that were stored as inf
};

/// BatchNorm's forward (no affine) by the textbook single pass: Σx and Σx²,
/// var = E[x²] − E[x]², every intermediate stored by `s`. It exists only as
/// this pitfall.
Normalized single_pass_batch_norm(const std::vector<float>& x, const norm_math::Layout& l, double eps,
                                  Store s) {
  const auto count = static_cast<std::size_t>(l.channels);
  Normalized r{std::vector<float>(x.size()), std::vector<float>(count), std::vector<float>(count), 0};
  for (std::int64_t c = 0; c < l.channels; ++c) {
    const auto at = [&](std::int64_t n) { return static_cast<std::size_t>(l.offset(n, c, 0)); };
    //! [bn-variance-fp16-single-pass]
    float sum = 0, sum_sq = 0;  // accumulators, stored by s after every add
    for (std::int64_t n = 0; n < l.outer; ++n) {
      const float sq = s(x[at(n)] * x[at(n)]);  // fp16: inf for |x| >= 256
      r.squares_inf += std::isinf(sq);
      sum = s(sum + x[at(n)]);
      sum_sq = s(sum_sq + sq);
    }
    const auto m = static_cast<float>(l.outer);
    const float mean = s(sum / m);
    const float var = s(s(sum_sq / m) - s(mean * mean));  // E[x²] − E[x]²: fp16: inf, or inf − inf
    const float invstd = s(1.0f / s(std::sqrt(s(var + s(static_cast<float>(eps))))));
    for (std::int64_t n = 0; n < l.outer; ++n) r.y[at(n)] = h(s(x[at(n)] - mean) * invstd);
    //! [bn-variance-fp16-single-pass]
    r.invstd[static_cast<std::size_t>(c)] = invstd;
    r.mean[static_cast<std::size_t>(c)] = mean;
  }
  return r;
}

/// The other formula with the same storage: Welford's update of the mean
/// and of M2 = Σ(x − mean)², every intermediate stored by `s`; var = M2/N.
Normalized welford_batch_norm(const std::vector<float>& x, const norm_math::Layout& l, double eps, Store s) {
  const auto count = static_cast<std::size_t>(l.channels);
  Normalized r{std::vector<float>(x.size()), std::vector<float>(count), std::vector<float>(count), 0};
  for (std::int64_t c = 0; c < l.channels; ++c) {
    const auto at = [&](std::int64_t n) { return static_cast<std::size_t>(l.offset(n, c, 0)); };
    float mean = 0, m2 = 0;
    for (std::int64_t n = 0; n < l.outer; ++n) {
      const float delta = s(x[at(n)] - mean);
      mean = s(mean + s(delta / static_cast<float>(n + 1)));
      const float sq = s(delta * s(x[at(n)] - mean));  // (x − mean)², never x²
      r.squares_inf += std::isinf(sq);
      m2 = s(m2 + sq);
    }
    const float var = s(m2 / static_cast<float>(l.outer));
    const float invstd = s(1.0f / s(std::sqrt(s(var + s(static_cast<float>(eps))))));
    for (std::int64_t n = 0; n < l.outer; ++n) r.y[at(n)] = h(s(x[at(n)] - mean) * invstd);
    r.invstd[static_cast<std::size_t>(c)] = invstd;
    r.mean[static_cast<std::size_t>(c)] = mean;
  }
  return r;
}

/// How one normalization compares with FP64's.
struct Compared {
  OutputErrors out;          ///< the outputs against the FP64 normalization
  double nonfinite_var = 0;  ///< channels whose variance is inf or NaN
  double var_rel_error = 0;  ///< the largest |var − var_fp64| / var_fp64 (inf: not finite)
  std::string inf_channels;  ///< "channel 1" ...: variance inf
  std::string nan_channels;  ///< "channel 2 (mean 398.25)" ...: variance NaN
};
Compared compare_with_fp64(const Normalized& r) {
  const std::vector<float>& x = activations();
  const Fp64Stats ref = fp64_statistics(x, layout());
  Compared c;
  c.out = compare_outputs(r.y, fp64_normalize(x, layout(), ref, kEps), layout());
  for (std::int64_t ch = 0; ch < kChannels; ++ch) {
    const auto k = static_cast<std::size_t>(ch);
    const double var = variance_from_invstd(r.invstd[k], kEps);
    const std::string name = "channel " + std::to_string(ch);
    if (std::isinf(var)) c.inf_channels += (c.inf_channels.empty() ? "" : ", ") + name;
    if (std::isnan(var))
      c.nan_channels += (c.nan_channels.empty() ? "" : ", ") + name + " (mean " + num(r.mean[k]) + ")";
    c.nonfinite_var += !std::isfinite(var);
    const double err = std::fabs(var - ref.var[k]) / ref.var[k];
    c.var_rel_error =
        std::isfinite(err) ? std::max(c.var_rel_error, err) : std::numeric_limits<double>::infinity();
  }
  return c;
}

/// The outcomes of both runs (defined after the runs): `single` is the run's
/// single pass, `welford` the other formula with the run's storage.
RunResult variance_outcomes(const Normalized& single, const Normalized& welford, std::string setup,
                            std::string why);

/// "mean 0, std 1; mean 0, std 200; ..." of the channels.
std::string channels_text() {
  std::string t;
  for (std::int64_t c = 0; c < kChannels; ++c)
    t += std::string(c == 0 ? "" : "; ") + "mean " + num(kChannelMean[c]) + ", std " + num(kChannelStd[c]);
  return t;
}

// ---------------------------------------------------------------------------
// The broken run.

RunResult bn_variance_broken() {
  const std::vector<float>& x = activations();
  //! [bn-variance-fp16-broken]
  const Normalized r = single_pass_batch_norm(x, layout(), kEps, h);  // every intermediate stored in fp16
  //! [bn-variance-fp16-broken]
  const Normalized w = welford_batch_norm(x, layout(), kEps, h);
  const Compared e = compare_with_fp64(r), ew = compare_with_fp64(w);
  double max_abs = 0;
  for (float v : x) max_abs = std::max(max_abs, std::fabs(static_cast<double>(v)));
  std::string why = "fp16 holds nothing above " + num(limits_of(format_of(DType::f16).spec).max) +
                    ", so x² overflows for |x| >= 256 (the largest |x| here is " + num(max_abs) +
                    "): " + num(r.squares_inf) +
                    " squares were stored as inf, and Σx² is inf in every channel "
                    "that has one.";
  if (!e.inf_channels.empty())
    why += " In " + e.inf_channels +
           " E[x]² is finite, var = inf − E[x]² = inf and 1/√(var + eps) = 0: its " +
           num(static_cast<double>(kBatch)) + " outputs are all 0.";
  if (!e.nan_channels.empty())
    why += " In " + e.nan_channels + " E[x]² overflows too, and inf − inf = NaN: " + num(e.out.nan) +
           " NaN outputs.";
  why +=
      " The other formula with the same fp16 storage, Welford's M2 = Σ(x − mean)², squares no raw "
      "value, and still " +
      num(ew.nonfinite_var) + " channel(s) get an inf or NaN variance (" +
      (ew.inf_channels.empty() ? ew.nan_channels : ew.inf_channels) + ": M2 itself passes 65504) and " +
      num(ew.out.off) + " outputs are more than one fp16 ulp off: the formula alone does not cure it.";
  return variance_outcomes(r, w,
                           "a batch of " + std::to_string(kBatch) + " fp16 activations in " +
                               std::to_string(kChannels) + " channels (" + channels_text() +
                               "), normalized with E[x²] − E[x]², every intermediate stored in fp16",
                           why);
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult bn_variance_fixed() {
  const std::vector<float>& x = activations();
  //! [bn-variance-fp16-fixed]
  const Normalized r = single_pass_batch_norm(x, layout(), kEps, fp32);  // intermediates in FP32
  //! [bn-variance-fp16-fixed]
  const Normalized w = welford_batch_norm(x, layout(), kEps, fp32);
  const Compared e = compare_with_fp64(r), ew = compare_with_fp64(w);
  double max_sq = 0;
  for (float v : x) max_sq = std::max(max_sq, static_cast<double>(v) * v);
  const std::string why =
      "The same single pass with its intermediates in FP32: the largest square (" + num(max_sq) +
      ") is far from FP32's " + num(limits_of(format_of(DType::f32).spec).max) + ", " + num(r.squares_inf) +
      " squares overflow, every variance is within " + num(e.var_rel_error) +
      " of FP64's (relative) and every output within " + num(e.out.worst_ulps) +
      " fp16 ulp of the FP64 normalization: FP32 alone cures the overflow. Welford's formula in FP32 "
      "gives variances within " +
      num(ew.var_rel_error) + ": the single pass's larger error is the cancellation of E[x²] − E[x]² (mean " +
      num(kChannelMean[2]) + " against std " + num(kChannelStd[2]) +
      " in channel 2), small here and the whole story of variance-cancellation.";
  return variance_outcomes(r, w,
                           "the same fp16 batch through the same single pass with every intermediate kept "
                           "in FP32 (the output rounded once into fp16)",
                           why);
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult variance_outcomes(const Normalized& single, const Normalized& welford, std::string setup,
                            std::string why) {
  const std::vector<float>& x = activations();
  const Compared e = compare_with_fp64(single), ew = compare_with_fp64(welford);
  double max_abs = 0;
  for (float v : x) max_abs = std::max(max_abs, std::fabs(static_cast<double>(v)));
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"values", static_cast<double>(x.size()), "activations normalized (N x C)"},
      {"max_abs_input", max_abs, "the largest |x|"},
      {"squares_inf", single.squares_inf, "squares x² the single pass stored as inf"},
      {"nonfinite_variances", e.nonfinite_var, "channels whose variance came out inf or NaN"},
      {"max_variance_rel_error", e.var_rel_error, "largest |var − var_fp64| / var_fp64 (inf: not finite)"},
      {"nan_outputs", e.out.nan, "normalized outputs that are NaN"},
      {"collapsed_channels", e.out.collapsed, "channels normalized to all zeros"},
      {"outputs_off", e.out.off,
       "outputs more than one fp16 ulp (at max(|y|, 1)) from the FP64 normalization"},
      {"worst_error_ulps", e.out.worst_ulps, "the largest error, in those ulps (inf: not finite)"},
      {"welford_nonfinite_variances", ew.nonfinite_var,
       "the other formula, Welford's M2, same storage: channels whose variance is inf or NaN"},
      {"welford_max_variance_rel_error", ew.var_rel_error,
       "its largest relative variance error (inf: not finite)"},
      {"welford_outputs_off", ew.out.off, "its outputs more than one fp16 ulp from FP64's"},
  };
  out.explanation = std::move(why);
  return out;
}

}  // namespace bn_variance_fp16
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall bn_variance_fp16_pitfall() {
  using namespace bn_variance_fp16;
  return Pitfall{
      "bn-variance-fp16",
      3,
      "BatchNorm's variance as E[x²] − E[x]² in fp16: x² overflows",
      "fp16's largest value is 65504, so x² is inf for |x| >= 256: with Σx² and every other intermediate "
      "in fp16 the variance E[x²] − E[x]² is inf (1/√(var + eps) = 0 maps a channel's outputs to 0) or, "
      "when E[x]² overflows too, inf − inf = NaN. Keeping the intermediates in FP32 cures it, with the "
      "same formula; Welford's formula with fp16 intermediates does not (M2 = Σ(x − mean)² overflows for "
      "a wide channel). The library's norms compute their statistics in FP32 from the widened values.",
      bn_variance_broken,
      bn_variance_fixed,
      {
          check("squares x² were stored as inf", [](const RunResult& r) { return r.get("squares_inf") > 0; }),
          check("some channel's variance came out inf or NaN",
                [](const RunResult& r) { return r.get("nonfinite_variances") > 0; }),
          check("NaN outputs", [](const RunResult& r) { return r.get("nan_outputs") > 0; }),
          check("a channel whose values vary was normalized to all zeros",
                [](const RunResult& r) { return r.get("collapsed_channels") > 0; }),
          check("with the same storage, Welford's formula gives an inf or NaN variance too",
                [](const RunResult& r) { return r.get("welford_nonfinite_variances") > 0; }),
      },
      {
          // Half an fp16 ulp, relative (2^-11): the variance as good as the
          // FP64 one rounded once into fp16. FP32's single pass loses about
          // (mean/std)²·2^-24·√N relative to cancellation (section 2), a few
          // 1e-5 for mean/std = 20: a margin of about ten.
          check("every variance within 2^-11 (half an fp16 ulp) of FP64's, relative",
                [](const RunResult& r) { return r.get("max_variance_rel_error") <= std::ldexp(1.0, -11); }),
          check("every output within one fp16 ulp (at max(|y|, 1)) of the FP64 normalization",
                [](const RunResult& r) { return r.get("outputs_off") == 0; }),
          check("with the same storage, Welford's formula is within one fp16 ulp too",
                [](const RunResult& r) {
                  return r.get("welford_nonfinite_variances") == 0 && r.get("welford_outputs_off") == 0;
                }),
      },
      {}};
}

}  // namespace mpt::ch03
