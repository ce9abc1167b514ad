// Chapter 02 exercises — YOUR FILE: write the functions of exercises 2.1 to 2.3
// here, and find and fix the bug in the one of exercise 2.4.
// Depends on: ex02.hpp (the specification), the C++ standard library, and
// for 2.4's given body mpt's training stack (mpt/nn/layers/losses.hpp: mse_loss,
// mse_backward; the GradScaler, Mlp and Optimizer of ex02.hpp).
// Each function of 2.1 to 2.3 throws until you replace its body; the grader
// reports the exercise as "not implemented" until then. 2.4's body runs, and
// scores nothing until it is fixed. See README.md for how to grade.
#include "ex02.hpp"

#include <cmath>  // std::isfinite, std::sqrt
#include <stdexcept>

#include "mpt/nn/layers/losses.hpp"  // mpt::mse_loss, mpt::mse_backward (used by 2.4's given body)

namespace mpt::ex02 {

void update_scale(float& scale, std::int32_t& growth_tracker, bool found_inf, double growth_factor,
                  double backoff_factor, std::int32_t growth_interval) {
  (void)scale;
  (void)growth_tracker;
  (void)found_inf;
  (void)growth_factor;
  (void)backoff_factor;
  (void)growth_interval;
  throw std::logic_error("exercise 2.1 not implemented");
}

bool unscale_and_check(float* g, std::size_t n, float inv_scale) {
  (void)g;
  (void)n;
  (void)inv_scale;
  throw std::logic_error("exercise 2.2 not implemented");
}

ClipResult unscale_and_clip(const std::vector<GradTensor>& grads, float inv_scale, double max_norm) {
  (void)grads;
  (void)inv_scale;
  (void)max_norm;
  throw std::logic_error("exercise 2.3 not implemented");
}

// Exercise 2.4 — DIAGNOSE: this body is given. It compiles, runs and
// trains, and it has one mixed-precision bug; find it and fix it (ex02.hpp
// says what one call must do).
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
    // Unscale, step unless a gradient overflowed, and move the scale.
    result.stepped = scaler.step(opt);
    scaler.update();
  }
  net.refresh_model_copies();  // the fp16 copies the next forward reads
  return result;
}

}  // namespace mpt::ex02
