// Chapter 02 exercises — REFERENCE SOLUTION (MPT-REFERENCE-SOLUTION): never shipped to students.
// Depends on: ex02.hpp, and for 2.4 mpt/nn/layers/losses.hpp; 2.1 to 2.3 are
// written from the specification, not from mpt's scaler code, so that
// grading them against mpt is a real check.
// tools/make_handout.sh refuses to produce a handout that contains these lines.
#include "ex02.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "mpt/nn/layers/losses.hpp"

namespace mpt::ex02 {

namespace {

// Finite means: the exponent field is not all ones. Read from the bits so
// that no compiler flag (-ffinite-math-only) can assume the answer.
bool finite_by_bits(float value) {
  std::uint32_t pattern;
  std::memcpy(&pattern, &value, sizeof pattern);
  return (pattern & 0x7f800000u) != 0x7f800000u;
}

// scale * factor, the product taken in double and rounded to float once.
float times_in_double(float scale, double factor) {
  return static_cast<float>(static_cast<double>(scale) * factor);
}

}  // namespace

void update_scale(float& scale, std::int32_t& growth_tracker, bool found_inf, double growth_factor,
                  double backoff_factor, std::int32_t growth_interval) {
  if (found_inf) {
    // Back off at once, and start counting clean iterations afresh.
    scale = times_in_double(scale, backoff_factor);
    growth_tracker = 0;
    return;
  }
  const std::int32_t clean_iterations = growth_tracker + 1;
  if (clean_iterations < growth_interval) {
    growth_tracker = clean_iterations;
    return;
  }
  // The interval is complete: try to grow; the count restarts either way.
  const float candidate = times_in_double(scale, growth_factor);
  if (finite_by_bits(candidate)) scale = candidate;
  growth_tracker = 0;
}

bool unscale_and_check(float* g, std::size_t n, float inv_scale) {
  bool saw_nonfinite = false;
  if (inv_scale == 1.0f) {
    // Nothing to multiply; still look at every element.
    for (std::size_t i = 0; i < n; ++i) saw_nonfinite |= !finite_by_bits(g[i]);
    return saw_nonfinite;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const float scaled = g[i];
    saw_nonfinite |= !finite_by_bits(scaled);  // judged before the multiply
    g[i] = scaled * inv_scale;                 // and multiplied regardless
  }
  return saw_nonfinite;
}

ClipResult unscale_and_clip(const std::vector<GradTensor>& grads, float inv_scale, double max_norm) {
  bool any_overflow = false;
  for (const GradTensor& t : grads) any_overflow |= unscale_and_check(t.data, t.size, inv_scale);
  if (any_overflow) return {true, std::numeric_limits<double>::infinity(), false};

  double sum_of_squares = 0.0;
  for (const GradTensor& t : grads)
    for (std::size_t i = 0; i < t.size; ++i) {
      const double unscaled = static_cast<double>(t.data[i]);
      sum_of_squares += unscaled * unscaled;
    }
  const double norm = std::sqrt(sum_of_squares);
  const double coefficient = max_norm / (norm + 1e-6);
  if (!(coefficient < 1.0)) return {false, norm, false};

  const float shrink = static_cast<float>(coefficient);
  for (const GradTensor& t : grads)
    for (std::size_t i = 0; i < t.size; ++i) t.data[i] *= shrink;
  return {false, norm, true};
}

// The fix of 2.4: the given body called scaler.step() and scaler.update()
// inside the micro-batch loop. Every micro-batch then stepped on a partial
// gradient, K steps per iteration; step() unscaled .grad in place, so the
// next micro-batch added S * its gradient onto gradients already divided by
// S; an overflow in one micro-batch skipped only that micro-batch's step
// (the others still moved the weights); and update() ran K times, so the
// scale grew K times too fast and backed off more than once per iteration.
// The loop must only accumulate; the step and the update close the
// iteration, once each.
AccumulationResult accumulate_and_step(mpt::Mlp& net, mpt::Optimizer& opt, mpt::GradScaler& scaler,
                                       const std::vector<mpt::Dataset>& micro_batches) {
  const float k = static_cast<float>(micro_batches.size());
  AccumulationResult result;
  opt.zero_grad();
  for (const mpt::Dataset& b : micro_batches) {
    const mpt::Tensor& out = net.forward(b.x);
    const float loss = mpt::mse_loss(out, b.targets) / k;  // this micro-batch's share of the mean
    result.loss += loss;
    (void)scaler.scale(loss);
    // Backward from S * loss: .grad += S * (this micro-batch's gradient) / K.
    net.backward(mpt::mse_backward(out, b.targets, scaler.get_scale() / k));
  }
  // All K gradients are in, scaled by one S: one step (unscaled once,
  // skipped if any micro-batch overflowed), one update of the scale.
  result.stepped = scaler.step(opt);
  scaler.update();
  net.refresh_model_copies();  // the fp16 copies the next forward reads
  return result;
}

}  // namespace mpt::ex02
