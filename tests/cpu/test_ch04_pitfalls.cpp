// Chapter 04 — tests of chapter 4's pitfalls (a softmax in fp16 without the
// max subtraction, the log of a stored softmax, a loss summed in fp16,
// additive masks in fp16, the plain softmax of a fully masked row, Q Kᵀ
// stored before the scale, a softmax with autocast disabled, the tiny
// Transformer trained with the naive loss).
// Depends on: mpt/registry/pitfall.hpp, mpt::chapters (pitfall_registry),
// doctest, test_support.hpp.
//
// Every entry must still show its failure and its fix, its checks must be
// able to fail, and its runs must be deterministic. The numbers the chapter
// text builds on are pinned at the end, against values worked out here by
// hand (fp16's largest finite exp, the edges at which a probability flushes,
// the stall of an fp16 sum, −1e9 and 2·finfo.min in fp16). Each run is made
// once and shared by the test cases (runs_of), plus once more for the
// determinism check.
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

TEST_CASE("chapter 4 registers its pitfalls, in order, after the chapters before it") {
  mpt_test::check_chapter_registration(
      4, {"fp16-softmax-overflow", "log-softmax-underflow", "fp16-loss-reduction", "fp16-mask-values",
          "fully-masked-row-nan", "attention-scale-overflow", "autocast-disabled-softmax",
          "naive-loss-training"});
}

// For each pitfall: the symptom on the broken run, the cure on the fixed
// run, the preconditions on both; and, since the two runs could become the
// same (or a check a tautology) while that still passes, every symptom check
// must fail on the fixed run and every cure check on the broken run. Both
// runs measure the same outcomes, deterministically (mpt_test::check_pitfall).
TEST_CASE("chapter 4: every pitfall shows its symptom and its fix, and its checks tell the runs apart") {
  for (const Pitfall* p : mpt_test::chapter_pitfalls(4)) {
    SUBCASE(p->id.c_str()) { mpt_test::check_pitfall(*p); }
  }
}

