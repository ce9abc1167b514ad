// Chapter 03 — tests of chapter 3's pitfalls (the norms' statistics in fp16,
// cancellation in FP32, running estimates in fp16, eps in fp16, a skipped
// step that still updates the running estimates).
// Depends on: mpt/pitfall.hpp, mpt::chapters (pitfall_registry), doctest,
// test_support.hpp.
//
// Every entry must still show its failure and its fix, its checks must be
// able to fail, and its runs must be deterministic. The numbers the chapter
// text builds on are pinned at the end, against values written out here
// (fp16's spacing, the stall of an fp16 sum, the fp16 encoding of eps). Each
// run is made once and shared by the test cases (runs_of), plus once more
// for the determinism check.
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

const mpt_test::PitfallRuns& runs_of(const std::string& id) { return mpt_test::pitfall_runs(id); }

}  // namespace

TEST_CASE("chapter 3 registers its pitfalls, in order, after the chapters before it") {
  mpt_test::check_chapter_registration(
      3, {"bn-variance-fp16", "variance-cancellation", "layernorm-fp16-accumulation", "running-stats-fp16",
          "norm-eps-fp16", "bn-skipped-step-not-skipped"});
}

// For each pitfall: the symptom on the broken run, the cure on the fixed
// run, the preconditions on both; and, since the two runs could become the
// same (or a check a tautology) while that still passes, every symptom check
// must fail on the fixed run and every cure check on the broken run. Both
// runs measure the same outcomes, deterministically (mpt_test::check_pitfall).
TEST_CASE("chapter 3: every pitfall shows its symptom and its fix, and its checks tell the runs apart") {
  for (const Pitfall* p : mpt_test::chapter_pitfalls(3)) {
    SUBCASE(p->id.c_str()) { mpt_test::check_pitfall(*p); }
  }
}

