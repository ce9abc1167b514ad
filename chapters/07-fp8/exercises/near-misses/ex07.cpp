// Chapter 07 — exercises: plausible wrong answers, the naive method of each part.
// Depends on: ex07.hpp, the C++ standard library. CI requires some points
// but at most a third of each exercise (NAIVE_AT_MOST_THIRD): proof that the
// tests separate the textbook version from the one the library runs.
#include "ex07.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mpt::ex07 {

// Mistake: the textbook update. Right for a tensor with an ordinary amax
// every step; but the step's amax overwrites the slot (a NaN goes in), the
// history rolls on a step without the tensor too (amax 0 ages it), and the
// quotient is taken whatever the amax: 0 gives a scale of inf, inf a scale
// of 0, a tiny amax inf. No check of the input either.
float delayed_update(DelayedState& state, float step_amax, mpt::DType dtype,
                     const mpt::fp8::DelayedScalingOptions& options) {
  std::vector<float>& h = state.amax_history;
  if (h.empty()) return 0.0f;
  h[0] = std::fabs(step_amax);
  const float last = h[0];
  float amax = 0.0f;
  for (const float a : h) amax = std::max(amax, a);
  for (std::size_t i = 1; i + 1 < h.size(); ++i) h[i] = h[i + 1];
  h.back() = last;
  h[0] = 0.0f;
  if (options.algo == mpt::fp8::AmaxComputeAlgo::most_recent) amax = last;
  const float fp8_max = dtype == mpt::DType::e5m2 ? 57344.0f : 448.0f;
  state.scale = std::ldexp(fp8_max, -options.margin) / amax;
  return amax;
}

// Mistake: log2 in double. floor(log2 amax) − emax and ceil(log2(amax /
// max_norm)) are the formulas, and right for ordinary amaxes; but RCEIL's
// kernels round 1/max_norm and the product to float first (the two differ
// where the product is subnormal), a NaN amax is not 0xFF, FLOOR's inf is
// not 2^127, and any dtype is taken for E4M3.
std::uint8_t e8m0_scale(float amax, mpt::DType element, mpt::fp8::MxScaleRule rule) {
  const bool e5m2 = element == mpt::DType::e5m2;
  const double max_norm = e5m2 ? 57344.0 : 448.0;
  const double emax = e5m2 ? 15.0 : 8.0;
  const double a = std::fabs(static_cast<double>(amax));
  if (!(a > 0)) return 0;
  double e = rule == mpt::fp8::MxScaleRule::floor ? std::floor(std::log2(a)) - emax
                                                  : std::ceil(std::log2(a / max_norm));
  e = std::min(127.0, std::max(-127.0, e));
  return static_cast<std::uint8_t>(e + 127.0);
}

// Mistake: one count, one threshold. "Values flushed to zero mean one
// value set the scale": right between a healthy run and a per-tensor
// outlier, and blind to everything else (a scale that never moves, the
// format of a gradient, the steps a spike or a peak saturates, a scale that
// lags behind a shrinking tensor).
Cause diagnose(const RunRecord& run) {
  double flushed = 0, values = 0;
  for (std::size_t t = 1; t < run.steps.size(); ++t) {
    flushed += static_cast<double>(run.steps[t].flushed);
    values += static_cast<double>(run.steps[t].values);
  }
  return values > 0 && flushed / values > 0.005 ? Cause::per_tensor_outlier : Cause::healthy;
}

}  // namespace mpt::ex07
