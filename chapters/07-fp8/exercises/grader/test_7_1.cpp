// Chapter 07 — exercises: grader tests for exercise 7.1 (delayed scaling's update after a step). Depends on:
// grader.hpp; mpt's DelayedScaling (record_amax, then update) is the reference, compared step by step, bit
// for bit: the history, the scale and the chosen amax. Seven test cases, two points each, and bad input for
// one: steady sequences under `max`; most_recent, margins and E5M2; steps with amax 0; inf and NaN; a spike
// and the steps it rules, zeros among them; a tiny amax; seeded random sequences. The ordinary update (the
// first two) is four points of fifteen: the rules for 0, inf, NaN and overflow carry the rest.
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex07;
using namespace mpt::ex07::grading;
using mpt::DType;

DelayedScalingOptions opts(std::size_t len, AmaxComputeAlgo algo = AmaxComputeAlgo::max, int margin = 0) {
  DelayedScalingOptions o;
  o.amax_history_len = len;
  o.algo = algo;
  o.margin = margin;
  return o;
}

const std::vector<std::vector<float>> kSteady = {
    {1.0f, 2.0f, 0.5f, 0.25f, 3.0f, 0.125f, 0.125f, 0.125f},
    {448.0f, 100.0f, 10.0f, 1.0f, 0.1f, 0.01f},
    {0.001f, 0.002f, 0.004f, 0.003f, 0.002f, 0.001f, 0.0005f},
    {7.5f, 7.25f, 8.0f, 6.0f, 5.0f, 9.0f, 1.5f, 1.25f, 1.0f, 0.75f},
    {-3.0f, 2.0f, -1.0f, 0.5f},  // an amax is recorded as |amax|
};

}  // namespace

