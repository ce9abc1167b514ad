// Chapter 02 — loss scaling and FP32 master weights (test inputs): the
// scale-update sequences that tests/cuda/test_ch02_scaler.cu replays on the
// device, and tests/cpu/test_ch02_scaler_math.cpp checks on the CPU: that
// the GradScaler follows them, and that rounding the factors to float
// changes them (so the GPU comparison would catch a float API).
// tests/cpu/test_ch02_grad_scaler.cpp drives a GradScaler through the same
// cases and holds it to PyTorch's rule written out independently.
// Depends on: mpt/amp/scaler_math.hpp (mpt::update_scale, the reference) and
// the standard library only; host-and-device safe, no Eigen.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "mpt/amp/scaler_math.hpp"

namespace mpt::test {

/// One configuration of the dynamic scale: start and factors.
struct ScaleUpdateCase {
  const char* name;
  float init;             ///< the first scale
  double growth;          ///< growth factor (a double, as GradScaler::Options has it)
  double backoff;         ///< backoff factor
  std::int32_t interval;  ///< growth interval
};

/// The cases. The last three have factors that are not FP32 values (0.3,
/// 1.7): with them a factor rounded to float gives a different scale from
/// the third backoff (or, for growth alone, the fifth growth) on.
inline std::vector<ScaleUpdateCase> scale_update_cases() {
  return {
      {"PyTorch's defaults", 65536.0f, 2.0, 0.5, 2000},
      {"short interval: many growths", 65536.0f, 2.0, 0.5, 3},
      {"growth stops where FP32 would overflow", 0x1p+126f, 2.0, 0.5, 1},
      {"backoff into subnormals and to 0 (no floor)", 0x1p-140f, 2.0, 0.5, 5},
      {"backoff 0.3 (not an FP32 value), growth 3", 1000.0f, 3.0, 0.3, 2},
      {"backoff 0.3 and growth 1.7 (neither an FP32 value)", 1000.0f, 1.7, 0.3, 2},
      {"growth 1.7 (not an FP32 value), backoff 0.5", 1.0f, 1.7, 0.5, 1},
  };
}

/// Steps in every sequence; the first kFixedSteps do not depend on the seed.
inline constexpr int kScaleUpdateSteps = 400;
/// Steps at the start of every sequence that are the same for any seed.
inline constexpr int kFixedSteps = 160;

/// found_inf for each of kScaleUpdateSteps steps: 20 overflows, 100 clean
/// steps, 40 alternating (overflow on even steps), then 3 in 10 at random
/// from `seed`. A case starting below 1 overflows for its first 200 steps,
/// to drive the scale to 0.
inline std::vector<bool> scale_update_flags(const ScaleUpdateCase& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<bool> flags;
  for (int s = 0; s < kScaleUpdateSteps; ++s) {
    const bool f = s < 20 ? true : s < 120 ? false : s < kFixedSteps ? (s % 2 == 0) : (rng() % 10) < 3;
    flags.push_back(f || (c.init < 1.0f && s < 200));
  }
  return flags;
}

/// The scale and growth tracker after one step.
struct ScaleUpdateStep {
  float scale;
  std::int32_t tracker;
};

/// The sequence mpt::update_scale gives for `flags`, starting from c.init
/// with tracker 0, with the factors given (c.growth and c.backoff for the
/// reference; the tests also pass them rounded to float).
inline std::vector<ScaleUpdateStep> scale_update_sequence(const ScaleUpdateCase& c,
                                                          const std::vector<bool>& flags, double growth,
                                                          double backoff) {
  float scale = c.init;
  std::int32_t tracker = 0;
  std::vector<ScaleUpdateStep> out;
  for (bool found_inf : flags) {
    mpt::update_scale(scale, tracker, found_inf, growth, backoff, c.interval);
    out.push_back({scale, tracker});
  }
  return out;
}

}  // namespace mpt::test
