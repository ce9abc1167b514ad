// Chapter 07 — pitfall amax-history-too-long: the scale lags a shrinking tensor
// Depends on: common.hpp (amax_history_run, check, this entry's
// declaration); <string>.
//
// Delayed scaling's `max` takes the largest amax of the last
// amax_history_len steps (Transformer Engine's default: 1024). A tensor
// that shrinks — gradients as the loss falls, here 64-fold over 160 steps,
// with an 8-fold peak every 16 steps — is quantized with the amax of a
// peak long past: with the default history the first peak's amax rules the
// whole run, the scale ends up hundreds of times smaller than the tensor's
// own, and its small values flush to zero. A history as long as the peaks'
// period (and no longer: 32 steps, two periods) follows the trend and still
// remembers the peak. amax-history-too-short is the other side of the same
// sequence.
#include <string>

#include "common.hpp"

namespace mpt::ch07 {
namespace {
namespace amax_history_too_long {

RunResult broken_run() {
  //! [amax-history-too-long-broken]
  // Transformer Engine's default history: 1024 steps
  const std::size_t history_len = 1024;
  //! [amax-history-too-long-broken]
  return amax_history_run(history_len,
                          "delayed scaling (E4M3, margin 0, max) with a history of 1024 steps; "
                          "a tensor shrinking 64-fold in 160 steps, 8-fold peaks every 16 steps");
}

RunResult fixed_run() {
  //! [amax-history-too-long-fixed]
  // two periods of the peaks, a fraction of the time the tensor takes to shrink
  const std::size_t history_len = 2 * kHistoryPeriod;
  //! [amax-history-too-long-fixed]
  return amax_history_run(history_len, "the same sequence with a history of 32 steps (two periods)");
}

}  // namespace amax_history_too_long
}  // namespace

Pitfall amax_history_too_long_pitfall() {
  using namespace amax_history_too_long;
  return Pitfall{
      "amax-history-too-long",
      7,
      "amax history too long: the scale lags a shrinking tensor and its small values underflow",
      "Delayed scaling's max over a long history (TE's default: 1024 steps) keeps an old, larger amax: the "
      "scale of a shrinking tensor stays too small and its small values flush to zero. A history as long as "
      "the tensor's peaks recur, and not much longer, follows the trend.",
      broken_run,
      fixed_run,
      {
          check("in the last period, the scale is more than 6 binades below the tensor's own",
                [](const RunResult& r) { return r.get("late_scale_lag_binades") > 6; }),
          check("in the last period, more than 4 times as many values flush as in the second",
                [](const RunResult& r) {
                  return r.get("late_flushed_fraction") > 4 * r.get("early_flushed_fraction");
                }),
      },
      {
          check("in the last period, the scale is less than 5 binades below the tensor's own",
                [](const RunResult& r) { return r.get("late_scale_lag_binades") < 5; }),
          check("in the last period, at most twice as many values flush as in the second",
                [](const RunResult& r) {
                  return r.get("late_flushed_fraction") <= 2 * r.get("early_flushed_fraction");
                }),
      },
      {
          check("the first peak saturates (no history has seen one yet)",
                [](const RunResult& r) { return r.get("first_peak_saturated_fraction") > 0; }),
      }};
}

}  // namespace mpt::ch07
