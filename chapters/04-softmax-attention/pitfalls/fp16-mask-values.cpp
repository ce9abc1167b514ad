// Chapter 04 — pitfall fp16-mask-values: additive attention masks in fp16, and fully masked rows
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/core/context.hpp, mpt/core/policy.hpp (uniform_policy),
// mpt/core/tensor.hpp, mpt/nn/attention.hpp (scaled_dot_product_attention,
// AttentionMask), mpt/nn/softmax.hpp (softmax); <algorithm>, <cmath>,
// <cstddef>, <cstdint>, <limits>, <string>, <utility>, <vector>.
//
// A hand-written attention removes positions by adding a large negative
// number to their scores: (1 − keep)·(−1e9), or the dtype's lowest value
// (torch.finfo(dtype).min). In fp16 −1e9 is stored as −inf, and a row in
// which every key is removed — a left-padded sequence under a causal mask
// gives such rows — is softmax(−inf, …, −inf) = exp(−inf − (−inf)) / … =
// NaN; the NaN reaches the output and, through the backward pass, every
// parameter. finfo(fp16).min = −65504 is finite, but two masks added in
// fp16 (causal plus padding) give −131008, stored as −inf, and so does a
// score below −16 plus −65504. Keras picks −3e4 for float16
// (keras/src/layers/activations/softmax.py, _large_negative_number; −1e9
// otherwise): twice −3e4 still fits, and a fully masked row is finite — but
// it attends, with weight 1, to keys it was meant not to see. PyTorch's
// scaled_dot_product_attention takes a boolean mask (true: take part), and
// its math backend returns 0 for a fully masked row (_safe_softmax in
// aten/src/ATen/native/transformers/attention.cpp); the library's
// attention does the same and documents it (attention.hpp).
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
#include "mpt/nn/attention.hpp"
#include "mpt/nn/softmax.hpp"

