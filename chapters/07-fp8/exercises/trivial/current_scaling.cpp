// Chapter 07 — exercises: trivial stub "current scaling everywhere": each step's own amax, no history.
// Depends on: ex07.hpp, the C++ standard library. A grader that gave it full
// marks for any exercise would be broken; CI requires a score below full
// marks on every exercise.
#include "ex07.hpp"

#include <cmath>
#include <cstdint>

namespace mpt::ex07 {

namespace {
float fp8_max(mpt::DType d) { return d == mpt::DType::e5m2 ? 57344.0f : 448.0f; }
}  // namespace

// The scale from this step's amax alone; the history never touched.
float delayed_update(DelayedState& state, float step_amax, mpt::DType dtype,
                     const mpt::fp8::DelayedScalingOptions&) {
  const float a = std::fabs(step_amax);
  if (std::isfinite(a) && a > 0.0f) state.scale = fp8_max(dtype) / a;
  return a;
}

// The amax's own power of two, as if a block's values needed no room below the max.
std::uint8_t e8m0_scale(float amax, mpt::DType, mpt::fp8::MxScaleRule) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 127;
  const int e = std::ilogb(amax);
  return static_cast<std::uint8_t>(e < -127 ? 0 : e > 127 ? 254 : e + 127);
}

// Blame the recipe's lack of scaling whenever anything was lost.
Cause diagnose(const RunRecord& run) {
  for (const StepRecord& s : run.steps)
    if (s.saturated + s.flushed > 0) return Cause::no_scaling;
  return Cause::healthy;
}

}  // namespace mpt::ex07
