// Chapter 01 exercises — YOUR FILE: write the three functions of ex01.hpp here.
// Depends on: ex01.hpp (the specification) and the mpt library.
// Each function throws until you replace its body; the grader reports the
// exercise as "not implemented" until then. See README.md for how to grade.
#include "ex01.hpp"

#include <cstring>  // std::memcpy, to read the bits of a float
#include <stdexcept>

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

}  // namespace mpt::ex01
