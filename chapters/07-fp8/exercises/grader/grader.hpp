// Chapter 07 — exercises: what every grader test file shares, instructors' hidden tests included.
// Depends on: doctest, grader_kit.hpp, ex07.hpp, mpt (the fp8 tier's
// DelayedScaling, mx_scale_code, quantize_with_scale; the core tier's Rng).
// The exercise list; the reference answers (mpt is the oracle: its
// DelayedScaling for 7.1, its mx_scale_code for 7.2, and for 7.3 the runs
// its recipes make under each misconfiguration, labelled by the
// misconfiguration that made them); the kit's helpers.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "ex07.hpp"
#include "grader_kit.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/core/random.hpp"
#include "mpt/fp8/fp8_math.hpp"
#include "mpt/fp8/quantize.hpp"
#include "mpt/fp8/recipes.hpp"

namespace mpt::ex07::grading {

// ---- the exercises --------------------------------------------------------
// A test case belongs to an exercise through its doctest test suite,
// "exercise-" + id; each test case that passes scores its exercise's points
// per test case (the last number below): 2 for a behaviour to write, 1 for
// the test cases whose name ends "[1 point]" (bad input). The kit's grader
// main (grader_main.cpp) reads this list as exercise_kit::kChapter.

using exercise_kit::Exercise;
using exercise_kit::Kind;

inline constexpr Exercise kExercises[] = {
    {"7.1", "delayed scaling's update after a step: the amax history and the scale", Kind::write, 2},
    {"7.2", "an MX block's E8M0 scale, by OCP's FLOOR and NVIDIA's RCEIL", Kind::write, 2},
    {"7.3", "name the cause of an FP8 run's symptoms", Kind::write, 2},
};

using exercise_kit::bits_of;
using exercise_kit::describe;
using exercise_kit::float_of;
using exercise_kit::Mismatches;
using mpt::fp8::AmaxComputeAlgo;
using mpt::fp8::DelayedScalingOptions;
using mpt::fp8::MxScaleRule;
using mpt::fp8::Pass;

inline const float kInfF = std::numeric_limits<float>::infinity();
inline const float kNaNF = std::numeric_limits<float>::quiet_NaN();

/// "e4m3", "e5m2".
inline std::string name_of(mpt::DType d) { return std::string(mpt::dtype_name(d)); }

/// A float short: "448", "inf", "1.17549435e-38".
inline std::string short_of(float x) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(x));
  return buf;
}

/// What a call threw: "" when nothing, else the exception's kind.
template <class F>
std::string thrown_by(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument&) {
    return "invalid_argument";
  } catch (const std::exception& e) {
    return std::string("another exception: ") + e.what();
  }
  return "";
}

// ---- 7.1: delayed scaling's update ----------------------------------------

/// "{0, 3, 1.5}".
inline std::string describe(const std::vector<float>& v) {
  std::string s = "{";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + short_of(v[i]);
  return s + "}";
}

/// The same floats, bit for bit.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (bits_of(a[i]) != bits_of(b[i])) return false;
  return true;
}

/// "e4m3, len 4, max, margin 0".
inline std::string describe(mpt::DType dtype, const DelayedScalingOptions& o) {
  return name_of(dtype) + ", len " + std::to_string(o.amax_history_len) + ", " +
         std::string(mpt::fp8::amax_compute_algo_name(o.algo)) + ", margin " + std::to_string(o.margin);
}

/// Plays `amaxes` through the student's delayed_update and through mpt's
/// DelayedScaling (record_amax, update) side by side from a fresh state;
/// adds one line to `m` at the first step that differs (history, scale or
/// the chosen amax).
inline void expect_sequence(Mismatches& m, mpt::DType dtype, const DelayedScalingOptions& o,
                            const std::vector<float>& amaxes, const std::string& why) {
  m.checked();
  mpt::fp8::DelayedScaling ref(dtype, o);
  DelayedState got;
  got.amax_history.assign(o.amax_history_len, 0.0f);
  for (std::size_t t = 0; t < amaxes.size(); ++t) {
    const std::vector<float> before = got.amax_history;
    const float before_scale = got.scale;
    ref.record_amax(amaxes[t]);
    ref.update();
    const float chosen = delayed_update(got, amaxes[t], dtype, o);
    std::string problem;
    if (!same_bits(got.amax_history, ref.amax_history()))
      problem = "history " + describe(got.amax_history) + ", expected " + describe(ref.amax_history());
    else if (bits_of(got.scale) != bits_of(ref.scale()))
      problem = "scale " + describe(got.scale) + ", expected " + describe(ref.scale());
    else if (bits_of(chosen) != bits_of(ref.last_update_amax()))
      problem = "returned amax " + short_of(chosen) + ", expected " + short_of(ref.last_update_amax());
    if (problem.empty()) continue;
    if (m.wrong())
      m.detail(why + " (" + describe(dtype, o) + "), step " + std::to_string(t) + " of " + describe(amaxes) +
               ": from history " + describe(before) + " and scale " + short_of(before_scale) +
               ", step amax " + short_of(amaxes[t]) + ": " + problem);
    return;
  }
}

