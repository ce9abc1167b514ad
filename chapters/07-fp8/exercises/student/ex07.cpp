// Chapter 07 — exercises: YOUR FILE: write 7.1, 7.2 and 7.3 here.
// Depends on: ex07.hpp (the specification) and the C++ standard library.
// Each function throws until you replace its body; the grader reports the
// exercise as "not implemented" until then. See README.md for how to grade.
#include "ex07.hpp"

#include <cmath>  // std::isnan, std::isfinite, std::fabs, std::ldexp
#include <cstddef>
#include <cstdint>
#include <cstring>  // std::memcpy, for a float's bits
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace mpt::ex07 {

float delayed_update(DelayedState& state, float step_amax, mpt::DType dtype,
                     const mpt::fp8::DelayedScalingOptions& options) {
  (void)state;
  (void)step_amax;
  (void)dtype;
  (void)options;
  throw std::logic_error("exercise 7.1 not implemented");
}

std::uint8_t e8m0_scale(float amax, mpt::DType element, mpt::fp8::MxScaleRule rule) {
  (void)amax;
  (void)element;
  (void)rule;
  throw std::logic_error("exercise 7.2 not implemented");
}

Cause diagnose(const RunRecord& run) {
  (void)run;
  throw std::logic_error("exercise 7.3 not implemented");
}

}  // namespace mpt::ex07
