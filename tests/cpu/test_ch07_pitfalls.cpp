// Chapter 07 — tests of chapter 7's pitfalls
// Depends on: mpt/registry/pitfall.hpp, mpt::chapters (pitfall_registry),
// mpt/train/run.hpp and checkpoint.hpp (the run resume-drops-amax-history
// resumes), doctest, test_support.hpp.
//
// FP8 without a scale, E4M3 for the output gradients (the blobs MLP trained
// under FP8), a spike under delayed scaling, an amax history too long and
// too short, one outlier under a per-tensor scale, saturation that hides an
// overflow, E4M3's max (240, 448, 480), a resume of `mpt train`'s run that
// drops the FP8 histories and scales. Every entry must still show its failure and its fix, its checks
// must be able to fail, and its runs must be deterministic. The numbers the
// chapter text builds on are pinned at the end, against values worked out by
// hand.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "mpt/registry/pitfall.hpp"
#include "mpt/train/checkpoint.hpp"
#include "mpt/train/run.hpp"
#include "test_support.hpp"

namespace {

using mpt::Pitfall;
using mpt::RunResult;

const mpt_test::PitfallRuns& runs_of(const std::string& id) { return mpt_test::pitfall_runs(id); }

}  // namespace

TEST_CASE("chapter 7 registers its pitfalls, in order, after the chapters before it") {
  mpt_test::check_chapter_registration(
      7, {"fp8-no-scaling", "e4m3-for-gradients", "delayed-scaling-spike", "amax-history-too-long",
          "amax-history-too-short", "per-tensor-outlier", "saturation-hides-overflow", "e4m3-max-240-448-480",
          "resume-drops-amax-history"});
}

TEST_CASE("chapter 7: every pitfall shows its symptom and its fix, and its checks tell the runs apart") {
  for (const Pitfall* p : mpt_test::chapter_pitfalls(7)) {
    SUBCASE(p->id.c_str()) { mpt_test::check_pitfall(*p); }
  }
}

// No timed test here: `mpt tour --chapter 7` shows how long the chapter's
// pitfalls take (hundredths of a second in a Release build for those of the
// fp8 tier alone; tenths for e4m3-for-gradients, which trains the MLP twice
// for 300 steps, and resume-drops-amax-history).

