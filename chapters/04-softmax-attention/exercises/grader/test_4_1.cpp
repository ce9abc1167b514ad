// Chapter 04 — exercises: grader tests for exercise 4.1 (a stable log-sum-exp of a row of floats).
// Depends on: grader.hpp; mpt's two-pass (max, sum) in double is the
// reference on rows without +inf or NaN, torch.logsumexp's rules on them.
// Six test cases: hand-worked rows, large logits (where exp overflows or
// underflows without the maximum taken out), masked rows (−inf), +inf and
// NaN (a detail, one point), a single logit (one point), long rows.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex04;
using namespace mpt::ex04::grading;

}  // namespace

TEST_SUITE("exercise-4.1") {
  TEST_CASE("4.1 hand-worked rows of moderate logits") {
    Mismatches m;
    // log(e^0 + e^0) = log 2.
    expect_lse(m, {0.0f, 0.0f}, kLseTolerance, "two zeros: log 2");
    // 3 + log(1 + e^-1 + e^-2) = 3.40760596.
    expect_lse(m, {1.0f, 2.0f, 3.0f}, kLseTolerance, "{1, 2, 3}: 3.40760596");
    expect_lse(m, {3.0f, 1.0f, 2.0f}, kLseTolerance, "{3, 1, 2}, the same set in another order");
    // log(1 + 2 + 3) = log 6, from the logs of 1, 2 and 3 stored as floats.
    expect_lse(m, {0.0f, std::log(2.0f), std::log(3.0f)}, kLseTolerance,
               "{log 1, log 2, log 3}: about log 6");
    // Four equal logits: 10 + log 4.
    expect_lse(m, {10.0f, 10.0f, 10.0f, 10.0f}, kLseTolerance, "four logits of 10: 10 + log 4");
    // One logit dominates: 20 + log(1 + e^-20.5 + e^-17) ~ 20 + 4.1e-8.
    expect_lse(m, {-0.5f, 20.0f, 3.0f}, kLseTolerance, "{-0.5, 20, 3}: 20 and a little");
    expect_lse(m, {-7.25f, -3.5f, -12.0f, -4.0f}, kLseTolerance, "negative logits");
    expect_lse(m, normal_row(4101u, 1000, 0.0, 2.0), kLseTolerance, "1000 logits N(0, 2)");
    expect_lse(m, normal_row(4102u, 4096, -3.0, 5.0), kLseTolerance, "4096 logits N(-3, 5)");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.1 large logits: no exp overflows or underflows once the maximum is taken out [9 points]") {
    // float's exp overflows above 88.72 and is 0 below -103.97: log(Σ exp(z))
    // as written gives inf or log(0) = -inf on all of these rows.
    Mismatches m;
    expect_lse(m, {60000.0f, 60000.0f}, kLseTolerance, "fp16's range: 60000 + log 2");
    expect_lse(m, {-60000.0f, -60001.0f, -59999.5f}, kLseTolerance, "logits near -60000");
    expect_lse(m, {1e30f, 1e30f}, kLseTolerance, "1e30 twice (log 2 is far below its spacing)");
    expect_lse(m, {1e30f, -1e30f, 0.0f}, kLseTolerance, "1e30, -1e30 and 0");
    expect_lse(m, {-1e30f, -5e29f}, kLseTolerance, "-1e30 and -5e29");
    expect_lse(m, {88.8f, 88.0f}, kLseTolerance, "just above float's overflow of exp");
    expect_lse(m, {-104.0f, -110.0f, -120.0f}, kLseTolerance, "every exp below float's smallest value");
    expect_lse(m, {3e38f, 3e38f, 1e38f}, kLseTolerance, "near float's largest value");
    expect_lse(m, {1e4f, -1e4f, 9999.0f}, kLseTolerance, "1e4 and -1e4");
    expect_lse(m, normal_row(4111u, 500, 50000.0, 10.0), kLseTolerance, "500 logits N(50000, 10)");
    expect_lse(m, normal_row(4112u, 500, -300.0, 40.0), kLseTolerance, "500 logits N(-300, 40)");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.1 masked positions (-inf) add nothing; a row of -inf only, or no logit, gives -inf") {
    // Attention rows with padding and causal masks: the maximum of a fully
    // masked row is -inf, and -inf - (-inf) is NaN.
    Mismatches m;
    expect_lse_exactly(m, {-kInf}, -kInf, "one masked position");
    expect_lse_exactly(m, {-kInf, -kInf, -kInf, -kInf}, -kInf, "four masked positions");
    expect_lse_exactly(m, {}, -kInf, "no logit at all (n = 0)");
    expect_lse(m, {-kInf, 2.0f, -kInf, 3.0f}, kLseTolerance, "masked positions between two logits");
    expect_lse(m, {-kInf, -kInf, -kInf, 0.5f}, kLseTolerance, "every position masked but the last");
    expect_lse(m, {-kInf, -1.5f}, kLseTolerance, "-inf next to -1.5");
    std::vector<float> padded = normal_row(4121u, 300, 1.0, 3.0);
    for (std::size_t j = 200; j < padded.size(); ++j) padded[j] = -kInf;
    expect_lse(m, padded, kLseTolerance, "300 logits, the last 100 masked (padding)");
    std::vector<float> left = normal_row(4122u, 300, 1.0, 3.0);
    for (std::size_t j = 0; j < 250; ++j) left[j] = -kInf;
    expect_lse(m, left, kLseTolerance, "300 logits, the first 250 masked (left padding)");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.1 +inf gives +inf, NaN gives NaN, as torch.logsumexp [1 point]") {
    Mismatches m;
    expect_lse_exactly(m, {kInf}, kInf, "one +inf");
    expect_lse_exactly(m, {1.0f, kInf, 2.0f}, kInf, "+inf among finite logits");
    expect_lse_exactly(m, {-kInf, kInf}, kInf, "-inf and +inf");
    expect_lse_exactly(m, {kInf, kInf}, kInf, "+inf twice");
    expect_lse_exactly(m, {kNaN}, kNaN, "one NaN");
    expect_lse_exactly(m, {1.0f, kNaN, 2.0f}, kNaN, "NaN among finite logits");
    expect_lse_exactly(m, {kInf, kNaN}, kNaN, "+inf, then NaN");
    expect_lse_exactly(m, {kNaN, -kInf}, kNaN, "NaN, then -inf");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.1 a single logit z gives z exactly [1 point]") {
    // max + log(exp(z - max)) = z + log 1 = z; log(exp(z)) is not z to the
    // last bit, and for most of these it is not even finite.
    Mismatches m;
    for (float z : {0.0f, 0.3f, -7.25f, 1.1f, 42.42f, 60000.0f, -60000.0f, 88.8f, -104.0f, 1e30f, -1e30f,
                    3.4e38f, -3.4e38f, 1e-40f}) {
      expect_lse_exactly(m, {z}, z, "a single logit");
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.1 long rows (2^16 to 2^20 logits): the sum accumulated in float or wider") {
    // Sums of up to 2^20 terms in [0, 1]: an fp16 accumulator stops growing
    // at 2048 (its spacing there is 2), bf16's at 256.
    Mismatches m;
    expect_lse(m, normal_row(4131u, 1u << 16, 0.0, 1.0), kLongLseTolerance, "2^16 logits N(0, 1)");
    expect_lse(m, normal_row(4132u, 1u << 18, 5.0, 0.5), kLongLseTolerance, "2^18 logits N(5, 0.5)");
    expect_lse(m, normal_row(4133u, 1u << 20, 0.0, 1.0), kLongLseTolerance, "2^20 logits N(0, 1)");
    expect_lse(m, normal_row(4134u, 1u << 20, 1000.0, 3.0), kLongLseTolerance, "2^20 logits N(1000, 3)");
    expect_lse(m, std::vector<float>(1u << 20, -2.5f), kLongLseTolerance,
               "2^20 equal logits of -2.5: -2.5 + log 2^20");
    CHECK_MESSAGE(m.none(), m.report());
  }
}  // TEST_SUITE
