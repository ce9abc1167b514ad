// Chapter 03 — pitfall layernorm-fp16-accumulation: a 4096-feature row summed in fp16
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/core/context.hpp, mpt/core/policy.hpp (uniform_policy),
// mpt/core/tensor.hpp, mpt/formats/format.hpp (limits_of),
// mpt/nn/layers/layer_norm.hpp, mpt/nn/layers/norm_math.hpp (Layout); <algorithm>,
// <cmath>, <cstddef>, <cstdint>, <string>, <utility>, <vector>.
//
// LayerNorm over 4096 features sums 4096 values twice, once for the mean
// and once for Σ(x − mean)². An fp16 accumulator rounds after every add,
// which fails in two ways. It stalls: once half its spacing at the running
// sum is more than the values added, each add rounds back to the same sum
// (a row of values near 0.7 stops at 2048, where the spacing is 2). And it
// overflows: a row whose squares add up past 65504 gets Σ = inf, a variance
// of inf and 1/√(var + eps) = 0, so the whole row normalizes to 0. The
// library's LayerNorm sums the widened fp16 values in double (two passes:
// the mean, then Σ(x − mean)²) and rounds the statistics into FP32.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/nn/layers/layer_norm.hpp"
#include "mpt/nn/layers/norm_math.hpp"

