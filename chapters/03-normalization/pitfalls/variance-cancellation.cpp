// Chapter 03 — pitfall variance-cancellation: E[x²] − E[x]² cancels in FP32 when the mean is large
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/core/context.hpp, mpt/core/policy.hpp (uniform_policy),
// mpt/core/tensor.hpp, mpt/nn/layers/batch_norm.hpp, mpt/nn/layers/norm_math.hpp
// (Layout); <algorithm>, <cmath>, <cstddef>, <cstdint>, <limits>, <string>,
// <utility>, <vector>.
//
// Channels with mean 1000 and standard deviation 1: E[x²] ≈ 10⁶ and
// E[x]² ≈ 10⁶ agree in their first six digits, and the variance, about 1,
// is their difference. FP32 keeps about seven digits, and Σx² over a
// thousand values carries rounding errors of tens (its spacing at 10⁹ is
// 64), and the mean squared carries Σx's rounding, so the difference is
// rounding error as large as itself (the broken run measures both terms'
// errors and says which is larger): it comes out too large,
// too small, zero or negative (√ of a negative: NaN; of 0 + eps: outputs
// multiplied by 1/√eps ≈ 316). Subtracting the mean before squaring
// (Welford's update, or a second pass) sums (x − mean)², values of size 1,
// and leaves no cancellation; the library's BatchNorm takes two passes. Both
// runs are FP32: they differ in the formula only (bn-variance-fp16 holds the
// formula and changes the precision).
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
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/norm_math.hpp"

