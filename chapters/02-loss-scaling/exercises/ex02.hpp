// Chapter 02 exercises — the adapter header: the student's specification.
// Depends on: the C++17 standard library for 2.1 to 2.3 (the grader compares
// with mpt's GradScaler arithmetic, src/mpt/amp/scaler_math.hpp and
// unscale.hpp); mpt's training stack for 2.4 (mpt/amp/grad_scaler.hpp,
// mpt/nn/data/data.hpp, mpt/nn/models/mlp.hpp, mpt/optim/optimizer.hpp).
// The grader includes this file and calls exactly these functions; the
// student writes them in ex02.cpp. Changing a signature breaks the grader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mpt/amp/grad_scaler.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/optimizer.hpp"

/// Chapter 2 exercises: the dynamic loss scale's update rule, the fused
/// unscale-and-check over a gradient buffer, gradient clipping done right
/// under loss scaling (unscale first), and a broken gradient-accumulation
/// step to diagnose and fix.
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

/// What exercise 2.4 reports.
struct AccumulationResult {
  float loss = 0.0f;     ///< the mean of the micro-batches' (unscaled) MSE losses
  bool stepped = false;  ///< the optimizer stepped (false: the GradScaler skipped the step)
};

/// Exercise 2.4 — DIAGNOSE: one training iteration with gradient
/// accumulation under dynamic loss scaling.
///
/// Not written from scratch: ex02.cpp comes with a body for this function
/// that compiles, runs, trains after a fashion and has one real
/// mixed-precision bug. Find it and fix it, changing as little as you can
/// (README.md lists the symptoms the grader reports).
///
/// `micro_batches` (at least two, of equal size) together are one
/// effective batch of an MSE regression; `net` may be fp16, bf16 or FP32,
/// `opt` updates its parameters, `scaler` is the run's GradScaler. One call
/// is one iteration, with the result of one iteration on the effective
/// batch:
///
///  - every micro-batch is run forward and backward from S * loss / K (S the
///    scale, K the number of micro-batches), so that the FP32 gradients hold
///    S times the gradient of the effective batch's mean loss once the last
///    micro-batch is in;
///  - then one optimizer step on that gradient, through the scaler (it
///    unscales, and skips the step if any gradient is inf or NaN), one
///    scaler.update() (the scale moves at most once per iteration), and the
///    model copies refreshed from the master weights;
///  - returns the mean of the micro-batches' losses and whether the step ran.
///
/// The given body's arithmetic (the losses, the dloss S / K) is right;
/// compare its calls and their order with this list. Use the GradScaler as
/// the body does (scale, step, update); do not write your own.
AccumulationResult accumulate_and_step(mpt::Mlp& net, mpt::Optimizer& opt, mpt::GradScaler& scaler,
                                       const std::vector<mpt::Dataset>& micro_batches);

}  // namespace mpt::ex02