// The numbers the chapter text builds on (measured by the runs; here is
// what they must come out as, worked out by hand).
TEST_CASE("chapter 4: the numbers the chapter states") {
  SUBCASE("fp16-softmax-overflow: 11.0859375 is the last fp16 logit with a finite fp16 exp") {
    const RunResult b = runs_of("fp16-softmax-overflow").broken;
    const RunResult f = runs_of("fp16-softmax-overflow").fixed;
    // fp16 values near 11 are 2^-7 apart: exp(11.0859375) ≈ 65249 rounds to
    // 65248; exp(11.09375) ≈ 65761 is past 65520, the midpoint to 2^16, and
    // rounds to inf.
    CHECK(std::exp(11.0859375) < 65504.0);
    CHECK(std::exp(11.09375) > 65520.0);
    CHECK(b.get("largest_finite_logit") == 11.0859375);
    CHECK(f.get("largest_finite_logit") == 65504.0);
    CHECK(b.get("logits_past_ln_max") == 2);  // 12.5 and 16: the two confident rows
    CHECK(f.get("logits_past_ln_max") == 2);
    CHECK(b.get("nan_rows") == 2);
    CHECK(b.get("all_zero_rows") == 2);              // 4·exp(10.25..10.625) > 65504, each exp below it
    CHECK(b.get("nan_probabilities") == 2);          // one per confident row: inf/inf at its large logit
    CHECK(f.get("worst_error_ulps") <= 0.5 + 1e-2);  // one rounding of an FP32 result
  }
  SUBCASE(
      "log-softmax-underflow: fp16 flushes below a margin of ln 2^25 ≈ 17.33, FP32 below ln 2^150 ≈ 103.97") {
    const RunResult b = runs_of("log-softmax-underflow").broken;
    const RunResult f = runs_of("log-softmax-underflow").fixed;
    // Margins 19, 22, 25 of the fp16 batch are past 25·ln 2 ≈ 17.33; margins
    // 110 and 120 of the FP32 batch are past 150·ln 2 ≈ 103.97.
    CHECK(25 * std::log(2.0) == doctest::Approx(17.33).epsilon(1e-3));
    CHECK(b.get("inf_rows_fp16") == 3);
    CHECK(b.get("inf_rows_fp32") == 2);
    CHECK(f.get("worst_finite_row_error_fp16") <= 1.0 / 128 + 1e-6);  // half an fp16 ulp at 16..32 (2^-6)
    CHECK(b.get("loss_fp16_fp64") == f.get("loss_fp16_fp64"));
    CHECK(std::isfinite(b.get("loss_fp16_fp64")));  // the story needs finite FP64 losses
    CHECK(std::isfinite(b.get("loss_fp32_fp64")));
  }
  SUBCASE("fp16-loss-reduction: the stored sum passes 65504; the running sums stall") {
    const RunResult b = runs_of("fp16-loss-reduction").broken;
    const RunResult f = runs_of("fp16-loss-reduction").fixed;
    CHECK(b.get("early_sum_fp64") > 65504);
    CHECK(b.get("late_sum_fp64") < 65504);  // the late batch's sum fits: only the running sum fails it
    CHECK(std::isinf(b.get("early_sum")));
    // An fp16 running sum of losses below 16 stops in [2^15, 2^16): from
    // 32768 on the spacing is 32. The running mean is below FP64's, so the
    // sum it came from is (1 − relative error)·mean_fp64·tokens (exact: the
    // division by 16384 = 2^14 is exact in fp16).
    const double early_running_sum =
        (1 - b.get("early_running_rel_error")) * b.get("early_mean_fp64") * b.get("tokens");
    CHECK(early_running_sum >= 32768 - 1e-2);
    CHECK(early_running_sum < 65536);
    // The late losses are mostly below 1: the sum stalls in [2^11, 2^12).
    const double late_running_sum = b.get("late_running_mean") * b.get("tokens");
    CHECK(late_running_sum >= 2048);
    CHECK(late_running_sum < 4096);
    CHECK(b.get("late_sum_fp64") > 4096);
    CHECK(f.get("early_sum") == doctest::Approx(f.get("early_sum_fp64")).epsilon(1e-5));
    CHECK(f.get("late_running_rel_error") < 1e-5);
  }
  SUBCASE("fp16-mask-values: −1e9 is −inf in fp16, −65504·2 too; 2 fully masked rows") {
    const RunResult b = runs_of("fp16-mask-values").broken;
    const RunResult f = runs_of("fp16-mask-values").fixed;
    CHECK(b.get("fully_masked_rows") == 2);  // the two left pads of sequence 0
    CHECK(b.get("nan_probability_rows") == 2);
    CHECK(b.get("nan_output_rows") == 2);
    CHECK(f.get("nan_probability_rows") == 0);
    // Every removed entry: 15 above the diagonal per sequence, and in
    // sequence 0 the 2 padding keys of the 6 rows, less the 1 counted twice
    // (row 0's key 1): 15 + 15 + 12 − 1 = 41.
    CHECK(b.get("mask_inf_entries") == 41);
    // Removed by both masks: the keys j > i of every row (15 per sequence)
    // that are also padding in sequence 0 (keys 0 and 1 above the diagonal:
    // row 0's key 1) — exactly 1 entry.
    CHECK(b.get("summed_mask_inf_entries") == 1);
    CHECK(f.get("summed_mask_inf_entries") == 0);
    CHECK(b.explanation.find("stored in fp16 as -inf") != std::string::npos);
    // FP32 masks: a fully masked row is a softmax over removed keys only.
    CHECK(f.get("fully_masked_removed_weight") == doctest::Approx(1.0));
    // The other ingredient: with a softmax that gives 0 for a row of −inf
    // the fp16 mask gives no NaN either (the rows of −inf are exactly the
    // fully masked ones).
    CHECK(b.get("safe_softmax_nan_rows") == 0);
    // The rows that keep a key are the same computation in both runs.
    CHECK(mpt_test::same_bits(b.get("kept_rows_error_to_bound"), f.get("kept_rows_error_to_bound")));
  }
  SUBCASE("fully-masked-row-nan: NaN in 2 rows reaches every value of the padded sequence") {
    const RunResult b = runs_of("fully-masked-row-nan").broken;
    const RunResult f = runs_of("fully-masked-row-nan").fixed;
    CHECK(b.get("fully_masked_rows") == 2);
    CHECK(b.get("nan_output_rows") == 2);
    CHECK(b.get("dv_nan_entries") == 6 * 16);  // dV of the padded sequence's 6 keys, 16 each
    CHECK(f.get("fully_masked_output_max") == 0);
    // An additive FP32 mask: neither softmax can tell a fully masked row.
    CHECK(b.get("additive_removed_weight") == doctest::Approx(1.0));
    CHECK(f.get("additive_removed_weight") == doctest::Approx(1.0));
    CHECK(mpt_test::same_bits(b.get("kept_rows_error_to_bound"), f.get("kept_rows_error_to_bound")));
  }
  SUBCASE("attention-scale-overflow: products past 65504, scaled scores √128 times smaller") {
    const RunResult b = runs_of("attention-scale-overflow").broken;
    const RunResult f = runs_of("attention-scale-overflow").fixed;
    CHECK(b.get("max_product_fp64") / b.get("max_score_fp64") == doctest::Approx(std::sqrt(128.0)));
    CHECK(b.get("max_product_fp64") > 65504);
    CHECK(b.get("max_score_fp64") < 65504);  // scaled, the scores fit
    CHECK(f.get("inf_scores") == 0);
    CHECK(f.get("nan_output_rows") == 0);
    CHECK(std::isinf(b.get("output_max_error")));
    // The cure check sees the roundings: the ordinary head's softmax is
    // spread, so the fixed run's error is not 0.
    CHECK(f.get("output_max_error") > 0);
    CHECK(f.get("ordinary_top_probability") < 0.9);
    // The outlier head's rows are one-hot: their top two scores lie far more
    // than fp16's spacing there (8 at 8192..16384) apart.
    CHECK(f.get("outlier_rows_min_gap") > 8 * 8);
  }
  SUBCASE("autocast-disabled-softmax: the trace says f16 then f32; one cast") {
    const RunResult b = runs_of("autocast-disabled-softmax").broken;
    const RunResult f = runs_of("autocast-disabled-softmax").fixed;
    CHECK(b.get("softmax_input_bits") == 16);
    CHECK(b.get("softmax_output_bits") == 16);
    CHECK(b.get("casts") == 0);
    CHECK(b.get("smallest_probability_fp64") < std::ldexp(1.0, -25));  // the story needs one to flush
    CHECK(f.get("softmax_output_bits") == 32);
    CHECK(f.get("casts") == 1);
    CHECK(b.explanation.find("writing f16") != std::string::npos);
    CHECK(f.explanation.find("writing f32") != std::string::npos);
  }
  SUBCASE("naive-loss-training: the naive loss overflows early, the library's never") {
    const RunResult b = runs_of("naive-loss-training").broken;
    const RunResult f = runs_of("naive-loss-training").fixed;
    // Both start from the same weights and data: the same validation loss, bit for bit.
    CHECK(mpt_test::same_bits(b.get("initial_valid_loss"), f.get("initial_valid_loss")));
    CHECK(b.get("first_nonfinite_loss_step") >= 1);
    CHECK(b.get("first_nonfinite_loss_step") <= 20);
    CHECK(f.get("first_nonfinite_loss_step") == 0);
    CHECK(f.get("skipped_steps") < 5);
  }
}
