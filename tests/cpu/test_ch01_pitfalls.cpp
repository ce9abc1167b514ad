// Chapter 01 — tests of the pitfall registry and of chapter 1's pitfalls.
// Depends on: mpt/pitfall.hpp, mpt::chapters (pitfall_registry), doctest,
// test_support.hpp (failed_claims, check_separates, check_preconditions).
//
// The registry is the spine of the project: every entry must
// still show its failure and its fix, and its checks must be able to fail,
// so a demo that quietly stops reproducing anything fails CI.
#include <doctest/doctest.h>

#include <Eigen/Core>
#include <cmath>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mpt/registry/pitfall.hpp"
#include "test_support.hpp"

namespace {

using mpt::Check;
using mpt::Pitfall;
using mpt::Registry;
using mpt::RunResult;
using mpt_test::failed_claims;

std::string outcome_names(const RunResult& r) {
  std::string out;
  for (const auto& o : r.outcomes) out += o.name + " ";
  return out;
}

// A well-formed entry to mutate in the registry tests.
Pitfall sample(std::string id) {
  Pitfall p;
  p.id = std::move(id);
  p.chapter = 1;
  p.title = "sample";
  p.mechanism = "a sample entry for the registry tests";
  p.broken = [] { return RunResult{"broken", {{"x", 1.0, "one"}}, ""}; };
  p.fixed = [] { return RunResult{"fixed", {{"x", 2.0, "two"}}, ""}; };
  p.symptom = {Check{"x is 1", [](const RunResult& r) { return r.get("x") == 1.0; }}};
  p.cure = {Check{"x is 2", [](const RunResult& r) { return r.get("x") == 2.0; }}};
  return p;
}

}  // namespace

TEST_CASE("every registered pitfall shows its symptom and its fix") {
  const Registry& registry = mpt::pitfall_registry();
  REQUIRE(!registry.all().empty());
  for (const Pitfall& p : registry.all()) {
    SUBCASE(p.id.c_str()) {
      const mpt::Verdict v = mpt::run_pitfall(p);
      CHECK(v.pitfall == &p);
      CHECK_MESSAGE(v.symptom_shown(), p.id << ": the broken run does not show the symptom; "
                                               "failed claims:"
                                            << failed_claims(v.symptom_checks));
      CHECK_MESSAGE(v.fix_works(), p.id << ": the fixed run does not show the fix; failed claims:"
                                        << failed_claims(v.cure_checks));
      CHECK_MESSAGE(v.preconditions_hold(), p.id << ": a shared precondition does not hold; broken:"
                                                 << failed_claims(v.precondition_checks_broken)
                                                 << "\nfixed:" << failed_claims(v.precondition_checks_fixed));
      CHECK(v.precondition_checks_broken.size() == p.preconditions.size());
      CHECK(v.precondition_checks_fixed.size() == p.preconditions.size());
    }
  }
}

TEST_CASE("chapter 1 registers its five pitfalls, in order") {
  const Registry& registry = mpt::pitfall_registry();
  const std::vector<std::string> expected = {"fp16-overflow", "fp16-lost-update", "fp16-sum-stagnation",
                                             "fp16-gradient-underflow", "fp16-vs-bf16"};
  std::vector<std::string> chapter1;
  for (const Pitfall& p : registry.all())
    if (p.chapter == 1) chapter1.push_back(p.id);
  CHECK(chapter1 == expected);
}

TEST_CASE("chapter 1: broken and fixed runs measure the same things, deterministically") {
  for (const Pitfall& p : mpt::pitfall_registry().all()) {
    if (p.chapter != 1) continue;
    SUBCASE(p.id.c_str()) {
      const RunResult broken = p.broken(), fixed = p.fixed();
      INFO("broken: " << outcome_names(broken) << "\nfixed:  " << outcome_names(fixed));
      mpt_test::check_runs_comparable(broken, fixed);
      // Seeded runs: a second run gives the same bits (NaN never appears).
      const RunResult again = p.broken();
      REQUIRE(again.outcomes.size() == broken.outcomes.size());
      for (std::size_t i = 0; i < broken.outcomes.size(); ++i) {
        INFO(broken.outcomes[i].name);
        CHECK(!std::isnan(broken.outcomes[i].value));
        CHECK(!std::isnan(fixed.outcomes[i].value));
        CHECK(again.outcomes[i].value == broken.outcomes[i].value);
      }
    }
  }
}

// If a broken run and its fixed run became identical (or a check became a
// tautology), the main test above could still pass. These cross-checks
// catch that, check by check: every symptom check must fail on the fixed
// run and every cure check on the broken run. What both runs share is
// declared as a precondition, and must hold on both.
TEST_CASE("chapter 1: every symptom check fails on the fixed run, every cure check on the broken run") {
  for (const Pitfall& p : mpt::pitfall_registry().all()) {
    if (p.chapter != 1) continue;
    SUBCASE(p.id.c_str()) {
      const RunResult broken = p.broken(), fixed = p.fixed();
      mpt_test::check_separates(p, broken, fixed);
      mpt_test::check_preconditions(p, broken, fixed);
    }
  }
}

