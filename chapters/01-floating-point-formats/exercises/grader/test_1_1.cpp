// Chapter 01 exercises — grader tests for exercise 1.1 (fp32 -> fp16 bits).
// Depends on: grader.hpp (mpt's rounding and encoder are the reference).
// Four test cases, two points each (the exercise's points per test case):
// exact values, the neighbourhood of every fp16 value, the edges of the
// range and NaN, and a million random floats.
#include <cfloat>
#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "grader.hpp"

namespace {

using namespace mpt::ex01;
using namespace mpt::ex01::grading;

// One comparison with the reference; `why` says what kind of input it is,
// so that a wrong answer teaches something.
void expect_code(Mismatches& m, float x, const char* why) {
  m.checked();
  const std::uint16_t got = fp32_to_fp16_bits(x);
  if (std::isnan(x)) {
    if (!fp16_code_is_quiet_nan(got) && m.wrong())
      m.detail("x = " + describe(x) + " (NaN): got " + hex16(got) +
               ", expected a quiet NaN (exponent all ones, top fraction bit set: code & 0x7e00 == 0x7e00)");
    return;
  }
  const std::uint16_t want = reference_fp16_bits(x);
  if (got != want && m.wrong())
    m.detail("x = " + describe(x) + ", " + why + ": got " + hex16(got) + " (" + describe(fp16_value(got)) +
             "), expected " + hex16(want) + " (" + describe(fp16_value(want)) + ")");
}

}  // namespace

TEST_SUITE("exercise-1.1") {
  TEST_CASE("1.1 every fp16 value converts to its own code (signed zeros, subnormals, infinities)") {
    Mismatches m;
    for (std::uint32_t code = 0; code <= 0xffffu; ++code) {
      if (fp16_code_is_nan(code)) continue;
      const float x = fp16_value(code);
      m.checked();
      const std::uint16_t got = fp32_to_fp16_bits(x);
      if (got != code && m.wrong())
        m.detail("x = " + describe(x) + " is exactly representable: got " + hex16(got) + ", expected " +
                 hex16(code));
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("1.1 between every two neighbours: ties to even, nearest otherwise") {
    // For each pair of adjacent fp16 magnitudes lo < hi (0 and the smallest
    // subnormal included; above 65504 the next "neighbour" is 65536, where
    // rounding puts infinity), probe the midpoint and the points around it,
    // with both signs. The midpoint is exact in fp32 (fp16 values need 11
    // bits, the midpoint 12).
    Mismatches m;
    for (std::uint32_t code = 0; code < 0x7c00u; ++code) {
      const float lo = fp16_value(code);
      const float hi = code + 1 < 0x7c00u ? fp16_value(code + 1) : 65536.0f;
      const float mid = lo + (hi - lo) / 2;
      const float probes[] = {mid,
                              std::nextafter(mid, 0.0f),
                              std::nextafter(mid, hi),
                              lo + (hi - lo) / 4,
                              lo + 3 * (hi - lo) / 4,
                              std::nextafter(lo, hi),
                              std::nextafter(hi, lo)};
      const char* why[] = {"the midpoint, a tie (goes to the even code)",
                           "just below the midpoint",
                           "just above the midpoint",
                           "a quarter of the way up",
                           "three quarters of the way up",
                           "just above an fp16 value",
                           "just below an fp16 value"};
      for (int k = 0; k < 7; ++k) {
        expect_code(m, probes[k], why[k]);
        expect_code(m, -probes[k], why[k]);
      }
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("1.1 the edges: overflow to infinity, underflow to signed zero, NaN") {
    Mismatches m;
    const float inf = std::numeric_limits<float>::infinity();
    // Overflow: 65520 is the tie between 65504 (odd) and 65536, i.e. infinity.
    const float big[] = {65504.0f, std::nextafter(65520.0f, 0.0f),
                         65520.0f, std::nextafter(65520.0f, inf),
                         65536.0f, 1e5f,
                         1e10f,    1e30f,
                         FLT_MAX,  inf};
    for (float x : big) {
      expect_code(m, x, "at or beyond the top of the range");
      expect_code(m, -x, "at or beyond the top of the range");
    }
    for (std::uint32_t e = 143; e <= 254; ++e)  // 2^16 ... 2^127, a few fractions each
      for (std::uint32_t frac : {0u, 1u, 0x400000u, 0x7fffffu})
        expect_code(m, float_of(e << 23 | frac), "far beyond 65504");
    // Underflow: 2^-25 is the tie between 0 (even) and the smallest subnormal.
    const float small[] = {0x1p-25f,
                           std::nextafter(0x1p-25f, 1.0f),
                           std::nextafter(0x1p-25f, 0.0f),
                           0x1.8p-25f,
                           0x1p-26f,
                           1e-10f,
                           1e-20f,
                           FLT_MIN,
                           std::numeric_limits<float>::denorm_min()};
    for (float x : small) {
      expect_code(m, x, "near or below half the smallest subnormal");
      expect_code(m, -x, "near or below half the smallest subnormal");
    }
    for (std::uint32_t frac = 1; frac < 0x800000u; frac += 4099) {  // fp32 subnormals
      expect_code(m, float_of(frac), "an fp32 subnormal");
      expect_code(m, float_of(0x80000000u | frac), "an fp32 subnormal");
    }
    // NaN: quiet, signalling, with payloads, both signs.
    for (std::uint32_t frac : {0x400000u, 0x000001u, 0x200000u, 0x7fffffu, 0x000400u, 0x123456u}) {
      expect_code(m, float_of(0x7f800000u | frac), "NaN");
      expect_code(m, float_of(0xff800000u | frac), "NaN");
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("1.1 a million random floats: every exponent, and the fp16 range in detail") {
    // std::mt19937's output is fixed by the standard, so every machine
    // draws the same inputs (distributions are not, so none are used).
    std::mt19937 rng(20240101u);
    Mismatches m;
    for (int i = 0; i < (1 << 19); ++i) {
      expect_code(m, float_of(rng()), "a random bit pattern");
    }
    for (int i = 0; i < (1 << 19); ++i) {
      // biased exponents 101 ... 143: |x| from 2^-26 to just below 2^17
      const std::uint32_t sign = rng() & 0x80000000u;
      const std::uint32_t e = 101u + rng() % 43u;
      const std::uint32_t bits = sign | (e << 23) | (rng() & 0x7fffffu);
      expect_code(m, float_of(bits), "a random value in or near the fp16 range");
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

}  // TEST_SUITE
