// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the chapter's
// pitfalls, registered in the order of `mpt pitfalls`, `mpt tour` and the
// chapter text.
// Depends on: chapters.hpp (the declaration), common.hpp (the entries).
//
// To add a pitfall: a new pitfalls/<id>.cpp with its runs, outcomes and
// checks and an entry function (declared in common.hpp); one line here; one
// line in chapters/CMakeLists.txt; the chapter text's snippet markers
// (\snippet chapters/03-normalization/pitfalls/<id>.cpp <id>-fixed); the test
// test_ch03_pitfalls covers every registered entry automatically.
#include "chapters.hpp"
#include "common.hpp"

namespace mpt {

void register_chapter03_pitfalls(Registry& registry) {
  registry.add(ch03::bn_variance_fp16_pitfall());
  registry.add(ch03::variance_cancellation_pitfall());
  registry.add(ch03::layernorm_fp16_accumulation_pitfall());
  registry.add(ch03::running_stats_fp16_pitfall());
  registry.add(ch03::norm_eps_fp16_pitfall());
  registry.add(ch03::bn_skipped_step_not_skipped_pitfall());
}

}  // namespace mpt