// The numbers the chapter text states, pinned (they are measured by the
// runs; these tests say what the measurements must come out as).
TEST_CASE("chapter 1: the numbers the chapter states") {
  const Registry& registry = mpt::pitfall_registry();
  SUBCASE("fp16-overflow: squares overflow from 256 on; the activations themselves fit") {
    const RunResult r = registry.get("fp16-overflow").broken();
    CHECK(r.get("smallest_overflowing_input") == 256.0);
    CHECK(r.get("largest_activation") < 65504.0);
    CHECK(std::isinf(r.get("sum_of_squares")));
    CHECK(std::isinf(registry.get("fp16-overflow").fixed().get("smallest_overflowing_input")));
  }
  SUBCASE("fp16-lost-update: the threshold is 2^-11, half the spacing at 1") {
    const RunResult r = registry.get("fp16-lost-update").broken();
    CHECK(r.get("half_ulp_of_one") == std::ldexp(1.0, -11));
    CHECK(r.get("final_weight") == 1.0);
    CHECK(r.get("update") <= r.get("half_ulp_of_one"));  // the cause: the update is below half an ulp
    const RunResult f = registry.get("fp16-lost-update").fixed();
    CHECK(f.get("final_fp16_copy") == 2.0);
  }
  SUBCASE("fp16-sum-stagnation: the fp16 sum stalls at 32, where the spacing is 2^-5") {
    const RunResult r = registry.get("fp16-sum-stagnation").broken();
    CHECK(r.get("final_sum") == 32.0);
    CHECK(r.get("ulp_at_final") == std::ldexp(1.0, -5));
    CHECK(r.get("addend") == std::ldexp(1311.0, -17));  // fp16(0.01) = 1311 * 2^-17, not 0.01
  }
  SUBCASE("fp16-gradient-underflow: the loss scale is a power of two, exact to undo") {
    const RunResult f = registry.get("fp16-gradient-underflow").fixed();
    int e = 0;
    CHECK(std::frexp(f.get("loss_scale"), &e) == 0.5);
    CHECK(f.get("loss_scale") > 1.0);
  }
  SUBCASE("fp16-vs-bf16: unit roundoffs 2^-11 and 2^-8") {
    CHECK(registry.get("fp16-vs-bf16").broken().get("unit_roundoff") == std::ldexp(1.0, -11));
    CHECK(registry.get("fp16-vs-bf16").fixed().get("unit_roundoff") == std::ldexp(1.0, -8));
  }
}

TEST_CASE("registry: add validates the entry") {
  Registry r;
  r.add(sample("sample-one"));
  CHECK(r.all().size() == 1);
  CHECK(r.find("sample-one") != nullptr);
  CHECK(r.find("sample-two") == nullptr);

  SUBCASE("a duplicate id is rejected") {
    CHECK_THROWS_WITH_AS(r.add(sample("sample-one")), doctest::Contains("already registered"),
                         std::invalid_argument);
    CHECK(r.all().size() == 1);
  }
  SUBCASE("ids that are not kebab-case are rejected") {
    for (const char* bad : {"", "Fp16-overflow", "fp16_overflow", "fp16 overflow", "-fp16", "fp16-",
                            "fp16--overflow", "fp16.overflow", "fp16/overflow"}) {
      INFO("id '" << bad << "'");
      CHECK_THROWS_WITH_AS(r.add(sample(bad)), doctest::Contains("kebab-case"), std::invalid_argument);
    }
    CHECK_NOTHROW(r.add(sample("e4m3-scale-2")));
  }
  SUBCASE("an entry without runs or checks is rejected") {
    Pitfall no_broken = sample("no-broken");
    no_broken.broken = nullptr;
    CHECK_THROWS_WITH_AS(r.add(no_broken), doctest::Contains("no broken run"), std::invalid_argument);
    Pitfall no_fixed = sample("no-fixed");
    no_fixed.fixed = nullptr;
    CHECK_THROWS_WITH_AS(r.add(no_fixed), doctest::Contains("no fixed run"), std::invalid_argument);
    Pitfall no_symptom = sample("no-symptom");
    no_symptom.symptom.clear();
    CHECK_THROWS_WITH_AS(r.add(no_symptom), doctest::Contains("no symptom check"), std::invalid_argument);
    Pitfall no_cure = sample("no-cure");
    no_cure.cure.clear();
    CHECK_THROWS_WITH_AS(r.add(no_cure), doctest::Contains("no cure check"), std::invalid_argument);
    Pitfall empty_predicate = sample("empty-predicate");
    empty_predicate.cure.push_back(Check{"holds somehow", nullptr});
    CHECK_THROWS_WITH_AS(r.add(empty_predicate), doctest::Contains("no predicate"), std::invalid_argument);
    Pitfall empty_precondition = sample("empty-precondition");
    empty_precondition.preconditions.push_back(Check{"both hold somehow", nullptr});
    CHECK_THROWS_WITH_AS(r.add(empty_precondition), doctest::Contains("no predicate"), std::invalid_argument);
    Pitfall unnamed_precondition = sample("unnamed-precondition");
    unnamed_precondition.preconditions.push_back(Check{"", [](const RunResult&) { return true; }});
    CHECK_THROWS_WITH_AS(r.add(unnamed_precondition), doctest::Contains("empty claim"),
                         std::invalid_argument);
    CHECK(r.all().size() == 1);
  }
}

