// Chapter 06 — tests of chapter 6's pitfalls
// Depends on: mpt/registry/pitfall.hpp, mpt::chapters (pitfall_registry),
// doctest, test_support.hpp.
//
// The pitfalls: a per-layer policy by name substring, binary_cross_entropy
// on fp16 probabilities, a sum where autocast is disabled, the CPU autocast
// list taken for CUDA's, the FFN kept in FP32 by a rule of thumb. Every entry must still show its failure and
// its fix, its checks must be able to fail, and its runs must be deterministic. The numbers the chapter text
// builds on are pinned at the end, against values worked out by hand.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "mpt/registry/pitfall.hpp"
#include "test_support.hpp"

namespace {

using mpt::Pitfall;
using mpt::RunResult;

const mpt_test::PitfallRuns& runs_of(const std::string& id) { return mpt_test::pitfall_runs(id); }

}  // namespace

TEST_CASE("chapter 6 registers its pitfalls, in order, after the chapters before it") {
  mpt_test::check_chapter_registration(
      6, {"name-substring-policy", "bce-on-fp16-probabilities", "sum-outside-autocast", "half-under-autocast",
          "cpu-autocast-list", "ffn-fp32-rule-of-thumb", "o3-everything-fp16"});
}

TEST_CASE("chapter 6: every pitfall shows its symptom and its fix, and its checks tell the runs apart") {
  for (const Pitfall* p : mpt_test::chapter_pitfalls(6)) {
    SUBCASE(p->id.c_str()) { mpt_test::check_pitfall(*p); }
  }
}

// No timed test here: a test asserts behaviour, not speed (a sanitizer build
// runs these ten times slower). `mpt tour --chapter 6` shows how long the
// chapter's pitfalls take; they train for a fraction of a second in a
// Release build.

TEST_CASE("chapter 6: the numbers the chapter states") {
  SUBCASE("name-substring-policy: 'block1' is in block1, block10 and block11") {
    const RunResult b = runs_of("name-substring-policy").broken;
    const RunResult f = runs_of("name-substring-policy").fixed;
    CHECK(b.get("f32_blocks") == 3);
    CHECK(b.get("other_f32_blocks") == 2);
    CHECK(f.get("other_f32_blocks") == 0);
    // two more FP32 blocks: more bytes, a longer estimated step
    CHECK(b.get("step_bytes") > f.get("step_bytes"));
    CHECK(b.get("step_seconds_h100") > f.get("step_seconds_h100"));
  }
  SUBCASE("bce-on-fp16-probabilities: sigmoid(9) and sigmoid(12) round to 1 in fp16") {
    const RunResult b = runs_of("bce-on-fp16-probabilities").broken;
    // z = 9, t = 0: the loss is softplus(9) = 9.000123 in FP64; the clamp gives 100.
    CHECK(b.get("loss_max_error") == doctest::Approx(100 - (9 + std::log1p(std::exp(-9.0)))).epsilon(1e-5));
    // 1 - sigmoid(9) = 1.2e-4 and 1 - sigmoid(12) = 6.1e-6 are below 2^-12, half fp16's spacing below 1;
    // the third mistake, z = -10, has p = 4.5e-5, which fp16 keeps: its gradient survives
    CHECK(b.get("dead_gradients") == 2);
  }
  SUBCASE("sum-outside-autocast: 4096 values from 16 to 32 sum to 98048") {
    const RunResult b = runs_of("sum-outside-autocast").broken;
    // i·37 mod 128 runs through every residue 32 times: 4096·16 + 32·(0 + ... + 127)/8
    CHECK(b.get("exact_sum") == 4096.0 * 16 + 32.0 * (127.0 * 128.0 / 2) / 8);
    CHECK(b.get("accumulator") == b.get("exact_sum"));  // multiples of 1/8 below 2^17: exact in FP32
  }
  SUBCASE("half-under-autocast: every norm of the Transformer, and no cast of γ, β is cached") {
    const RunResult b = runs_of("half-under-autocast").broken;
    const RunResult f = runs_of("half-under-autocast").fixed;
    // two blocks of ln1 and ln2, then the final norm
    CHECK(b.get("norm_calls") == 5);
    // γ and β in forward, γ again in backward, at every norm
    CHECK(b.get("norm_param_casts") == 15);
    // the fp16 weights need no cast; the FP32 model casts each weight once
    // in forward and reuses it in backward: as many cached as cast
    CHECK(b.get("weight_casts") == 0);
    CHECK(f.get("cached_casts") == f.get("weight_casts"));
  }
  SUBCASE("cpu-autocast-list: layer_norm, softmax, log_softmax are the difference") {
    const RunResult b = runs_of("cpu-autocast-list").broken;
    CHECK(b.get("ops_unlike_cuda") == 3);
    // a bf16 probability: at most half of bf16's 2^-7 relative spacing, plus the FP32 work
    CHECK(b.get("softmax_max_rel_error") < std::ldexp(1.0, -8) * 1.01);
  }
  SUBCASE("ffn-fp32-rule-of-thumb: one set of paired differences, seen from each side") {
    const RunResult b = runs_of("ffn-fp32-rule-of-thumb").broken;
    const RunResult f = runs_of("ffn-fp32-rule-of-thumb").fixed;
    CHECK(b.get("seeds") == 8);
    // d = this − the other at each seed: the fixed run's d is the broken run's, negated
    CHECK(f.get("mean_paired_difference") == -b.get("mean_paired_difference"));
    CHECK(f.get("paired_sd") == b.get("paired_sd"));
    CHECK(f.get("paired_ci_low") == doctest::Approx(-b.get("paired_ci_high")).epsilon(1e-12));
    // Student's t with 7 degrees of freedom: t₀.₉₇₅ = 2.3646 (tables), the
    // interval mean ± 2.3646·sd/√8, t = mean/(sd/√8)
    const double se = b.get("paired_sd") / std::sqrt(8.0);
    CHECK((b.get("paired_ci_high") - b.get("paired_ci_low")) / 2 ==
          doctest::Approx(2.3646 * se).epsilon(1e-4));
    CHECK((b.get("paired_ci_high") + b.get("paired_ci_low")) / 2 ==
          doctest::Approx(b.get("mean_paired_difference")).epsilon(1e-9));
    CHECK(b.get("paired_t") == doctest::Approx(b.get("mean_paired_difference") / se).epsilon(1e-9));
    // the sign test over 8 pairs without ties: 2·P(X <= k), X binomial(8, 1/2),
    // k the smaller side: 2/256, 2·9/256, 2·37/256, 2·93/256, then 1
    CHECK(b.get("seeds_higher") + f.get("seeds_higher") == 8);
    const double p_sign[] = {2.0 / 256, 18.0 / 256, 74.0 / 256, 186.0 / 256, 1};
    const int k = static_cast<int>(std::min(b.get("seeds_higher"), f.get("seeds_higher")));
    CHECK(b.get("sign_test_p") == p_sign[k]);
    CHECK(f.get("sign_test_p") == p_sign[k]);
  }
}
