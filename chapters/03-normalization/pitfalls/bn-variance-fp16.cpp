// Chapter 03 — pitfall bn-variance-fp16: the variance E[x²] − E[x]² in fp16 overflows
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/core/context.hpp, mpt/core/policy.hpp (uniform_policy),
// mpt/core/tensor.hpp, mpt/formats/format.hpp (limits_of),
// mpt/nn/batch_norm.hpp, mpt/nn/norm_math.hpp (Layout); <algorithm>,
// <cmath>, <cstddef>, <cstdint>, <limits>, <string>, <utility>, <vector>.
//
// The textbook single pass keeps Σx and Σx² and takes var = E[x²] − E[x]².
// With every intermediate stored in fp16 (largest value 65504), x² is inf
// for |x| ≥ 256, so Σx² is inf: a channel whose mean is small gets
// var = inf and 1/√(var + eps) = 0, which maps all its outputs to 0; a
// channel whose mean is large squares its mean past 65504 too, and
// inf − inf = NaN makes all its outputs NaN. The library's BatchNorm widens
// the same fp16 values to FP32 and takes Welford's M2 = Σ(x − mean)², which
// never forms x² of the raw values.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/nn/batch_norm.hpp"
#include "mpt/nn/norm_math.hpp"

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

/// What a normalization of activations() gave: its outputs and the
/// 1/√(var + eps) of each channel.
struct Normalized {
  std::vector<float> y;
  std::vector<float> invstd;
};

/// The outcomes of both runs (defined after the runs); `why` is the run's
/// explanation.
RunResult variance_outcomes(const Normalized& r, std::string setup, std::string why);

// ---------------------------------------------------------------------------
// The broken run.

/// BatchNorm's forward as a half-precision kernel without FP32 accumulators
/// computes it: one pass for Σx and Σx², var = E[x²] − E[x]², every
/// intermediate rounded to fp16 where such a kernel stores it. It exists
/// only as this pitfall.
Normalized naive_fp16_batch_norm(const std::vector<float>& x, const norm_math::Layout& l, double eps,
                                 std::vector<float>& means) {
  Normalized r{std::vector<float>(x.size()), std::vector<float>(static_cast<std::size_t>(l.channels))};
  means.assign(static_cast<std::size_t>(l.channels), 0.0f);
  for (std::int64_t c = 0; c < l.channels; ++c) {
    const auto at = [&](std::int64_t n) { return static_cast<std::size_t>(l.offset(n, c, 0)); };
    //! [bn-variance-fp16-broken]
    float sum = 0, sum_sq = 0;  // fp16 accumulators
    for (std::int64_t n = 0; n < l.outer; ++n) {
      sum = h(sum + x[at(n)]);
      sum_sq = h(sum_sq + h(x[at(n)] * x[at(n)]));  // x² is inf for |x| >= 256
    }
    const auto m = static_cast<float>(l.outer);
    const float mean = h(sum / m);
    const float var = h(h(sum_sq / m) - h(mean * mean));  // E[x²] − E[x]²: inf, or inf − inf
    const float invstd = h(1.0f / h(std::sqrt(h(var + h(static_cast<float>(eps))))));
    for (std::int64_t n = 0; n < l.outer; ++n) r.y[at(n)] = h(h(x[at(n)] - mean) * invstd);
    //! [bn-variance-fp16-broken]
    r.invstd[static_cast<std::size_t>(c)] = invstd;
    means[static_cast<std::size_t>(c)] = mean;
  }
  return r;
}

