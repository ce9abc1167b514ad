// Chapter 04 — pitfall attention-scale-overflow: Q Kᵀ stored in fp16 before the 1/√D
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/core/context.hpp, mpt/core/policy.hpp (uniform_policy),
// mpt/core/tensor.hpp, mpt/nn/layers/attention.hpp (scaled_dot_product_attention,
// AttentionOptions::scale_q_first); <algorithm>, <cmath>, <cstddef>,
// <cstdint>, <limits>, <string>, <utility>, <vector>.
//
// An attention score is a dot product of D products: with D = 128 and
// activations of a few tens (an outlier feature every token shares) the raw
// Q Kᵀ reaches 10^5, past fp16's 65504, while the scaled score Q Kᵀ/√D is
// √128 ≈ 11.3 times smaller and fits. Stored in fp16 before the scale, the
// product is inf, the FP32 multiply by 1/√D leaves it inf, and a row holding
// +inf has the softmax exp(inf − inf) = NaN: the whole row of the output is
// NaN. Multiplying Q by the scale first (PyTorch's math backend scales
// before the product, splitting √scale between Q and K, "for stability":
// _scaled_dot_product_attention_math in
// aten/src/ATen/native/transformers/attention.cpp) stores scores of the
// final magnitude. The library's attention does that by default
// (AttentionOptions::scale_q_first) and keeps its softmax in FP32.
//
// Scaling first rounds Q·(1/√D) into fp16, one rounding more than the
// unscaled product, and the scores, probabilities and outputs are stored in
// fp16 either way: the fix has a precision cost, and the runs measure it
// against FP64 on a second head of ordinary activations, whose softmax is
// spread over several keys (a one-hot row returns one value exactly, and
// shows no error whatever its scores' errors). The cure check holds every
// output to a bound on what those roundings allow (attention_error_bound).
// A row that overflows unscaled has scaled scores above 65504/√128 ≈ 5790,
// where fp16's spacing is 4: scaling first makes such a row finite, and its
// softmax is right only because its scores lie far more than 4 apart (here
// the outlier head's rows are one-hot).
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
#include "mpt/nn/layers/attention.hpp"

