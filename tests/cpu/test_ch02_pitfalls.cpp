// Chapter 02 — tests of chapter 2's pitfalls (loss scaling, master weights,
// the GradScaler's misuse cases, Adam's eps in fp16).
// Depends on: mpt/pitfall.hpp, mpt::chapters (pitfall_registry), doctest.
//
// Every entry must still show its failure and its fix, its checks must be
// able to fail, and its runs must be deterministic. The
// numbers the chapter text builds on are pinned at the end. Each run is
// made once and shared by the test cases (runs_of), plus once more for the
// determinism check: the suite stays quick in sanitizer builds too.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "mpt/registry/pitfall.hpp"
#include "test_support.hpp"

namespace {

using mpt::Pitfall;
using mpt::RunResult;

using mpt_test::any_fails;
using mpt_test::failed_claims;

/// Both runs of a pitfall, made on first use and kept.
struct Runs {
  RunResult broken, fixed;
};
const Runs& runs_of(const Pitfall& p) {
  static std::map<std::string, Runs> cache;
  auto it = cache.find(p.id);
  if (it == cache.end()) it = cache.emplace(p.id, Runs{p.broken(), p.fixed()}).first;
  return it->second;
}
const Runs& runs_of(const std::string& id) { return runs_of(mpt::pitfall_registry().get(id)); }

std::vector<const Pitfall*> chapter2() {
  std::vector<const Pitfall*> out;
  for (const Pitfall& p : mpt::pitfall_registry().all())
    if (p.chapter == 2) out.push_back(&p);
  return out;
}

// Same bits, NaN payloads included: a broken run that produces NaN must
// produce the same NaN every time.
bool same_bits(double a, double b) {
  std::uint64_t ua, ub;
  std::memcpy(&ua, &a, sizeof a);
  std::memcpy(&ub, &b, sizeof b);
  return ua == ub;
}

// The broken-run outcomes that are meant to be NaN: the loss of a network
// whose weights the pitfall turned into inf/NaN.
bool nan_expected(const std::string& id, const std::string& outcome) {
  return outcome == "train_loss" && (id == "static-scale-too-large" || id == "adam-eps-fp16");
}

}  // namespace

TEST_CASE("chapter 2 registers its nine pitfalls, in order, after chapter 1's") {
  const std::vector<std::string> expected = {
      "no-loss-scaling",     "static-scale-too-large", "update-forgotten",
      "clip-before-unscale", "accumulation-unscale",   "fp16-weights-no-master",
      "init-scale-skips",    "adam-eps-fp16",          "resume-without-scaler-state"};
  std::vector<std::string> ids;
  for (const Pitfall* p : chapter2()) ids.push_back(p->id);
  CHECK(ids == expected);
  int last_chapter = 0;
  for (const Pitfall& p : mpt::pitfall_registry().all()) {
    CHECK(p.chapter >= last_chapter);
    last_chapter = p.chapter;
  }
}

TEST_CASE("chapter 2: every pitfall shows its symptom and its fix") {
  for (const Pitfall* p : chapter2()) {
    SUBCASE(p->id.c_str()) {
      const Runs& r = runs_of(*p);
      const auto symptom = mpt::evaluate_checks(p->symptom, r.broken);
      const auto cure = mpt::evaluate_checks(p->cure, r.fixed);
      CHECK_MESSAGE(!any_fails(symptom), p->id << ": the broken run does not show the symptom; failed claims:"
                                               << failed_claims(symptom));
      CHECK_MESSAGE(!any_fails(cure),
                    p->id << ": the fixed run does not show the fix; failed claims:" << failed_claims(cure));
      mpt_test::check_preconditions(*p, r.broken, r.fixed);
    }
  }
}

// If a broken run and its fixed run became the same (or a check became a
// tautology), the test above could still pass. Check by check: every
// symptom check must fail on the fixed run and every cure check on the
// broken run; what both runs share is a precondition (held on both above).
TEST_CASE("chapter 2: every symptom check fails on the fixed run, every cure check on the broken run") {
  for (const Pitfall* p : chapter2()) {
    SUBCASE(p->id.c_str()) { mpt_test::check_separates(*p, runs_of(*p).broken, runs_of(*p).fixed); }
  }
}

TEST_CASE("chapter 2: broken and fixed runs measure the same things, deterministically") {
  for (const Pitfall* p : chapter2()) {
    SUBCASE(p->id.c_str()) {
      const RunResult &broken = runs_of(*p).broken, &fixed = runs_of(*p).fixed;
      mpt_test::check_runs_comparable(broken, fixed);
      const RunResult broken_again = p->broken(), fixed_again = p->fixed();
      REQUIRE(broken_again.outcomes.size() == broken.outcomes.size());
      REQUIRE(fixed_again.outcomes.size() == fixed.outcomes.size());
      for (std::size_t i = 0; i < broken.outcomes.size(); ++i) {
        const std::string& name = broken.outcomes[i].name;
        INFO(p->id << ": " << name);
        CHECK(same_bits(broken_again.outcomes[i].value, broken.outcomes[i].value));
        CHECK(same_bits(fixed_again.outcomes[i].value, fixed.outcomes[i].value));
        CHECK(broken_again.explanation == broken.explanation);
        // NaN only where the pitfall's point is a NaN, never in a fixed run.
        CHECK(!std::isnan(fixed.outcomes[i].value));
        if (!nan_expected(p->id, name)) CHECK(!std::isnan(broken.outcomes[i].value));
      }
    }
  }
}