RunResult bn_variance_broken() {
  const std::vector<float>& x = activations();
  std::vector<float> means;
  const Normalized r = naive_fp16_batch_norm(x, layout(), kEps, means);
  // Why, channel by channel: which variance came out inf, which NaN.
  const OutputErrors e =
      compare_outputs(r.y, fp64_normalize(x, layout(), fp64_statistics(x, layout()), kEps), layout());
  std::string inf_channels, nan_channels;
  for (std::int64_t c = 0; c < kChannels; ++c) {
    const double var = variance_from_invstd(r.invstd[static_cast<std::size_t>(c)], kEps);
    const std::string name = "channel " + std::to_string(c);
    if (std::isinf(var)) inf_channels += (inf_channels.empty() ? "" : ", ") + name;
    if (std::isnan(var))
      nan_channels += (nan_channels.empty() ? "" : ", ") + name + " (mean " +
                      num(means[static_cast<std::size_t>(c)]) + ")";
  }
  const double max_abs = [&] {
    double m = 0;
    for (float v : x) m = std::max(m, std::fabs(static_cast<double>(v)));
    return m;
  }();
  std::string why = "fp16 holds nothing above " + num(limits_of(format_of(DType::f16).spec).max) +
                    ", so x² overflows for |x| >= 256 (the largest |x| here is " + num(max_abs) +
                    ") and Σx² is inf in every channel that has such a value.";
  if (!inf_channels.empty())
    why += " In " + inf_channels + " E[x]² is finite, var = inf − E[x]² = inf and 1/√(var + eps) = 0: its " +
           num(static_cast<double>(kBatch)) + " outputs are all 0.";
  if (!nan_channels.empty())
    why +=
        " In " + nan_channels + " E[x]² overflows too, and inf − inf = NaN: " + num(e.nan) + " NaN outputs.";
  std::string channels;
  for (std::int64_t c = 0; c < kChannels; ++c)
    channels +=
        std::string(c == 0 ? "" : "; ") + "mean " + num(kChannelMean[c]) + ", std " + num(kChannelStd[c]);
  return variance_outcomes(r,
                           "a batch of " + std::to_string(kBatch) + " fp16 activations in " +
                               std::to_string(kChannels) + " channels (" + channels +
                               "), normalized with E[x²] − E[x]², every intermediate in fp16",
                           why);
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult bn_variance_fixed() {
  const std::vector<float>& x = activations();
  const auto f16 = uniform_policy(DType::f16);
  Context ctx(f16);
  const Tensor input = Tensor::from_f32(x.data(), {kBatch, kChannels}, DType::f16);
  BatchNorm::Options o;
  o.eps = kEps;
  o.affine = false;  // the normalization alone, as in the broken run
  //! [bn-variance-fp16-fixed]
  BatchNorm bn(kChannels, o);
  bn.apply_policy(*f16);                    // fp16 model: fp16 output, fp16 running estimates
  const Tensor y = bn.forward(input, ctx);  // statistics: FP32 Welford of the widened values
  //! [bn-variance-fp16-fixed]
  Normalized r{std::vector<float>(static_cast<std::size_t>(y.numel())),
               std::vector<float>(static_cast<std::size_t>(kChannels))};
  y.to_f32(r.y.data());
  bn.invstd().to_f32(r.invstd.data());
  double max_sq = 0;
  for (float v : x) max_sq = std::max(max_sq, static_cast<double>(v) * v);
  RunResult out = variance_outcomes(
      r, "the same fp16 batch through the library's BatchNorm (uniform f16 policy: FP32 Welford statistics)",
      "");
  out.explanation =
      "The values are widened to FP32, where the largest square (" + num(max_sq) +
      ") is far from overflowing, and Welford's update sums (x − mean)², never x² itself: every "
      "variance is within " +
      num(out.get("max_variance_rel_error")) + " of FP64's, every output within " +
      num(out.get("worst_error_ulps")) + " fp16 ulp of the FP64 normalization.";
  return out;
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult variance_outcomes(const Normalized& r, std::string setup, std::string why) {
  const std::vector<float>& x = activations();
  const Fp64Stats ref = fp64_statistics(x, layout());
  const OutputErrors e = compare_outputs(r.y, fp64_normalize(x, layout(), ref, kEps), layout());
  double max_abs = 0, overflowing = 0;
  for (float v : x) {
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(v)));
    overflowing += std::isinf(h(v * v));
  }
  double nonfinite_var = 0, var_error = 0;
  for (std::int64_t c = 0; c < kChannels; ++c) {
    const double var = variance_from_invstd(r.invstd[static_cast<std::size_t>(c)], kEps);
    const double want = ref.var[static_cast<std::size_t>(c)];
    nonfinite_var += !std::isfinite(var);
    const double err = std::fabs(var - want) / want;
    var_error = std::isfinite(err) ? std::max(var_error, err) : std::numeric_limits<double>::infinity();
  }
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"values", static_cast<double>(x.size()), "activations normalized (N x C)"},
      {"max_abs_input", max_abs, "the largest |x|"},
      {"squares_overflowing", overflowing, "values whose square is inf in fp16"},
      {"nonfinite_variances", nonfinite_var, "channels whose variance came out inf or NaN"},
      {"max_variance_rel_error", var_error, "largest |var − var_fp64| / var_fp64 (inf: not finite)"},
      {"nan_outputs", e.nan, "normalized outputs that are NaN"},
      {"collapsed_channels", e.collapsed, "channels normalized to all zeros"},
      {"outputs_off", e.off, "outputs more than one fp16 ulp (at max(|y|, 1)) from the FP64 normalization"},
      {"worst_error_ulps", e.worst_ulps, "the largest error, in those ulps (inf: not finite)"},
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
      "when E[x]² overflows too, inf − inf = NaN. Compute the statistics in FP32 from the widened values, "
      "with Welford's M2 = Σ(x − mean)², as the library's BatchNorm does.",
      bn_variance_broken,
      bn_variance_fixed,
      {
          check("some channel's variance came out inf or NaN",
                [](const RunResult& r) { return r.get("nonfinite_variances") > 0; }),
          check("NaN outputs", [](const RunResult& r) { return r.get("nan_outputs") > 0; }),
          check("a channel whose values vary was normalized to all zeros",
                [](const RunResult& r) { return r.get("collapsed_channels") > 0; }),
      },
      {
          check("every variance within 1e-5 of FP64's (relative)",
                [](const RunResult& r) { return r.get("max_variance_rel_error") <= 1e-5; }),
          check("every output within one fp16 ulp (at max(|y|, 1)) of the FP64 normalization",
                [](const RunResult& r) { return r.get("outputs_off") == 0; }),
      },
      {
          check("the batch holds values whose fp16 square overflows",
                [](const RunResult& r) { return r.get("squares_overflowing") > 0; }),
      }};
}

}  // namespace mpt::ch03
