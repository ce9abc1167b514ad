// Chapter 01 exercises — grader tests for exercise 1.3 (the fraction of a
// tensor flushed to zero). Depends on: grader.hpp; mpt::classify is the
// reference. Three test cases, two points each: hand-worked fp16 tensors,
// every stock format at its own threshold, large random tensors.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex01;
using namespace mpt::ex01::grading;

// The answer must be the exact count over n: allow only the rounding of a
// division, far less than one element's worth (1/n).
void expect_fraction(Mismatches& m, const std::vector<float>& x, const mpt::Format& f, std::size_t want_count,
                     const std::string& what) {
  m.checked();
  const std::size_t n = x.size();
  const double got = flushed_fraction(n ? x.data() : nullptr, n, f);
  const double want = n ? static_cast<double>(want_count) / static_cast<double>(n) : 0.0;
  if (std::fabs(got - want) <= 1e-12 * (want > 1 ? want : 1) || !m.wrong()) return;
  m.detail(std::string(f.name) + ", " + what + " (n = " + std::to_string(n) + "): got " + describe(got) +
           ", expected " + describe(want) + " = " + std::to_string(want_count) + "/" + std::to_string(n));
}

std::string list(const std::vector<float>& x) {
  std::string s = "{";
  for (std::size_t i = 0; i < x.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.9g", i ? ", " : "", static_cast<double>(x[i]));
    s += buf;
  }
  return s + "}";
}

}  // namespace

TEST_SUITE("exercise-1.3") {
  TEST_CASE("1.3 small fp16 tensors worked out by hand: ties, zeros, inf and NaN") {
    const mpt::Format& fp16 = fp16_format();
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float half_min_sub = 0x1p-25f;  // half of fp16's smallest subnormal 2^-24
    struct Case {
      std::vector<float> x;
      std::size_t flushed;
      const char* why;
    };
    const Case cases[] = {
        {{}, 0, "an empty tensor: 0 by definition"},
        {{0.0f, -0.0f, 1.0f, -1.0f, 65504.0f}, 0, "zeros were zero already: not flushed"},
        {{half_min_sub, -half_min_sub, std::nextafter(half_min_sub, 1.0f), 1e-10f, 1e-3f, inf, nan, 0.0f},
         3,
         "the tie at 2^-25 goes to zero (even); just above it does not; inf, NaN and 0 count in n only"},
        {{1e-9f, -1e-9f, 0x1p-30f, std::numeric_limits<float>::denorm_min()}, 4, "everything flushed"},
        {{0x1p-24f, 0x1p-15f, 1e-8f, 3e-8f},
         1,
         "subnormal results are kept (2^-24, 2^-15, 3e-8 -> 2^-24); only 1e-8 < 2^-25 is flushed"},
        {{-3e-8f, -2.9e-8f, 2.99e-8f, 2.98e-8f}, 2, "2^-25 = 2.98023224e-08 sits between these"},
    };
    Mismatches m(10);
    for (const Case& c : cases) {
      // The hand-worked counts must agree with mpt, or the grader is wrong.
      REQUIRE(reference_flushed_count(c.x.data(), c.x.size(), fp16) == c.flushed);
      expect_fraction(m, c.x, fp16, c.flushed, list(c.x) + " -- " + c.why);
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("1.3 every stock format at its own threshold (fp32, tf32, bf16, fp16, e4m3, e5m2)") {
    Mismatches m(12);
    for (const mpt::Format& f : mpt::all_formats()) {
      const double min_sub = mpt::limits_of(f.spec).min_subnormal;
      const double t = min_sub / 2;
      std::vector<float> x;
      if (t >= static_cast<double>(std::numeric_limits<float>::denorm_min())) {
        const float tf = static_cast<float>(t);  // a power of two >= 2^-149: exact
        x = {tf,
             -tf,
             std::nextafter(tf, 1.0f),
             std::nextafter(tf, 0.0f),
             -std::nextafter(tf, 0.0f),
             static_cast<float>(min_sub),
             3 * tf,
             tf / 4,
             0.0f,
             1.0f};
      } else {  // fp32 itself: its own half-subnormal 2^-150 is not a float
        const float d = std::numeric_limits<float>::denorm_min();
        x = {d, -d, 2 * d, 3 * d, 0.0f, 1.0f};
      }
      expect_fraction(m, x, f, reference_flushed_count(x.data(), x.size(), f),
                      "values around half the smallest subnormal " + describe(t) + ": " + list(x));
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("1.3 large random tensors in every format: magnitudes from 2^-149 to 2^24") {
    std::mt19937 rng(31337u);  // raw engine output: the same tensors everywhere
    Mismatches m(12);
    for (const mpt::Format& f : mpt::all_formats()) {
      for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{100003}}) {
        std::vector<float> x(n);
        for (float& v : x) {
          const std::uint32_t r = rng() % 1000u;
          if (r == 0) {
            v = std::numeric_limits<float>::infinity();
          } else if (r == 1) {
            v = std::numeric_limits<float>::quiet_NaN();
          } else if (r < 20) {
            v = 0.0f;
          } else {
            // biased exponent 0 ... 150: fp32 subnormals up to 2^23
            const std::uint32_t e = rng() % 151u;
            v = float_of((rng() & 0x80000000u) | (e << 23) | (rng() & 0x7fffffu));
          }
        }
        expect_fraction(m, x, f, reference_flushed_count(x.data(), n, f), "a random tensor");
      }
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

}  // TEST_SUITE
