// Chapter 01 — pitfall fp16-gradient-underflow: gradient underflow: small gradients flush to zero
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/formats/format.hpp (limits_of), mpt/formats/rounding.hpp (round_value,
// round_array); <cmath>, <cstddef>, <string>, <utility>, <vector>.
//
// Small gradients flush to zero in fp16: everything of magnitude up to half
// the smallest subnormal (2^-25) rounds to 0, and what lies below the
// smallest normal keeps fewer significant bits. Multiplying by a power-of-two
// loss scale before the cast and dividing after, in fp32, moves them into
// range (chapter 2 makes the scale dynamic).
#include <cmath>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/formats/rounding.hpp"

namespace mpt::ch01 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace fp16_gradient_underflow {

// ---------------------------------------------------------------------------
// The constants and the inputs.

// Gradient magnitudes are log-normal: 10^N(mu, sigma^2) with random signs.
// Histograms of activation gradients on a log axis are bell-shaped and
// spread over many decades, with much of their mass below fp16's normal
// range (Micikevicius et al., "Mixed Precision Training", ICLR 2018, Fig. 3,
// which motivates loss scaling with exactly this picture). mu = -6.5 and
// sigma = 1.2 decades put the bell across fp16's subnormal floor 2^-24
// (about 10^-7.2), the situation that paper describes.
constexpr double kGradLog10Mean = -6.5;
constexpr double kGradLog10Sigma = 1.2;
constexpr std::size_t kGradients = std::size_t{1} << 16;

std::vector<float> lognormal_gradients() {
  Rng rng(0x01f16d0eULL);
  std::vector<float> g(kGradients);
  for (float& v : g)
    v = static_cast<float>(rng.sign() * std::pow(10.0, kGradLog10Mean + kGradLog10Sigma * rng.normal()));
  return g;
}

/// Standard normal cumulative distribution function.
double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

/// Measurements shared by both sides (defined after the runs).
RunResult underflow_outcomes(const std::vector<float>& g, const std::vector<float>& stored,
                             const std::vector<float>& recovered, float scale, std::string setup);

// ---------------------------------------------------------------------------
// The broken run.

RunResult fp16_gradient_underflow_broken() {
  const std::vector<float> g = lognormal_gradients();  // fp32 gradients
  std::vector<float> stored(g.size()), recovered(g.size());
  //! [fp16-gradient-underflow-broken]
  // The backward pass stores its gradients in fp16: a plain cast.
  round_array(g.data(), stored.data(), g.size(), fp16());
  for (std::size_t i = 0; i < g.size(); ++i) recovered[i] = stored[i];
  //! [fp16-gradient-underflow-broken]
  return underflow_outcomes(g, stored, recovered, 1.0f,
                            std::to_string(kGradients) + " fp32 gradients cast to fp16, no scaling");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult fp16_gradient_underflow_fixed() {
  const std::vector<float> g = lognormal_gradients();
  std::vector<float> stored(g.size()), recovered(g.size());
  //! [fp16-gradient-underflow-fixed]
  // Multiply by a power of two before the cast (in training: scale the loss,
  // and the chain rule scales every gradient), divide after, in fp32. Powers
  // of two change only the exponent, so scaling and unscaling are exact.
  // The scale is the largest power of two that keeps max|g| * scale within
  // fp16's max — the most room that does not overflow.
  float max_abs = 0.0f;
  for (float v : g) max_abs = std::fabs(v) > max_abs ? std::fabs(v) : max_abs;
  const double fp16_max = limits_of(fp16().spec).max;
  float scale = std::ldexp(1.0f, std::ilogb(fp16_max / max_abs));
  while (static_cast<double>(max_abs) * scale > fp16_max) scale /= 2;
  for (std::size_t i = 0; i < g.size(); ++i) stored[i] = round_value(g[i] * scale, fp16());
  for (std::size_t i = 0; i < g.size(); ++i) recovered[i] = stored[i] / scale;  // fp32 unscale
  //! [fp16-gradient-underflow-fixed]
  return underflow_outcomes(g, stored, recovered, scale,
                            "the same gradients times a power-of-two loss scale, cast to fp16, "
                            "unscaled in fp32");
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult underflow_outcomes(const std::vector<float>& g, const std::vector<float>& stored,
                             const std::vector<float>& recovered, float scale, std::string setup) {
  const Limits l16 = limits_of(fp16().spec);
  double flushed = 0, subnormal = 0, sum_rel = 0, ref_sq = 0, got_sq = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double a = std::fabs(static_cast<double>(stored[i]));
    flushed += a == 0.0 && g[i] != 0.0f;
    subnormal += a > 0.0 && a < l16.min_normal;
    sum_rel += std::fabs(static_cast<double>(recovered[i]) - g[i]) / std::fabs(g[i]);
    ref_sq += static_cast<double>(g[i]) * g[i];
    got_sq += static_cast<double>(recovered[i]) * recovered[i];
  }
  const double n = static_cast<double>(g.size());
  // Round-to-nearest sends |x| <= min_subnormal / 2 to zero (the tie goes to
  // the even neighbour, 0). Divided by the scale: the gradient magnitude at
  // or below which a gradient is lost.
  const double threshold = l16.min_subnormal / 2 / scale;
  const double predicted = normal_cdf((std::log10(threshold) - kGradLog10Mean) / kGradLog10Sigma);
  const double ref_norm = std::sqrt(ref_sq);
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"gradients", n,
       "gradient values, |g| = 10^N(" + num(kGradLog10Mean) + ", " + num(kGradLog10Sigma) +
           "^2), random signs"},
      {"loss_scale", scale, "factor applied before the fp16 cast (1: none)"},
      {"flush_threshold", threshold, "|g| at or below this becomes 0 in fp16"},
      {"predicted_flushed_fraction", predicted, "P(|g| < threshold) under the log-normal model"},
      {"flushed_fraction", flushed / n, "nonzero gradients that became exactly 0"},
      {"subnormal_fraction", subnormal / n, "gradients stored as fp16 subnormals (fewer significant bits)"},
      {"mean_rel_error", sum_rel / n, "mean over elements of |g~ - g| / |g| (vs fp64)"},
      // Reported, not checked: the norm is dominated by the largest
      // gradients, so it barely notices the small ones vanishing.
      {"norm_rel_error", std::fabs(std::sqrt(got_sq) - ref_norm) / ref_norm,
       "relative error of the gradient's L2 norm (vs fp64)"},
  };
  r.explanation = "fp16's smallest subnormal is " + num(l16.min_subnormal) + "; with a loss scale of " +
                  num(scale) + " every gradient with |g| <= " + num(threshold) + " rounds to zero (" +
                  num(flushed / n) + " of them; the log-normal model predicts " + num(predicted) + "), and " +
                  num(subnormal / n) + " land below the smallest normal " + num(l16.min_normal) +
                  " with fewer significant bits.";
  return r;
}

}  // namespace fp16_gradient_underflow
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall fp16_gradient_underflow_pitfall() {
  using namespace fp16_gradient_underflow;
  const Limits l16 = limits_of(fp16().spec);
  return Pitfall{
      "fp16-gradient-underflow",
      1,
      "gradient underflow: small gradients flush to zero",
      "fp16's smallest subnormal is " + p2(l16.min_subnormal) + ", so gradients of magnitude " +
          p2(l16.min_subnormal / 2) + " or less round to zero and those below " + p2(l16.min_normal) +
          " keep fewer significant bits; multiplying by a power-of-two loss scale before the "
          "cast and dividing after (in fp32) moves them into range.",
      fp16_gradient_underflow_broken,
      fp16_gradient_underflow_fixed,
      {
          check("more than 5% of the gradients become exactly zero",
                [](const RunResult& r) { return r.get("flushed_fraction") > 0.05; }),
          check("most gradients that survive are subnormal (fewer significant bits)",
                [](const RunResult& r) { return r.get("subnormal_fraction") > 0.5; }),
          check("underflow, not rounding, dominates: the mean relative error per gradient is "
                "over 100 times fp16's unit roundoff",
                [](const RunResult& r) { return r.get("mean_rel_error") > 100 * unit_roundoff(fp16()); }),
      },
      {
          check("fewer than 0.1% of the gradients become zero",
                [](const RunResult& r) { return r.get("flushed_fraction") < 0.001; }),
          check("the mean relative error per gradient is within fp16's unit roundoff",
                [](const RunResult& r) { return r.get("mean_rel_error") <= unit_roundoff(fp16()); }),
      },
      {
          // The model behind the threshold explains both runs: with or
          // without the scale, what flushes is what it predicts.
          check("the flushed fraction is what the log-normal model predicts (within 4 standard "
                "errors)",
                [](const RunResult& r) {
                  const double p = r.get("predicted_flushed_fraction");
                  const double se = std::sqrt(p * (1 - p) / r.get("gradients"));
                  return std::fabs(r.get("flushed_fraction") - p) <= 4 * se;
                }),
      }};
}

}  // namespace mpt::ch01
