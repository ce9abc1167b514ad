// Chapter 02 exercises — grader tests for exercise 2.2 (fused unscale and
// check over one gradient buffer). Depends on: grader.hpp; mpt's
// unscale_and_check (src/mpt/amp/unscale.hpp) is the reference.
// Six test cases, two points each but one: a buffer by hand, inf/NaN
// anywhere, judged before the multiply, short buffers, large random buffers;
// inv_scale == 1 (a signalling NaN's bits) is a detail, one point.
#include <cfloat>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex02;
using namespace mpt::ex02::grading;

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::string list(const std::vector<float>& x) {
  std::string s = "{";
  for (std::size_t i = 0; i < x.size() && i < 12; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.9g", i ? ", " : "", static_cast<double>(x[i]));
    s += buf;
  }
  return s + (x.size() > 12 ? ", ...}" : "}");
}

// The student's and the reference's unscale of the same buffer: the flag,
// and every element (same bits; two NaNs count as equal unless exact_nan).
void expect_unscale(Mismatches& m, const std::vector<float>& input, float inv_scale, const std::string& what,
                    bool exact_nan = false) {
  m.checked();
  std::vector<float> want = input, got = input;
  const bool want_flag = reference_unscale(want, inv_scale);
  const bool got_flag = unscale_and_check(got.empty() ? nullptr : got.data(), got.size(), inv_scale);
  std::string problem;
  if (got_flag != want_flag)
    problem = std::string("returned ") + (got_flag ? "true" : "false") + ", expected " +
              (want_flag ? "true" : "false");
  for (std::size_t i = 0; i < input.size() && problem.empty(); ++i) {
    const bool ok = exact_nan ? bits_of(got[i]) == bits_of(want[i]) : same_float(got[i], want[i]);
    if (!ok)
      problem = "element " + std::to_string(i) + " = " + describe(input[i]) + " became " + describe(got[i]) +
                ", expected " + describe(want[i]);
  }
  if (problem.empty() || !m.wrong()) return;
  m.detail(what + ": g = " + list(input) + " (n = " + std::to_string(input.size()) +
           "), inv_scale = " + describe(inv_scale) + ": " + problem);
}

}  // namespace

TEST_SUITE("exercise-2.2") {
  TEST_CASE("2.2 a buffer worked by hand: finite gradients, every one multiplied, nothing reported") {
    Mismatches m(20);
    const std::vector<float> g = {65536.0f, -131072.0f, 0.5f,   3.0f,      -0.0f,
                                  0.0f,     1e-3f,      -7.25f, 0x1p-140f, 1e30f};
    for (float inv : {0x1p-16f, 0.5f, 0x1p-24f, 1.0f / 3.0f, 1.0f / 1000.0f, 0.0f})
      expect_unscale(m, g, inv, "finite gradients");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.2 an inf or NaN anywhere is reported, and every element is still multiplied") {
    Mismatches m(20);
    const std::vector<float> base = {2.0f, -4.0f, 8.0f, 16.0f, 0.25f, -1.0f, 3.0f, 1024.0f, 5.0f};
    for (float bad : {kInf, -kInf, kNaN, -kNaN})
      for (std::size_t at : {std::size_t{0}, std::size_t{4}, std::size_t{8}}) {
        std::vector<float> g = base;
        g[at] = bad;
        expect_unscale(m, g, 0x1p-16f, "one non-finite element");
        expect_unscale(m, g, 0.1f, "one non-finite element");
      }
    std::vector<float> two = base;
    two[1] = kInf;
    two[6] = kNaN;
    expect_unscale(m, two, 0x1p-10f, "two non-finite elements");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.2 judged before the multiply: a product that overflows is not reported [14 points]") {
    // A scale below 1 (inv_scale > 1) can overflow finite gradients while
    // unscaling; a scale that backed off to 0 gives inv_scale = inf. PyTorch
    // looks at the values backward produced, not at the products.
    Mismatches m(20);
    const std::vector<float> big = {1e38f, -3e38f, FLT_MAX, 1.0f, 0.0f};
    expect_unscale(m, big, 8.0f, "finite gradients, some products overflow");
    expect_unscale(m, big, 2.0f, "finite gradients, some products overflow");
    expect_unscale(m, {1.0f, -2.0f, 0.0f, 1e-30f}, kInf, "finite gradients, inv_scale = inf (a scale of 0)");
    expect_unscale(m, {1e38f, kInf, 3.0f}, 8.0f, "a real inf among products that overflow");
    expect_unscale(m, {kNaN, 0.0f}, kInf, "a NaN, inv_scale = inf");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.2 inv_scale == 1 leaves every bit as it was, signalling NaNs included [3 points]") {
    Mismatches m(20);
    const std::vector<float> finite = {1.0f, -0.0f, 0x1p-149f, -3.5f, FLT_MAX, 1e-40f};
    expect_unscale(m, finite, 1.0f, "inv_scale 1, finite gradients", true);
    const std::vector<float> odd = {
        2.0f,  float_of(0x7f800001u), -1.0f, float_of(0xffa00000u), float_of(0x7fc12345u), kInf,
        -kInf, float_of(0x7f812345u)};
    expect_unscale(m, odd, 1.0f,
                   "inv_scale 1, signalling and quiet NaNs with payloads (x * 1 quiets a signalling NaN)",
                   true);
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.2 short buffers: n = 0 with nullptr, and every position of an inf in 1 to 17 elements") {
    Mismatches m(20);
    m.checked();
    const bool empty = unscale_and_check(nullptr, 0, 0.5f);
    if (empty) m.add("n = 0, g = nullptr: returned true, expected false");
    for (std::size_t n = 1; n <= 17; ++n) {
      std::vector<float> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(i + 1) * 0.75f;
      expect_unscale(m, g, 0x1p-3f, "all finite");
      for (std::size_t at = 0; at < n; ++at) {
        std::vector<float> h = g;
        h[at] = (at % 2) ? kNaN : -kInf;
        expect_unscale(m, h, 0x1p-3f, "one non-finite element");
      }
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.2 random buffers against the reference: lengths 0 to 300, a million elements") {
    std::mt19937 rng(424242u);
    Mismatches m;
    std::size_t elements = 0;
    while (elements < 1000000) {
      const std::size_t n = rng() % 301u;
      std::vector<float> g(n);
      const unsigned kind = rng() % 4u;
      for (float& v : g) {
        if (kind == 0) {
          v = float_of(rng());  // any bit pattern: inf and NaN now and then
        } else {
          // gradients as a scaled backward leaves them: |g| from 2^-30 to 2^30
          const std::uint32_t e = 97u + rng() % 61u;
          v = float_of((rng() & 0x80000000u) | (e << 23) | (rng() & 0x7fffffu));
        }
      }
      if (kind == 3 && n > 0) g[rng() % n] = (rng() & 1u) ? kInf : kNaN;
      float inv;
      switch (rng() % 3u) {
        case 0: inv = std::ldexp(1.0f, -static_cast<int>(rng() % 25u)); break;  // 1/2^k
        case 1: inv = static_cast<float>(1.0 / (1.0 + static_cast<double>(rng() % 100000u))); break;
        default: inv = float_of(0x3f800000u | (rng() & 0x7fffffu)) * 0.5f; break;  // [0.5, 1)
      }
      expect_unscale(m, g, inv, "a random buffer");
      elements += n;
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

}  // TEST_SUITE
