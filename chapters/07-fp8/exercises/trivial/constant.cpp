// Chapter 07 — exercises: trivial stub "return a constant", each constant a plausible one.
// Depends on: ex07.hpp. A grader that gave it full marks for any exercise
// would be broken; CI requires a score below full marks on every exercise.
#include "ex07.hpp"

#include <cstdint>

namespace mpt::ex07 {

// "The scale is 1 and nothing needs remembering": the state untouched.
float delayed_update(DelayedState&, float step_amax, mpt::DType, const mpt::fp8::DelayedScalingOptions&) {
  return step_amax;
}

// Every block scaled by 2^0.
std::uint8_t e8m0_scale(float, mpt::DType, mpt::fp8::MxScaleRule) { return 127; }

// "FP8 is fine": every run healthy.
Cause diagnose(const RunRecord&) { return Cause::healthy; }

}  // namespace mpt::ex07
