// Chapter 07 — exercises: grader tests for exercise 7.2 (an MX block's E8M0 scale by FLOOR and RCEIL).
// Depends on: grader.hpp; mpt's mx_scale_code is the reference, by both rules, for E4M3 and E5M2 elements.
// Four test cases, two points each, and bad input for one: ordinary amaxes; powers of two and the edges
// of each rule (max_norm x 2^k and its neighbours, down to where amax x (1/max_norm) is subnormal); the
// ends (zero, subnormal, FLT_MAX, inf, NaN); a sweep of float bit patterns. log2 in double gets the
// first right and loses the rest.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex07;
using namespace mpt::ex07::grading;
using mpt::DType;

}  // namespace

TEST_SUITE("exercise-7.2") {
  TEST_CASE("7.2 ordinary amaxes: the block's exponent by FLOOR and by RCEIL") {
    Mismatches m;
    for (const float a : {1.0f, 3.0f, 0.3f, 7.5f, 100.0f, 300.0f, 447.0f, 500.0f, 1000.0f, 0.001f, 0.0123f,
                          12345.0f, 6.0e4f, 1.0e6f, 2.5e-5f, 3.3e10f, 1.7e-12f, -5.0f, -0.25f})
      expect_codes(m, a);
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("7.2 powers of two, and max_norm x 2^k and its neighbours, across the whole range") {
    // FLOOR: an amax of 2^k starts a binade; RCEIL: max_norm x 2^k is the
    // largest amax a scale of 2^-k keeps in range. Down at the bottom,
    // amax x (1/max_norm) is a float subnormal, rounded as the kernels round it.
    Mismatches m;
    for (int k = -149; k <= 127; ++k) {
      const float p = std::ldexp(1.0f, k);
      expect_codes(m, p);
      expect_codes(m, std::nextafter(p, 0.0f));
      expect_codes(m, std::nextafter(p, kInfF));
    }
    for (const float max_norm : {448.0f, 57344.0f})
      for (int k = -135; k <= 112; ++k) {
        float a = std::ldexp(max_norm, k);
        float below = a, above = a;
        for (int j = 0; j < 3; ++j) {
          expect_codes(m, below);
          expect_codes(m, above);
          below = std::nextafter(below, 0.0f);
          above = std::nextafter(above, kInfF);
        }
      }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("7.2 the ends: an all-zero block, subnormal amaxes, FLT_MAX, inf and NaN") {
    Mismatches m;
    for (const float a :
         {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), 1e-45f, 1e-40f, 5.877472e-39f,
          1.1754942e-38f, std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
          -std::numeric_limits<float>::max(), kInfF, -kInfF, kNaNF, -kNaNF})
      expect_codes(m, a);
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("7.2 a sweep of float bit patterns, both rules, both element formats") {
    // Every 4093rd bit pattern of the 2^32, NaNs and infinities included.
    Mismatches m;
    for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 4093)
      expect_codes(m, float_of(static_cast<std::uint32_t>(u)));
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("7.2 an element dtype that is not FP8 throws std::invalid_argument [1 point]") {
    Mismatches m;
    for (const DType d : {DType::f32, DType::f16, DType::bf16})
      for (const MxScaleRule r : {MxScaleRule::floor, MxScaleRule::rceil}) {
        m.checked();
        const std::string thrown = thrown_by([&] { (void)e8m0_scale(1.0f, d, r); });
        if (thrown != "invalid_argument" && m.wrong())
          m.detail(name_of(d) + " elements, " + name_of(r) + ": " +
                   (thrown.empty() ? std::string("nothing thrown") : thrown) +
                   ", expected std::invalid_argument");
      }
    CHECK_MESSAGE(m.none(), m.report());
  }
}  // TEST_SUITE
