// Chapter 04 — pitfall fp16-mask-values: additive attention masks stored and added in fp16
// Depends on: common.hpp (the chapter's helpers, the masked batch, this
// entry's declaration); <algorithm>, <cmath>, <cstddef>, <cstdint>,
// <limits>, <string>, <utility>, <vector>.
//
// A hand-written attention removes positions by adding a large negative
// number to their scores: (1 − keep)·(−1e9), or the dtype's lowest value
// (torch.finfo(dtype).min), often after casting the mask to the scores'
// dtype. In fp16 −1e9 is stored as −inf, and a row in which every key is
// removed — a left-padded sequence under a causal mask gives such rows — is
// −inf everywhere, and softmax(−inf, …, −inf) = exp(−inf − (−inf)) / … =
// NaN; the NaN reaches the output and, through the backward pass, every
// parameter. finfo(fp16).min = −65504 is finite, but two masks added in
// fp16 (causal plus padding) give −131008, stored as −inf, and so does a
// score below −16 plus −65504.
//
// The two runs differ in one thing: the dtype the masks are stored and
// added in. The broken run stores them in fp16 and adds them to the fp16
// scores in fp16; the fixed run keeps them in FP32 and adds them to the
// widened scores in FP32 (what PyTorch's type promotion does with an FP32
// mask and fp16 scores). Both take the same plain softmax in FP32 (torch's,
// which autocast runs in FP32) and the same P V. In FP32 −1e9 and −131008 are
// finite: a fully masked row is finite, and it attends, with weight 1, to
// keys it was meant not to see — harmless where the loss ignores the padded
// positions, and what FP32 training always did. Keras's fp16 constant, −3e4
// (keras/src/layers/activations/softmax.py, _large_negative_number), fits
// fp16 even twice over and gives the same finite rows.
//
// The NaN needs a second ingredient, a softmax that answers a row of −inf
// with NaN: each run also measures its masked scores under a softmax that
// returns 0 for such a row (PyTorch's _safe_softmax), and there the fp16
// mask gives no NaN either. That ingredient is the next pitfall,
// fully-masked-row-nan.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"

