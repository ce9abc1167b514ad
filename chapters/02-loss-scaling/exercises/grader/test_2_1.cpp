// Chapter 02 exercises — grader tests for exercise 2.1 (the loss scale's
// update rule). Depends on: grader.hpp; mpt::update_scale is the reference.
// Six test cases, two points each but one: backoff, growth at the interval,
// no growth to infinity, no floor, long seeded runs; factors that are not
// floats is a detail, one point.
#include <cfloat>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex02;
using namespace mpt::ex02::grading;

// One update from `s` compared with the reference; `why` says what the
// case is about, so that a wrong answer teaches something.
void expect_update(Mismatches& m, ScaleState s, bool found_inf, const ScalerConfig& c,
                   const std::string& why) {
  m.checked();
  const ScaleState want = reference_update(s, found_inf, c);
  const ScaleState got = student_update(s, found_inf, c);
  if (same_state(got, want) || !m.wrong()) return;
  m.detail(why + ": from " + describe(s) + (found_inf ? ", found_inf" : ", clean step") + " (" + describe(c) +
           "): got " + describe(got) + ", expected " + describe(want));
}

// A run of iterations from `start`, the student's state carried from step to
// step and compared after each with the reference's; stops at the first
// difference (after it the two runs would differ for ever).
void expect_run(Mismatches& m, ScaleState start, const std::vector<bool>& overflow, const ScalerConfig& c,
                const std::string& what) {
  ScaleState want = start, got = start;
  for (std::size_t i = 0; i < overflow.size(); ++i) {
    m.checked();
    const ScaleState before = got;
    want = reference_update(want, overflow[i], c);
    got = student_update(got, overflow[i], c);
    if (same_state(got, want)) continue;
    if (m.wrong())
      m.detail(what + " (" + describe(c) + "), iteration " + std::to_string(i + 1) + " of " +
               std::to_string(overflow.size()) + (overflow[i] ? ", found_inf" : ", clean step") + ": from " +
               describe(before) + " got " + describe(got) + ", expected " + describe(want));
    return;
  }
}

}  // namespace