namespace mpt::ch04 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace fp16_mask_values {

// ---------------------------------------------------------------------------
// The batch both runs attend over, and what a run measures.

constexpr std::int64_t kBatch = 2;
constexpr std::int64_t kLen = 6;
constexpr std::int64_t kDim = 16;
constexpr std::int64_t kPad = 2;  // sequence 0 is left-padded by 2 tokens

/// The batch: fp16 q, k [2, 1, 6, 16] (N(0, 4²)), v (N(0, 1)), and which
/// keys each query may see: causal, and never a padding token.
struct Inputs {
  std::vector<float> q, k, v;
  std::vector<std::uint8_t> causal, padding, keep;  ///< [2, 6, 6]: 1 = the key takes part
};
const Inputs& inputs() {
  static const Inputs in = [] {
    Inputs r{rounded_to_fp16(normal_values(kBatch * kLen * kDim, 0, 4, 406)),
             rounded_to_fp16(normal_values(kBatch * kLen * kDim, 0, 4, 407)),
             rounded_to_fp16(normal_values(kBatch * kLen * kDim, 0, 1, 408)),
             {},
             {},
             {}};
    for (std::int64_t b = 0; b < kBatch; ++b)
      for (std::int64_t i = 0; i < kLen; ++i)
        for (std::int64_t j = 0; j < kLen; ++j) {
          const bool causal = j <= i, real = !(b == 0 && j < kPad);
          r.causal.push_back(causal);
          r.padding.push_back(real);
          r.keep.push_back(causal && real);
        }
    return r;
  }();
  return in;
}

AttentionDims dims() { return {kBatch, kLen, kLen, kDim, kDim}; }
double scale() { return 1.0 / std::sqrt(static_cast<double>(kDim)); }

/// The scaled scores Q Kᵀ/√D, FP32 products rounded into fp16 [2, 6, 6].
std::vector<float> fp16_scores() {
  const Inputs& in = inputs();
  std::vector<float> s(static_cast<std::size_t>(kBatch * kLen * kLen));
  for (std::int64_t b = 0; b < kBatch; ++b)
    for (std::int64_t i = 0; i < kLen; ++i)
      for (std::int64_t j = 0; j < kLen; ++j) {
        float dot = 0;
        for (std::int64_t c = 0; c < kDim; ++c)
          dot += in.q[static_cast<std::size_t>((b * kLen + i) * kDim + c)] *
                 in.k[static_cast<std::size_t>((b * kLen + j) * kDim + c)];
        s[static_cast<std::size_t>((b * kLen + i) * kLen + j)] = h(dot * static_cast<float>(scale()));
      }
  return s;
}

/// P V in FP32 per row, P [2, 6, 6] (NaN propagates).
std::vector<float> times_v(const std::vector<float>& p) {
  const Inputs& in = inputs();
  std::vector<float> o(static_cast<std::size_t>(kBatch * kLen * kDim), 0.0f);
  for (std::int64_t b = 0; b < kBatch; ++b)
    for (std::int64_t i = 0; i < kLen; ++i)
      for (std::int64_t j = 0; j < kLen; ++j)
        for (std::int64_t c = 0; c < kDim; ++c)
          o[static_cast<std::size_t>((b * kLen + i) * kDim + c)] +=
              p[static_cast<std::size_t>((b * kLen + i) * kLen + j)] *
              in.v[static_cast<std::size_t>((b * kLen + j) * kDim + c)];
  return rounded_to_fp16(std::move(o));
}

/// softmax(t) of fp16 scores t [2, 6, 6] through the library's softmax
/// (a fully −inf row is NaN, as torch.softmax).
std::vector<float> plain_softmax(const std::vector<float>& t) {
  Context ctx(uniform_policy(DType::f16));
  return values_of(softmax(Tensor::from_f32(t.data(), {kBatch, 1, kLen, kLen}, DType::f16), ctx));
}

/// What one run measured.
struct MaskRun {
  std::vector<float> probs, out;   ///< recipe A (−1e9 or boolean): P [2, 6, 6] and the output [2, 6, 16]
  double summed_mask_inf = 0;      ///< recipe B: entries of the combined finfo.min mask that are −inf
  double score_plus_mask_inf = 0;  ///< recipe B: a finite mask entry plus its score that is −inf
};

/// The outcomes of both runs (defined after the runs); `why` is the run's explanation.
RunResult mask_outcomes(const MaskRun& r, std::string setup, std::string why);

// ---------------------------------------------------------------------------
// The broken run.

constexpr float kLowest16 = -65504.0f;  // torch.finfo(torch.float16).min

MaskRun mask_broken() {
  const Inputs& in = inputs();
  const std::vector<float> s = fp16_scores();
  MaskRun r;
  // Recipe A: one mask of −1e9, stored in fp16, added in fp16, softmax.
  std::vector<float> t(s.size());
  for (std::size_t e = 0; e < s.size(); ++e) {
    //! [fp16-mask-values-broken]
    const float mask = h(in.keep[e] ? 0.0f : -1e9f);  // −1e9 in fp16 is −inf
    t[e] = h(s[e] + mask);                            // a fully masked row: −inf everywhere
    //! [fp16-mask-values-broken]
  }
  r.probs = plain_softmax(t);  // exp(−inf − (−inf)) = NaN
  r.out = times_v(r.probs);
  // Recipe B: a causal and a padding mask of finfo(fp16).min, added in fp16.
  for (std::size_t e = 0; e < s.size(); ++e) {
    const float mask = h(h(in.causal[e] ? 0.0f : kLowest16) + h(in.padding[e] ? 0.0f : kLowest16));
    r.summed_mask_inf += std::isinf(mask);
    if (!std::isinf(mask) && std::isinf(h(s[e] + mask))) r.score_plus_mask_inf += 1;
  }
  return r;
}

RunResult mask_broken_result() {
  const MaskRun r = mask_broken();
  const std::string why =
      "−1e9 is stored in fp16 as " + num(h(-1e9f)) + ", and the " + std::to_string(kPad) +
      " first queries of the left-padded sequence see only padding: softmax of a row of −inf is NaN, and "
      "so is that row's output. finfo(fp16).min + finfo(fp16).min = " +
      num(2.0 * kLowest16) + " is stored as " + num(h(2 * kLowest16)) +
      " (mask entries: " + num(r.summed_mask_inf) +
      "), and a score of −16 or below plus finfo.min rounds past −65504 to −inf too (entries: " +
      num(r.score_plus_mask_inf) + "). −3e4 + −3e4 = " + num(h(-6e4f)) +
      " stays finite, so Keras's constant gives no NaN.";
  return mask_outcomes(
      r,
      "2 sequences of 6 tokens (one left-padded by 2), one head of 16, fp16 scores; causal and "
      "padding masks added in fp16: −1e9, and finfo(fp16).min twice; torch.softmax",
      why);
}

// ---------------------------------------------------------------------------
// The fixed run.

MaskRun mask_fixed() {
  const Inputs& in = inputs();
  Context ctx(uniform_policy(DType::f16));
  const Shape shape{kBatch, 1, kLen, kDim};
  const Tensor q = Tensor::from_f32(in.q.data(), shape, DType::f16);
  const Tensor k = Tensor::from_f32(in.k.data(), shape, DType::f16);
  const Tensor v = Tensor::from_f32(in.v.data(), shape, DType::f16);
  //! [fp16-mask-values-fixed]
  const AttentionMask keep = AttentionMask::boolean({kBatch, 1, kLen, kLen}, in.keep);  // true: take part
  const AttentionResult a = scaled_dot_product_attention(q, k, v, keep, AttentionOptions{}, ctx);
  //! [fp16-mask-values-fixed]
  MaskRun r;
  r.probs = values_of(a.saved.probs);
  r.out = values_of(a.out);
  // Recipe B, fixed: the masks combined as booleans, finfo.min added once, in FP32.
  const std::vector<float> s = fp16_scores();
  for (std::size_t e = 0; e < s.size(); ++e) {
    const float mask = in.keep[e] ? 0.0f : kLowest16;
    r.summed_mask_inf += std::isinf(mask);
    if (std::isinf(s[e] + mask)) r.score_plus_mask_inf += 1;
  }
  return r;
}

RunResult mask_fixed_result() {
  const MaskRun r = mask_fixed();
  const std::string why =
      "A boolean mask gives a removed key the score −inf inside the softmax's FP32 pass, and a row with no "
      "key left gets probabilities and output 0 instead of NaN, as PyTorch's math backend (_safe_softmax). "
      "Combined as booleans the two masks never add two large negative numbers.";
  return mask_outcomes(r,
                       "the same batch through the library's scaled_dot_product_attention with the boolean "
                       "mask causal and not padding; the masks combined as booleans",
                       why);
}

// ---------------------------------------------------------------------------
// The outcomes.

/// Keras's float16 constant −3e4 for both masks, added in fp16; softmax:
/// NaN rows, and the weight the fully masked rows put on removed keys.
std::pair<double, double> keras_mask() {
  const Inputs& in = inputs();
  const std::vector<float> s = fp16_scores();
  std::vector<float> t(s.size());
  for (std::size_t e = 0; e < s.size(); ++e)
    t[e] = h(s[e] + h(h(in.causal[e] ? 0.0f : -3e4f) + h(in.padding[e] ? 0.0f : -3e4f)));
  const std::vector<float> p = plain_softmax(t);
  double nan_rows = 0, weight = 0, full = 0;
  for (std::int64_t row = 0; row < kBatch * kLen; ++row) {
    bool any_nan = false, any_kept = false;
    double w = 0;
    for (std::int64_t j = 0; j < kLen; ++j) {
      const auto e = static_cast<std::size_t>(row * kLen + j);
      any_nan = any_nan || std::isnan(p[e]);
      any_kept = any_kept || in.keep[e];
      if (!in.keep[e]) w += p[e];
    }
    nan_rows += any_nan;
    if (!any_kept) {
      weight += w;
      full += 1;
    }
  }
  return {nan_rows, weight / full};
}

RunResult mask_outcomes(const MaskRun& r, std::string setup, std::string why) {
  const Inputs& in = inputs();
  const double inf = std::numeric_limits<double>::infinity();
  double fully = 0, nan_prob = 0, nan_out = 0, masked_max = 0, fully_out = 0;
  for (std::int64_t row = 0; row < kBatch * kLen; ++row) {
    bool any_kept = false, p_nan = false, o_nan = false;
    double removed_max = 0;
    for (std::int64_t j = 0; j < kLen; ++j) {
      const auto e = static_cast<std::size_t>(row * kLen + j);
      any_kept = any_kept || in.keep[e];
      p_nan = p_nan || std::isnan(r.probs[e]);
      if (!in.keep[e]) removed_max = std::max(removed_max, static_cast<double>(r.probs[e]));
    }
    double out_max = 0;
    for (std::int64_t c = 0; c < kDim; ++c) {
      const float o = r.out[static_cast<std::size_t>(row * kDim + c)];
      o_nan = o_nan || std::isnan(o);
      out_max = std::isfinite(o) ? std::max(out_max, static_cast<double>(std::fabs(o))) : inf;
    }
    fully += !any_kept;
    nan_prob += p_nan;
    nan_out += o_nan;
    if (any_kept && !p_nan) masked_max = std::max(masked_max, removed_max);
    if (!any_kept) fully_out = std::max(fully_out, out_max);
  }
  const Errors err = compare(r.out, fp64_attention(in.q, in.k, in.v, dims(), scale(), in.keep));
  const auto [keras_nan, keras_weight] = keras_mask();
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"rows", static_cast<double>(kBatch * kLen), "query rows"},
      {"fully_masked_rows", fully, "rows in which no key takes part"},
      {"nan_probability_rows", nan_prob, "rows of probabilities with a NaN"},
      {"nan_output_rows", nan_out, "rows of the output with a NaN"},
      {"masked_probability_max", masked_max,
       "the largest probability of a removed key, in rows that keep one"},
      {"fully_masked_output_max", fully_out, "the largest |output| of a fully masked row (inf: not finite)"},
      {"output_max_error", err.max_error, "the largest |out − out_fp64| (fully masked rows: 0 in FP64)"},
      {"summed_mask_inf_entries", r.summed_mask_inf,
       "entries of the combined finfo(fp16).min mask that are −inf"},
      {"score_plus_mask_inf", r.score_plus_mask_inf, "scores that a finite mask entry turned into −inf"},
      {"minus_3e4_nan_rows", keras_nan, "with −3e4 for both masks (in fp16): rows with a NaN"},
      {"minus_3e4_removed_weight", keras_weight,
       "with −3e4: the probability a fully masked row puts on removed keys"},
  };
  out.explanation = std::move(why);
  return out;
}

}  // namespace fp16_mask_values
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall fp16_mask_values_pitfall() {
  using namespace fp16_mask_values;
  return Pitfall{
      "fp16-mask-values",
      4,
      "additive masks in fp16: −1e9 is −inf, finfo.min + finfo.min is −inf, and a fully masked row is NaN",
      "In fp16 a mask of −1e9 is stored as −inf, and finfo(fp16).min added to a second mask or to a "
      "negative score overflows to −inf: a row in which every key is removed is then exp(−inf − (−inf)) = "
      "NaN, in its probabilities and its output. Give attention a boolean mask (combined with and, never "
      "added), whose removed keys are −inf inside an FP32 softmax and whose fully masked rows are 0, as "
      "PyTorch's scaled_dot_product_attention and the library's attention do.",
      mask_broken_result,
      mask_fixed_result,
      {
          check("NaN rows of probabilities",
                [](const RunResult& r) { return r.get("nan_probability_rows") > 0; }),
          check("NaN rows of the output", [](const RunResult& r) { return r.get("nan_output_rows") > 0; }),
          check("finfo.min + finfo.min is −inf",
                [](const RunResult& r) { return r.get("summed_mask_inf_entries") > 0; }),
          check("a score plus finfo.min is −inf",
                [](const RunResult& r) { return r.get("score_plus_mask_inf") > 0; }),
      },
      {
          check("a fully masked row's output is 0",
                [](const RunResult& r) { return r.get("fully_masked_output_max") == 0; }),
          check("every output within 0.01 of FP64's",
                [](const RunResult& r) { return r.get("output_max_error") < 0.01; }),
          check("no mask entry and no masked score is −inf",
                [](const RunResult& r) {
                  return r.get("summed_mask_inf_entries") == 0 && r.get("score_plus_mask_inf") == 0;
                }),
      },
      {
          check("the batch has fully masked rows",
                [](const RunResult& r) { return r.get("fully_masked_rows") > 0; }),
          check("a removed key gets probability 0 in a row that keeps one",
                [](const RunResult& r) { return r.get("masked_probability_max") == 0; }),
          check("−3e4 gives no NaN, but fully masked rows attend to removed keys",
                [](const RunResult& r) {
                  return r.get("minus_3e4_nan_rows") == 0 && r.get("minus_3e4_removed_weight") > 0.99;
                }),
      }};
}

}  // namespace mpt::ch04
