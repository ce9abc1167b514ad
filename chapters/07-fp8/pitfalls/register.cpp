// Chapter 07 — FP8 with per-tensor and block scaling: the chapter's pitfalls, registered in order
// Depends on: chapters.hpp (the declaration), common.hpp (the entries).
//
// The order is that of `mpt pitfalls`, `mpt tour` and the chapter text
// (issue 21's list). Most need only the fp8 tier; e4m3-for-gradients trains
// the blobs MLP under FP8, resume-drops-amax-history runs `mpt train`'s run.
//
// To add a pitfall: a new pitfalls/<id>.cpp with its runs, outcomes and
// checks and an entry function (declared in common.hpp); one line here; one
// line in chapters/CMakeLists.txt; the test test_ch07_pitfalls covers every
// registered entry automatically.
#include "chapters.hpp"
#include "common.hpp"

namespace mpt {

void register_chapter07_pitfalls(Registry& registry) {
  registry.add(ch07::fp8_no_scaling_pitfall());
  registry.add(ch07::e4m3_for_gradients_pitfall());
  registry.add(ch07::delayed_scaling_spike_pitfall());
  registry.add(ch07::amax_history_too_long_pitfall());
  registry.add(ch07::amax_history_too_short_pitfall());
  registry.add(ch07::per_tensor_outlier_pitfall());
  registry.add(ch07::saturation_hides_overflow_pitfall());
  registry.add(ch07::e4m3_max_240_448_480_pitfall());
  registry.add(ch07::resume_drops_amax_history_pitfall());
}

}  // namespace mpt