TEST_CASE("registry: an unknown id names the valid ones") {
  Registry r;
  r.add(sample("sample-one"));
  r.add(sample("sample-two"));
  CHECK(r.ids() == "sample-one, sample-two");
  CHECK_THROWS_WITH_AS(r.get("sample-three"),
                       "unknown pitfall 'sample-three'; valid ids: sample-one, sample-two",
                       std::invalid_argument);
  // The project's registry says the same about its own ids.
  const Registry& project = mpt::pitfall_registry();
  CHECK_THROWS_WITH_AS(project.get("no-such-pitfall"), doctest::Contains("fp16-overflow"),
                       std::invalid_argument);
}

TEST_CASE("RunResult::get names the outcomes that exist") {
  const RunResult r{"setup", {{"final_sum", 32.0, "sum"}, {"stalled_adds", 7.0, "adds"}}, ""};
  CHECK(r.get("final_sum") == 32.0);
  CHECK_THROWS_WITH_AS(r.get("final_weight"),
                       "no outcome named 'final_weight'; this run measured: final_sum, stalled_adds",
                       std::out_of_range);
}

TEST_CASE("run_pitfall: preconditions are checked on both runs") {
  Pitfall p = sample("with-preconditions");
  // x is 1 on the broken run and 2 on the fixed one.
  p.preconditions = {Check{"x is positive", [](const RunResult& r) { return r.get("x") > 0; }}};
  mpt::Verdict v = mpt::run_pitfall(p);
  REQUIRE(v.precondition_checks_broken.size() == 1);
  REQUIRE(v.precondition_checks_fixed.size() == 1);
  CHECK(v.precondition_checks_broken[0] == std::make_pair(std::string("x is positive"), true));
  CHECK(v.preconditions_hold());
  CHECK(v.reproduced());

  SUBCASE("one that fails on one run only fails the verdict") {
    p.preconditions.push_back(Check{"x is 2", [](const RunResult& r) { return r.get("x") == 2.0; }});
    v = mpt::run_pitfall(p);
    CHECK(v.symptom_shown());
    CHECK(v.fix_works());
    CHECK_FALSE(v.precondition_checks_broken[1].second);
    CHECK(v.precondition_checks_fixed[1].second);
    CHECK_FALSE(v.preconditions_hold());
    CHECK_FALSE(v.reproduced());
  }
  SUBCASE("a run that throws fails them") {
    p.fixed = []() -> RunResult { throw std::runtime_error("no data"); };
    v = mpt::run_pitfall(p);
    REQUIRE(v.precondition_checks_fixed.size() == 1);
    CHECK(v.precondition_checks_fixed[0].first.find("no data") != std::string::npos);
    CHECK_FALSE(v.preconditions_hold());
  }
  SUBCASE("an entry without preconditions has none to hold") {
    p.preconditions.clear();
    v = mpt::run_pitfall(p);
    CHECK(v.precondition_checks_broken.empty());
    CHECK(v.preconditions_hold());
  }
}

TEST_CASE("run_pitfall: a run that throws is reported as failed, not a crash") {
  Pitfall p = sample("throwing-run");
  p.broken = []() -> RunResult { throw std::runtime_error("out of memory in the demo"); };
  const mpt::Verdict v = mpt::run_pitfall(p);
  CHECK_FALSE(v.symptom_shown());
  CHECK_FALSE(v.reproduced());
  REQUIRE(v.symptom_checks.size() == 1);
  CHECK(v.symptom_checks[0].first.find("out of memory in the demo") != std::string::npos);
  CHECK_FALSE(v.symptom_checks[0].second);
  CHECK(v.fix_works());  // the other side still ran and was checked

  SUBCASE("a non-std exception too") {
    Pitfall q = sample("throwing-int");
    q.fixed = []() -> RunResult { throw 42; };
    const mpt::Verdict w = mpt::run_pitfall(q);
    CHECK(w.symptom_shown());
    CHECK_FALSE(w.fix_works());
  }
  SUBCASE("a check that throws counts as failed and says why") {
    Pitfall q = sample("throwing-check");
    q.symptom.push_back(
        Check{"reads a missing outcome", [](const RunResult& r) { return r.get("missing") > 0; }});
    const mpt::Verdict w = mpt::run_pitfall(q);
    CHECK_FALSE(w.symptom_shown());
    REQUIRE(w.symptom_checks.size() == 2);
    CHECK(w.symptom_checks[1].first.find("no outcome named 'missing'") != std::string::npos);
  }
}