// The numbers the chapter text builds on (measured by the runs; here is
// what they must come out as).
TEST_CASE("chapter 3: the numbers the chapter states") {
  SUBCASE("bn-variance-fp16: inputs past 256 square past 65504; one channel NaN, one collapsed") {
    const RunResult b = runs_of("bn-variance-fp16").broken;
    const RunResult f = runs_of("bn-variance-fp16").fixed;
    CHECK(b.get("max_abs_input") >= 256.0);  // 256² = 65536 > 65504
    CHECK(b.get("squares_inf") > 0);
    CHECK(f.get("squares_inf") == 0);
    CHECK(b.get("nonfinite_variances") == 2);
    CHECK(b.get("nan_outputs") == 64);  // one channel of the batch of 64
    CHECK(b.get("collapsed_channels") == 1);
    CHECK(f.get("worst_error_ulps") <= 0.5 + 1e-3);  // one rounding of an FP32 result
    // The other factor, the formula: Welford's M2 in fp16 still overflows in
    // the wide channel (std 200: M2 ≈ 64·200² = 2.56e6 > 65504), and in FP32
    // it is more accurate than the single pass, whose error is cancellation
    // (mean 400, std 20).
    CHECK(b.get("welford_nonfinite_variances") == 1);
    CHECK(f.get("welford_max_variance_rel_error") < f.get("max_variance_rel_error"));
    CHECK(f.get("max_variance_rel_error") > 1e-6);  // FP32's single pass is not exact here
  }
  SUBCASE("variance-cancellation: FP32 Welford keeps the variance, the single pass does not") {
    const RunResult b = runs_of("variance-cancellation").broken;
    const RunResult f = runs_of("variance-cancellation").fixed;
    CHECK(b.get("values_per_channel") == 16 * 8 * 8);
    // The story needs a mean far above the spread (mean/std ≈ 1000).
    CHECK(b.get("mean") == doctest::Approx(1000).epsilon(1e-3));
    CHECK(b.get("std") == doctest::Approx(1).epsilon(0.02));
    CHECK(b.get("nonpositive_variances") >= 1);
    CHECK(f.get("max_variance_rel_error") < 1e-4);
    CHECK(f.get("max_variance_rel_error") > 0);  // measured, not assumed exact
  }
  SUBCASE("layernorm-fp16-accumulation: the fp16 sum stalls at 2048, the squares pass 65504") {
    const RunResult b = runs_of("layernorm-fp16-accumulation").broken;
    const RunResult f = runs_of("layernorm-fp16-accumulation").fixed;
    // At 2048 fp16's spacing is 2: values below 1 no longer add, and the
    // mean is 2048 / 4096.
    CHECK(b.get("offset_row_mean") == 2048.0 / 4096.0);
    CHECK(b.get("offset_row_sum_fp64") > 2048.0);
    CHECK(std::isinf(b.get("wide_row_sum_sq")));
    CHECK(b.get("wide_row_sum_sq_fp64") > 65504.0);
    CHECK(b.explanation.find("stops at 2048") != std::string::npos);
    CHECK(f.get("worst_error_ulps") <= 0.5 + 1e-2);
  }
  SUBCASE("running-stats-fp16: the fp16 running mean stops about 0.1⁻¹·(half an ulp) = 10 short") {
    const RunResult b = runs_of("running-stats-fp16").broken;
    const RunResult f = runs_of("running-stats-fp16").fixed;
    // At 2048..4096 fp16's spacing is 2: updates 0.1·gap below 1 are lost,
    // so the gap stays below 10 and above a few units (batch means scatter).
    CHECK(b.get("running_mean_gap") <= 10.0 + 2.0);
    CHECK(b.get("running_mean_gap") >= 4.0);
    CHECK(f.get("running_mean_gap") < 0.5);
    CHECK(b.get("train_accuracy") == doctest::Approx(f.get("train_accuracy")).epsilon(0.02));
    CHECK(b.get("skipped_steps") == f.get("skipped_steps"));
  }
  SUBCASE("norm-eps-fp16: fp16(1e-5) = 168·2^-24 with 8 bits; fp16(1e-8) = 0") {
    const RunResult b = runs_of("norm-eps-fp16").broken;
    const RunResult f = runs_of("norm-eps-fp16").fixed;
    CHECK(b.get("eps_default_stored") == std::ldexp(168.0, -24));
    CHECK(b.get("eps_default_bits") == 8);  // 168 = 0b10101000
    CHECK(b.get("eps_small_stored") == 0.0);
    CHECK(f.get("eps_default_stored") == static_cast<double>(1e-5f));
    CHECK(f.get("eps_default_bits") == 24);
    CHECK(f.get("eps_small_stored") == static_cast<double>(1e-8f));
    CHECK(f.get("constant_invstd") == doctest::Approx(1e4).epsilon(1e-6));  // 1/√1e-8
    CHECK(std::isinf(b.get("constant_invstd")));
    // The near-constant channel varies, by less than eps = 1e-8 and less
    // than half fp16's smallest subnormal: its variance rounds to 0 in fp16.
    CHECK(b.get("near_constant_var_fp64") > 0);
    CHECK(b.get("near_constant_var_fp64") < std::ldexp(1.0, -25));
  }
  SUBCASE("bn-skipped-step-not-skipped: one skip, and only the guard keeps eval working") {
    const RunResult b = runs_of("bn-skipped-step-not-skipped").broken;
    const RunResult f = runs_of("bn-skipped-step-not-skipped").fixed;
    CHECK(b.get("skipped_steps") == 1);
    CHECK(f.get("skipped_steps") == 1);
    CHECK(b.get("guarded_updates") == 0);
    CHECK(b.get("train_accuracy") == f.get("train_accuracy"));  // the guard changes nothing in training
    CHECK(b.get("test_accuracy") < 0.35);                       // about chance: 4 classes
    CHECK(f.get("fp32_test_accuracy") > 0.85);
  }
}
