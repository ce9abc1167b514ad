// Chapter 04 — numerically stable softmax, cross-entropy and attention: what
// the chapter's pitfalls share, and the declarations of their registry entries.
// Depends on: ../../03-normalization/pitfalls/common.hpp (h, fp16_ulp,
// normal_values, and Chapter 2's num, check, within, reused),
// mpt/registry/pitfall.hpp (Check, Pitfall, RunResult), mpt/core/tensor.hpp
// (Tensor); <cstdint>, <vector>.
//
// One file per pitfall, pitfalls/<id>.cpp: its broken run, its fixed run,
// their outcomes and its checks, ending with the function that returns its
// registry entry (declared here, called by pitfalls/register.cpp). What more
// than one pitfall uses is here and in common.cpp; the rest stays in its
// pitfall's file.
//
// Every run feeds seeded logits or activations, stored in fp16 as an fp16
// model would hand them over, to a softmax, a loss or an attention and
// compares what comes out with the same computation in FP64 (written out in
// common.cpp, from the same stored inputs), and, where a run's error is not
// 0 or inf, with a bound on what its roundings allow (attention_error_bound).
// The broken runs hold the
// arithmetic the library does not do (exponentials and sums in fp16, the
// log of a stored softmax, masks added in fp16): every value such code
// would store in fp16 is rounded there, through the library's rounding.
// Runs take a fraction of a second. The `//! [id-broken]` / `//! [id-fixed]`
// markers in each pitfall's file delimit the code the chapter text shows.
#pragma once

#include <cstdint>
#include <vector>

#include "../../03-normalization/pitfalls/common.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/registry/pitfall.hpp"

