// Chapter 01 exercises — YOUR FILE: write the functions of exercises 1.1 to 1.3
// here, and find and fix the bug in the one of exercise 1.4.
// Depends on: ex01.hpp (the specification) and the mpt library
// (mpt/formats/rounding.hpp: the rounding 1.4's given body uses).
// Each function of 1.1 to 1.3 throws until you replace its body; the grader
// reports the exercise as "not implemented" until then. 1.4's body runs, and
// scores nothing until it is fixed. See README.md for how to grade.
#include "ex01.hpp"

#include <cstring>  // std::memcpy, to read the bits of a float
#include <stdexcept>

#include "mpt/formats/rounding.hpp"  // mpt::round_value (used by 1.4's given body)

namespace mpt::ex01 {

std::uint16_t fp32_to_fp16_bits(float x) {
  (void)x;
  throw std::logic_error("exercise 1.1 not implemented");
}

float smallest_effective_update(float w) {
  (void)w;
  throw std::logic_error("exercise 1.2 not implemented");
}

double flushed_fraction(const float* x, std::size_t n, const mpt::Format& f) {
  (void)x;
  (void)n;
  (void)f;
  throw std::logic_error("exercise 1.3 not implemented");
}

// Exercise 1.4 — DIAGNOSE: this body is given. It compiles and runs, and it
// has one mixed-precision bug; find it and fix it (ex01.hpp says what the
// function must return).
float mean_square(const float* x, std::size_t n) {
  // The activations are fp16 values, so the statistic is computed the way
  // an fp16 tensor holds numbers: every intermediate stored as fp16.
  const mpt::Format& fp16 = mpt::format_named("fp16");
  float sum = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float square = mpt::round_value(x[i] * x[i], fp16);
    sum = mpt::round_value(sum + square, fp16);
  }
  return n > 0 ? sum / static_cast<float>(n) : 0.0f;
}

}  // namespace mpt::ex01
