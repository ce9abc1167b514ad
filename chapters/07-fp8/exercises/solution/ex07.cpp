// Chapter 07 — exercises: the reference solution. MPT-REFERENCE-SOLUTION (never shipped to students).
// Depends on: ex07.hpp, the C++ standard library. tools/make_handout.sh
// refuses to ship a file with the marker above or any long line of this one.
#include "ex07.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace mpt::ex07 {

namespace {

std::uint32_t bits(float x) {
  std::uint32_t b = 0;
  std::memcpy(&b, &x, sizeof(float));
  return b;
}

// The largest finite value of an element format, and the exponent of its
// top binade; std::invalid_argument for a dtype that is not FP8.
struct Element {
  float max_norm;
  int emax;
};
Element element_of(mpt::DType d, const char* what) {
  if (d == mpt::DType::e4m3) return {448.0f, 8};
  if (d == mpt::DType::e5m2) return {57344.0f, 15};
  throw std::invalid_argument(std::string(what) + ": dtype " + std::string(mpt::dtype_name(d)) +
                              " is not an FP8 format; valid: e4m3, e5m2");
}

// fmaxf's rule for an amax: the larger, a NaN ignored.
float amax_max(float running, float x) {
  const float a = std::fabs(x);
  return std::isnan(a) || !(a > running) ? running : a;
}

}  // namespace

// ---- 7.1 ----------------------------------------------------------------------

float delayed_update(DelayedState& state, float step_amax, mpt::DType dtype,
                     const mpt::fp8::DelayedScalingOptions& options) {
  const Element e = element_of(dtype, "delayed_update");
  if (options.margin < 0 || options.margin > mpt::fp8::kMaxMargin)
    throw std::invalid_argument("delayed_update: margin " + std::to_string(options.margin) +
                                "; valid: 0 to " + std::to_string(mpt::fp8::kMaxMargin));
  std::vector<float>& h = state.amax_history;
  if (h.empty() || h.size() != options.amax_history_len)
    throw std::invalid_argument("delayed_update: a history of " + std::to_string(h.size()) +
                                " entries; amax_history_len is " + std::to_string(options.amax_history_len) +
                                " (at least 1)");
  h[0] = amax_max(h[0], step_amax);
  const float last = h[0];
  float amax = 0.0f;
  if (last != 0.0f) {
    for (const float a : h) amax = amax_max(amax, a);  // the history before the roll
    for (std::size_t i = 1; i + 1 < h.size(); ++i) h[i] = h[i + 1];
    h.back() = last;
    h[0] = 0.0f;  // after the last: with one entry, the slot is also the last
  }
  if (options.algo == mpt::fp8::AmaxComputeAlgo::most_recent) amax = last;
  if (std::isfinite(amax) && amax > 0.0f) {
    const float scaled_max = std::ldexp(e.max_norm, -options.margin);
    float scale = scaled_max / amax;
    if (std::isinf(scale)) scale = std::numeric_limits<float>::max();
    state.scale = scale;
  }
  return amax;
}

// ---- 7.2 ----------------------------------------------------------------------

std::uint8_t e8m0_scale(float amax, mpt::DType element, mpt::fp8::MxScaleRule rule) {
  const Element e = element_of(element, "e8m0_scale");
  if (std::isnan(amax)) return 0xFF;
  if (rule == mpt::fp8::MxScaleRule::floor) {
    // The exponent field: a zero or subnormal amax reads as 2^-127, inf as 2^128.
    const int field = static_cast<int>((bits(amax) >> 23) & 0xFFu);
    int x = field - 127 - e.emax;
    if (x < -127) x = -127;
    if (x > 127) x = 127;
    return static_cast<std::uint8_t>(x + 127);
  }
  const float rcp = 1.0f / e.max_norm;        // rounded to float, as the kernels hold it
  const float v = std::fabs(amax) * rcp;      // rounded to float once
  if (std::isinf(v)) return 254;              // saturates at 2^127
  if (v <= std::ldexp(1.0f, -127)) return 0;  // everything up to 2^-127
  const std::uint32_t b = bits(v);
  std::uint32_t field = b >> 23;
  if ((b & 0x7FFFFFu) != 0 && field != 0) ++field;  // above 2^(field-127): one binade up
  else if (field == 0) field = 1;                   // a subnormal above 2^-127: 2^-126
  return static_cast<std::uint8_t>(field > 254 ? 254 : field);
}

// ---- 7.3 ----------------------------------------------------------------------

Cause diagnose(const RunRecord& run) {
  if (run.steps.empty()) throw std::invalid_argument("diagnose: a run without steps");
  const Element e = element_of(run.dtype, "diagnose");
  for (const StepRecord& s : run.steps) {
    if (s.saturated + s.flushed > s.values)
      throw std::invalid_argument("diagnose: a step counts more saturated and flushed values than it has");
    if (!(std::isfinite(s.scale) && s.scale > 0.0f))
      throw std::invalid_argument("diagnose: a step's scale is not finite and > 0");
  }
  // A scale that never moves: nothing was scaled.
  bool all_one = true;
  for (const StepRecord& s : run.steps) all_one = all_one && s.scale == 1.0f;
  if (all_one) return Cause::no_scaling;
  // Gradients in E4M3: the format is the cause, whatever else shows.
  if (run.pass == mpt::fp8::Pass::backward && run.dtype == mpt::DType::e4m3) return Cause::e4m3_gradients;
  // From step 1 on (step 0 ran with the initial scale 1): how far each
  // step's amax landed from the format's max.
  std::size_t overshoots = 0;
  double flushed = 0, values = 0;
  std::vector<double> use;
  for (std::size_t t = 1; t < run.steps.size(); ++t) {
    const StepRecord& s = run.steps[t];
    const double u =
        static_cast<double>(s.amax) * static_cast<double>(s.scale) / static_cast<double>(e.max_norm);
    use.push_back(u);
    // A step the history did not see coming: its amax far beyond the
    // max, and many of its values clamped (a heavy tail's largest value
    // alone saturates a few).
    if (u >= 4.0 && static_cast<double>(s.saturated) >= 0.015 * static_cast<double>(s.values)) ++overshoots;
    flushed += static_cast<double>(s.flushed);
    values += static_cast<double>(s.values);
  }
  if (overshoots >= 2) return Cause::history_too_short;  // peaks the history keeps forgetting
  if (overshoots == 1) return Cause::stale_after_spike;  // one spike (the steps after it underflow)
  // The last quarter of the run: the scale far above what the tensor needs.
  double late = 0;
  const std::size_t quarter = use.size() / 4 > 0 ? use.size() / 4 : 1;
  for (std::size_t i = use.size() - quarter; i < use.size(); ++i) late += use[i];
  late /= static_cast<double>(quarter);
  if (late < 1.0 / 32) return Cause::history_too_long;
  // Well aimed at the max and still flushing: one value set the scale.
  if (values > 0 && flushed / values > 0.005) return Cause::per_tensor_outlier;
  return Cause::healthy;
}

}  // namespace mpt::ex07
