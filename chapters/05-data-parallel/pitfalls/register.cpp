// Chapter 05 — loss scaling across ranks: the chapter's pitfalls, registered in order
// Depends on: chapters.hpp (the declaration), common.hpp (the entries).
//
// The order is that of `mpt pitfalls`, `mpt tour` and the chapter text.
//
// To add a pitfall: a new pitfalls/<id>.cpp with its runs, outcomes and
// checks and an entry function (declared in common.hpp); one line here; one
// line in chapters/CMakeLists.txt; the chapter text's snippet markers; the
// test test_ch05_pitfalls covers every registered entry automatically.
#include "chapters.hpp"
#include "common.hpp"

namespace mpt {

void register_chapter05_pitfalls(Registry& registry) {
  registry.add(ch05::fp16_allreduce_overflow_pitfall());
  registry.add(ch05::sharded_found_inf_unsynced_pitfall());
  registry.add(ch05::scaler_state_one_rank_pitfall());
  registry.add(ch05::loss_summed_across_ranks_pitfall());
  registry.add(ch05::ddp_accumulation_sync_pitfall());
  registry.add(ch05::bn_buffers_per_rank_pitfall());
  registry.add(ch05::ranks_disagree_on_skip_pitfall());
}

}  // namespace mpt