// The numbers the chapter text builds on (measured by the runs; here is
// what they must come out as).
TEST_CASE("chapter 2: the numbers the chapter states") {
  SUBCASE("no-loss-scaling: most fp16 activation gradients are 0 without a scale; 2^16 never overflows") {
    const RunResult b = runs_of("no-loss-scaling").broken;
    const RunResult f = runs_of("no-loss-scaling").fixed;
    CHECK(b.get("loss_scale") == 1.0);
    CHECK(b.get("fc1_weight_change") == 0.0);  // every first-layer gradient flushed
    CHECK(f.get("loss_scale") == 65536.0);
    CHECK(f.get("skipped_steps") == 0.0);
  }
  SUBCASE("static-scale-too-large: 2^18 fits until a later step; the dynamic scaler skips once") {
    const RunResult b = runs_of("static-scale-too-large").broken;
    const RunResult f = runs_of("static-scale-too-large").fixed;
    CHECK(b.get("initial_scale") == std::ldexp(1.0, 18));
    CHECK(b.get("first_overflow_step") > 10);
    CHECK(f.get("first_overflow_step") == b.get("first_overflow_step"));  // same run up to there
    CHECK(f.get("skipped_steps") == 1.0);
    CHECK(f.get("final_scale") == std::ldexp(1.0, 17));
  }
  SUBCASE("update-forgotten: the error says what to do") {
    const RunResult b = runs_of("update-forgotten").broken;
    CHECK(b.explanation.find("GradScaler::step() has already been called since the last update()") !=
          std::string::npos);
  }
  SUBCASE("clip-before-unscale: the clip sees S times the norm; the optimizer gets max_norm / S") {
    const RunResult b = runs_of("clip-before-unscale").broken;
    CHECK(b.get("loss_scale") == 65536.0);
    CHECK(b.get("first_applied_norm") == doctest::Approx(b.get("max_norm") / 65536.0).epsilon(1e-3));
  }
  SUBCASE("accumulation-unscale: one unscale reproduces the one-pass gradient") {
    const RunResult b = runs_of("accumulation-unscale").broken;
    const RunResult f = runs_of("accumulation-unscale").fixed;
    CHECK(b.get("unscale_refusals") == (b.get("micro_batches") - 1) * b.get("steps"));
    CHECK(f.get("first_step_norm_ratio") == doctest::Approx(1.0).epsilon(1e-3));
  }
  SUBCASE("init-scale-skips: the skips halve 2^16 to the first scale that fits") {
    const RunResult b = runs_of("init-scale-skips").broken;
    const RunResult f = runs_of("init-scale-skips").fixed;
    CHECK(b.get("scale_at_first_update") == std::ldexp(65536.0, -static_cast<int>(b.get("initial_skips"))));
    CHECK(b.get("first_update_iteration") == b.get("initial_skips") + 1);
    CHECK(b.get("initial_skips") == f.get("initial_skips"));  // the scaler behaves the same
    CHECK(b.get("warmup_updates") == b.get("warmup_steps") - b.get("initial_skips"));
  }
  SUBCASE("clip-before-unscale: the runs train on the real digits") {
    const RunResult f = runs_of("clip-before-unscale").fixed;
    CHECK(f.setup.find("the same run") != std::string::npos);
    CHECK(runs_of("clip-before-unscale").broken.setup.find("handwritten digits") != std::string::npos);
    CHECK(f.get("fp32_test_accuracy") > 0.85);  // a real classifier of the 10 digits
  }
  SUBCASE("fp16-weights-no-master: without masters the weights move less than FP32's") {
    const RunResult b = runs_of("fp16-weights-no-master").broken;
    CHECK(b.get("weight_change") < 0.9 * b.get("fp32_weight_change"));
  }
  SUBCASE("init-scale-skips: the first real step of the broken schedule is (skips + 1) times too large") {
    const RunResult b = runs_of("init-scale-skips").broken;
    // Adam's first step is about lr per weight: the broken schedule's lr is
    // (initial_skips + 1) warmup values in.
    CHECK(b.get("lr_at_first_update") ==
          doctest::Approx((b.get("initial_skips") + 1) *
                          runs_of("init-scale-skips").fixed.get("lr_at_first_update")));
  }
  SUBCASE("adam-eps-fp16: 1e-8 is 0 in fp16, and fp16 state takes half the bytes") {
    const RunResult b = runs_of("adam-eps-fp16").broken;
    const RunResult f = runs_of("adam-eps-fp16").fixed;
    CHECK(b.get("eps_stored") == 0.0);
    CHECK(f.get("eps_stored") == static_cast<double>(1e-8f));
    CHECK(2 * b.get("state_bytes") == f.get("state_bytes"));
  }
  SUBCASE("resume-without-scaler-state: the fresh scaler halves its way back from 2^16, one skip a halving") {
    const RunResult b = runs_of("resume-without-scaler-state").broken;
    const RunResult f = runs_of("resume-without-scaler-state").fixed;
    CHECK(b.get("scale_after_resume") == 65536.0);
    CHECK(b.get("skipped_after_resume") == std::log2(65536.0 / b.get("saved_scale")));
    CHECK(f.get("skipped_after_resume") == 0.0);
    CHECK(f.get("first_differing_step") == 0.0);
  }
}