// ---- 7.2: an MX block's E8M0 scale ----------------------------------------

/// "floor" or "rceil".
inline std::string name_of(MxScaleRule r) { return r == MxScaleRule::floor ? "floor" : "rceil"; }

/// The student's code for `amax` against mpt's mx_scale_code; one line to
/// `m` when they differ.
inline void expect_code(Mismatches& m, float amax, mpt::DType element, MxScaleRule rule) {
  m.checked();
  const std::uint8_t want = mpt::fp8::mx_scale_code(amax, mpt::fp8::fp8_spec(element), rule);
  const std::uint8_t got = e8m0_scale(amax, element, rule);
  if (got == want || !m.wrong()) return;
  m.detail(name_of(rule) + ", " + name_of(element) + " elements, amax " + describe(amax) + ": code " +
           std::to_string(got) + ", expected " + std::to_string(want) + " (2^" +
           std::to_string(int(want) - 127) + ")");
}

/// expect_code by both rules for both element formats.
inline void expect_codes(Mismatches& m, float amax) {
  for (const mpt::DType e : {mpt::DType::e4m3, mpt::DType::e5m2})
    for (const MxScaleRule r : {MxScaleRule::floor, MxScaleRule::rceil}) expect_code(m, amax, e, r);
}

// ---- 7.3: runs under each cause ---------------------------------------------

inline constexpr std::size_t kRunSteps = 40;     // steps per run
inline constexpr std::size_t kRunValues = 1024;  // values per step

/// "stale_after_spike".
inline std::string name_of(Cause c) {
  switch (c) {
    case Cause::healthy: return "healthy";
    case Cause::no_scaling: return "no_scaling";
    case Cause::e4m3_gradients: return "e4m3_gradients";
    case Cause::stale_after_spike: return "stale_after_spike";
    case Cause::history_too_long: return "history_too_long";
    case Cause::history_too_short: return "history_too_short";
    case Cause::per_tensor_outlier: return "per_tensor_outlier";
  }
  return "(not a Cause: " + std::to_string(static_cast<int>(c)) + ")";
}

/// Every cause, in the enum's order.
inline const std::vector<Cause>& all_causes() {
  static const std::vector<Cause> c = {
      Cause::healthy,          Cause::no_scaling,        Cause::e4m3_gradients,    Cause::stale_after_spike,
      Cause::history_too_long, Cause::history_too_short, Cause::per_tensor_outlier};
  return c;
}

/// A run and how it was made (for the grader's messages).
struct GradedRun {
  Cause cause = Cause::healthy;
  std::uint64_t seed = 0;
  std::string setup;  ///< "backward e5m2, delayed len 12, a 2^8 spike at step 11"
  RunRecord run;
};

