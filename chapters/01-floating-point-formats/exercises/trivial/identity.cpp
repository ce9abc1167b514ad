// Chapter 01 exercises — trivial stub "return the input": a grader that
// gave it full marks for any exercise would be broken. Depends on: ex01.hpp.
// CI builds the grader against it and requires a score below full marks on
// every exercise.
#include "ex01.hpp"

#include <cstring>

namespace mpt::ex01 {

// The input's own bits, cut to 16: the upper half of an fp32 pattern
// (which is bf16 truncation, not fp16 rounding).
std::uint16_t fp32_to_fp16_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return static_cast<std::uint16_t>(u >> 16);
}

float smallest_effective_update(float w) { return w; }

double flushed_fraction(const float* x, std::size_t n, const mpt::Format&) {
  return n > 0 ? static_cast<double>(x[0]) : 0.0;
}

float mean_square(const float* x, std::size_t n) { return n > 0 ? x[0] : 0.0f; }

}  // namespace mpt::ex01
