// Chapter 01 exercises — grader tests for exercise 1.2 (the smallest update
// that changes an fp16 weight). Depends on: grader.hpp, whose reference
// answer comes from a search with mpt's fp16 rounding, not from a formula.
// Three test cases, two points each: named weights, every w >= 0, every w <= 0.
#include <cstdint>
#include <string>

#include "grader.hpp"

namespace {

using namespace mpt::ex01;
using namespace mpt::ex01::grading;

// Checks the answer for one weight; the message says which way it is wrong.
void expect_update(Mismatches& m, float w, const char* note) {
  m.checked();
  const float want = reference_smallest_update(w);
  const float got = smallest_effective_update(w);
  if (bits_of(got) == bits_of(want) || !m.wrong()) return;
  std::string msg = "w = " + describe(w) + " (code " + hex16(reference_fp16_bits(w)) + ")";
  if (note[0] != '\0') msg += std::string(" [") + note + "]";
  msg += ": got u = " + describe(got) + ", expected " + describe(want);
  if (!(got > 0.0f) || !std::isfinite(got)) {
    msg += " -- u must be a positive finite float";
  } else if (got < want) {
    msg += " -- too small: fp16(w + u) = " + describe(fp16_of_exact_sum(w, got)) + " is still w";
  } else {
    msg += " -- too large: u = expected already moves w to " + describe(fp16_of_exact_sum(w, want));
  }
  m.detail(msg);
}

}  // namespace

TEST_SUITE("exercise-1.2") {
  TEST_CASE("1.2 named weights: 1, its neighbours, zero, the top and bottom of the range") {
    struct Case {
      float w;
      const char* note;
    };
    const Case cases[] = {
        {1.0f, "1.0, an even code: the tie 1 + 2^-11 stays at 1"},
        {1.0f + 0x1p-10f, "1 + 2^-10, an odd code: the tie goes up to the even neighbour"},
        {1.0f + 0x1p-9f, "1 + 2^-9, an even code"},
        {-1.0f, "-1: the neighbour toward zero is 1 - 2^-11, only half as far"},
        {0.5f, "0.5"},
        {-0.5f, "-0.5, a negative power of two"},
        {3.0f, "3 = 1.5 * 2"},
        {2048.0f, "2048: the spacing is 2 from here up"},
        {-2048.0f, "-2048: the spacing toward zero is 1"},
        {65504.0f, "65504, the largest value: 65520 rounds to infinity"},
        {-65504.0f, "-65504"},
        {0.0f, "+0: the tie 2^-25 goes to zero (even)"},
        {-0.0f, "-0 equals +0"},
        {0x1p-24f, "the smallest subnormal, an odd code"},
        {-0x1p-24f, "minus the smallest subnormal"},
        {0x1p-14f, "the smallest normal number"},
        {-0x1p-14f, "minus the smallest normal: the spacing below it is still 2^-24"},
        {0x1.ff8p-15f, "the largest subnormal, 1023 * 2^-24"},
        {0.0999755859375f, "fp16(0.1)"},
    };
    Mismatches m(20);  // few enough to show every wrong one
    for (const Case& c : cases) {
      // The weights must be fp16 values (the precondition), or the grader is wrong.
      REQUIRE(fp16_value(reference_fp16_bits(c.w)) == c.w);
      expect_update(m, c.w, c.note);
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("1.2 every fp16 weight w >= 0: zero, subnormals, normals up to 65504") {
    Mismatches m;
    for (std::uint32_t code = 0x0000u; code < 0x7c00u; ++code) expect_update(m, fp16_value(code), "");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("1.2 every fp16 weight w <= 0: -0, subnormals, normals down to -65504") {
    Mismatches m;
    for (std::uint32_t code = 0x8000u; code < 0xfc00u; ++code) expect_update(m, fp16_value(code), "");
    CHECK_MESSAGE(m.none(), m.report());
  }

}  // TEST_SUITE