/// The run mpt's recipes make for `cause` with `seed`. The watched tensor
/// is an activation (forward: typical · z · exp(0.5 w), z and w standard
/// normals) or a gradient (backward: typical 2^-24..2^-14, spread
/// exp(2.5 w): many binades), stored as TE's HYBRID format stores it (E4M3
/// forward, E5M2 backward; e4m3_gradients: E4M3 backward). Its size per
/// step: a slow wobble of ±0.25 binade, and what the cause adds — a spike
/// of 2^7..2^10 at one step from step 8 to 16 (stale_after_spike, history
/// 8..24), a shrink of 2^9..2^12 over the run (history_too_long, history
/// 1024, TE's default), peaks of 2^5..2^7 every 5..9 steps (history_too_short,
/// history 1 or 2), one value 2^13..2^16 above the typical one at the same
/// place every step (per_tensor_outlier). Delayed scaling (TE's `max`,
/// margin 0) with a history of 8..32 steps unless the cause says otherwise;
/// no_scaling quantizes every step with scale 1 (its activations 2^6..2^9
/// large). Each step: quantize with the recipe (mpt's DelayedScaling or
/// quantize_with_scale), log amax, scale and counts, update.
inline GradedRun make_run(Cause cause, std::uint64_t seed) {
  mpt::Rng rng(0x7e3000u + seed * 131u + static_cast<std::uint64_t>(cause));
  GradedRun g;
  g.cause = cause;
  g.seed = seed;
  Pass pass = rng.below(2) == 0 ? Pass::forward : Pass::backward;
  if (cause == Cause::e4m3_gradients) pass = Pass::backward;
  if (cause == Cause::per_tensor_outlier) pass = Pass::forward;
  const bool forward = pass == Pass::forward;
  const mpt::DType dtype = cause == Cause::e4m3_gradients
                               ? mpt::DType::e4m3
                               : mpt::fp8::fp8_dtype_for(mpt::fp8::Fp8Format::hybrid, pass);
  double typical = forward ? std::exp2(rng.uniform(-3.0, 3.0)) : std::exp2(rng.uniform(-24.0, -14.0));
  if (cause == Cause::no_scaling && forward) typical = std::exp2(rng.uniform(6.0, 9.0));
  const double spread = forward ? 0.5 : 1.5;
  std::size_t len = 8 + static_cast<std::size_t>(rng.below(25));
  if (cause == Cause::stale_after_spike) len = 8 + static_cast<std::size_t>(rng.below(17));
  if (cause == Cause::history_too_long) len = 1024;
  if (cause == Cause::history_too_short) len = 1 + static_cast<std::size_t>(rng.below(2));
  const double wobble_period = rng.uniform(12.0, 30.0), wobble_phase = rng.uniform(0.0, 6.283);
  const std::size_t spike_at = 8 + static_cast<std::size_t>(rng.below(9));
  const double spike = std::exp2(rng.uniform(7.0, 10.0));
  const double shrink = rng.uniform(9.0, 12.0);
  const std::size_t period = 5 + static_cast<std::size_t>(rng.below(5));
  const std::size_t phase = static_cast<std::size_t>(rng.below(period));
  const double peak = std::exp2(rng.uniform(5.0, 7.0));
  const double outlier = std::exp2(rng.uniform(13.0, 16.0));
  const std::size_t outlier_at = static_cast<std::size_t>(rng.below(kRunValues));

  g.setup = std::string(forward ? "forward " : "backward ") + name_of(dtype) + ", typical 2^" +
            std::to_string(static_cast<int>(std::lround(std::log2(typical))));
  if (cause == Cause::no_scaling) g.setup += ", scale 1";
  else g.setup += ", delayed len " + std::to_string(len);
  if (cause == Cause::stale_after_spike)
    g.setup += ", a 2^" + short_of(static_cast<float>(std::log2(spike))) + " spike at step " +
               std::to_string(spike_at);
  if (cause == Cause::history_too_long) g.setup += ", shrinking 2^" + short_of(static_cast<float>(shrink));
  if (cause == Cause::history_too_short)
    g.setup += ", 2^" + short_of(static_cast<float>(std::log2(peak))) + " peaks every " +
               std::to_string(period) + " steps";
  if (cause == Cause::per_tensor_outlier)
    g.setup += ", an outlier 2^" + short_of(static_cast<float>(std::log2(outlier))) + " above";

  DelayedScalingOptions options;
  options.amax_history_len = len;
  options.margin = 0;
  options.algo = AmaxComputeAlgo::max;
  mpt::fp8::DelayedScaling recipe(dtype, options);
  g.run.pass = pass;
  g.run.dtype = dtype;
  std::vector<float> x(kRunValues);
  for (std::size_t t = 0; t < kRunSteps; ++t) {
    const double tt = static_cast<double>(t);
    double size = typical * std::exp2(0.25 * std::sin(6.283 * tt / wobble_period + wobble_phase));
    if (cause == Cause::stale_after_spike && t == spike_at) size *= spike;
    if (cause == Cause::history_too_long) size *= std::exp2(-shrink * tt / static_cast<double>(kRunSteps));
    if (cause == Cause::history_too_short && t % period == phase && t > 0) size *= peak;
    for (float& v : x) v = static_cast<float>(size * rng.normal() * std::exp(spread * rng.normal()));
    if (cause == Cause::per_tensor_outlier)
      x[outlier_at] = static_cast<float>(size * outlier * (1.0 + 0.05 * rng.uniform(-1.0, 1.0)));
    const mpt::fp8::Fp8Tensor q = cause == Cause::no_scaling
                                      ? mpt::fp8::quantize_with_scale(x.data(), x.size(), dtype, 1.0f)
                                      : recipe.quantize(x.data(), x.size());
    if (cause != Cause::no_scaling) recipe.update();
    StepRecord s;
    s.amax = q.amax[0];
    s.scale = q.scales[0];
    s.values = x.size();
    s.saturated = q.counts.saturated;
    s.flushed = q.counts.flushed;
    g.run.steps.push_back(s);
  }
  return g;
}

/// The student's answer for `g`; one line to `m` when it is not g.cause.
inline void expect_cause(Mismatches& m, const GradedRun& g) {
  m.checked();
  const Cause got = diagnose(g.run);
  if (got == g.cause || !m.wrong()) return;
  m.detail("run " + std::to_string(g.seed) + " (" + g.setup + "): " + name_of(got) + ", expected " +
           name_of(g.cause));
}

}  // namespace mpt::ex07::grading

namespace mpt::exercise_kit {
/// What the kit's grader main grades: Chapter 7 and its exercises.
inline constexpr Chapter kChapter{7, mpt::ex07::grading::kExercises,
                                  sizeof mpt::ex07::grading::kExercises / sizeof(Exercise)};
}  // namespace mpt::exercise_kit
