// All chapters — the exercise kit: what every chapter's grader shares: the
// exercise list's types, float bit helpers, printing, and the collector of
// the first few wrong answers. Depends on: the C++17 standard library only.
// Shipped in every handout as grader/grader_kit.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace mpt::exercise_kit {

// ---- the exercise list ------------------------------------------------------
// A test case belongs to an exercise through its doctest test suite,
// "exercise-" + id; each test case that passes scores its points: the
// exercise's points per test case, or the number a test case's name ends
// with, "... [1 point]" or "... [4 points]" (a detail worth less, say). A
// chapter's grader/grader.hpp defines the list as mpt::exercise_kit::kChapter:
//
//   inline constexpr Exercise kExercises[] = {{"2.1", "...", Kind::write, 2},
//                                             {"2.4", "...", Kind::diagnose, 3}};
//   inline constexpr Chapter kChapter{2, kExercises, std::size(kExercises)};

/// What the student does in an exercise.
enum class Kind {
  write,     ///< write the body of a function; the stub throws "exercise N.M not implemented"
  diagnose,  ///< a broken body is given (it compiles and runs); find the bug and fix it
};

/// One exercise: its id, a title for the score table, its kind and the
/// points each of its test cases is worth.
struct Exercise {
  const char* id;           ///< "1.2": what --exercise takes
  const char* title;        ///< one line for the score table
  Kind kind = Kind::write;  ///< a diagnose exercise's title is printed after "diagnose: "
  int points = 1;           ///< per test case passed, unless its name says "[N points]"
};

/// The chapter a grader grades, and its exercises in order.
struct Chapter {
  int number;                 ///< 1 for Chapter 1: names grader_ch01, "chapter 1 exercises"
  const Exercise* exercises;  ///< the chapter's exercise list
  std::size_t count;          ///< entries in `exercises`
};

// ---- bits and printing ------------------------------------------------------

/// The 32 bits of a float.
inline std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

/// The float with these 32 bits.
inline float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// "1.00048828 (0x3f801000 = 0x1.002p+0)": decimal for people, bits and a
/// hex float for checking by hand.
inline std::string describe(float x) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x = %a)", static_cast<double>(x),
                static_cast<unsigned>(bits_of(x)), static_cast<double>(x));
  return buf;
}

/// A double to 17 significant digits (reads back to the same double).
inline std::string describe(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

// ---- reporting --------------------------------------------------------------

/// Collects wrong answers over a sweep and reports how many there were and
/// the first few (a sweep over 65536 inputs must not print 65536 lines).
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

}  // namespace mpt::exercise_kit