// Independent checks of two things the tests above used to check against
// their own definitions: Verdict::reproduced() on hand-built verdicts, and
// fp16-sum-stagnation's numbers from a separate fp16 loop written here with
// Eigen::half arithmetic (each + rounds to fp16), not the pitfall's code.
TEST_CASE("independent checks: reproduced() on hand-built verdicts") {
  using Claims = std::vector<std::pair<std::string, bool>>;
  auto verdict = [](Claims symptom, Claims cure) {
    mpt::Verdict v;
    v.symptom_checks = std::move(symptom);
    v.cure_checks = std::move(cure);
    return v;
  };
  const Claims held = {{"a", true}, {"b", true}}, one_failed = {{"a", true}, {"b", false}}, none = {};
  CHECK(verdict(held, held).reproduced());
  CHECK(verdict({{"only", true}}, {{"only", true}}).reproduced());
  CHECK_FALSE(verdict(one_failed, held).reproduced());  // the symptom did not show
  CHECK_FALSE(verdict(held, one_failed).reproduced());  // the fix did not work
  CHECK_FALSE(verdict(one_failed, one_failed).reproduced());
  CHECK_FALSE(verdict({{"a", false}}, {{"b", false}}).reproduced());
  CHECK_FALSE(verdict(none, held).reproduced());  // no check ran: nothing was shown
  CHECK_FALSE(verdict(held, none).reproduced());
  CHECK_FALSE(verdict(none, none).reproduced());
  CHECK(verdict(held, held).symptom_shown());
  CHECK_FALSE(verdict(held, one_failed).fix_works());
  CHECK(verdict(held, one_failed).symptom_shown());
  // Shared preconditions: none declared holds; one failing on either run fails.
  mpt::Verdict v = verdict(held, held);
  v.precondition_checks_broken = held;
  v.precondition_checks_fixed = held;
  CHECK(v.preconditions_hold());
  CHECK(v.reproduced());
  v.precondition_checks_fixed = one_failed;
  CHECK_FALSE(v.preconditions_hold());
  CHECK_FALSE(v.reproduced());
  v.precondition_checks_fixed = held;
  v.precondition_checks_broken = {{"a", false}};
  CHECK_FALSE(v.reproduced());
  CHECK(v.symptom_shown());
  CHECK(v.fix_works());
}

TEST_CASE("independent checks: fp16-sum-stagnation against an Eigen::half loop") {
  // 10000 additions of fp16(0.01) into an fp16 accumulator, and into an
  // fp32 one, counted here.
  const Eigen::half addend(0.01f);
  Eigen::half sum16(0.0f);
  float sum32 = 0.0f;
  int stalled = 0, first_stall = 0;
  for (int i = 1; i <= 10000; ++i) {
    const Eigen::half next = sum16 + addend;
    if (next == sum16 && stalled++ == 0) first_stall = i;
    sum16 = next;
    sum32 += static_cast<float>(addend);
  }
  REQUIRE(stalled > 0);
  const double a = static_cast<double>(static_cast<float>(addend));
  const RunResult broken = mpt::pitfall_registry().get("fp16-sum-stagnation").broken();
  const RunResult fixed = mpt::pitfall_registry().get("fp16-sum-stagnation").fixed();
  CHECK(broken.get("addend") == a);
  CHECK(broken.get("final_sum") == static_cast<double>(static_cast<float>(sum16)));
  CHECK(broken.get("stalled_adds") == stalled);
  CHECK(broken.get("first_stalled_step") == first_stall);
  CHECK(broken.get("expected_sum") == 10000 * a);  // steps * addend in fp64, addend from Eigen
  CHECK(fixed.get("final_sum") == static_cast<double>(sum32));
  CHECK(fixed.get("stalled_adds") == 0);
  // The pitfall's own description of the stall, from first principles: at
  // the final fp16 sum, half the spacing (2^(e-10) / 2) is at least the addend.
  int e = 0;
  std::frexp(static_cast<float>(sum16), &e);  // sum16 = m * 2^e, m in [0.5, 1)
  CHECK(broken.get("ulp_at_final") == std::ldexp(1.0, e - 1 - 10));
  CHECK(std::ldexp(1.0, e - 1 - 10) / 2 >= a);
}
