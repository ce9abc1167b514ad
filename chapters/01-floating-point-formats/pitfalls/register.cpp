// Chapter 01 — floating-point formats and their limits: the chapter's pitfalls,
// registered in the order of `mpt pitfalls`, `mpt tour` and the chapter text.
// Depends on: chapters.hpp (the declaration), common.hpp (the entries).
//
// To add a pitfall: a new pitfalls/<id>.cpp with its runs, outcomes and
// checks and an entry function (declared in common.hpp); one line here; one
// line in chapters/CMakeLists.txt; the chapter text's snippet markers
// (\snippet chapters/01-floating-point-formats/pitfalls/<id>.cpp <id>-fixed);
// the test test_ch01_pitfalls covers every registered entry automatically.
#include "chapters.hpp"
#include "common.hpp"

namespace mpt {

void register_chapter01_pitfalls(Registry& registry) {
  registry.add(ch01::fp16_overflow_pitfall());
  registry.add(ch01::fp16_lost_update_pitfall());
  registry.add(ch01::fp16_sum_stagnation_pitfall());
  registry.add(ch01::fp16_gradient_underflow_pitfall());
  registry.add(ch01::fp16_vs_bf16_pitfall());
}

}  // namespace mpt
