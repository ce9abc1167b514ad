// Chapter 01 exercises — what every grader test file shares, instructors'
// hidden tests included: the exercise list, the reference answers (the mpt
// library is the oracle) and a collector of the first few wrong answers.
// Depends on: doctest, ex01.hpp, mpt (format, rounding, range_classify).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "ex01.hpp"
#include "mpt/format.hpp"
#include "mpt/range_classify.hpp"
#include "mpt/round_element.hpp"
#include "mpt/rounding.hpp"

namespace mpt::ex01::grading {

// ---- the exercises --------------------------------------------------------
// A test case belongs to an exercise through its doctest test suite,
// "exercise-" + id; each test case that passes is one point.

struct Exercise {
  const char* id;     ///< "1.2": what --exercise takes
  const char* title;  ///< one line for the score table
};

inline constexpr Exercise kExercises[] = {
    {"1.1", "fp32 -> fp16 bits, round to nearest even"},
    {"1.2", "smallest update that changes an fp16 weight"},
    {"1.3", "fraction of a tensor flushed to zero"},
};

// ---- bits and printing ----------------------------------------------------

inline std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

inline float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// "0x3c00"
inline std::string hex16(std::uint32_t code) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%04x", static_cast<unsigned>(code & 0xffffu));
  return buf;
}

/// "1.00048828 (0x3f801000 = 0x1.002p+0)": decimal for people, bits and a
/// hex float for checking by hand.
inline std::string describe(float x) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x = %a)", static_cast<double>(x),
                static_cast<unsigned>(bits_of(x)), static_cast<double>(x));
  return buf;
}

inline std::string describe(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
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

// ---- reporting ------------------------------------------------------------

/// Collects wrong answers over a sweep and reports how many there were and
/// the first few (a sweep over 65536 codes must not print 65536 lines).
class Mismatches {
 public:
  explicit Mismatches(std::size_t shown = 6) : shown_(shown) {}

  void checked() { ++checked_; }
  /// Counts a wrong answer; true when it is one of the first few, whose
  /// description should follow with detail(). Sweeps use this pair so that
  /// a wrong implementation does not pay for 65536 messages nobody reads.
  bool wrong() { return ++wrong_ <= shown_; }
  void detail(const std::string& what) { first_ += "\n    " + what; }
  void add(const std::string& what) {
    if (wrong()) detail(what);
  }
  bool none() const { return wrong_ == 0; }
  std::string report() const {
    return std::to_string(wrong_) + " of " + std::to_string(checked_) + " cases wrong; the first " +
           std::to_string(wrong_ < shown_ ? wrong_ : shown_) + ":" + first_;
  }

 private:
  std::size_t shown_;
  std::size_t checked_ = 0;
  std::size_t wrong_ = 0;
  std::string first_;
};

}  // namespace mpt::ex01::grading