namespace mpt::ch04 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace fp16_mask_values {

constexpr std::int64_t kLen = MaskedBatch::kLen, kDim = MaskedBatch::kDim;
constexpr std::int64_t kRows = MaskedBatch::kBatch * kLen;
constexpr float kLowest16 = -65504.0f;  // torch.finfo(torch.float16).min

/// Where a run stores the masks and their sums with the scores: h (fp16) or
/// fp32 (the FP32 arithmetic's own result).
using Store = float (*)(float);
float fp32(float x) { return x; }

/// What one run measured.
struct MaskRun {
  std::vector<float> probs, out;  ///< recipe A (−1e9): P [2, 6, 6] and the output [2, 6, 16]
  std::vector<float> safe_probs;  ///< recipe A's masked scores under a softmax that gives 0 for a row of −inf
  double mask_inf = 0;            ///< recipe A: −1e9 entries stored as −inf
  double summed_mask_inf = 0;     ///< recipe B: entries of the two finfo(fp16).min masks' sum that are −inf
  double score_plus_mask_inf = 0;  ///< recipe B: a finite mask entry plus its score that is −inf
};

/// The outcomes of both runs (defined after the runs); `why` is the run's explanation.
RunResult mask_outcomes(const MaskRun& r, std::string setup, std::string why);

/// The hand-written attention of both runs, with the masks stored and added
/// by `s`: recipe A, one mask of −1e9 (keep: 0) added to the scores, then
/// torch.softmax in FP32 and P V; recipe B, a causal and a padding mask of
/// finfo(fp16).min, added to each other and to the scores.
MaskRun masked_attention(Store s) {
  const MaskedBatch& in = masked_batch();
  const std::vector<float> score = masked_batch_scores();
  MaskRun r;
  std::vector<float> t(score.size());
  for (std::size_t e = 0; e < score.size(); ++e) {
    //! [fp16-mask-values-mask]
    const float mask = s(in.keep[e] ? 0.0f : -1e9f);  // fp16: −1e9 is −inf
    t[e] = s(score[e] + mask);                        // fp16: a fully masked row is −inf everywhere
    //! [fp16-mask-values-mask]
    r.mask_inf += std::isinf(mask);
  }
  r.probs = fp32_softmax_rows(t);  // exp(z − max)/Σ: a row of −inf is NaN
  r.out = masked_batch_output(r.probs);
  r.safe_probs = fp32_safe_softmax_rows(t);
  for (std::size_t e = 0; e < score.size(); ++e) {
    const float mask = s(s(in.causal[e] ? 0.0f : kLowest16) + s(in.padding[e] ? 0.0f : kLowest16));
    r.summed_mask_inf += std::isinf(mask);
    if (!std::isinf(mask) && std::isinf(s(score[e] + mask))) r.score_plus_mask_inf += 1;
  }
  return r;
}

// ---------------------------------------------------------------------------
// The broken run.

RunResult mask_broken() {
  //! [fp16-mask-values-broken]
  const MaskRun r = masked_attention(h);  // the masks stored in fp16 and added to the fp16 scores in fp16
  //! [fp16-mask-values-broken]
  RunResult out = mask_outcomes(
      r,
      "2 sequences of 6 tokens (one left-padded by 2), one head of 16, fp16 scores; a causal-and-padding "
      "mask of −1e9, and a causal and a padding mask of finfo(fp16).min, stored and added in fp16; "
      "torch.softmax (FP32)",
      "");
  out.explanation =
      "−1e9 is stored in fp16 as " + num(h(-1e9f)) + " (" + num(out.get("mask_inf_entries")) +
      " mask entries), and the " + num(out.get("fully_masked_rows")) +
      " first queries of the left-padded sequence see only padding: their rows are −inf everywhere, "
      "softmax gives exp(−inf − (−inf)) = NaN, and so does their output. finfo(fp16).min + "
      "finfo(fp16).min = " +
      num(2.0 * kLowest16) + " is stored as " + num(h(2 * kLowest16)) + " (" +
      num(out.get("summed_mask_inf_entries")) +
      " entries), and a score of −16 or below plus finfo.min rounds past −65504 to −inf too (" +
      num(out.get("score_plus_mask_inf")) +
      " entries). A softmax that gives 0 for a row of −inf would leave " +
      num(out.get("safe_softmax_nan_rows")) + " NaN rows: the NaN needs the plain softmax too.";
  return out;
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult mask_fixed() {
  //! [fp16-mask-values-fixed]
  const MaskRun r = masked_attention(fp32);  // the masks kept in FP32, added to the widened scores
  //! [fp16-mask-values-fixed]
  RunResult out = mask_outcomes(r,
                                "the same batch, scores and masks, the masks kept in FP32 and added to the "
                                "widened fp16 scores in FP32; the same torch.softmax (FP32)",
                                "");
  out.explanation =
      "In FP32 −1e9, finfo(fp16).min twice (" + num(2.0 * kLowest16) +
      ") and every score plus a mask are finite: no row is −inf everywhere, and no probability is NaN. "
      "A fully masked row is a softmax over removed keys: it puts " +
      num(out.get("fully_masked_removed_weight")) +
      " of its weight on them and its output is finite (at most " + num(out.get("fully_masked_output_max")) +
      " in size), where FP64 with the keys removed gives 0; the loss ignores padded positions, so this is "
      "harmless, and it is what FP32 training always did. In the rows that keep a key the removed keys get "
      "probability " +
      num(out.get("masked_probability_max")) + ".";
  return out;
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult mask_outcomes(const MaskRun& r, std::string setup, std::string why) {
  const MaskedBatch& in = masked_batch();
  const double inf = std::numeric_limits<double>::infinity();
  double fully = 0, nan_prob = 0, nan_out = 0, safe_nan = 0, masked_max = 0, fully_out = 0, fully_weight = 0;
  for (std::int64_t row = 0; row < kRows; ++row) {
    bool any_kept = false, p_nan = false, o_nan = false, s_nan = false;
    double removed_max = 0, removed_sum = 0;
    for (std::int64_t j = 0; j < kLen; ++j) {
      const auto e = static_cast<std::size_t>(row * kLen + j);
      any_kept = any_kept || in.keep[e];
      p_nan = p_nan || std::isnan(r.probs[e]);
      s_nan = s_nan || std::isnan(r.safe_probs[e]);
      if (!in.keep[e]) {
        removed_max = std::max(removed_max, static_cast<double>(r.probs[e]));
        removed_sum += r.probs[e];
      }
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
    safe_nan += s_nan;
    if (any_kept) masked_max = std::max(masked_max, removed_max);
    if (!any_kept) {
      fully_out = std::max(fully_out, out_max);
      fully_weight = std::isnan(removed_sum) ? inf : std::max(fully_weight, removed_sum);
    }
  }
  // The rows that keep a key, against FP64 (the removed keys dropped) and
  // against what the roundings allow: scores stored in fp16 (FP32 sums),
  // FP32 probabilities, outputs stored in fp16.
  const std::vector<double> ref =
      fp64_attention(in.q, in.k, in.v, MaskedBatch::dims(), MaskedBatch::scale(), in.keep);
  AttentionRounding rounding;
  rounding.scores = true;
  rounding.out = true;
  const std::vector<double> bound =
      attention_error_bound(in.q, in.k, in.v, MaskedBatch::dims(), MaskedBatch::scale(), rounding, in.keep);
  const double kept_ratio = error_to_bound(r.out, ref, bound, masked_batch_kept_outputs());
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"rows", static_cast<double>(kRows), "query rows"},
      {"fully_masked_rows", fully, "rows in which no key takes part"},
      {"mask_inf_entries", r.mask_inf, "entries of the −1e9 mask stored as −inf"},
      {"nan_probability_rows", nan_prob, "rows of probabilities with a NaN"},
      {"nan_output_rows", nan_out, "rows of the output with a NaN"},
      {"fully_masked_output_max", fully_out, "the largest |output| of a fully masked row (inf: not finite)"},
      {"fully_masked_removed_weight", fully_weight,
       "the probability a fully masked row puts on removed keys (inf: NaN)"},
      {"masked_probability_max", masked_max,
       "the largest probability of a removed key, in rows that keep one"},
      {"kept_rows_error_to_bound", kept_ratio,
       "rows that keep a key: the largest |out − out_fp64| / its rounding bound (inf: not finite)"},
      {"summed_mask_inf_entries", r.summed_mask_inf,
       "entries of the summed finfo(fp16).min masks that are −inf"},
      {"score_plus_mask_inf", r.score_plus_mask_inf, "scores that a finite mask entry turned into −inf"},
      {"safe_softmax_nan_rows", safe_nan,
       "the same masked scores under a softmax that gives 0 for a row of −inf: rows with a NaN"},
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
      "Stored and added in fp16, a mask of −1e9 is −inf, and finfo(fp16).min added to a second mask or to a "
      "negative score overflows to −inf: a row in which every key is removed is then −inf everywhere, and "
      "the plain softmax of it is exp(−inf − (−inf)) = NaN, in its probabilities and its output. Keep "
      "additive masks in FP32 (add them to the widened scores), or use a constant that stays finite in "
      "fp16 even summed; a boolean mask with a softmax that gives 0 for an empty row (fully-masked-row-nan) "
      "removes keys exactly.",
      mask_broken,
      mask_fixed,
      {
          check("−1e9 is stored as −inf", [](const RunResult& r) { return r.get("mask_inf_entries") > 0; }),
          check("NaN rows of probabilities",
                [](const RunResult& r) { return r.get("nan_probability_rows") > 0; }),
          check("NaN rows of the output", [](const RunResult& r) { return r.get("nan_output_rows") > 0; }),
          check("finfo.min + finfo.min is −inf",
                [](const RunResult& r) { return r.get("summed_mask_inf_entries") > 0; }),
          check("a score plus finfo.min is −inf",
                [](const RunResult& r) { return r.get("score_plus_mask_inf") > 0; }),
      },
      {
          check("no mask entry and no masked score is −inf",
                [](const RunResult& r) {
                  return r.get("mask_inf_entries") == 0 && r.get("summed_mask_inf_entries") == 0 &&
                         r.get("score_plus_mask_inf") == 0;
                }),
          check("no NaN: every row's probabilities and output are finite",
                [](const RunResult& r) {
                  return r.get("nan_probability_rows") == 0 && r.get("nan_output_rows") == 0 &&
                         std::isfinite(r.get("fully_masked_output_max"));
                }),
      },
      {
          check("a removed key gets probability 0 in a row that keeps one",
                [](const RunResult& r) { return r.get("masked_probability_max") == 0; }),
          check("in the rows that keep a key the output is within its rounding bound of FP64's",
                [](const RunResult& r) { return r.get("kept_rows_error_to_bound") <= 1; }),
      }};
}

}  // namespace mpt::ch04
