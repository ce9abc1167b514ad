// Chapter 02 — loss scaling and FP32 master weights: the chapter's pitfalls,
// registered in the order of `mpt pitfalls`, `mpt tour` and the chapter text.
// Depends on: chapters.hpp (the declaration), common.hpp (the entries).
//
// To add a pitfall: a new pitfalls/<id>.cpp with its runs, outcomes and
// checks and an entry function (declared in common.hpp); one line here; one
// line in chapters/CMakeLists.txt; the chapter text's snippet markers
// (\snippet chapters/02-loss-scaling/pitfalls/<id>.cpp <id>-fixed); the test
// test_ch02_pitfalls covers every registered entry automatically.
#include "chapters.hpp"
#include "common.hpp"

namespace mpt {

void register_chapter02_pitfalls(Registry& registry) {
  registry.add(ch02::no_loss_scaling_pitfall());
  registry.add(ch02::static_scale_too_large_pitfall());
  registry.add(ch02::update_forgotten_pitfall());
  registry.add(ch02::clip_before_unscale_pitfall());
  registry.add(ch02::accumulation_unscale_pitfall());
  registry.add(ch02::fp16_weights_no_master_pitfall());
  registry.add(ch02::init_scale_skips_pitfall());
  registry.add(ch02::adam_eps_fp16_pitfall());
  registry.add(ch02::resume_without_scaler_state_pitfall());
}

}  // namespace mpt
