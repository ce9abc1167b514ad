// Chapter 04 — exercises: grader tests for exercise 4.4 (diagnose: an attention row's masked softmax).
// Depends on: grader.hpp (the reference: the softmax of mpt's attention
// row, attention_math.hpp, in double, on the same stored scores).
// Four test cases, three points each (a diagnose exercise's): rows without
// a mask, padding masks, fully masked rows, causal rows of a long sequence.
// The given, broken body (the scaled and masked scores rounded into the
// scores' dtype before the softmax) fails every one of them; its rows sum
// to 1 throughout, apart from the fully masked ones.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex04;
using namespace mpt::ex04::grading;

// Grades one row; adds one line to `m` for a wrong answer.
void expect_row(Mismatches& m, const AttentionRow& r, const std::string& why) {
  m.checked();
  const std::string problem = attention_problem(r);
  if (problem.empty() || !m.wrong()) return;
  m.detail(why + " (" + describe(r) + "): " + problem);
}

// 1/√d, the scale of a head of dimension d.
float head_scale(int d) { return 1.0f / std::sqrt(static_cast<float>(d)); }

}  // namespace

TEST_SUITE("exercise-4.4") {
  TEST_CASE("4.4 rows without a mask: the probabilities of mpt's attention softmax, within one unit") {
    // Scaled scores of standard deviation 4 (a trained model's attention is
    // peaked): the largest reach 10 to 15.
    Mismatches m;
    std::uint32_t seed = 4401u;
    for (mpt::DType dtype : {mpt::DType::f16, mpt::DType::bf16}) {
      for (int d : {80, 96, 48}) {
        for (std::size_t n : {16u, 80u, 500u}) {
          const float scale = head_scale(d);
          expect_row(m, attention_row(seed++, n, 4.0 / scale, scale, dtype),
                     "head dimension " + std::to_string(d) + ", no mask");
        }
      }
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.4 padding masks: keys past a sequence's length get exactly 0, the others as mpt's") {
    Mismatches m;
    std::uint32_t seed = 4411u;
    for (mpt::DType dtype : {mpt::DType::f16, mpt::DType::bf16}) {
      for (std::size_t length : {100u, 37u, 2u, 1u}) {
        AttentionRow r = attention_row(seed++, 128, 4.0 / head_scale(80), head_scale(80), dtype);
        for (std::size_t j = length; j < r.keep.size(); ++j) r.keep[j] = false;
        // What a padded key's product is does not matter, however large
        // (the dtype's largest value here).
        r.scores[length] = dtype == mpt::DType::f16 ? 65504.0f : float_of(0x7f7f0000u);
        expect_row(m, r, "128 keys, the first " + std::to_string(length) + " of them real");
      }
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.4 fully masked rows (a padded query) give zeros, not NaN, in f16 and in bf16 [1 point]") {
    // A batch of sequences of different lengths pads its short ones: a
    // padded query attends to nothing. Its output is discarded, but a NaN
    // there reaches every parameter through the backward pass.
    Mismatches m;
    std::uint32_t seed = 4421u;
    for (mpt::DType dtype : {mpt::DType::f16, mpt::DType::bf16}) {
      for (std::size_t n : {1u, 7u, 128u, 1024u}) {
        AttentionRow r = attention_row(seed++, n, 20.0, 0.125f, dtype);
        r.keep.assign(n, false);
        expect_row(m, r, "no key kept");
      }
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.4 causal rows of a 2048-key sequence: query i sees keys 0 to i") {
    Mismatches m;
    std::uint32_t seed = 4431u;
    for (mpt::DType dtype : {mpt::DType::f16, mpt::DType::bf16}) {
      for (std::size_t i : {0u, 1u, 63u, 500u, 1023u, 2047u}) {
        AttentionRow r = attention_row(seed++, 2048, 5.0 / head_scale(96), head_scale(96), dtype);
        for (std::size_t j = i + 1; j < r.keep.size(); ++j) r.keep[j] = false;
        expect_row(m, r, "query " + std::to_string(i) + " of 2048, causal, head dimension 96");
      }
    }
    CHECK_MESSAGE(m.none(), m.report());
  }
}  // TEST_SUITE
