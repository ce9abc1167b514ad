// Chapter 07 — exercises: grader tests for exercise 7.3 (name the cause of an FP8 run's symptoms). Depends
// on: grader.hpp (make_run: the runs mpt's recipes make under each cause, labelled by it). One test case per
// cause, two points each (twelve seeded runs of that cause, every one named right), a mixed test case of
// seeded runs of every cause, and bad input for one point. Always the same answer passes one test case of
// nine; a single threshold on one count, two or three.
#include <cstdint>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex07;
using namespace mpt::ex07::grading;
using mpt::DType;

constexpr std::uint64_t kRunsPerCause = 12;

void expect_cause_runs(Cause cause) {
  Mismatches m;
  for (std::uint64_t seed = 0; seed < kRunsPerCause; ++seed) expect_cause(m, make_run(cause, seed));
  CHECK_MESSAGE(m.none(), m.report());
}

}  // namespace

TEST_SUITE("exercise-7.3") {
  TEST_CASE("7.3 healthy runs: delayed scaling, HYBRID, a history of 8 to 32 steps") {
    expect_cause_runs(Cause::healthy);
  }
  TEST_CASE("7.3 no scaling: every step quantized with scale 1") { expect_cause_runs(Cause::no_scaling); }
  TEST_CASE("7.3 gradients stored in E4M3") { expect_cause_runs(Cause::e4m3_gradients); }
  TEST_CASE("7.3 one spike, then its amax ruling the history") {
    expect_cause_runs(Cause::stale_after_spike);
  }
  TEST_CASE("7.3 a shrinking tensor under a history of 1024 steps") {
    expect_cause_runs(Cause::history_too_long);
  }
  TEST_CASE("7.3 periodic peaks under a history of 1 or 2 steps") {
    expect_cause_runs(Cause::history_too_short);
  }
  TEST_CASE("7.3 one outlier value in a per-tensor-scaled activation") {
    expect_cause_runs(Cause::per_tensor_outlier);
  }

  TEST_CASE("7.3 seeded runs of every cause, mixed") {
    // Eight more runs of each cause (seeds the test cases above do not use).
    Mismatches m;
    for (std::uint64_t seed = 100; seed < 108; ++seed)
      for (const Cause c : all_causes()) expect_cause(m, make_run(c, seed));
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("7.3 bad input throws std::invalid_argument [1 point]") {
    Mismatches m;
    const RunRecord good = make_run(Cause::healthy, 0).run;
    const auto expect_refused = [&](const RunRecord& r, const std::string& why) {
      m.checked();
      const std::string thrown = thrown_by([&] { (void)diagnose(r); });
      if (thrown != "invalid_argument" && m.wrong())
        m.detail(why + ": " + (thrown.empty() ? std::string("nothing thrown") : thrown) +
                 ", expected std::invalid_argument");
    };
    RunRecord r = good;
    r.steps.clear();
    expect_refused(r, "no steps");
    r = good;
    r.dtype = DType::bf16;
    expect_refused(r, "dtype bf16");
    r = good;
    r.steps[3].saturated = r.steps[3].values;
    r.steps[3].flushed = 1;
    expect_refused(r, "step 3 counts more saturated and flushed values than it has");
    r = good;
    r.steps[5].scale = 0.0f;
    expect_refused(r, "step 5's scale is 0");
    r = good;
    r.steps[5].scale = kInfF;
    expect_refused(r, "step 5's scale is inf");
    r = good;
    r.steps[0].scale = kNaNF;
    expect_refused(r, "step 0's scale is NaN");
    CHECK_MESSAGE(m.none(), m.report());
  }
}  // TEST_SUITE
