// Chapter 07 — exercises: the adapter header, the student's specification.
// Depends on: mpt/core/dtype.hpp (e4m3, e5m2), mpt/fp8/recipes.hpp for the
// recipe's option types (DelayedScalingOptions, AmaxComputeAlgo, Pass) and
// mpt/fp8/fp8_math.hpp for MxScaleRule; the grader compares 7.1 with mpt's
// DelayedScaling, 7.2 with mx_scale_code, and grades 7.3 on runs it makes
// with mpt's recipes (src/mpt/fp8/).
// The grader includes this file and calls exactly these functions; the
// student writes them in ex07.cpp. Changing a signature breaks the grader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/fp8/fp8_math.hpp"
#include "mpt/fp8/recipes.hpp"

/// Chapter 7 exercises: the update of delayed scaling after a step, an MX
/// block's E8M0 scale by both rules in use, and naming what went wrong in
/// an FP8 run from what its quantizations counted.
namespace mpt::ex07 {

/// One tensor's delayed-scaling state, as Transformer Engine keeps it (one
/// quantizer's column of fp8_meta's amax_history, and its scale).
struct DelayedState {
  /// amax_history_len entries in TE's layout: entry 0 is the slot this
  /// step's amax is recorded into, entry len−1 holds the previous step's
  /// amax, entry 1 the oldest one still remembered. All zeros at first.
  std::vector<float> amax_history;
  /// The scale the next quantization multiplies by (stored = value × scale); 1 at first.
  float scale = 1.0f;
};

/// Exercise 7.1 — delayed scaling's bookkeeping after one step of one
/// tensor, as Transformer Engine's fused update does it (PyTorch's default
/// path; src/mpt/fp8/recipes.hpp cites the source).
///
/// First record the step's amax: slot 0 becomes the larger of itself and
/// |step_amax|, a NaN ignored (TE's cast kernels max into the slot with
/// fmaxf, so a NaN never enters the history; an inf does). Then update;
/// let a be slot 0 after the record:
///  - a ≠ 0: the history rolls by one: entry i takes entry i+1 for
///    i = 1 .. len−2, the last entry takes a, and entry 0 is cleared for the
///    next step (the oldest amax, entry 1, falls out). The chosen amax is,
///    for AmaxComputeAlgo::max, the largest entry of the history before the
///    roll (NaN ignored, as fmaxf does), for most_recent, a itself;
///  - a = 0 (the tensor did not take part in the step): nothing rolls, the
///    history stays as it is, and the chosen amax is 0.
/// Then the scale: fp8_max × 2^-margin / amax, one division in float, where
/// fp8_max is the format's largest finite value (448 for e4m3, 57344 for
/// e5m2) and fp8_max × 2^-margin is exact; an amax of 0, inf or NaN keeps
/// the previous scale; a quotient that overflows float becomes FLT_MAX.
/// Return the chosen amax.
///
/// `options.amax_history_len` must equal the history's length;
/// options.margin is 0..mpt::fp8::kMaxMargin. Bad input throws
/// std::invalid_argument and leaves `state` unchanged: a dtype other than
/// e4m3 and e5m2; a margin out of range; a history that is empty or not
/// amax_history_len long.
///
/// Graded against mpt's DelayedScaling (record_amax, then update) step by
/// step: the history, the scale and the chosen amax, bit for bit, on
/// hand-picked and seeded random sequences with spikes, zeros, inf and NaN.
/// Do not call DelayedScaling, simulate_delayed or delayed_scale_from_amax:
/// the grader uses them as its reference.
float delayed_update(DelayedState& state, float step_amax, mpt::DType dtype,
                     const mpt::fp8::DelayedScalingOptions& options);

/// Exercise 7.2 — the E8M0 code of an MX block's shared scale, from the
/// block's amax, for elements in `element` (e4m3 or e5m2), by either rule.
///
/// E8M0 (OCP MX v1.0, section 5.4.1) is a byte holding a biased exponent:
/// code c stands for 2^(c − 127), c = 0 .. 254; 0xFF is NaN. The block's
/// elements are stored as x / 2^(c − 127).
///  - MxScaleRule::floor (OCP MX v1.0, section 6.3): c − 127 =
///    floor(log2 amax) − emax_elem, emax_elem the exponent of the element
///    format's largest binade (8 for e4m3, whose max 448 is 1.75 × 2^8; 15
///    for e5m2, 57344 = 1.75 × 2^15), taken as torchao does it: the amax's
///    float exponent field minus 127 (a zero or subnormal amax reads as
///    2^-127, an inf as 2^128), minus emax_elem, clamped to −127 .. 127.
///  - MxScaleRule::rceil (NVIDIA's, Transformer Engine's MXFP8 casts): the
///    smallest power of two at or above amax × (1 / max_norm), max_norm the
///    element format's largest value, the reciprocal and the product each
///    rounded to float first, as the kernels compute them; saturating at
///    2^127 (an inf amax too), and everything at or below 2^-127 (an
///    all-zero block) giving 2^-127.
/// A NaN amax gives 0xFF by either rule.
///
/// Bad input throws std::invalid_argument: an element dtype other than e4m3
/// and e5m2.
///
/// Graded against mpt's mx_scale_code on hand-picked amaxes (powers of two,
/// the edges of each rule, zero, subnormals, inf, NaN) and on a sweep of
/// float bit patterns. Do not call mx_scale_code, e8m0_round_up or
/// e8m0_from_exponent: the grader uses them as its reference.
std::uint8_t e8m0_scale(float amax, mpt::DType element, mpt::fp8::MxScaleRule rule);

/// What one step's quantization of the watched tensor counted (the fields
/// of mpt's Fp8Tensor a training run logs).
struct StepRecord {
  float amax = 0;             ///< the tensor's amax this step (its largest |value|)
  float scale = 1;            ///< the scale it was quantized with (stored = value × scale)
  std::size_t values = 0;     ///< its elements
  std::size_t saturated = 0;  ///< of them, clamped to ±fp8_max
  std::size_t flushed = 0;    ///< of them, nonzero values stored as ±0
};

/// An FP8 run's log for one tensor: which pass it belongs to, the format it
/// was stored in, and one record per step (step 0 first).
struct RunRecord {
  mpt::fp8::Pass pass = mpt::fp8::Pass::forward;  ///< forward: an activation; backward: a gradient
  mpt::DType dtype = mpt::DType::e4m3;            ///< e4m3 or e5m2
  std::vector<StepRecord> steps;                  ///< in order
};

/// The misconfigurations 7.3 tells apart, and a healthy run.
enum class Cause : std::uint8_t {
  healthy,             ///< delayed scaling, history of a few dozen steps, HYBRID: nothing wrong
  no_scaling,          ///< every step quantized with scale 1
  e4m3_gradients,      ///< gradients stored in E4M3 (Format.E4M3 where HYBRID was meant)
  stale_after_spike,   ///< one step's spike, then its amax ruling the history
  history_too_long,    ///< a shrinking tensor under a history that never forgets its start
  history_too_short,   ///< a history shorter than the period of the tensor's peaks
  per_tensor_outlier,  ///< one outlier value sets the scale of a whole per-tensor activation
};

/// Exercise 7.3 — name the cause of an FP8 run's symptoms.
///
/// Each run the grader hands you was made by mpt's recipes on seeded
/// tensors (a few dozen steps of about a thousand values) under exactly
/// one of the causes above: delayed scaling (TE's `max` algorithm, margin
/// 0) unless the cause says otherwise, and its first step quantized with
/// the initial scale 1, as TE's is. Activations are roughly normal;
/// gradients spread over many binades. Return the cause. What tells them
/// apart is in the records: how far a step's amax × scale lies from the
/// format's max (448 or 57344) and when, which steps saturate and which
/// flush, whether the scale ever moves, and the pass and format.
///
/// Bad input throws std::invalid_argument: no steps; a dtype other than
/// e4m3 and e5m2; a step whose saturated + flushed exceed its values, or
/// whose scale is not finite and > 0.
///
/// Graded on runs mpt makes under each cause with seeded random sizes,
/// history lengths, spike sizes and periods: every run must be named right.
Cause diagnose(const RunRecord& run);

}  // namespace mpt::ex07