TEST_CASE("chapter 7: the numbers the chapter states") {
  SUBCASE("fp8-no-scaling: scale 1, then fp8_max / amax for each tensor") {
    const RunResult b = runs_of("fp8-no-scaling").broken;
    const RunResult f = runs_of("fp8-no-scaling").fixed;
    CHECK(b.get("activation_scale") == 1);
    CHECK(b.get("gradient_scale") == 1);
    // current scaling, margin 0: 448 / amax (E4M3), 57344 / amax (E5M2), each quotient rounded to fp32
    CHECK(f.get("activation_scale") ==
          static_cast<double>(448.0f / static_cast<float>(f.get("activation_amax"))));
    CHECK(f.get("gradient_scale") ==
          static_cast<double>(57344.0f / static_cast<float>(f.get("gradient_amax"))));
    // with current scaling the amax lands on the max: nothing beyond it
    CHECK(f.get("gradient_saturated_fraction") == 0);
  }
  SUBCASE("e4m3-for-gradients: the windows of the two formats, and one first step") {
    const RunResult b = runs_of("e4m3-for-gradients").broken;
    const RunResult f = runs_of("e4m3-for-gradients").fixed;
    // E4M3: 448 = 1.75·2^8 down to 2^-9; E5M2: 57344 = 1.75·2^15 down to 2^-16
    CHECK(b.get("dy_window_binades") == doctest::Approx(std::log2(448.0) + 9));
    CHECK(f.get("dy_window_binades") == doctest::Approx(std::log2(57344.0) + 16));
    // the first forward is E4M3 with scale 1 in both runs: the same loss
    CHECK(b.get("first_loss") == f.get("first_loss"));
    // the HYBRID run is `mpt train --model mlp --policy fp8:delayed`'s run: the same losses
    mpt::train::RunConfig c;
    c.model = "mlp";
    c.policy = "fp8:delayed";
    c.scaler = "none";
    c.steps = 300;
    mpt::train::TrainRun run(c);
    double late = 0;
    for (int i = 0; i < 300; ++i) {
      const float loss = run.step().loss;
      if (i == 0) CHECK(f.get("first_loss") == static_cast<double>(loss));
      if (i >= 250) late += loss;
    }
    CHECK(f.get("late_loss") == late / 50);
  }
  SUBCASE("delayed-scaling-spike: the scale of amax 1, then 16 steps of the spike's") {
    const RunResult b = runs_of("delayed-scaling-spike").broken;
    const RunResult f = runs_of("delayed-scaling-spike").fixed;
    // the history holds amaxes of 1 (to within fp32's rounding of the rescale): 448 / 1
    CHECK(b.get("spike_scale") == doctest::Approx(448).epsilon(1e-6));
    // the spike's own: 448 / 100
    CHECK(f.get("spike_scale") == doctest::Approx(4.48).epsilon(1e-6));
    // the spike enters the history after its step and leaves it amax_history_len = 16 updates later
    CHECK(b.get("small_scale_steps") == 16);
    // the same tensors on both sides: before the spike delayed and current scaling agree (448 / 1)
    CHECK(b.get("before_flushed_fraction") == f.get("before_flushed_fraction"));
  }
  SUBCASE("amax-history: one sequence; both fixed runs are the same run (a history of 32)") {
    const RunResult l = runs_of("amax-history-too-long").fixed;
    const RunResult s = runs_of("amax-history-too-short").fixed;
    REQUIRE(l.outcomes.size() == s.outcomes.size());
    for (std::size_t i = 0; i < l.outcomes.size(); ++i) CHECK(l.outcomes[i].value == s.outcomes[i].value);
    // 1024 and 32 steps see the same history up to the first peak (step 16): the same saturation there
    CHECK(runs_of("amax-history-too-long").broken.get("first_peak_saturated_fraction") ==
          l.get("first_peak_saturated_fraction"));
    // the 1024-step history keeps the first peak's amax, 8·16·2^(-6·15/160) (step index 15), to the end;
    // an ordinary step t of the last period (t = 144..158) has amax 16·2^(-6t/160), so its lag is
    // log2(8) + 6·(t − 15)/160 binades: 3 + 4.84..5.36
    const double lag = runs_of("amax-history-too-long").broken.get("late_scale_lag_binades");
    CHECK(lag > 3 + 6.0 * 128 / 160);
    CHECK(lag < 3 + 6.0 * 144 / 160);
  }
  SUBCASE("per-tensor-outlier: one scale against 32 rows x 4 blocks") {
    const RunResult b = runs_of("per-tensor-outlier").broken;
    const RunResult f = runs_of("per-tensor-outlier").fixed;
    CHECK(b.get("scales") == 1);
    CHECK(f.get("scales") == 32 * 128 / 32);
    // 2^16 is a value of E4M3 at either scale (a power of two): exact
    CHECK(b.get("outlier_relative_error") == 0);
    CHECK(f.get("outlier_relative_error") == 0);
  }
  SUBCASE("saturation-hides-overflow: three infs read back as the finite amax") {
    const RunResult b = runs_of("saturation-hides-overflow").broken;
    CHECK(b.get("input_nonfinite") == 3);
    // scale = 448 / amax; ±inf is stored as ±448 and read back as 448 × fp32(1 / scale)
    CHECK(b.get("read_back_at_inf") == doctest::Approx(b.get("finite_amax")).epsilon(1e-6));
    CHECK(runs_of("saturation-hides-overflow").fixed.get("overflow_found") == 3);
  }
  SUBCASE("e4m3-max-240-448-480: where each convention stops") {
    const RunResult b = runs_of("e4m3-max-240-448-480").broken;
    const RunResult f = runs_of("e4m3-max-240-448-480").fixed;
    // 224, 232, ..., 512
    CHECK(b.get("values") == 37);
    // OCP: 464 is the tie between 448 (mantissa 110) and 480 (111, NaN), and goes to the even 448;
    // 472 to 512 (6 inputs) are beyond
    CHECK(f.get("largest_kept") == 464);
    CHECK(f.get("smallest_clamped") == 472);
    CHECK(f.get("clamped") == 6);
    CHECK(f.get("nonfinite_without_saturation") == 6);
    // 480 convention: 472..488 round to 480 (kept), 496 is the tie 480/512 and goes to the even 512: clamped
    CHECK(b.get("largest_kept") == 488);
    CHECK(b.get("smallest_clamped") == 496);
    // every input from 472 is written as S.1111.111: NaN for OCP
    CHECK(b.get("codes_nan_on_ocp") == 6);
    // IEEE-style: 1.875·2^7 = 240 is the max; 248 is the tie 240/256, goes to the even 256: inf.
    // 224, 232, 240 kept; the other 34 are inf
    CHECK(b.get("ieee_style_largest_kept") == 240);
    CHECK(b.get("ieee_style_inf") == 34);
  }
  SUBCASE("resume-drops-amax-history: scale 1 against the checkpoint's scales") {
    const RunResult b = runs_of("resume-drops-amax-history").broken;
    const RunResult f = runs_of("resume-drops-amax-history").fixed;
    // 3 Linears × (x, W, dy): 9 scales, each with a history
    CHECK(b.get("fp8_scales") == 9);
    CHECK(b.get("first_step_scales_at_one") == 9);
    // scale 1 against the scales `mpt train` saved after 100 steps: the gap is the largest |log2| of those
    mpt::train::RunConfig c;
    c.model = "mlp";
    c.policy = "fp8:delayed";
    c.scaler = "none";
    c.steps = 100;
    mpt::train::TrainRun run(c);
    for (int i = 0; i < 100; ++i) (void)run.step();
    double largest = 0;
    for (const mpt::train::TensorRecord& t : run.checkpoint().tensors)
      if (t.name.rfind("fp8.scale/", 0) == 0)
        largest = std::max(largest, std::fabs(std::log2(static_cast<double>(t.values.at(0)))));
    CHECK(b.get("first_step_scale_gap_binades") == doctest::Approx(largest));
    // the scales never come back within the 20 steps: the uninterrupted run's histories hold the
    // amaxes of the 100 steps before the checkpoint, for 1024 updates
    CHECK(b.get("steps_scales_differ") == 20);
    CHECK(b.get("last_step_scale_gap_binades") > 0);
    CHECK(f.get("first_step_scale_gap_binades") == 0);
  }
}
