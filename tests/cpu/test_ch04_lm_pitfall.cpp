// Chapter 04 — tests of the pitfall naive-loss-training (the tiny
// Transformer with an fp16 softmax without the max subtracted).
// Depends on: chapters/04-softmax-attention/pitfalls/lm_pitfall.hpp (the
// entry, compiled into mpt::chapters), mpt/core/pitfall.hpp, doctest,
// test_support.hpp.
//
// The entry is tested directly, with the rule every chapter's pitfall suite
// applies to registered entries: the symptom holds on the broken run and
// every symptom check fails on the fixed run, the cure the other way round,
// the preconditions on both; both runs measure the same outcomes, and a
// rerun gives the same numbers, bit for bit.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../../chapters/04-softmax-attention/pitfalls/lm_pitfall.hpp"
#include "mpt/core/pitfall.hpp"
#include "test_support.hpp"

namespace {

using mpt::Pitfall;
using mpt::RunResult;

struct Runs {
  RunResult broken, fixed;
  double broken_seconds = 0, fixed_seconds = 0;
};

const Runs& runs() {
  static const Runs r = [] {
    const Pitfall p = mpt::ch04::naive_loss_training_pitfall();
    Runs out;
    auto t0 = std::chrono::steady_clock::now();
    out.broken = p.broken();
    auto t1 = std::chrono::steady_clock::now();
    out.fixed = p.fixed();
    auto t2 = std::chrono::steady_clock::now();
    out.broken_seconds = std::chrono::duration<double>(t1 - t0).count();
    out.fixed_seconds = std::chrono::duration<double>(t2 - t1).count();
    return out;
  }();
  return r;
}

bool same_bits(double a, double b) {
  std::uint64_t ua = 0, ub = 0;
  std::memcpy(&ua, &a, sizeof a);
  std::memcpy(&ub, &b, sizeof b);
  return ua == ub;
}

}  // namespace

TEST_CASE("naive-loss-training: the entry is well formed") {
  const Pitfall p = mpt::ch04::naive_loss_training_pitfall();
  CHECK(p.id == "naive-loss-training");
  CHECK(p.chapter == 4);
  CHECK(!p.symptom.empty());
  CHECK(!p.cure.empty());
  mpt::Registry reg;
  CHECK_NOTHROW(reg.add(p));
}

TEST_CASE("naive-loss-training: the symptom shows on the broken run and the fix works") {
  const Pitfall p = mpt::ch04::naive_loss_training_pitfall();
  const Runs& r = runs();
  const auto symptom = mpt::evaluate_checks(p.symptom, r.broken);
  const auto cure = mpt::evaluate_checks(p.cure, r.fixed);
  CHECK_MESSAGE(!mpt_test::any_fails(symptom), "symptom checks failing:" << mpt_test::failed_claims(symptom));
  CHECK_MESSAGE(!mpt_test::any_fails(cure), "cure checks failing:" << mpt_test::failed_claims(cure));
  mpt_test::check_separates(p, r.broken, r.fixed);
  mpt_test::check_preconditions(p, r.broken, r.fixed);
  mpt_test::check_runs_comparable(r.broken, r.fixed);
}

TEST_CASE("naive-loss-training: what the runs measured") {
  const Runs& r = runs();
  // Both start from the same weights and data: the same initial validation loss, bit for bit.
  CHECK(same_bits(r.broken.get("initial_valid_loss"), r.fixed.get("initial_valid_loss")));
  // The broken run overflows early; the fixed run sees logits as large and stays finite.
  CHECK(r.broken.get("first_nonfinite_loss_step") >= 1);
  CHECK(r.broken.get("first_nonfinite_loss_step") <= 20);
  CHECK(r.fixed.get("first_nonfinite_loss_step") == 0);
  CHECK(r.fixed.get("skipped_steps") < 5);
  // Each run stays within the time a pitfall may take.
  CHECK(r.broken_seconds < 2.0);
  CHECK(r.fixed_seconds < 2.0);
}

TEST_CASE("naive-loss-training: a rerun gives the same numbers, bit for bit") {
  const Pitfall p = mpt::ch04::naive_loss_training_pitfall();
  const RunResult again = p.broken();
  const Runs& r = runs();
  REQUIRE(again.outcomes.size() == r.broken.outcomes.size());
  for (std::size_t i = 0; i < again.outcomes.size(); ++i)
    CHECK_MESSAGE(same_bits(again.outcomes[i].value, r.broken.outcomes[i].value), again.outcomes[i].name);
}
