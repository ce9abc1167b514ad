// Chapter 04 — numerically stable softmax, cross-entropy and attention: the
// chapter's pitfalls, registered in the order of `mpt pitfalls`, `mpt tour`
// and the chapter text.
// Depends on: chapters.hpp (the declaration), common.hpp (the entries).
//
// To add a pitfall: a new pitfalls/<id>.cpp with its runs, outcomes and
// checks and an entry function (declared in common.hpp); one line here; one
// line in chapters/CMakeLists.txt; the chapter text's snippet markers
// (\snippet chapters/04-softmax-attention/pitfalls/<id>.cpp <id>-fixed); the
// test test_ch04_pitfalls covers every registered entry automatically.
#include "chapters.hpp"
#include "common.hpp"

namespace mpt {

void register_chapter04_pitfalls(Registry& registry) {
  registry.add(ch04::fp16_softmax_overflow_pitfall());
  registry.add(ch04::log_softmax_underflow_pitfall());
  registry.add(ch04::fp16_loss_reduction_pitfall());
  registry.add(ch04::fp16_mask_values_pitfall());
  registry.add(ch04::fully_masked_row_nan_pitfall());
  registry.add(ch04::attention_scale_overflow_pitfall());
  registry.add(ch04::autocast_disabled_softmax_pitfall());
  registry.add(ch04::naive_loss_training_pitfall());
}

}  // namespace mpt
