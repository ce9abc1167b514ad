// Chapter 07 — pitfall amax-history-too-short: the history forgets a periodic peak
// Depends on: common.hpp (amax_history_run, check, this entry's
// declaration); <string>.
//
// The sequence of amax-history-too-long (a tensor shrinking 64-fold over
// 160 steps, 8 times larger every 16th step), with the opposite mistake: a
// history of 4 steps forgets each peak long before the next one, so every
// peak is quantized with the scale of the ordinary steps before it, and its
// values above the ordinary steps' amax are clamped to ±448. A history spanning the period
// (32 steps) remembers the last peak: the next one, smaller since the
// tensor shrinks, fits. The first peak saturates with any history (nothing
// has seen one yet): that takes a margin, or current scaling.
#include <string>

#include "common.hpp"

namespace mpt::ch07 {
namespace {
namespace amax_history_too_short {

RunResult broken_run() {
  //! [amax-history-too-short-broken]
  // a short history: the peaks come every 16 steps
  const std::size_t history_len = 4;
  //! [amax-history-too-short-broken]
  return amax_history_run(history_len,
                          "delayed scaling (E4M3, margin 0, max) with a history of 4 steps; "
                          "the same sequence: 8-fold peaks every 16 steps");
}

RunResult fixed_run() {
  //! [amax-history-too-short-fixed]
  // long enough to hold the last peak: two periods
  const std::size_t history_len = 2 * kHistoryPeriod;
  //! [amax-history-too-short-fixed]
  return amax_history_run(history_len, "the same sequence with a history of 32 steps (two periods)");
}

}  // namespace amax_history_too_short
}  // namespace

Pitfall amax_history_too_short_pitfall() {
  using namespace amax_history_too_short;
  return Pitfall{
      "amax-history-too-short",
      7,
      "amax history too short: it forgets a periodic peak, and every peak saturates",
      "A history shorter than the interval between a tensor's peaks has forgotten the last peak when the "
      "next one comes: each peak is quantized with the ordinary steps' scale and saturates. A history that "
      "spans the period remembers it.",
      broken_run,
      fixed_run,
      {
          check("the peaks after the first saturate more than 1% of their values",
                [](const RunResult& r) { return r.get("peak_saturated_fraction") > 0.01; }),
      },
      {
          check("no peak after the first saturates",
                [](const RunResult& r) { return r.get("peak_saturated_fraction") == 0; }),
      },
      {
          check("the first peak saturates (no history has seen one yet)",
                [](const RunResult& r) { return r.get("first_peak_saturated_fraction") > 0; }),
      }};
}

}  // namespace mpt::ch07
