// Chapter 04 — pitfall fully-masked-row-nan: the plain softmax of a row whose every key is masked
// Depends on: common.hpp (the chapter's helpers, the masked batch, this
// entry's declaration); <algorithm>, <cmath>, <cstddef>, <cstdint>,
// <limits>, <string>, <utility>, <vector>.
//
// A boolean mask removes a key exactly: its score becomes −inf
// (masked_fill(~keep, −inf)), and exp(−inf − max) = 0 whatever the other
// scores are. But a row that keeps no key — the first queries of a
// left-padded sequence under a causal mask — is −inf everywhere, and the
// plain softmax exp(z − max)/Σ exp(z − max) takes exp(−inf − (−inf)) = NaN
// there: 0/0. The NaN is in the row's probabilities and output, and the loss
// cannot keep it out by ignoring the padded positions: the gradient of V is
// Pᵀ dO, and NaN·0 = NaN, so every value of the sequence gets a NaN
// gradient, and through it every parameter. PyTorch's
// scaled_dot_product_attention used to return NaN for such rows; its math
// backend now calls at::_safe_softmax (aten/src/ATen/native/transformers/
// attention.cpp), which writes 0 for a row whose scores are all −inf, and
// the library's attention does the same (attention.hpp).
//
// The two runs differ in the softmax only: the same batch, scores and
// boolean mask, and the same P V and Pᵀ dO. Each run also measures its
// softmax on the other kind of mask, an additive FP32 one of −1e9: no row is
// −inf everywhere then, neither softmax gives NaN, and neither can tell a
// fully masked row from a real one — it attends, with weight 1, to the keys
// it was meant not to see. The zero row needs a mask that removes keys
// exactly.
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
namespace fully_masked_row_nan {

constexpr std::int64_t kLen = MaskedBatch::kLen, kDim = MaskedBatch::kDim;
constexpr std::int64_t kRows = MaskedBatch::kBatch * kLen;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// A softmax over each row of 6 of t [2, 6, 6].
using SoftmaxFn = std::vector<float> (*)(const std::vector<float>&);

/// What one run measured.
struct RowRun {
  std::vector<float> probs, out;  ///< P [2, 6, 6] and the output [2, 6, 16]
  std::vector<float> dv;          ///< the gradient of V [2, 6, 16] when the loss ignores the padded queries
  std::vector<float> additive;    ///< the same softmax of the scores plus an FP32 mask of −1e9: P [2, 6, 6]
};

/// The attention of both runs with `softmax`: the boolean mask applied to
/// the widened fp16 scores (a removed key's score is −inf), P, P V, and
/// dV = Pᵀ dO for a loss that reads every output of the rows that keep a key
/// (dO = 1 there) and ignores the padded queries' rows (dO = 0).
RowRun masked_attention(SoftmaxFn softmax) {
  const MaskedBatch& in = masked_batch();
  const std::vector<float> score = masked_batch_scores();
  std::vector<float> t(score.size()), t_add(score.size());
  for (std::size_t e = 0; e < score.size(); ++e) {
    t[e] = in.keep[e] ? score[e] : kNegInf;             // masked_fill(~keep, −inf)
    t_add[e] = score[e] + (in.keep[e] ? 0.0f : -1e9f);  // an additive FP32 mask, for comparison
  }
  RowRun r;
  r.probs = softmax(t);
  r.out = masked_batch_output(r.probs);
  r.additive = softmax(t_add);
  const std::vector<std::uint8_t> kept = masked_batch_kept_outputs();
  r.dv.assign(r.out.size(), 0.0f);
  for (std::int64_t seq = 0; seq < MaskedBatch::kBatch; ++seq)
    for (std::int64_t i = 0; i < kLen; ++i)
      for (std::int64_t j = 0; j < kLen; ++j)
        for (std::int64_t c = 0; c < kDim; ++c) {
          const float d_out = kept[static_cast<std::size_t>((seq * kLen + i) * kDim + c)] ? 1.0f : 0.0f;
          r.dv[static_cast<std::size_t>((seq * kLen + j) * kDim + c)] +=
              r.probs[static_cast<std::size_t>((seq * kLen + i) * kLen + j)] * d_out;  // NaN·0 = NaN
        }
  return r;
}

/// The outcomes of both runs (defined after the runs).
RunResult row_outcomes(const RowRun& r, std::string setup);

// ---------------------------------------------------------------------------
// The broken run.

RunResult row_broken() {
  //! [fully-masked-row-nan-broken]
  const RowRun r = masked_attention(fp32_softmax_rows);  // torch.softmax: a row of −inf is 0/0
  //! [fully-masked-row-nan-broken]
  RunResult out = row_outcomes(r,
                               "2 sequences of 6 tokens (one left-padded by 2), one head of 16, fp16 scores; "
                               "the boolean mask causal and not padding (removed keys −inf); torch.softmax "
                               "(FP32), P V, and dV = Pᵀ dO with the padded queries ignored (dO = 0)");
  out.explanation =
      "The " + num(out.get("fully_masked_rows")) +
      " first queries of the padded sequence keep no key: their rows are −inf everywhere, the maximum is "
      "−inf, and exp(−inf − (−inf)) = exp(NaN): " +
      num(out.get("nan_probability_rows")) + " rows of NaN probabilities and " +
      num(out.get("nan_output_rows")) +
      " of NaN outputs. The loss ignores those rows (dO = 0), but dV = Pᵀ dO multiplies NaN by 0: " +
      num(out.get("dv_nan_entries")) + " of the " + num(static_cast<double>(r.dv.size())) +
      " entries of dV are NaN, every value of the padded sequence. With an additive FP32 mask of −1e9 the "
      "rows are finite and the same softmax puts " +
      num(out.get("additive_removed_weight")) + " of a fully masked row's weight on removed keys.";
  return out;
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult row_fixed() {
  //! [fully-masked-row-nan-fixed]
  const RowRun r = masked_attention(fp32_safe_softmax_rows);  // _safe_softmax: 0 for a row of −inf
  //! [fully-masked-row-nan-fixed]
  RunResult out =
      row_outcomes(r,
                   "the same batch, scores, mask, P V and dV with PyTorch's _safe_softmax (0 for a "
                   "row whose scores are all −inf), as the library's attention");
  out.explanation =
      "A row with no key left gets probabilities 0, so its output is 0, what FP64 with the keys removed "
      "gives, and it adds nothing to dV: " +
      num(out.get("dv_nan_entries")) + " NaN entries, and the largest output error is " +
      num(out.get("output_error_to_bound")) +
      " times its rounding bound. The safe softmax recognises the row by its −inf scores: with an additive "
      "FP32 mask of −1e9 it sees a finite row and puts " +
      num(out.get("additive_removed_weight")) + " of its weight on removed keys, as the plain softmax does.";
  return out;
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult row_outcomes(const RowRun& r, std::string setup) {
  const MaskedBatch& in = masked_batch();
  const double inf = std::numeric_limits<double>::infinity();
  double fully = 0, nan_prob = 0, nan_out = 0, masked_max = 0, fully_out = 0, additive_weight = 0;
  for (std::int64_t row = 0; row < kRows; ++row) {
    bool any_kept = false, p_nan = false, o_nan = false;
    double removed_max = 0, additive_removed = 0;
    for (std::int64_t j = 0; j < kLen; ++j) {
      const auto e = static_cast<std::size_t>(row * kLen + j);
      any_kept = any_kept || in.keep[e];
      p_nan = p_nan || std::isnan(r.probs[e]);
      if (!in.keep[e]) {
        removed_max = std::max(removed_max, static_cast<double>(r.probs[e]));
        additive_removed += r.additive[e];
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
    if (any_kept) masked_max = std::max(masked_max, removed_max);
    if (!any_kept) {
      fully_out = std::max(fully_out, out_max);
      additive_weight = std::isnan(additive_removed) ? inf : std::max(additive_weight, additive_removed);
    }
  }
  double dv_nan = 0;
  for (const float g : r.dv) dv_nan += std::isnan(g);
  // Against FP64 with the removed keys dropped (a row with none left: 0), and
  // against what the roundings allow: scores stored in fp16 (FP32 sums), FP32
  // probabilities, outputs stored in fp16.
  const std::vector<double> ref =
      fp64_attention(in.q, in.k, in.v, MaskedBatch::dims(), MaskedBatch::scale(), in.keep);
  AttentionRounding rounding;
  rounding.scores = true;
  rounding.out = true;
  const std::vector<double> bound =
      attention_error_bound(in.q, in.k, in.v, MaskedBatch::dims(), MaskedBatch::scale(), rounding, in.keep);
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"rows", static_cast<double>(kRows), "query rows"},
      {"fully_masked_rows", fully, "rows in which no key takes part"},
      {"nan_probability_rows", nan_prob, "rows of probabilities with a NaN"},
      {"nan_output_rows", nan_out, "rows of the output with a NaN"},
      {"fully_masked_output_max", fully_out, "the largest |output| of a fully masked row (inf: not finite)"},
      {"dv_nan_entries", dv_nan, "entries of dV = Pᵀ dO that are NaN (dO = 0 on the padded queries)"},
      {"masked_probability_max", masked_max,
       "the largest probability of a removed key, in rows that keep one"},
      {"kept_rows_error_to_bound", error_to_bound(r.out, ref, bound, masked_batch_kept_outputs()),
       "rows that keep a key: the largest |out − out_fp64| / its rounding bound (inf: not finite)"},
      {"output_error_to_bound", error_to_bound(r.out, ref, bound),
       "every row: the same (fully masked rows: out_fp64 = 0)"},
      {"additive_removed_weight", additive_weight,
       "with an additive FP32 mask of −1e9 instead: the weight a fully masked row puts on removed keys"},
  };
  return out;
}

}  // namespace fully_masked_row_nan
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall fully_masked_row_nan_pitfall() {
  using namespace fully_masked_row_nan;
  return Pitfall{
      "fully-masked-row-nan",
      4,
      "a row with every key masked: the plain softmax of all −inf is NaN, and the NaN reaches dV",
      "A boolean mask gives a removed key the score −inf; a row that keeps no key (left padding under a "
      "causal mask) is −inf everywhere, and the plain softmax takes exp(−inf − (−inf)) = NaN there. Ignoring "
      "those positions in the loss does not help: dV = Pᵀ dO multiplies the NaN by 0. Give such a row "
      "probabilities 0 (PyTorch's _safe_softmax, the library's attention): its output is 0 and it adds "
      "nothing to any gradient.",
      row_broken,
      row_fixed,
      {
          check("NaN rows of probabilities",
                [](const RunResult& r) { return r.get("nan_probability_rows") > 0; }),
          check("NaN rows of the output", [](const RunResult& r) { return r.get("nan_output_rows") > 0; }),
          check("NaN in dV although the loss ignores the padded queries",
                [](const RunResult& r) { return r.get("dv_nan_entries") > 0; }),
      },
      {
          check("a fully masked row's output is 0",
                [](const RunResult& r) { return r.get("fully_masked_output_max") == 0; }),
          check("dV has no NaN", [](const RunResult& r) { return r.get("dv_nan_entries") == 0; }),
          check("every output within its rounding bound of FP64's (fully masked rows: 0)",
                [](const RunResult& r) { return r.get("output_error_to_bound") <= 1; }),
      },
      {
          check("a removed key gets probability 0 in a row that keeps one",
                [](const RunResult& r) { return r.get("masked_probability_max") == 0; }),
          check("in the rows that keep a key the output is within its rounding bound of FP64's",
                [](const RunResult& r) { return r.get("kept_rows_error_to_bound") <= 1; }),
      }};
}

}  // namespace mpt::ch04
