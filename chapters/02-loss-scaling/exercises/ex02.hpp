// Chapter 02 exercises — the adapter header: the student's specification.
// Depends on: the C++17 standard library only (the grader compares with
// mpt's GradScaler arithmetic, src/mpt/scaler_math.hpp and unscale.hpp).
// The grader includes this file and calls exactly these functions; the
// student writes them in ex02.cpp. Changing a signature breaks the grader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

/// Chapter 2 exercises: the dynamic loss scale's update rule, the fused
/// unscale-and-check over a gradient buffer, and gradient clipping done
/// right under loss scaling (unscale first).
namespace mpt::ex02 {

/// Exercise 2.1 — the scale update rule of torch.amp.GradScaler.update().
///
/// One call is the end of one training iteration. `scale` is the current
/// loss scale (an FP32 number), `growth_tracker` the number of clean
/// (overflow-free) iterations counted since the scale last changed, and
/// `found_inf` whether this iteration's gradients held an inf or NaN.
/// Update both in place:
///
///  - found_inf: scale = scale * backoff_factor, growth_tracker = 0;
///  - otherwise the clean iteration counts: growth_tracker + 1. When that
///    count equals growth_interval, the scale grows, scale = scale *
///    growth_factor, but only if the grown value is finite as a float (at
///    the top of FP32's range the scale stays where it is), and
///    growth_tracker = 0 whether it grew or not. Below the interval,
///    growth_tracker = the count and the scale is unchanged.
///
/// Each product is formed in double (the scale widened, times the double
/// factor) and rounded once to float, as PyTorch's kernels compute it: with
/// a factor such as 0.3, which no float equals, float(scale * 0.3f) can
/// differ from float(double(scale) * 0.3) in the last bit.
///
/// There is no floor: enough overflows in a row take the scale down through
/// the FP32 subnormals to exactly 0, and the rule does not stop it (a scale
/// of 0 then stays 0: 0 * growth_factor is 0). Preconditions (the grader
/// keeps to them): growth_factor > 1 and finite, 0 < backoff_factor < 1,
/// growth_interval >= 1, 0 <= growth_tracker < growth_interval, scale >= 0
/// and finite.
///
/// Do not call mpt::update_scale or mpt::GradScaler: the grader uses them
/// as its reference.
void update_scale(float& scale, std::int32_t& growth_tracker, bool found_inf, double growth_factor,
                  double backoff_factor, std::int32_t growth_interval);

/// Exercise 2.2 — fused unscale-and-check over one gradient buffer.
///
/// Multiplies g[0], ..., g[n-1] in place by `inv_scale` (the caller's
/// float(1 / scale)) and returns true if any of them was non-finite (±inf
/// or NaN). Exactly as PyTorch's _amp_foreach_non_finite_check_and_unscale_:
///
///  - finiteness is judged on each value *before* its multiply, i.e. on the
///    scaled gradient that backward produced. A finite value whose product
///    overflows (possible when inv_scale > 1, a scale below 1) is not
///    reported; judging after the multiply would report it;
///  - every element is multiplied, also the ones after the first inf or NaN
///    (the gradients must be unscaled whatever happens next);
///  - one pass: read each element once, write it once;
///  - when inv_scale == 1 nothing is multiplied and every bit stays as it was
///    (PyTorch skips the multiply: x * 1 would turn a signalling NaN into a
///    quiet one);
///  - n == 0 returns false (then g may be nullptr).
///
/// inv_scale is any float >= 0, inf included (the reciprocal of a scale
/// that backed off to 0). Do not call mpt::unscale_and_check, mpt::unscale
/// or mpt::any_nonfinite: the grader uses them as its reference.
bool unscale_and_check(float* g, std::size_t n, float inv_scale);

/// One gradient tensor: `size` floats at `data` (size 0: data may be nullptr).
struct GradTensor {
  float* data;
  std::size_t size;
};

/// What exercise 2.3 reports.
struct ClipResult {
  bool found_inf;     ///< some scaled gradient was inf or NaN (as 2.2 reports it)
  double total_norm;  ///< L2 norm of all unscaled gradients, before clipping; +inf when found_inf
  bool clipped;       ///< the gradients were multiplied by a clip coefficient < 1
};

/// Exercise 2.3 — gradient clipping under loss scaling: unscale first.
///
/// `grads` are one iteration's gradients, still multiplied by the loss scale
/// (backward ran from the scaled loss). Clip them to a total norm of
/// `max_norm` the way a GradScaler loop must: scaler.unscale(optimizer),
/// then torch.nn.utils.clip_grad_norm_(params, max_norm), then
/// scaler.step(optimizer). In order:
///
///  1. Unscale every tensor with exercise 2.2's rule (multiply by
///     inv_scale, check before the multiply), every tensor even after one
///     held an inf.
///  2. If any value was non-finite, stop there: return {true, +infinity,
///     false}. The step will be skipped; the gradients stay unscaled and
///     unclipped.
///  3. total_norm = sqrt(sum of g * g over every element of every tensor),
///     each g the unscaled float widened to double, the sum in double.
///  4. coef = max_norm / (total_norm + 1e-6), in double (PyTorch's formula:
///     the 1e-6 keeps a zero norm from dividing by zero). If coef < 1,
///     multiply every element of every tensor by float(coef) and report
///     clipped; otherwise leave the unscaled gradients as they are.
///
/// Clipping before unscaling compares the *scaled* norm, scale times too
/// large, with max_norm: the threshold is effectively max_norm / scale.
/// Preconditions: max_norm > 0 and finite; inv_scale > 0 and finite. You
/// may call your 2.2.
ClipResult unscale_and_clip(const std::vector<GradTensor>& grads, float inv_scale, double max_norm);

}  // namespace mpt::ex02
