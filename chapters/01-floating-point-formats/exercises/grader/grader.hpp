// Chapter 01 exercises — what every grader test file shares, instructors'
// hidden tests included: the exercise list, the reference answers (the mpt
// library is the oracle); the kit's helpers (grader_kit.hpp: bits, printing,
// the collector of the first few wrong answers) are brought in by name.
// Depends on: doctest, grader_kit.hpp, ex01.hpp, mpt (format, rounding, range_classify).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ex01.hpp"
#include "grader_kit.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/formats/range_classify.hpp"
#include "mpt/formats/round_element.hpp"
#include "mpt/formats/rounding.hpp"

namespace mpt::ex01::grading {

// ---- the exercises --------------------------------------------------------
// A test case belongs to an exercise through its doctest test suite,
// "exercise-" + id; each test case that passes scores its exercise's points
// per test case (the last number below): 2 for a behaviour to write, 3 for
// one of the diagnose exercise, whose bug is the chapter's lesson. The kit's
// grader main (grader_main.cpp) reads this list as exercise_kit::kChapter.

using exercise_kit::Exercise;
using exercise_kit::Kind;

inline constexpr Exercise kExercises[] = {
    {"1.1", "fp32 -> fp16 bits, round to nearest even", Kind::write, 2},
    {"1.2", "smallest update that changes an fp16 weight", Kind::write, 2},
    {"1.3", "fraction of a tensor flushed to zero", Kind::write, 2},
    {"1.4", "the mean square of fp16 activations", Kind::diagnose, 3},
};

// ---- bits and printing ----------------------------------------------------
// bits_of, float_of and describe come from the kit; hex16 is this chapter's.

using exercise_kit::bits_of;
using exercise_kit::describe;
using exercise_kit::float_of;
using exercise_kit::Mismatches;

/// "0x3c00"
inline std::string hex16(std::uint32_t code) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%04x", static_cast<unsigned>(code & 0xffffu));
  return buf;
}

// ---- fp16 through the library (the oracle) --------------------------------

inline const mpt::Format& fp16_format() { return mpt::format_named("fp16"); }

/// The value of an fp16 code; NaN codes give a NaN.
inline float fp16_value(std::uint32_t code) { return mpt::decode(code & 0xffffu, mpt::formats::fp16); }

inline bool fp16_code_is_nan(std::uint32_t code) {
  return (code & 0x7c00u) == 0x7c00u && (code & 0x03ffu) != 0;
}

/// What exercise 1.2 accepts for NaN: all-ones exponent, top fraction bit set.
inline bool fp16_code_is_quiet_nan(std::uint32_t code) { return (code & 0x7e00u) == 0x7e00u; }

/// Exercise 1.1's answer for a non-NaN input, from mpt's rounding and encoder.
inline std::uint16_t reference_fp16_bits(float x) {
  const float y = mpt::round_to_format(x, mpt::formats::fp16, mpt::RoundingMode::nearest_even,
                                       mpt::OverflowMode::infinity, mpt::SubnormalMode::keep);
  return static_cast<std::uint16_t>(mpt::encode_exact(y, mpt::formats::fp16));
}

/// fp16 rounding (RNE) of the exact sum w + u, for exercise 1.2.
///
/// The sum is formed in double, then narrowed to float with round-to-odd
/// (truncate; if anything was dropped, set the last bit), then rounded to
/// fp16 by mpt. Round-to-odd to a format with at least p + 2 bits (24 >=
/// 11 + 2) makes the second rounding give the same result as rounding the
/// exact sum once. The double sum itself is exact whenever u is within a
/// few binades of the fp16 spacing at w, which covers every u for which
/// the answer could be in doubt; for a u far below the spacing it rounds to
/// w and for one far above it cannot land back on w, just like the real sum.
inline float fp16_of_exact_sum(float w, float u) {
  const double s = static_cast<double>(w) + static_cast<double>(u);
  float f = static_cast<float>(s);
  if (std::isfinite(f) && static_cast<double>(f) != s) {
    if (std::fabs(static_cast<double>(f)) > std::fabs(s)) f = std::nextafter(f, 0.0f);
    f = float_of(bits_of(f) | 1u);
  }
  return mpt::round_value(f, fp16_format());
}

/// Does adding u to the fp16 weight w change it (compared by value)?
inline bool update_changes(float w, float u) { return fp16_of_exact_sum(w, u) != w; }

/// Exercise 1.2's answer by search, not by formula: the predicate is
/// monotone in u > 0, so bisect over the positive float bit patterns.
inline float reference_smallest_update(float w) {
  std::uint32_t lo = 0;            // u = 0 never changes w
  std::uint32_t hi = 0x7f800000u;  // u = inf always does; never evaluated
  while (hi - lo > 1) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    if (update_changes(w, float_of(mid))) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return float_of(hi);
}

/// Exercise 1.3's count, from mpt's own classification of each value.
inline std::size_t reference_flushed_count(const float* x, std::size_t n, const mpt::Format& f) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (mpt::classify(x[i], f.spec) == mpt::RangeClass::flushed_to_zero) ++count;
  return count;
}

/// Exercise 1.4's answer: FP32 arithmetic on the fp16 inputs, in index order.
inline float reference_mean_square(const std::vector<float>& x) {
  float acc = 0.0f;
  for (float v : x) acc = acc + v * v;
  return x.empty() ? 0.0f : acc / static_cast<float>(x.size());
}

/// An fp16 value near `x` (round to nearest even), as an fp16 tensor holds it.
inline float to_fp16(float x) { return mpt::round_value(x, fp16_format()); }

}  // namespace mpt::ex01::grading

namespace mpt::exercise_kit {
/// What the kit's grader main grades: Chapter 1 and its exercises.
inline constexpr Chapter kChapter{1, mpt::ex01::grading::kExercises,
                                  sizeof mpt::ex01::grading::kExercises / sizeof(Exercise)};
}  // namespace mpt::exercise_kit