namespace mpt::ch04 {

// ---------------------------------------------------------------------------
// Small tools shared by the runs.

using ch02::check;
using ch02::num;
using ch02::within;
using ch03::fp16_ulp;
using ch03::h;
using ch03::normal_values;

/// fp16's largest finite value (65504), from its format descriptor.
double fp16_max();
/// fp16's smallest positive (subnormal) value, 2^-24.
double fp16_min_subnormal();

/// Every element of t, widened to float.
std::vector<float> values_of(const Tensor& t);

/// Every element of v rounded to fp16 (where an fp16 model stores it).
std::vector<float> rounded_to_fp16(std::vector<float> v);

// ---------------------------------------------------------------------------
// The FP64 references: every pitfall's outputs are compared with them.

/// softmax over each of `rows` rows of `width` values, in double from the
/// widened values: exp(z − max) / Σ exp(z − max). A row of −inf only is NaN
/// (0/0), as torch.softmax.
std::vector<double> fp64_softmax(const std::vector<float>& z, std::int64_t rows, std::int64_t width);
/// log_softmax over each row in double: (z − max) − log Σ exp(z − max).
std::vector<double> fp64_log_softmax(const std::vector<float>& z, std::int64_t rows, std::int64_t width);

/// The shapes of one attention: n = batch·heads independent (Lq, Lk) problems.
struct AttentionDims {
  std::int64_t n = 1;   ///< batch times heads
  std::int64_t lq = 1;  ///< query positions
  std::int64_t lk = 1;  ///< key positions
  std::int64_t d = 1;   ///< the dimension of a query and a key
  std::int64_t dv = 1;  ///< the dimension of a value
};
/// softmax(Q Kᵀ·scale, keys with keep[(n·Lq + i)·Lk + j] == 0 removed) V in
/// double, from the widened q [n, Lq, D], k [n, Lk, D], v [n, Lk, Dv] (the
/// sizes in g); an empty keep keeps every key. A row that keeps no key gives 0 (the choice
/// of PyTorch's _safe_softmax and of the library's attention). Returns
/// [n, Lq, Dv].
std::vector<double> fp64_attention(const std::vector<float>& q, const std::vector<float>& k,
                                   const std::vector<float>& v, const AttentionDims& g, double scale,
                                   const std::vector<std::uint8_t>& keep = {});

/// How far a run's outputs are from the FP64 ones.
struct Errors {
  double nan = 0;        ///< outputs that are NaN
  double inf = 0;        ///< outputs that are ±inf
  double max_error = 0;  ///< the largest |y − y_fp64|; inf when some output is not finite
  /// The largest |y − y_fp64| in fp16 ulps at |y_fp64| (the spacing of the
  /// fp16 values there; the subnormal quantum below the normal range); inf
  /// as max_error.
  double worst_ulps = 0;
};
/// Compare y with the FP64 outputs `ref` (same size), element by element.
Errors compare(const std::vector<float>& y, const std::vector<double>& ref);

/// Which values an attention stores in fp16, for attention_error_bound; the
/// rest it keeps in FP32. Every sum is an FP32 sum.
struct AttentionRounding {
  bool q_scaled = false;  ///< Q·scale rounded into fp16 before the product (scale_q_first)
  bool scores = false;    ///< the scores S rounded into fp16
  /// S rounded before the scale (S = Q Kᵀ stored, then S·scale in FP32):
  /// the rounding is at |s|/scale, its error multiplied by the scale.
  bool scores_unscaled = false;
  bool probs = false;  ///< the probabilities P rounded into fp16
  bool out = false;    ///< the outputs rounded into fp16
};
/// A bound on |out − out_fp64| of every output [n, Lq, Dv] of an attention
/// that rounds as `r` says, from those roundings alone, each at most half an
/// fp16 spacing (round to nearest). To first order, scores off by δ_j move
/// P_j by P_j·(δ_j − Σ_k P_k δ_k), and so the output by
/// Σ_j P_j δ_j (v_j − out), which the bound takes term by term:
///   - a stored score's rounding, at most half the spacing at s_j (or scale
///     times that at s_j/scale), worst case: Σ_j ½ulp·P_j·|v_j − out|;
///   - the rounding of each of Q·scale's D elements, shared by every key of
///     the row: Σ_c ρ_c·a_c with a_c = Σ_j P_j (v_j − out)·k_jc. A sum of D
///     independent roundings is bounded as probabilistic rounding-error
///     analysis does (Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019, by
///     Hoeffding's inequality): λ·√(Σ_c (½ulp(q_c·scale)·a_c)²), λ = 5, which
///     holds but with probability 2·e^(−λ²/2) < 1e-5 per output if the
///     roundings act as independent; the worst case, Σ_c ½ulp·|a_c|, would
///     be about √D times larger and blind to a rounding a few times coarser;
///   - the FP32 sums (D·2^-24 of Σ|q_c k_jc| per score, the key count times
///     2^-24 over the keys), the second-order remainder (about
///     e^2Δ − 1 − 2Δ + Δ²/2 of Σ P_j |v_j|, Δ the row's largest score
///     error), the rounding of each P_j and of the output, worst case.
/// Rows that keep no key get 0. Arguments as fp64_attention.
std::vector<double> attention_error_bound(const std::vector<float>& q, const std::vector<float>& k,
                                          const std::vector<float>& v, const AttentionDims& g, double scale,
                                          const AttentionRounding& r,
                                          const std::vector<std::uint8_t>& keep = {});

/// The largest |y − ref| / bound over the elements (0 where y equals ref;
/// inf where y is not finite or the error passes a bound of 0); `use`, when
/// not empty, picks the elements compared (nonzero: compared).
double error_to_bound(const std::vector<float>& y, const std::vector<double>& ref,
                      const std::vector<double>& bound, const std::vector<std::uint8_t>& use = {});

// ---------------------------------------------------------------------------
// The batch of the two masking pitfalls (fp16-mask-values,
// fully-masked-row-nan).

/// Two sequences of 6 tokens, the first left-padded by 2 tokens, one head of
/// 16: fp16 q, k (N(0, 4²)) and v (N(0, 1)), and which keys each query may
/// see — causal, and never a padding token. The first two queries of the
/// padded sequence see only padding: no key is left in their rows.
struct MaskedBatch {
  static constexpr std::int64_t kBatch = 2;  ///< sequences
  static constexpr std::int64_t kLen = 6;    ///< tokens per sequence
  static constexpr std::int64_t kDim = 16;   ///< the head's dimension
  static constexpr std::int64_t kPad = 2;    ///< sequence 0's left padding
  std::vector<float> q;                      ///< queries [2, 6, 16], fp16 values
  std::vector<float> k;                      ///< keys [2, 6, 16], fp16 values
  std::vector<float> v;                      ///< values [2, 6, 16], fp16 values
  /// [2, 6, 6], 1 where the key takes part: causal (j <= i).
  std::vector<std::uint8_t> causal;
  /// [2, 6, 6], 1 where the key is not a pad token.
  std::vector<std::uint8_t> padding;
  /// [2, 6, 6], 1 where both causal and padding keep the key.
  std::vector<std::uint8_t> keep;
  /// The shapes, for fp64_attention.
  static AttentionDims dims() { return {kBatch, kLen, kLen, kDim, kDim}; }
  /// 1/√D.
  static double scale();
};
/// The batch (seeded, built once).
const MaskedBatch& masked_batch();
/// Its scaled scores Q Kᵀ/√D [2, 6, 6]: FP32 products rounded once into fp16,
/// as an fp16 model hands them to a hand-written mask and softmax.
std::vector<float> masked_batch_scores();
/// P V for the batch, P [2, 6, 6]: FP32 sums over the keys, each output
/// rounded into fp16 [2, 6, 16] (a NaN in P reaches its row).
std::vector<float> masked_batch_output(const std::vector<float>& p);
/// softmax over each row of 6 of t [2, 6, 6] by the library's softmax in
/// FP32 (FP32 probabilities): exp(z − max)/Σ, so a row of −inf only is NaN,
/// as torch.softmax.
std::vector<float> fp32_softmax_rows(const std::vector<float>& t);
/// The same, then 0 for every row whose scores are all −inf: PyTorch's
/// _safe_softmax (the library's attention does the same for a row with no
/// key).
std::vector<float> fp32_safe_softmax_rows(const std::vector<float>& t);
/// Per row of P [2, 6, 6]: the rows that keep a key (1) or none (0), from
/// the batch's keep mask, spread over the row's 16 outputs ([2, 6, 16]),
/// for error_to_bound.
std::vector<std::uint8_t> masked_batch_kept_outputs();

// ---------------------------------------------------------------------------
// The chapter's registry entries, one per pitfalls/<id>.cpp, in the order
// pitfalls/register.cpp registers them.

/// fp16-softmax-overflow: exp(z) in fp16 without the max subtraction is inf
/// for z above ln(65504) ≈ 11.09, and inf/inf = NaN.
Pitfall fp16_softmax_overflow_pitfall();
/// log-softmax-underflow: log(softmax(z)) with the softmax stored in fp16
/// (or FP32) takes the log of probabilities that flushed to 0: the loss is inf.
Pitfall log_softmax_underflow_pitfall();
/// fp16-loss-reduction: per-token losses summed in fp16 overflow past 65504
/// or stop adding once the running sum is large.
Pitfall fp16_loss_reduction_pitfall();
/// fp16-mask-values: additive masks stored and added in fp16 (−1e9 is −inf,
/// finfo.min + x overflows to −inf) turn fully masked rows into NaN.
Pitfall fp16_mask_values_pitfall();
/// fully-masked-row-nan: a row whose every key is masked is all −inf, the
/// plain softmax of it is NaN (0/0), and through P V and Pᵀ dO the NaN
/// reaches every value's gradient.
Pitfall fully_masked_row_nan_pitfall();
/// attention-scale-overflow: Q Kᵀ stored in fp16 before the 1/√D overflows
/// for large activations; scaling Q first keeps the scores finite.
Pitfall attention_scale_overflow_pitfall();
/// autocast-disabled-softmax: a softmax on an fp16 input with autocast off
/// stores fp16 probabilities; small ones flush to 0 and their log is −inf.
Pitfall autocast_disabled_softmax_pitfall();
/// naive-loss-training: the tiny Transformer trained in fp16 with the naive
/// loss (an fp16 softmax without the max subtracted, then its log) against
/// the library's FP32 cross-entropy: the loss turns NaN, every step is
/// skipped, the model stops learning.
Pitfall naive_loss_training_pitfall();

}  // namespace mpt::ch04