TEST_SUITE("exercise-2.1") {
  TEST_CASE("2.1 an overflow backs off the scale and resets the growth tracker") {
    Mismatches m;
    const float scales[] = {65536.0f, 1.0f, 3.0f, 0x1p-10f, 1e30f, 12345.678f, FLT_MIN, FLT_MAX, 0x1p127f};
    const double backoffs[] = {0.5, 0.25, 0.125, 0.5 + 0x1p-10};
    for (float scale : scales)
      for (double b : backoffs)
        for (std::int32_t interval : {1, 3, 2000})
          for (std::int32_t tracker : {0, 1, 2, 1999}) {
            if (tracker >= interval) continue;
            ScalerConfig c;
            c.backoff_factor = b;
            c.growth_interval = interval;
            expect_update(m, {scale, tracker}, true, c, "an overflow");
          }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.1 clean steps count up; at growth_interval the scale grows and the count restarts") {
    Mismatches m;
    // Every tracker value below a few intervals, growth factors that are exact.
    for (std::int32_t interval : {1, 2, 3, 7, 100, 2000})
      for (double g : {2.0, 4.0, 1.5, 1.0 + 0x1p-8})
        for (std::int32_t tracker = 0; tracker < interval && tracker < 120; ++tracker) {
          ScalerConfig c;
          c.growth_factor = g;
          c.growth_interval = interval;
          expect_update(m, {65536.0f, tracker}, false, c, "a clean step");
          expect_update(m, {0.75f, tracker}, false, c, "a clean step");
        }
    // The last count before the interval, for large intervals too.
    for (std::int32_t interval : {2000, 65536, 2147483647}) {
      ScalerConfig c;
      c.growth_interval = interval;
      expect_update(m, {1024.0f, interval - 1}, false, c, "the clean step that completes the interval");
      expect_update(m, {1024.0f, interval - 2}, false, c, "the clean step before that");
    }
    // Three intervals in a row, from a fresh scaler.
    ScalerConfig c;
    c.growth_interval = 5;
    expect_run(m, {65536.0f, 0}, std::vector<bool>(15, false), c, "15 clean steps with growth_interval 5");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE(
      "2.1 the scale never grows to infinity: at FP32's top it stays, and the count restarts [8 points]") {
    Mismatches m;
    const float tops[] = {FLT_MAX,  0x1p127f,        0x1.8p127f,     std::nextafter(0x1p127f, 0.0f),
                          0x1p126f, 0x1.fffffep126f, 0x1.000002p127f};
    for (float scale : tops)
      for (double g : {2.0, 1.5, 1.0001, 65536.0})
        for (std::int32_t interval : {1, 2, 2000}) {
          ScalerConfig c;
          c.growth_factor = g;
          c.growth_interval = interval;
          expect_update(m, {scale, interval - 1}, false, c, "growth near FP32's largest value");
        }
    // With growth_interval 1 and no overflow the scale climbs to the top and stays there.
    ScalerConfig c;
    c.growth_interval = 1;
    expect_run(m, {65536.0f, 0}, std::vector<bool>(200, false), c, "200 clean steps with growth_interval 1");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.1 no floor: overflow after overflow takes the scale through the subnormals to 0") {
    Mismatches m;
    ScalerConfig c;
    // 2^16 down to 2^-149 and then 0 takes 166 backoffs; keep going, then clean steps.
    std::vector<bool> steps(180, true);
    steps.insert(steps.end(), 50, false);
    c.growth_interval = 10;
    expect_run(m, {65536.0f, 0}, steps, c, "180 overflows in a row, then 50 clean steps");
    c.backoff_factor = 0.3;
    c.growth_factor = 3.0;
    expect_run(m, {1e-40f, 0}, std::vector<bool>(30, true), c, "overflows from a subnormal scale");
    // Single steps at the bottom of the range: halving the smallest subnormal is a tie that rounds to 0.
    ScalerConfig d;
    for (float s : {0x1p-149f, 0x1p-148f, 0x1.8p-148f, 0x1p-126f, 0.0f})
      expect_update(m, {s, 0}, true, d, "an overflow at the bottom of FP32's range");
    d.growth_interval = 1;
    expect_update(m, {0.0f, 0}, false, d, "a clean step at scale 0");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.1 factors that are not floats: each product taken in double, rounded once [1 point]") {
    // float(scale * 0.3f) and float(double(scale) * 0.3) differ for some
    // scales; PyTorch's kernels compute the second.
    Mismatches m;
    std::mt19937 rng(20250202u);
    const double backoffs[] = {0.3, 0.7, 0.1, 0.999, 0.55};
    const double growths[] = {1.1, 3.3, 1.0001, 1.7, 10.0 / 3.0};
    for (int i = 0; i < 2000; ++i) {
      // random scales 2^-20 ... 2^40 with random fractions
      const float scale = float_of((107u + rng() % 60u) << 23 | (rng() & 0x7fffffu));
      ScalerConfig c;
      c.backoff_factor = backoffs[i % 5];
      c.growth_factor = growths[(i / 5) % 5];
      c.growth_interval = 4;
      expect_update(m, {scale, 0}, true, c, "an overflow with a backoff factor that is not a float");
      expect_update(m, {scale, 3}, false, c, "growth with a growth factor that is not a float");
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.1 long seeded runs match the reference iteration for iteration (the sawtooth) [7 points]") {
    Mismatches m;
    struct Run {
      ScalerConfig c;
      float init;
      double overflow_probability;
      int steps;
    };
    const Run runs[] = {
        {{2.0, 0.5, 2000}, 65536.0f, 0.0005, 30000},  // PyTorch's defaults
        {{2.0, 0.5, 10}, 65536.0f, 0.05, 5000},      {{2.0, 0.5, 1}, 1.0f, 0.3, 5000},
        {{4.0, 0.25, 3}, 0x1p100f, 0.2, 5000},       {{1.7, 0.3, 25}, 1000.0f, 0.02, 5000},
        {{2.0, 0.5, 1}, 65536.0f, 0.02, 5000},  // climbs into the top of FP32's range
        {{2.0, 0.5, 50}, 65536.0f, 0.9, 2000},  // sinks to 0 and stays there
    };
    std::mt19937_64 rng(7u);
    for (const Run& r : runs) {
      std::vector<bool> overflow(static_cast<std::size_t>(r.steps));
      for (std::size_t i = 0; i < overflow.size(); ++i)
        overflow[i] = static_cast<double>(rng() >> 11) * 0x1p-53 < r.overflow_probability;
      expect_run(m, {r.init, 0}, overflow, r.c,
                 "a run of " + std::to_string(r.steps) + " iterations from " + describe(r.init));
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

}  // TEST_SUITE