TEST_SUITE("exercise-7.1") {
  TEST_CASE("7.1 a steady tensor: the history rolls, the largest of the last len steps sets the scale") {
    Mismatches m;
    for (const std::size_t len : {1u, 2u, 3u, 4u, 16u})
      for (const std::vector<float>& s : kSteady) expect_sequence(m, DType::e4m3, opts(len), s, "max");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("7.1 most_recent, a margin, and E5M2: fp8_max x 2^-margin / amax") {
    Mismatches m;
    for (const std::size_t len : {1u, 3u, 8u})
      for (const std::vector<float>& s : kSteady) {
        expect_sequence(m, DType::e4m3, opts(len, AmaxComputeAlgo::most_recent), s, "most_recent");
        expect_sequence(m, DType::e5m2, opts(len), s, "e5m2");
        for (const int margin : {1, 2, 5, 24}) {
          expect_sequence(m, DType::e4m3, opts(len, AmaxComputeAlgo::max, margin), s, "margin");
          expect_sequence(m, DType::e5m2, opts(len, AmaxComputeAlgo::most_recent, margin), s, "margin");
        }
      }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("7.1 a step with amax 0 rolls nothing and keeps the scale") {
    // TE's fused update (the PyTorch default): a tensor that took no part
    // in a step does not age its history. The unfused Python path would.
    Mismatches m;
    const std::vector<std::vector<float>> seqs = {
        {0.0f, 0.0f, 1.0f},
        {2.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f, 0.5f},
        {8.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 1.0f, 1.0f, 1.0f},
        {0.0f, -0.0f, 3.0f, 0.0f},
    };
    for (const std::size_t len : {1u, 2u, 3u, 4u})
      for (const std::vector<float>& s : seqs) {
        expect_sequence(m, DType::e4m3, opts(len), s, "zeros, max");
        expect_sequence(m, DType::e5m2, opts(len, AmaxComputeAlgo::most_recent, 1), s, "zeros, most_recent");
      }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE(
      "7.1 inf and NaN: a NaN amax is never recorded; an inf one keeps the scale while it is remembered") {
    Mismatches m;
    const std::vector<std::vector<float>> seqs = {
        {1.0f, kNaNF, 2.0f, 1.0f},
        {kNaNF, kNaNF, 4.0f},
        {1.0f, kInfF, 1.0f, 1.0f, 1.0f, 2.0f, 1.0f},
        {2.0f, -kInfF, kNaNF, 0.5f, 0.5f, 0.5f, 0.5f},
    };
    for (const std::size_t len : {1u, 2u, 3u})
      for (const std::vector<float>& s : seqs) {
        expect_sequence(m, DType::e4m3, opts(len), s, "inf/NaN, max");
        expect_sequence(m, DType::e4m3, opts(len, AmaxComputeAlgo::most_recent), s, "inf/NaN, most_recent");
      }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("7.1 a spike rules the scale for exactly amax_history_len steps of the tensor") {
    // Steps without the tensor (amax 0) do not count: the spike stays.
    Mismatches m;
    for (const std::size_t len : {2u, 4u, 6u}) {
      std::vector<float> s = {1.0f, 1.0f, 100.0f};
      for (int t = 0; t < 9; ++t) s.push_back(t % 3 == 1 ? 0.0f : 1.0f);
      expect_sequence(m, DType::e4m3, opts(len), s, "a spike");
      expect_sequence(m, DType::e5m2, opts(len), s, "a spike");
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("7.1 a tiny amax: a quotient past FLT_MAX becomes FLT_MAX, a subnormal amax is an amax") {
    Mismatches m;
    const float denorm = std::numeric_limits<float>::denorm_min();
    const std::vector<std::vector<float>> seqs = {
        {1e-40f, 1.0f},
        {denorm, 0.0f, 1e-30f},
        {std::numeric_limits<float>::min(), 1e-39f, 2.0f},
        {1e-36f, 1e-37f, 1e-38f},
    };
    for (const std::size_t len : {1u, 2u})
      for (const std::vector<float>& s : seqs) {
        expect_sequence(m, DType::e4m3, opts(len), s, "tiny");
        expect_sequence(m, DType::e5m2, opts(len, AmaxComputeAlgo::max, 3), s, "tiny");
      }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("7.1 seeded random sequences against mpt's DelayedScaling") {
    // 200 sequences of 1 to 40 steps: amaxes over 60 binades, with zeros,
    // spikes, inf and NaN among them; lengths 1 to 20, both algorithms,
    // margins 0 to 4, both formats.
    std::mt19937 rng(7101u);
    Mismatches m;
    for (int k = 0; k < 200; ++k) {
      const std::size_t len = 1 + rng() % 20, steps = 1 + rng() % 40;
      const AmaxComputeAlgo algo = rng() % 2 ? AmaxComputeAlgo::max : AmaxComputeAlgo::most_recent;
      const DType dtype = rng() % 2 ? DType::e4m3 : DType::e5m2;
      const int margin = static_cast<int>(rng() % 5);
      std::vector<float> s;
      for (std::size_t t = 0; t < steps; ++t) {
        const unsigned kind = rng() % 40;
        if (kind == 0) s.push_back(0.0f);
        else if (kind == 1) s.push_back(kInfF);
        else if (kind == 2) s.push_back(kNaNF);
        else if (kind < 6) s.push_back(std::ldexp(1.0f, static_cast<int>(rng() % 20)));  // a spike
        else
          s.push_back(std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f,
                                 static_cast<int>(rng() % 60) - 40));
      }
      expect_sequence(m, dtype, opts(len, algo, margin), s, "random " + std::to_string(k));
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("7.1 bad input throws std::invalid_argument and leaves the state as it was [1 point]") {
    Mismatches m;
    const auto expect_refused = [&](DType dtype, std::size_t history, const DelayedScalingOptions& o,
                                    const std::string& why) {
      m.checked();
      DelayedState s;
      s.amax_history.assign(history, 0.5f);
      s.scale = 2.0f;
      const DelayedState before = s;
      const std::string thrown = thrown_by([&] { delayed_update(s, 1.0f, dtype, o); });
      std::string problem;
      if (thrown != "invalid_argument")
        problem = thrown.empty() ? "nothing thrown" : thrown + ", expected std::invalid_argument";
      else if (!same_bits(s.amax_history, before.amax_history) || bits_of(s.scale) != bits_of(before.scale))
        problem = "the state changed: history " + describe(s.amax_history) + ", scale " + short_of(s.scale);
      if (!problem.empty() && m.wrong()) m.detail(why + ": " + problem);
    };
    expect_refused(DType::f16, 4, opts(4), "dtype f16");
    expect_refused(DType::f32, 4, opts(4), "dtype f32");
    expect_refused(DType::e4m3, 4, opts(4, AmaxComputeAlgo::max, -1), "margin -1");
    expect_refused(DType::e5m2, 4, opts(4, AmaxComputeAlgo::max, 25), "margin 25");
    expect_refused(DType::e4m3, 0, opts(0), "an empty history");
    expect_refused(DType::e4m3, 3, opts(4), "a history of 3 for amax_history_len 4");
    expect_refused(DType::e4m3, 5, opts(4), "a history of 5 for amax_history_len 4");
    CHECK_MESSAGE(m.none(), m.report());
  }
}  // TEST_SUITE
