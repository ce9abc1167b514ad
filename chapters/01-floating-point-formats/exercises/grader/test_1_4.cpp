// Chapter 01 exercises — grader tests for exercise 1.4 (diagnose: the mean
// square of fp16 activations). Depends on: grader.hpp (reference_mean_square:
// FP32 arithmetic in index order; to_fp16: mpt's rounding).
// Four test cases, three points each (a diagnose exercise's): squares above
// fp16's range, a sum past 2048, squares below fp16's subnormals, random
// layers. The given, broken body fails every one of them; a half fix (FP32
// sum, squares still rounded to fp16) passes only the second.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex01;
using namespace mpt::ex01::grading;

std::string head(const std::vector<float>& x) {
  std::string s = "{";
  for (std::size_t i = 0; i < x.size() && i < 6; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.6g", i ? ", " : "", static_cast<double>(x[i]));
    s += buf;
  }
  return s + (x.size() > 6 ? ", ...}" : "}");
}

// The student's mean square of x against the reference, bit for bit.
void expect_mean_square(Mismatches& m, const std::vector<float>& x, const std::string& what) {
  m.checked();
  const float want = reference_mean_square(x);
  const float got = mean_square(x.empty() ? nullptr : x.data(), x.size());
  if (bits_of(got) == bits_of(want) || !m.wrong()) return;
  m.detail(what + " (n = " + std::to_string(x.size()) + ", x = " + head(x) + "): got " + describe(got) +
           ", expected " + describe(want));
}

// A random fp16 value of magnitude about 2^lo ... 2^hi, random sign.
float random_fp16(std::mt19937& rng, int lo, int hi) {
  const int e = lo + static_cast<int>(rng() % static_cast<unsigned>(hi - lo + 1));
  const float frac = 1.0f + static_cast<float>(rng() % 1024u) / 1024.0f;
  const float v = std::ldexp(frac, e);
  return to_fp16((rng() & 1u) ? -v : v);
}

std::vector<float> random_layer(std::mt19937& rng, std::size_t n, int lo, int hi) {
  std::vector<float> x(n);
  for (float& v : x) v = random_fp16(rng, lo, hi);
  return x;
}

}  // namespace

TEST_SUITE("exercise-1.4") {
  TEST_CASE("1.4 large activations: a square above fp16's 65504 is still a number") {
    Mismatches m;
    // 256^2 = 65536 is already past fp16's largest value.
    for (float v : {256.0f, 300.0f, -1000.0f, 4096.0f, 65504.0f})
      expect_mean_square(m, {v}, "one large activation");
    expect_mean_square(m, {0.5f, -2.0f, 1.0f, 320.0f, 0.25f}, "one large activation among small ones");
    std::mt19937 rng(141u);
    for (std::size_t n : {16u, 100u, 1000u})
      expect_mean_square(m, random_layer(rng, n, 7, 11), "a layer of activations between 2^7 and 2^12");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("1.4 many activations: the sum keeps growing past 2048") {
    // Squares 0.25, 1, 2.25 and 4 are exact in fp16, and so is every partial
    // sum in FP32; in fp16 the spacing at 2048 is already 2, and the sum stalls.
    Mismatches m;
    const float levels[] = {0.5f, 1.0f, 1.5f, 2.0f};
    std::mt19937 rng(142u);
    for (std::size_t n : {3000u, 20000u, 100000u}) {
      std::vector<float> x(n);
      for (float& v : x) v = ((rng() & 1u) ? -1.0f : 1.0f) * levels[rng() % 4u];
      expect_mean_square(m, x, "activations of size 0.5 to 2");
    }
    expect_mean_square(m, std::vector<float>(5000, 1.5f), "5000 activations of 1.5");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("1.4 tiny activations: squares below fp16's smallest subnormal still count") {
    // fp16 holds 1e-4, but not its square 1e-8 (below 2^-25, half the
    // smallest subnormal 2^-24): an fp16 square is 0. FP32 holds it.
    Mismatches m;
    expect_mean_square(m, {to_fp16(1e-4f)}, "one activation of 1e-4");
    expect_mean_square(m, {to_fp16(1e-3f), to_fp16(-2e-3f), to_fp16(5e-4f)}, "three activations near 1e-3");
    std::mt19937 rng(143u);
    for (std::size_t n : {64u, 1000u})
      expect_mean_square(m, random_layer(rng, n, -24, -8), "a layer of activations between 2^-24 and 2^-7");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("1.4 random layers of every size against the reference, n = 0 to 5000") {
    Mismatches m;
    std::mt19937 rng(144u);
    std::vector<std::size_t> sizes = {0, 1, 2, 3, 17, 256, 1000, 4096, 5000};
    for (int i = 0; i < 40; ++i) sizes.push_back(rng() % 3000u);
    for (std::size_t n : sizes) {
      // Most layers are of ordinary size; some hold a few large values too.
      std::vector<float> x = random_layer(rng, n, -10, 4);
      if (n > 10 && rng() % 2u) x[rng() % n] = random_fp16(rng, 8, 15);
      expect_mean_square(m, x, "a random layer");
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

}  // TEST_SUITE