namespace mpt::ch03 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace variance_cancellation {

// ---------------------------------------------------------------------------
// The activations both runs normalize, and what a run measures.

constexpr std::int64_t kBatch = 16, kChannels = 8, kHeight = 8, kWidth = 8;
constexpr double kMean = 1000, kStd = 1;
constexpr double kEps = 1e-5;  // torch.nn.BatchNorm's default

/// BatchNorm2d's view of [N, C, H, W]: statistics over N·H·W values per channel.
norm_math::Layout layout() {
  norm_math::Layout l;
  l.outer = kBatch;
  l.channels = kChannels;
  l.inner = kHeight * kWidth;
  return l;
}

/// [N, C, H, W] FP32 activations, every channel N(1000, 1).
const std::vector<float>& activations() {
  static const std::vector<float> x = normal_values(layout().numel(), kMean, kStd, 302);
  return x;
}

struct Normalized {
  std::vector<float> y;       ///< the outputs
  std::vector<float> invstd;  ///< 1/√(var + eps) per channel
};

/// The outcomes of both runs (defined after the runs).
RunResult cancellation_outcomes(const Normalized& r, std::string setup);

// ---------------------------------------------------------------------------
// The broken run.

/// How far the two terms of the single pass are off, the largest over the
/// channels: E[x²] (from the FP32 Σx²) and E[x]² (from the FP32 Σx, through
/// the mean), each against the same term computed in double on the same
/// FP32 values.
struct TermErrors {
  double mean_sq = 0;  ///< |fl(Σx²)/n − E[x²]|
  double sq_mean = 0;  ///< |fl(mean)² − E[x]²|
};

/// The textbook single pass in FP32: Σx and Σx², then E[x²] − E[x]². It
/// exists only as this pitfall. Also reports the largest Σx² it formed, the
/// variance of every channel and the error of each of the two terms.
Normalized naive_fp32_batch_norm(const std::vector<float>& x, const norm_math::Layout& l, double eps,
                                 float& largest_sum_sq, std::vector<float>& vars, TermErrors& terms) {
  Normalized r{std::vector<float>(x.size()), std::vector<float>(static_cast<std::size_t>(l.channels))};
  largest_sum_sq = 0;
  vars.assign(static_cast<std::size_t>(l.channels), 0.0f);
  const auto m = static_cast<float>(l.count());
  for (std::int64_t c = 0; c < l.channels; ++c) {
    const auto at = [&](std::int64_t n, std::int64_t i) {
      return static_cast<std::size_t>(l.offset(n, c, i));
    };
    //! [variance-cancellation-broken]
    float sum = 0, sum_sq = 0;
    for (std::int64_t n = 0; n < l.outer; ++n)
      for (std::int64_t i = 0; i < l.inner; ++i) {
        sum += x[at(n, i)];
        sum_sq += x[at(n, i)] * x[at(n, i)];
      }
    const float mean = sum / m;
    const float var = sum_sq / m - mean * mean;  // two numbers near 1e6 whose difference is about 1
    const float invstd = 1.0f / std::sqrt(var + static_cast<float>(eps));
    //! [variance-cancellation-broken]
    for (std::int64_t n = 0; n < l.outer; ++n)
      for (std::int64_t i = 0; i < l.inner; ++i) r.y[at(n, i)] = (x[at(n, i)] - mean) * invstd;
    r.invstd[static_cast<std::size_t>(c)] = invstd;
    vars[static_cast<std::size_t>(c)] = var;
    largest_sum_sq = std::max(largest_sum_sq, sum_sq);
    // The two terms in double on the same values (x² of a float is exact in
    // double, and the double sums keep far more than FP32 can show).
    double sum_d = 0, sum_sq_d = 0;
    for (std::int64_t n = 0; n < l.outer; ++n)
      for (std::int64_t i = 0; i < l.inner; ++i) {
        const double v = x[at(n, i)];
        sum_d += v;
        sum_sq_d += v * v;
      }
    const double mean_d = sum_d / m;
    terms.mean_sq = std::max(terms.mean_sq, std::fabs(static_cast<double>(sum_sq / m) - sum_sq_d / m));
    terms.sq_mean = std::max(terms.sq_mean, std::fabs(static_cast<double>(mean * mean) - mean_d * mean_d));
  }
  return r;
}

RunResult cancellation_broken() {
  float largest = 0;
  std::vector<float> vars;
  TermErrors terms;
  const Normalized r = naive_fp32_batch_norm(activations(), layout(), kEps, largest, vars, terms);
  std::string listed;
  for (float v : vars) listed += (listed.empty() ? "" : ", ") + num(std::round(v * 100) / 100);
  RunResult out = cancellation_outcomes(
      r,
      "[16, 8, 8, 8] FP32 activations, every channel mean 1000 and std 1, normalized with the single "
      "pass E[x²] − E[x]² in FP32");
  const double spacing = std::nextafter(largest, std::numeric_limits<float>::infinity()) - largest;
  const double mean_sq = kMean * kMean;
  const bool sum_sq_larger = terms.mean_sq >= terms.sq_mean;
  out.explanation =
      "E[x²] and E[x]² are both about " + num(mean_sq) + " and differ by the variance, about " +
      num(kStd * kStd) + "; Σx² reaches " + num(largest) + ", where FP32's spacing is " + num(spacing) +
      ", so each of its " + num(out.get("values_per_channel")) + " additions may round by up to " +
      num(spacing / 2) + ". Measured against the same terms in double, E[x²] = Σx²/" +
      num(out.get("values_per_channel")) + " is off by up to " + num(terms.mean_sq) +
      " and E[x]² (Σx rounded, " + "then the mean squared) by up to " + num(terms.sq_mean) +
      ": the larger error is " + (sum_sq_larger ? "Σx²'s" : "Σx's, through the mean") +
      ", and either is of the size of the variance. The " + num(static_cast<double>(kChannels)) +
      " variances came out as " + listed + " (FP64: about " +
      num(std::round(out.get("std") * out.get("std") * 100) / 100) + "); √ of a negative one is NaN (" +
      num(out.get("nan_outputs")) +
      " NaN outputs), and one that is too small blows the outputs up (largest |y| " +
      num(out.get("max_abs_output")) + " against FP64's " + num(out.get("fp64_max_abs_output")) + ").";
  return out;
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult cancellation_fixed() {
  const std::vector<float>& x = activations();
  const auto f32 = uniform_policy(DType::f32);
  Context ctx(f32);
  const Tensor input = Tensor::from_f32(x.data(), {kBatch, kChannels, kHeight, kWidth}, DType::f32);
  BatchNorm::Options o;
  o.eps = kEps;
  o.affine = false;
  //! [variance-cancellation-fixed]
  BatchNorm bn(kChannels, o);               // sums (x − mean)², values of size 1
  const Tensor y = bn.forward(input, ctx);  // the same FP32 activations
  //! [variance-cancellation-fixed]
  Normalized r{std::vector<float>(x.size()), std::vector<float>(static_cast<std::size_t>(kChannels))};
  y.to_f32(r.y.data());
  bn.invstd().to_f32(r.invstd.data());
  RunResult out = cancellation_outcomes(
      r, "the same activations through the library's BatchNorm (the mean subtracted before squaring)");
  out.explanation =
      "The library's BatchNorm subtracts the mean before it squares, so it sums values of size " +
      num(kStd * kStd) + " instead of " + num(kMean * kMean) + ": the variance is within " +
      num(out.get("max_variance_rel_error")) + " of FP64's (relative), every output within " +
      num(out.get("max_output_error")) + ".";
  return out;
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult cancellation_outcomes(const Normalized& r, std::string setup) {
  const std::vector<float>& x = activations();
  const Fp64Stats ref = fp64_statistics(x, layout());
  const std::vector<double> want = fp64_normalize(x, layout(), ref, kEps);
  double nonpositive = 0, var_error = 0, mean = 0, var = 0;
  for (std::int64_t c = 0; c < kChannels; ++c) {
    const auto k = static_cast<std::size_t>(c);
    const double v = variance_from_invstd(r.invstd[k], kEps);
    nonpositive += !(v > 0);
    const double err = std::fabs(v - ref.var[k]) / ref.var[k];
    var_error = std::isfinite(err) ? std::max(var_error, err) : std::numeric_limits<double>::infinity();
    mean += ref.mean[k] / kChannels;
    var += ref.var[k] / kChannels;
  }
  double nan = 0, max_abs = 0, max_err = 0;
  for (std::size_t e = 0; e < r.y.size(); ++e) {
    if (std::isnan(r.y[e])) {
      ++nan;
      max_err = std::numeric_limits<double>::infinity();
      continue;
    }
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(r.y[e])));
    max_err = std::max(max_err, std::fabs(r.y[e] - want[e]));
  }
  double max_abs_ref = 0;
  for (double v : want) max_abs_ref = std::max(max_abs_ref, std::fabs(v));
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"mean", mean, "the channels' mean (FP64, averaged over the channels)"},
      {"std", std::sqrt(var), "their standard deviation (FP64)"},
      {"values_per_channel", static_cast<double>(layout().count()), "N·H·W values per channel"},
      {"nonpositive_variances", nonpositive, "channels whose variance came out <= 0 (or NaN)"},
      {"max_variance_rel_error", var_error, "largest |var − var_fp64| / var_fp64 (inf: not finite)"},
      {"nan_outputs", nan, "normalized outputs that are NaN"},
      {"max_abs_output", max_abs, "the largest |y| that is not NaN"},
      {"fp64_max_abs_output", max_abs_ref, "the largest |y| of the FP64 normalization"},
      {"max_output_error", max_err, "largest |y − y_fp64| (inf: some output is NaN)"},
  };
  return out;
}

}  // namespace variance_cancellation
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall variance_cancellation_pitfall() {
  using namespace variance_cancellation;
  return Pitfall{
      "variance-cancellation",
      3,
      "E[x²] − E[x]² in FP32 cancels when the mean is far above the spread",
      "With mean 1000 and std 1, E[x²] and E[x]² are both about 10⁶ and agree in six digits; FP32 keeps "
      "about seven, and both carry rounding errors as large as their difference, the variance: it comes "
      "out too large, too small, zero or negative (NaN outputs, or outputs multiplied by 1/√eps). "
      "Subtracting the mean before squaring, as the library's BatchNorm does, sums (x − mean)², values "
      "of size 1, and leaves no cancellation.",
      cancellation_broken,
      cancellation_fixed,
      {
          check("some channel's variance came out zero or negative",
                [](const RunResult& r) { return r.get("nonpositive_variances") > 0; }),
          check("some variance is off by more than 10%",
                [](const RunResult& r) { return !(r.get("max_variance_rel_error") <= 0.1); }),
          check("outputs are NaN or exploding (more than 10x the largest FP64 output)",
                [](const RunResult& r) {
                  return r.get("nan_outputs") > 0 ||
                         r.get("max_abs_output") > 10 * r.get("fp64_max_abs_output");
                }),
      },
      {
          check("every variance within 1e-4 of FP64's (relative)",
                [](const RunResult& r) { return r.get("max_variance_rel_error") <= 1e-4; }),
          check("every output within 1e-3 of FP64's",
                [](const RunResult& r) { return r.get("max_output_error") <= 1e-3; }),
      },
      {}};
}

}  // namespace mpt::ch03
