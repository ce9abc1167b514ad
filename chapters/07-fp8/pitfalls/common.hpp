// Chapter 07 — FP8 with per-tensor and block scaling: what the pitfalls share, and their registry entries
// Depends on: ../../02-loss-scaling/pitfalls/common.hpp (check, num, pct),
// mpt/fp8/quantize.hpp (Fp8Tensor), mpt/registry/pitfall.hpp; <cstddef>,
// <cstdint>, <string>, <vector>.
//
// One file per pitfall, pitfalls/<id>.cpp: its broken run, its fixed run,
// their outcomes and its checks, ending with the function that returns its
// registry entry (declared here, called by pitfalls/register.cpp). Most of
// these pitfalls need only the fp8 tier: their tensors are drawn with the
// project's Rng (seeded), quantized by the tier's recipes and measured
// element by element with quantize_element's verdicts, in milliseconds. Two
// train: e4m3-for-gradients measures the output gradients of the blobs MLP
// under FP8 training, and resume-drops-amax-history resumes `mpt train`'s
// run from its checkpoint (a fraction of a second each). The
// `//! [id-broken]` / `//! [id-fixed]` markers delimit the code the chapter
// text shows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../../02-loss-scaling/pitfalls/common.hpp"
#include "mpt/fp8/quantize.hpp"
#include "mpt/registry/pitfall.hpp"

namespace mpt::ch07 {

using ch02::check;
using ch02::num;
using ch02::pct;

// ---------------------------------------------------------------------------
// Inputs.

/// n values typical · z · exp(spread · w), z and w standard normals drawn
/// with Rng(seed): a normal whose magnitude is spread log-normally. spread 0
/// is a plain normal (activations after a norm); spread 1.5 puts the amax a
/// few hundred times above the median magnitude, as in a gradient tensor
/// whose rows differ in size by orders of magnitude.
std::vector<float> draw_values(std::uint64_t seed, std::size_t n, double typical, double spread);

/// x multiplied by amax / max|x| (in double, each product rounded once to
/// float), so that its amax is `amax` (to within fp32's rounding).
std::vector<float> with_amax(std::vector<float> x, double amax);

// ---------------------------------------------------------------------------
// Measurements.

/// What FP8 did to a set of values (those a mask selects, or all).
struct Fidelity {
  double values = 0;                 ///< the values measured
  double flushed_fraction = 0;       ///< not zero, stored as ±0
  double saturated_fraction = 0;     ///< clamped to ±max (beyond it after rounding, or ±inf)
  double subnormal_fraction = 0;     ///< stored as a nonzero subnormal code: fewer significant bits
  double relative_error = 0;         ///< ‖read back − x‖₂ / ‖x‖₂ over the finite values
  double median_relative_error = 0;  ///< the median of |read back − x| / |x| over the finite nonzero values
};

/// The fidelity of t (quantized from x, every element with its own scale:
/// per tensor or per MX block) over the elements with include[i] (all when
/// include is empty). Each element's fate is quantize_element's verdict,
/// recomputed with the scale t used.
Fidelity fidelity(const std::vector<float>& x, const fp8::Fp8Tensor& t,
                  const std::vector<bool>& include = {});

// ---------------------------------------------------------------------------
// amax-history-too-long and amax-history-too-short share one sequence of
// tensors and one run (common.cpp).

/// Delayed scaling (E4M3, margin 0, TE's `max` algorithm) with an amax
/// history of `history_len` steps, over a tensor that shrinks 64-fold in
/// kHistorySteps steps and peaks 8-fold every kHistoryPeriod steps.
RunResult amax_history_run(std::size_t history_len, std::string setup);
/// The period of the peaks of amax_history_run's sequence.
inline constexpr std::size_t kHistoryPeriod = 16;

// ---------------------------------------------------------------------------
// The chapter's registry entries, one per pitfalls/<id>.cpp, in the order
// pitfalls/register.cpp registers them.

/// fp8-no-scaling: scale 1 flushes gradients and saturates large activations.
Pitfall fp8_no_scaling_pitfall();
/// e4m3-for-gradients: dy in E4M3 loses the small rows' gradients; HYBRID's E5M2 keeps them.
Pitfall e4m3_for_gradients_pitfall();
/// delayed-scaling-spike: the spike saturates, then the stale amax keeps
/// the scale small and later tensors underflow.
Pitfall delayed_scaling_spike_pitfall();
/// amax-history-too-long: the scale lags a shrinking tensor: underflow.
Pitfall amax_history_too_long_pitfall();
/// amax-history-too-short: the history forgets a periodic peak: saturation.
Pitfall amax_history_too_short_pitfall();
/// per-tensor-outlier: one outlier flattens the other values of its tensor.
Pitfall per_tensor_outlier_pitfall();
/// saturation-hides-overflow: inf becomes ±448; only the counts tell.
Pitfall saturation_hides_overflow_pitfall();
/// e4m3-max-240-448-480: which values between 240 and 512 each E4M3 keeps.
Pitfall e4m3_max_240_448_480_pitfall();
/// resume-drops-amax-history: a resume without the FP8 histories and scales
/// quantizes with scale 1, then with other scales than the uninterrupted run.
Pitfall resume_drops_amax_history_pitfall();

}  // namespace mpt::ch07
