// Chapter 06 — per-task precision policies: the chapter's pitfalls, registered in order
// Depends on: chapters.hpp (the declaration), common.hpp (the entries).
//
// The order is that of `mpt pitfalls`, `mpt tour` and the chapter text.
//
// To add a pitfall: a new pitfalls/<id>.cpp with its runs, outcomes and
// checks and an entry function (declared in common.hpp); one line here; one
// line in chapters/CMakeLists.txt; the test test_ch06_pitfalls covers every
// registered entry automatically.
#include "chapters.hpp"
#include "common.hpp"

namespace mpt {

void register_chapter06_pitfalls(Registry& registry) {
  registry.add(ch06::name_substring_policy_pitfall());
  registry.add(ch06::bce_on_fp16_probabilities_pitfall());
  registry.add(ch06::sum_outside_autocast_pitfall());
  registry.add(ch06::half_under_autocast_pitfall());
  registry.add(ch06::cpu_autocast_list_pitfall());
  registry.add(ch06::ffn_fp32_rule_of_thumb_pitfall());
  registry.add(ch06::o3_everything_fp16_pitfall());
}

}  // namespace mpt
