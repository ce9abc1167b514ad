// Chapter 04 — pitfall attention-scale-overflow: Q Kᵀ stored in fp16 before the 1/√D
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/core/context.hpp, mpt/core/policy.hpp (uniform_policy),
// mpt/core/tensor.hpp, mpt/nn/attention.hpp (scaled_dot_product_attention,
// AttentionOptions::scale_q_first); <algorithm>, <cmath>, <cstddef>,
// <cstdint>, <string>, <utility>, <vector>.
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
#include "mpt/nn/attention.hpp"

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

/// q, k [1, 2, 8, 128]: a shared offset c·(1, …, 1) plus N(0, 1) noise, the
/// offset growing from token to token (c from 8 to 29 for queries, 10 to 27.5
/// for keys); v ~ N(0, 1). Every value rounded to fp16.
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
          r.q[e] += 8.0f + 3.0f * static_cast<float>(i);
          r.k[e] += 10.0f + 2.5f * static_cast<float>(i);
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

/// The outcomes of both runs (defined after the runs); `why` is the run's explanation.
RunResult scale_outcomes(const AttentionResult& a, std::string setup, std::string why);

/// The largest |q·k| of inputs() in FP64, unscaled.
double fp64_max_product() {
  const Inputs& in = inputs();
  double m = 0;
  for (std::int64_t hd = 0; hd < kHeads; ++hd)
    for (std::int64_t i = 0; i < kLen; ++i)
      for (std::int64_t j = 0; j < kLen; ++j) {
        double s = 0;
        for (std::int64_t c = 0; c < kDim; ++c)
          s += static_cast<double>(in.q[static_cast<std::size_t>((hd * kLen + i) * kDim + c)]) *
               in.k[static_cast<std::size_t>((hd * kLen + j) * kDim + c)];
        m = std::max(m, std::fabs(s));
      }
  return m;
}

// ---------------------------------------------------------------------------
// The broken run.

RunResult scale_broken() {
  AttentionOptions o;
  //! [attention-scale-overflow-broken]
  o.scale_q_first = false;  // S = Q Kᵀ stored in fp16, then S·(1/√D) in FP32: too late
  //! [attention-scale-overflow-broken]
  const AttentionResult a = attend(o);
  const double raw = fp64_max_product();
  const std::string why =
      "The largest product q·k is " + num(raw) + " (FP64), past fp16's " + num(fp16_max()) +
      ": stored before the scale it is inf, and inf·(1/√" + std::to_string(kDim) +
      ") is still inf. Its row's softmax is exp(inf − inf) = NaN, and so is the row's output; "
      "scaled, the same score would have been " +
      num(raw / std::sqrt(static_cast<double>(kDim))) + ".";
  return scale_outcomes(a,
                        "2 heads of 8 tokens, D = 128, fp16 activations with a shared offset of 8 to 29; the "
                        "library's attention with Q Kᵀ stored unscaled in fp16",
                        why);
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult scale_fixed() {
  AttentionOptions o;
  //! [attention-scale-overflow-fixed]
  o.scale_q_first = true;  // Q·(1/√D) in FP32, rounded into fp16, then S = (Q/√D) Kᵀ: the final size
  //! [attention-scale-overflow-fixed]
  const AttentionResult a = attend(o);
  const std::string why = "Q is scaled first, so the stored scores are at most " +
                          num(fp64_max_product() / std::sqrt(static_cast<double>(kDim))) +
                          ", well inside fp16; the softmax subtracts the row's maximum in FP32.";
  return scale_outcomes(
      a,
      "the same activations through the library's attention with Q scaled before the product "
      "(scale_q_first, the default)",
      why);
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult scale_outcomes(const AttentionResult& a, std::string setup, std::string why) {
  const Inputs& in = inputs();
  const std::vector<float> scores = values_of(a.scores), out = values_of(a.out);
  double inf_scores = 0, nan_rows = 0;
  for (const float s : scores) inf_scores += std::isinf(s);
  for (std::int64_t row = 0; row < kHeads * kLen; ++row) {
    bool any = false;
    for (std::int64_t c = 0; c < kDim; ++c)
      any = any || std::isnan(out[static_cast<std::size_t>(row * kDim + c)]);
    nan_rows += any;
  }
  const double raw = fp64_max_product();
  const Errors err =
      compare(out, fp64_attention(in.q, in.k, in.v, dims(), 1.0 / std::sqrt(static_cast<double>(kDim))));
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"max_product_fp64", raw, "the largest |q·k|, unscaled, in FP64"},
      {"max_score_fp64", raw / std::sqrt(static_cast<double>(kDim)), "the largest |q·k|/√D in FP64"},
      {"inf_scores", inf_scores, "stored scores that are inf"},
      {"nan_output_rows", nan_rows, "rows of the output with a NaN"},
      {"output_max_error", err.max_error,
       "the largest |out − out_fp64| (inf when some output is not finite)"},
      {"output_worst_ulps", err.worst_ulps, "the same in fp16 ulps at out_fp64"},
  };
  r.explanation = std::move(why);
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
      "their final size, and keep the softmax in FP32, as the library's attention does by default.",
      scale_broken,
      scale_fixed,
      {
          check("stored scores that are inf", [](const RunResult& r) { return r.get("inf_scores") > 0; }),
          check("NaN rows of the output", [](const RunResult& r) { return r.get("nan_output_rows") > 0; }),
      },
      {
          check("every output within one fp16 ulp of FP64's",
                [](const RunResult& r) { return r.get("output_worst_ulps") <= 1; }),
      },
      {
          check("the raw products pass 65504",
                [](const RunResult& r) { return r.get("max_product_fp64") > 65504; }),
          check("the scaled scores fit fp16",
                [](const RunResult& r) { return r.get("max_score_fp64") < 65504; }),
      }};
}

}  // namespace mpt::ch04