namespace mpt::ch03 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace layernorm_fp16_accumulation {

// ---------------------------------------------------------------------------
// The rows both runs normalize, and what a run measures.

constexpr std::int64_t kFeatures = 4096;
constexpr double kEps = 1e-5;  // torch.nn.LayerNorm's default
/// Row 0 sits near 0.7 with a small spread (its sum stalls); row 1 spreads
/// around 0 with std 8 (its squares add up past fp16's max).
constexpr double kOffsetMean = 0.7, kOffsetStd = 0.05;
constexpr double kWideMean = 0, kWideStd = 8;

/// LayerNorm's view of [2, 4096]: one "channel" per row, statistics over the row.
norm_math::Layout layout() {
  norm_math::Layout l;
  l.channels = 2;
  l.inner = kFeatures;
  return l;
}

/// Two rows of 4096 fp16 activations (a half model's hidden states), row-major.
const std::vector<float>& activations() {
  static const std::vector<float> x = [] {
    std::vector<float> v = normal_values(kFeatures, kOffsetMean, kOffsetStd, 303);
    const std::vector<float> wide = normal_values(kFeatures, kWideMean, kWideStd, 304);
    v.insert(v.end(), wide.begin(), wide.end());
    for (float& e : v) e = h(e);
    return v;
  }();
  return x;
}

struct Normalized {
  std::vector<float> y;     ///< the outputs
  std::vector<float> mean;  ///< per row
  std::vector<float> rstd;  ///< 1/√(var + eps) per row
};

/// The outcomes of both runs (defined after the runs).
RunResult accumulation_outcomes(const Normalized& r, std::string setup);

// ---------------------------------------------------------------------------
// The broken run.

/// What an fp16 accumulator did to one row's two sums.
struct Accumulation {
  double stalled_adds = 0;  ///< adds to Σx that left it unchanged
  double first_stall = 0;   ///< the first of them, counting from 1 (0: none)
  double stalled_at = 0;    ///< Σx where it first stalled
  double overflow_at = 0;   ///< the add at which Σ(x − mean)² became inf (0: never)
  /// Note that add i (from 0) left Σx at `sum_now`.
  void stalled(std::int64_t i, float sum_now) {
    if (stalled_adds++ == 0) {
      first_stall = static_cast<double>(i + 1);
      stalled_at = sum_now;
    }
  }
  /// Note that add i (from 0) made Σ(x − mean)² inf.
  void overflowed(std::int64_t i) {
    if (overflow_at == 0) overflow_at = static_cast<double>(i + 1);
  }
};

/// LayerNorm over each row as a half-precision kernel with fp16 accumulators
/// computes it: Σx for the mean, then Σ(x − mean)², every intermediate
/// rounded to fp16. It exists only as this pitfall.
Normalized naive_fp16_layer_norm(const std::vector<float>& x, const norm_math::Layout& l, double eps,
                                 std::vector<Accumulation>& acc) {
  Normalized r{std::vector<float>(x.size()), std::vector<float>(static_cast<std::size_t>(l.channels)),
               std::vector<float>(static_cast<std::size_t>(l.channels))};
  acc.assign(static_cast<std::size_t>(l.channels), Accumulation{});
  const auto d = static_cast<float>(l.inner);
  for (std::int64_t row = 0; row < l.channels; ++row) {
    const float* v = x.data() + l.offset(0, row, 0);
    Accumulation& a = acc[static_cast<std::size_t>(row)];
    //! [layernorm-fp16-accumulation-broken]
    float sum = 0;  // an fp16 accumulator: rounded after every add
    for (std::int64_t i = 0; i < l.inner; ++i) {
      const float next = h(sum + v[i]);
      if (next == sum) a.stalled(i, sum);  // v[i] rounded away
      sum = next;
    }
    const float mean = h(sum / d);
    float sum_sq = 0;
    for (std::int64_t i = 0; i < l.inner; ++i) {
      const float dev = h(v[i] - mean);
      sum_sq = h(sum_sq + h(dev * dev));  // inf once it passes 65504
      if (std::isinf(sum_sq)) a.overflowed(i);
    }
    const float rstd = h(1.0f / h(std::sqrt(h(h(sum_sq / d) + h(static_cast<float>(eps))))));
    //! [layernorm-fp16-accumulation-broken]
    for (std::int64_t i = 0; i < l.inner; ++i)
      r.y[static_cast<std::size_t>(l.offset(0, row, i))] = h(h(v[i] - mean) * rstd);
    r.mean[static_cast<std::size_t>(row)] = mean;
    r.rstd[static_cast<std::size_t>(row)] = rstd;
  }
  return r;
}

RunResult accumulation_broken() {
  std::vector<Accumulation> acc;
  const Normalized r = naive_fp16_layer_norm(activations(), layout(), kEps, acc);
  RunResult out = accumulation_outcomes(
      r,
      "two rows of 4096 fp16 activations (near 0.7, std 0.05; around 0, std 8) through a LayerNorm whose "
      "sums are fp16 accumulators");
  const Accumulation& a = acc[0];
  const Accumulation& b = acc[1];
  const double largest = [] {
    double m = 0;
    for (std::int64_t i = 0; i < kFeatures; ++i) m = std::max(m, static_cast<double>(activations()[i]));
    return m;
  }();
  out.explanation = "It stalls: row 0's Σx stops at " + num(a.stalled_at) + " at add " + num(a.first_stall) +
                    " of " + num(static_cast<double>(kFeatures)) + ": there fp16's spacing is " +
                    num(fp16_ulp(a.stalled_at)) +
                    ", half of it is more than any of the row's values (at most " + num(largest) + "), and " +
                    num(a.stalled_adds) + " adds round back to the same sum; the mean comes out " +
                    num(out.get("offset_row_mean")) + " instead of " + num(out.get("offset_row_mean_fp64")) +
                    ". It overflows: row 1's Σ(x − mean)² (" + num(out.get("wide_row_sum_sq_fp64")) +
                    " in FP64) passes " + num(limits_of(format_of(DType::f16).spec).max) + " at add " +
                    num(b.overflow_at) + " and is inf; 1/√inf = 0, and the row normalizes to all zeros.";
  return out;
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult accumulation_fixed() {
  const std::vector<float>& x = activations();
  const auto f16 = uniform_policy(DType::f16);
  Context ctx(f16);
  const Tensor input = Tensor::from_f32(x.data(), {layout().channels, kFeatures}, DType::f16);
  LayerNorm::Options o;
  o.eps = kEps;
  o.elementwise_affine = false;  // the normalization alone, as in the broken run
  //! [layernorm-fp16-accumulation-fixed]
  LayerNorm ln({kFeatures}, o);
  ln.apply_policy(*f16);                    // an fp16 model: fp16 in, fp16 out
  const Tensor y = ln.forward(input, ctx);  // statistics of the widened row: double sums, FP32 results
  //! [layernorm-fp16-accumulation-fixed]
  Normalized r{std::vector<float>(x.size()), std::vector<float>(2), std::vector<float>(2)};
  y.to_f32(r.y.data());
  ln.mean().to_f32(r.mean.data());
  ln.rstd().to_f32(r.rstd.data());
  RunResult out = accumulation_outcomes(
      r, "the same rows through the library's LayerNorm (uniform f16 policy: FP32 statistics)");
  const auto sum = static_cast<float>(out.get("offset_row_sum_fp64"));
  out.explanation = "FP32's spacing at " + num(sum) + " is " + num(std::nextafter(sum, 2 * sum) - sum) +
                    " and its largest value " + num(limits_of(format_of(DType::f32).spec).max) +
                    "; the library sums the widened values in double and rounds the mean into FP32: it is " +
                    num(out.get("offset_row_mean")) + ", the wide row's Σ(x − mean)² " +
                    num(out.get("wide_row_sum_sq")) + ", every output within " +
                    num(out.get("worst_error_ulps")) + " fp16 ulp of the FP64 normalization.";
  return out;
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult accumulation_outcomes(const Normalized& r, std::string setup) {
  const std::vector<float>& x = activations();
  const Fp64Stats ref = fp64_statistics(x, layout());
  const OutputErrors e = compare_outputs(r.y, fp64_normalize(x, layout(), ref, kEps), layout());
  const auto d = static_cast<double>(kFeatures);
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"features", d, "values per row"},
      {"offset_row_mean", r.mean[0], "the mean row 0 was normalized with"},
      {"offset_row_mean_fp64", ref.mean[0], "its FP64 mean"},
      {"offset_row_sum_fp64", ref.mean[0] * d, "its FP64 Σx"},
      {"wide_row_sum_sq", variance_from_invstd(r.rstd[1], kEps) * d,
       "row 1's Σ(x − mean)² as the run used it (variance · features)"},
      {"wide_row_sum_sq_fp64", ref.var[1] * d, "its FP64 value"},
      {"collapsed_rows", e.collapsed, "rows normalized to all zeros"},
      {"nonfinite_outputs", e.nan + e.inf, "outputs that are inf or NaN"},
      {"outputs_off", e.off, "outputs more than one fp16 ulp (at max(|y|, 1)) from the FP64 normalization"},
      {"worst_error_ulps", e.worst_ulps, "the largest error, in those ulps"},
  };
  return out;
}

}  // namespace layernorm_fp16_accumulation
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall layernorm_fp16_accumulation_pitfall() {
  using namespace layernorm_fp16_accumulation;
  return Pitfall{
      "layernorm-fp16-accumulation",
      3,
      "LayerNorm over 4096 features with fp16 accumulators: the sums stall or overflow",
      "An fp16 accumulator rounds after every add: a sum of 4096 values near 0.7 stalls at 2048, where half "
      "fp16's spacing (1) is more than any value added, and a sum of 4096 squares of size 64 passes 65504 "
      "and "
      "is inf (the variance is inf, 1/√(var + eps) = 0, the row normalizes to 0). Accumulate the statistics "
      "in FP32 or wider, as the library's LayerNorm does (double sums of the widened fp16 values, rounded "
      "into "
      "FP32).",
      accumulation_broken,
      accumulation_fixed,
      {
          check("the offset row's mean is off by more than 10%",
                [](const RunResult& r) {
                  return !within(r.get("offset_row_mean"), r.get("offset_row_mean_fp64"), 0.1);
                }),
          check("the wide row's Σ(x − mean)² is inf",
                [](const RunResult& r) { return std::isinf(r.get("wide_row_sum_sq")); }),
          check("a row was normalized to all zeros",
                [](const RunResult& r) { return r.get("collapsed_rows") > 0; }),
          check("most outputs are more than one fp16 ulp (at max(|y|, 1)) off",
                [](const RunResult& r) { return r.get("outputs_off") > r.get("features"); }),
      },
      {
          check("the offset row's mean within 1e-5 of FP64's (relative)",
                [](const RunResult& r) {
                  return within(r.get("offset_row_mean"), r.get("offset_row_mean_fp64"), 1e-5);
                }),
          check("the wide row's Σ(x − mean)² within 1e-5 of FP64's (relative)",
                [](const RunResult& r) {
                  return within(r.get("wide_row_sum_sq"), r.get("wide_row_sum_sq_fp64"), 1e-5);
                }),
          check("every output within one fp16 ulp (at max(|y|, 1)) of the FP64 normalization",
                [](const RunResult& r) { return r.get("outputs_off") == 0; }),
      },
      {}};
}

}  // namespace mpt::ch03
