// Chapter 02 exercises — what every grader test file shares, instructors'
// hidden tests included: the exercise list, the reference answers (mpt's
// GradScaler arithmetic is the oracle) and the kit's helpers.
// Depends on: doctest, grader_kit.hpp, ex02.hpp, mpt (scaler_math, unscale).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "ex02.hpp"
#include "grader_kit.hpp"
#include "mpt/amp/scaler_math.hpp"
#include "mpt/amp/unscale.hpp"

namespace mpt::ex02::grading {

// ---- the exercises --------------------------------------------------------
// A test case belongs to an exercise through its doctest test suite,
// "exercise-" + id; each test case that passes is one point. The kit's
// grader main (grader_main.cpp) reads this list as exercise_kit::kChapter.

using exercise_kit::Exercise;

inline constexpr Exercise kExercises[] = {
    {"2.1", "the loss scale's update rule"},
    {"2.2", "fused unscale-and-check over a gradient buffer"},
    {"2.3", "gradient clipping under loss scaling: unscale first"},
};

using exercise_kit::bits_of;
using exercise_kit::describe;
using exercise_kit::float_of;
using exercise_kit::Mismatches;

/// Same bits, or both NaN (payloads are not part of the specification,
/// except where a test says so).
inline bool same_float(float a, float b) {
  return bits_of(a) == bits_of(b) || (std::isnan(a) && std::isnan(b));
}

// ---- the loss scale (exercise 2.1) ------------------------------------------

/// A GradScaler's constructor arguments that the update rule uses.
struct ScalerConfig {
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int32_t growth_interval = 2000;
};

/// What update() changes: the scale and the growth tracker.
struct ScaleState {
  float scale = 65536.0f;
  std::int32_t tracker = 0;
};

/// "scale 65536 (0x47800000 = 0x1p+16), tracker 3"
inline std::string describe(const ScaleState& s) {
  return "scale " + describe(s.scale) + ", tracker " + std::to_string(s.tracker);
}

/// "growth_factor 2, backoff_factor 0.5, growth_interval 2000"
inline std::string describe(const ScalerConfig& c) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "growth_factor %.17g, backoff_factor %.17g, growth_interval %d",
                c.growth_factor, c.backoff_factor, static_cast<int>(c.growth_interval));
  return buf;
}

/// Exercise 2.1's answer: the update rule the GradScaler and the CUDA
/// kernel run (src/mpt/scaler_math.hpp).
inline ScaleState reference_update(ScaleState s, bool found_inf, const ScalerConfig& c) {
  mpt::update_scale(s.scale, s.tracker, found_inf, c.growth_factor, c.backoff_factor, c.growth_interval);
  return s;
}

/// The student's update_scale on a copy of `s`.
inline ScaleState student_update(ScaleState s, bool found_inf, const ScalerConfig& c) {
  update_scale(s.scale, s.tracker, found_inf, c.growth_factor, c.backoff_factor, c.growth_interval);
  return s;
}

inline bool same_state(const ScaleState& a, const ScaleState& b) {
  return bits_of(a.scale) == bits_of(b.scale) && a.tracker == b.tracker;
}

// ---- unscale and check (exercise 2.2) -----------------------------------------

/// Exercise 2.2's answer: mpt's fused unscale-and-check (unscale.hpp), in
/// place on `g`; returns the flag.
inline bool reference_unscale(std::vector<float>& g, float inv_scale) {
  return mpt::unscale_and_check(g.data(), g.size(), inv_scale);
}

// ---- clipping (exercise 2.3) ----------------------------------------------------

/// Exercise 2.3's answer, in place on `tensors`: mpt's multi-tensor unscale
/// and check, then the norm summed in double in element order, then
/// PyTorch's clip coefficient.
inline ClipResult reference_unscale_and_clip(std::vector<std::vector<float>>& tensors, float inv_scale,
                                             double max_norm) {
  mpt::TensorList list;
  for (auto& t : tensors) list.emplace_back(t.empty() ? nullptr : t.data(), t.size());
  if (mpt::unscale_and_check(list, inv_scale)) return {true, std::numeric_limits<double>::infinity(), false};
  double sum = 0.0;
  for (const auto& t : tensors)
    for (float v : t) sum += static_cast<double>(v) * static_cast<double>(v);
  const double norm = std::sqrt(sum);
  const double coef = max_norm / (norm + 1e-6);
  if (!(coef < 1.0)) return {false, norm, false};
  for (auto& t : tensors)
    for (float& v : t) v *= static_cast<float>(coef);
  return {false, norm, true};
}

/// The student's unscale_and_clip on `tensors` (in place).
inline ClipResult student_unscale_and_clip(std::vector<std::vector<float>>& tensors, float inv_scale,
                                           double max_norm) {
  std::vector<GradTensor> list;
  for (auto& t : tensors) list.push_back({t.empty() ? nullptr : t.data(), t.size()});
  return unscale_and_clip(list, inv_scale, max_norm);
}

}  // namespace mpt::ex02::grading

namespace mpt::exercise_kit {
/// What the kit's grader main grades: Chapter 2 and its exercises.
inline constexpr Chapter kChapter{2, mpt::ex02::grading::kExercises,
                                  sizeof mpt::ex02::grading::kExercises / sizeof(Exercise)};
}  // namespace mpt::exercise_kit
