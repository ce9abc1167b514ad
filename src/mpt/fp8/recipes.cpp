// Chapter 07 — FP8 training: delayed and current scaling.
// Depends on: recipes.hpp, formats/explain.hpp (shortest_decimal, for messages).
#include "mpt/fp8/recipes.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "mpt/formats/explain.hpp"

namespace mpt::fp8 {

namespace {

void check_margin(const char* recipe, int margin) {
  if (margin < 0 || margin > kMaxMargin)
    throw std::invalid_argument(std::string(recipe) + ": margin = " + std::to_string(margin) +
                                "; it must be a whole number from 0 to " + std::to_string(kMaxMargin));
}

}  // namespace

DType fp8_dtype_for(Fp8Format format, Pass pass) {
  return format == Fp8Format::hybrid && pass == Pass::backward ? DType::e5m2 : DType::e4m3;
}

std::string_view amax_compute_algo_name(AmaxComputeAlgo a) {
  return a == AmaxComputeAlgo::max ? "max" : "most_recent";
}

AmaxComputeAlgo amax_compute_algo_named(std::string_view name) {
  if (name == "max") return AmaxComputeAlgo::max;
  if (name == "most_recent") return AmaxComputeAlgo::most_recent;
  throw std::invalid_argument("unknown amax_compute_algo '" + std::string(name) +
                              "'; valid: max, most_recent");
}

// ---------------------------------------------------------------------------
// Delayed scaling.

DelayedScaling::DelayedScaling(DType dtype, const DelayedScalingOptions& options)
    : dtype_(dtype), options_(options) {
  const FormatSpec& f = fp8_spec(dtype);
  check_margin("DelayedScaling", options.margin);
  if (options.amax_history_len < 1 || options.amax_history_len > kMaxAmaxHistoryLen)
    throw std::invalid_argument(
        "DelayedScaling: amax_history_len = " + std::to_string(options.amax_history_len) +
        "; it must be from 1 to " + std::to_string(kMaxAmaxHistoryLen));
  scaled_max_ = scaled_max(f, options.margin);
  history_.assign(options.amax_history_len, 0.0f);
}

void DelayedScaling::restore(float scale, const std::vector<float>& history) {
  if (history.size() != history_.size())
    throw std::invalid_argument("DelayedScaling: a saved amax history of " + std::to_string(history.size()) +
                                " entries, this state's amax_history_len is " +
                                std::to_string(history_.size()));
  for (const float a : history)
    if (!(a >= 0.0f))
      throw std::invalid_argument("DelayedScaling: a saved amax history holds " + std::to_string(a) +
                                  "; an amax is >= 0");
  if (!(std::isfinite(scale) && scale > 0.0f))
    throw std::invalid_argument("DelayedScaling: a saved scale of " + std::to_string(scale) +
                                "; a scale is finite and > 0");
  history_ = history;
  scale_ = scale;
}

void DelayedScaling::set_pending_amax(float amax) {
  if (!(amax >= 0.0f))
    throw std::invalid_argument("DelayedScaling: a pending amax of " + shortest_decimal(amax) +
                                "; an amax is >= 0 (not NaN)");
  history_[0] = amax;
}

void DelayedScaling::record_amax(float amax) { history_[0] = amax_step(history_[0], amax); }

Fp8Tensor DelayedScaling::quantize(const float* x, std::size_t n, bool saturate) {
  Fp8Tensor t = quantize_with_scale(x, n, dtype_, scale_, saturate);
  record_amax(t.amax[0]);
  return t;
}

void DelayedScaling::update() {
  //! [delayed-update]
  const std::size_t len = history_.size();
  const float last = history_[0];
  float amax = 0.0f;
  if (last != 0.0f) {
    // kernel_bulk's roll, one thread's view: a_i is entry i+1 (the last
    // entry takes the step's amax), the max runs over every a_i, and entry
    // i > 0 becomes a_i while entry 0 is cleared for the next step.
    for (std::size_t i = 0; i < len; ++i) {
      const float a = i + 1 < len ? history_[i + 1] : last;
      amax = std::fmax(amax, a);
      history_[i] = i > 0 ? a : 0.0f;
    }
  }
  if (options_.algo == AmaxComputeAlgo::most_recent) amax = last;
  last_amax_ = amax;
  scale_ = delayed_scale_from_amax(amax, scale_, scaled_max_);
  //! [delayed-update]
}

std::vector<DelayedStep> simulate_delayed(const std::vector<float>& amaxes, DType dtype,
                                          const DelayedScalingOptions& options) {
  DelayedScaling state(dtype, options);
  const FormatSpec& f = fp8_spec(dtype);
  std::vector<DelayedStep> steps;
  steps.reserve(amaxes.size());
  for (std::size_t i = 0; i < amaxes.size(); ++i) {
    const float a = amaxes[i];
    if (std::isnan(a) || a < 0.0f)
      throw std::invalid_argument("amax " + shortest_decimal(a) + " (step " + std::to_string(i + 1) +
                                  ") is not an amax; an amax is a number >= 0 or inf");
    DelayedStep s{};
    s.amax = a;
    s.scale = state.scale();
    const Fp8Outcome o = quantize_element(a, s.scale, f, true).outcome;
    s.overflow = o == Fp8Outcome::saturated;
    state.record_amax(a);
    state.update();
    s.update_amax = state.last_update_amax();
    s.next_scale = state.scale();
    steps.push_back(s);
  }
  return steps;
}

// ---------------------------------------------------------------------------
// Current scaling.

float current_scale(float amax, DType dtype, const CurrentScalingOptions& options) {
  const FormatSpec& f = fp8_spec(dtype);
  check_margin("current scaling", options.margin);
  if (!(std::isfinite(options.amax_epsilon) && options.amax_epsilon >= 0.0f))
    throw std::invalid_argument("current scaling: amax_epsilon = " + shortest_decimal(options.amax_epsilon) +
                                "; it must be a finite number >= 0");
  return current_scale_from_amax(amax, scaled_max(f, options.margin), options.power_2_scale,
                                 options.amax_epsilon);
}

Fp8Tensor quantize_current(const float* x, std::size_t n, DType dtype, const CurrentScalingOptions& options,
                           bool saturate) {
  const float scale = current_scale(amax_of(x, n), dtype, options);
  return quantize_with_scale(x, n, dtype, scale, saturate);
}

}  // namespace mpt::fp8