namespace mpt::ch04 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace attention_scale_overflow {

// ---------------------------------------------------------------------------
// The activations both runs attend over, and what a run measures.

constexpr std::int64_t kHeads = 2;
constexpr std::int64_t kLen = 8;
constexpr std::int64_t kDim = 128;

/// The ordinary head's spread: q, k ~ N(0, 1.2²), so q·k/√D ~ N(0, 1.2⁴):
/// scores a few units apart, a softmax over several keys.
constexpr double kOrdinaryStd = 1.2;

/// q, k [1, 2, 8, 128]. Head 0, the outlier head: a shared offset
/// c·(1, …, 1) plus N(0, 1) noise, the offset growing from token to token (c
/// from 8 to 29 for queries, 10 to 27.5 for keys). Head 1, ordinary:
/// N(0, 1.2²). v ~ N(0, 1). Every value rounded to fp16.
struct Inputs {
  std::vector<float> q, k, v;
};
const Inputs& inputs() {
  static const Inputs in = [] {
    const std::int64_t n = kHeads * kLen * kDim;
    Inputs r{normal_values(n, 0, 1, 409), normal_values(n, 0, 1, 410), normal_values(n, 0, 1, 411)};
    for (std::int64_t hd = 0; hd < kHeads; ++hd)
      for (std::int64_t i = 0; i < kLen; ++i)
        for (std::int64_t c = 0; c < kDim; ++c) {
          const auto e = static_cast<std::size_t>((hd * kLen + i) * kDim + c);
          if (hd == 0) {
            r.q[e] += 8.0f + 3.0f * static_cast<float>(i);
            r.k[e] += 10.0f + 2.5f * static_cast<float>(i);
          } else {
            r.q[e] *= static_cast<float>(kOrdinaryStd);
            r.k[e] *= static_cast<float>(kOrdinaryStd);
          }
        }
    r.q = rounded_to_fp16(std::move(r.q));
    r.k = rounded_to_fp16(std::move(r.k));
    r.v = rounded_to_fp16(std::move(r.v));
    return r;
  }();
  return in;
}

AttentionDims dims() { return {kHeads, kLen, kLen, kDim, kDim}; }

/// The library's attention over inputs() with options o.
AttentionResult attend(const AttentionOptions& o) {
  const Inputs& in = inputs();
  Context ctx(uniform_policy(DType::f16));
  const Shape shape{1, kHeads, kLen, kDim};
  const Tensor q = Tensor::from_f32(in.q.data(), shape, DType::f16);
  const Tensor k = Tensor::from_f32(in.k.data(), shape, DType::f16);
  const Tensor v = Tensor::from_f32(in.v.data(), shape, DType::f16);
  return scaled_dot_product_attention(q, k, v, AttentionMask{}, o, ctx);
}

/// The outcomes of both runs (defined after the runs).
RunResult scale_outcomes(const AttentionResult& a, const AttentionOptions& o, std::string setup);

/// The scaled scores q·k/√D of inputs() in FP64, [2, 8, 8].
std::vector<double> fp64_scores() {
  const Inputs& in = inputs();
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  std::vector<double> s(static_cast<std::size_t>(kHeads * kLen * kLen));
  for (std::int64_t hd = 0; hd < kHeads; ++hd)
    for (std::int64_t i = 0; i < kLen; ++i)
      for (std::int64_t j = 0; j < kLen; ++j) {
        double dot = 0;
        for (std::int64_t c = 0; c < kDim; ++c)
          dot += static_cast<double>(in.q[static_cast<std::size_t>((hd * kLen + i) * kDim + c)]) *
                 in.k[static_cast<std::size_t>((hd * kLen + j) * kDim + c)];
        s[static_cast<std::size_t>((hd * kLen + i) * kLen + j)] = dot * scale;
      }
  return s;
}

// ---------------------------------------------------------------------------
// The broken run.

RunResult scale_broken() {
  AttentionOptions o;
  //! [attention-scale-overflow-broken]
  o.scale_q_first = false;  // S = Q Kᵀ stored in fp16, then S·(1/√D) in FP32: too late
  //! [attention-scale-overflow-broken]
  RunResult r =
      scale_outcomes(attend(o), o,
                     "2 heads of 8 tokens, D = 128, fp16 activations: head 0 with a shared offset of "
                     "8 to 29 (an outlier feature), head 1 ordinary (N(0, 1.44)); the library's "
                     "attention with Q Kᵀ stored unscaled in fp16");
  r.explanation =
      "The largest product q·k is " + num(r.get("max_product_fp64")) + " (FP64), past fp16's " +
      num(fp16_max()) + ": stored before the scale " + num(r.get("inf_scores")) +
      " products are inf, and inf·(1/√" + std::to_string(kDim) +
      ") is still inf. Their rows' softmax is exp(inf − inf) = NaN, and so are " +
      num(r.get("nan_output_rows")) + " rows of the output; scaled, the largest score would have been " +
      num(r.get("max_score_fp64")) + ". The ordinary head's products fit: its largest output error is " +
      num(r.get("ordinary_error_to_bound")) + " times its rounding bound.";
  return r;
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult scale_fixed() {
  AttentionOptions o;
  //! [attention-scale-overflow-fixed]
  o.scale_q_first = true;  // Q·(1/√D) in FP32, rounded into fp16, then S = (Q/√D) Kᵀ: the final size
  //! [attention-scale-overflow-fixed]
  RunResult r =
      scale_outcomes(attend(o), o,
                     "the same activations through the library's attention with Q scaled before the "
                     "product (scale_q_first, the default)");
  const double top = r.get("max_score_fp64");
  r.explanation =
      "Q is scaled first, so the stored scores are at most " + num(top) + ", inside fp16; " +
      num(r.get("inf_scores")) + " are inf and " + num(r.get("nan_output_rows")) +
      " rows NaN. The cost is one rounding of Q·(1/√D) more: on the ordinary head, whose rows spread "
      "their weight (the largest probability " +
      num(r.get("ordinary_top_probability")) + "), the largest output error is " +
      num(r.get("ordinary_error_to_bound")) +
      " times its rounding bound, which counts that rounding. The outlier head's scores lie where fp16's "
      "spacing is " +
      num(fp16_ulp(top)) + ", but its rows' two largest scores are at least " +
      num(r.get("outlier_rows_min_gap")) + " apart: one-hot, whatever the roundings.";
  return r;
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult scale_outcomes(const AttentionResult& a, const AttentionOptions& o, std::string setup) {
  const Inputs& in = inputs();
  const std::vector<float> scores = values_of(a.scores), out = values_of(a.out),
                           probs = values_of(a.saved.probs);
  double inf_scores = 0, nan_rows = 0;
  for (const float s : scores) inf_scores += std::isinf(s);
  for (std::int64_t row = 0; row < kHeads * kLen; ++row) {
    bool any = false;
    for (std::int64_t c = 0; c < kDim; ++c)
      any = any || std::isnan(out[static_cast<std::size_t>(row * kDim + c)]);
    nan_rows += any;
  }
  // The ordinary head (1): the largest stored probability of any of its rows.
  double top_p = 0;
  for (std::int64_t e = kLen * kLen; e < kHeads * kLen * kLen; ++e)
    top_p = std::isnan(probs[static_cast<std::size_t>(e)])
                ? 1.0
                : std::max(top_p, static_cast<double>(probs[static_cast<std::size_t>(e)]));
  // The outlier head (0): the smallest gap between a row's two largest scores.
  const std::vector<double> s64 = fp64_scores();
  double gap = std::numeric_limits<double>::infinity(), raw = 0;
  for (std::int64_t row = 0; row < kLen; ++row) {
    std::vector<double> row_scores(s64.begin() + row * kLen, s64.begin() + (row + 1) * kLen);
    std::sort(row_scores.rbegin(), row_scores.rend());
    gap = std::min(gap, row_scores[0] - row_scores[1]);
  }
  for (const double v : s64) raw = std::max(raw, std::fabs(v) * std::sqrt(static_cast<double>(kDim)));
  // Against FP64, and against what the run's roundings allow: Q·(1/√D) (when
  // scaled first), the scores, the probabilities and the outputs stored in
  // fp16, FP32 sums.
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  const std::vector<double> ref = fp64_attention(in.q, in.k, in.v, dims(), scale);
  AttentionRounding rounding;
  rounding.q_scaled = o.scale_q_first;
  rounding.scores = true;
  rounding.scores_unscaled = !o.scale_q_first;
  rounding.probs = true;
  rounding.out = true;
  const std::vector<double> bound = attention_error_bound(in.q, in.k, in.v, dims(), scale, rounding);
  std::vector<std::uint8_t> ordinary(out.size(), 0);
  std::fill(ordinary.begin() + kLen * kDim, ordinary.end(), 1);
  const Errors err = compare(out, ref);
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"max_product_fp64", raw, "the largest |q·k|, unscaled, in FP64"},
      {"max_score_fp64", raw * scale, "the largest |q·k|/√D in FP64"},
      {"inf_scores", inf_scores, "stored scores that are inf"},
      {"nan_output_rows", nan_rows, "rows of the output with a NaN"},
      {"output_max_error", err.max_error,
       "the largest |out − out_fp64| (inf when some output is not finite)"},
      {"output_error_to_bound", error_to_bound(out, ref, bound),
       "the largest |out − out_fp64| / its rounding bound (inf: not finite)"},
      {"ordinary_error_to_bound", error_to_bound(out, ref, bound, ordinary), "the same on the ordinary head"},
      {"ordinary_top_probability", top_p, "the ordinary head: the largest stored probability of a row"},
      {"outlier_rows_min_gap", gap,
       "the outlier head: the smallest gap between a row's two largest scores (FP64)"},
  };
  return r;
}

}  // namespace attention_scale_overflow
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall attention_scale_overflow_pitfall() {
  using namespace attention_scale_overflow;
  return Pitfall{
      "attention-scale-overflow",
      4,
      "Q Kᵀ stored in fp16 before the 1/√D: large activations overflow to inf and the row is NaN",
      "With D = 128 and activations of a few tens, a dot product q·k passes 65504 although q·k/√D fits: "
      "stored in fp16 before the scale it is inf, the scale cannot undo it, and the row's softmax is "
      "exp(inf − inf) = NaN. Scale Q before the product (in FP32, then round), so the stored scores have "
      "their final size, and keep the softmax in FP32, as the library's attention does by default; the "
      "extra rounding of Q costs no more than the bound the scores' own fp16 rounding sets.",
      scale_broken,
      scale_fixed,
      {
          check("stored scores that are inf", [](const RunResult& r) { return r.get("inf_scores") > 0; }),
          check("NaN rows of the output", [](const RunResult& r) { return r.get("nan_output_rows") > 0; }),
      },
      {
          check("no stored score is inf", [](const RunResult& r) { return r.get("inf_scores") == 0; }),
          check("every output within its rounding bound of FP64's",
                [](const RunResult& r) { return r.get("output_error_to_bound") <= 1; }),
      },
      {
          check("the ordinary head's rows spread their weight: none puts more than 0.9 on one key",
                [](const RunResult& r) { return r.get("ordinary_top_probability") <= 0.9; }),
          check("on the ordinary head the output is within its rounding bound of FP64's",
                [](const RunResult& r) { return r.get("ordinary_error_to_bound") <= 1; }),
      }};
}

}  // namespace mpt::ch04
