// Chapter 02 exercises — plausible wrong answers, one classic mistake per
// exercise. Depends on: ex02.hpp, mpt/nn/layers/losses.hpp (2.4). CI requires some
// points but not full marks on every exercise: proof that the tests
// separate close from right.
#include "ex02.hpp"

#include <cmath>
#include <limits>

#include "mpt/nn/layers/losses.hpp"

namespace mpt::ex02 {

// Mistake: grows without asking whether the grown scale is finite, so at
// the top of FP32's range the scale becomes inf (and then every gradient
// overflows). Everything else is right.
void update_scale(float& scale, std::int32_t& growth_tracker, bool found_inf, double growth_factor,
                  double backoff_factor, std::int32_t growth_interval) {
  if (found_inf) {
    scale = static_cast<float>(static_cast<double>(scale) * backoff_factor);
    growth_tracker = 0;
  } else if (++growth_tracker == growth_interval) {
    scale = static_cast<float>(static_cast<double>(scale) * growth_factor);
    growth_tracker = 0;
  }
}

// Mistake: multiplies first and checks the product, the obvious loop. It
// reports finite gradients whose product overflows, and x * 1 quiets a
// signalling NaN.
bool unscale_and_check(float* g, std::size_t n, float inv_scale) {
  bool found = false;
  for (std::size_t i = 0; i < n; ++i) {
    g[i] *= inv_scale;
    if (!std::isfinite(g[i])) found = true;
  }
  return found;
}

// Mistake: clips before unscaling, comparing the scaled norm with max_norm
// (pitfall 4 of the chapter). Right only when the scale is 1 or on overflow.
ClipResult unscale_and_clip(const std::vector<GradTensor>& grads, float inv_scale, double max_norm) {
  bool found = false;
  for (const GradTensor& t : grads)
    for (std::size_t i = 0; i < t.size; ++i) found = found || !std::isfinite(t.data[i]);
  if (found) {
    for (const GradTensor& t : grads)
      for (std::size_t i = 0; i < t.size; ++i)
        if (inv_scale != 1.0f) t.data[i] *= inv_scale;
    return {true, std::numeric_limits<double>::infinity(), false};
  }
  double sum = 0.0;
  for (const GradTensor& t : grads)
    for (std::size_t i = 0; i < t.size; ++i) sum += static_cast<double>(t.data[i]) * t.data[i];
  const double norm = std::sqrt(sum);
  const double coef = max_norm / (norm + 1e-6);
  for (const GradTensor& t : grads)
    for (std::size_t i = 0; i < t.size; ++i) {
      if (coef < 1.0) t.data[i] *= static_cast<float>(coef);
      if (inv_scale != 1.0f) t.data[i] *= inv_scale;
    }
  return {false, norm * inv_scale, coef < 1.0};
}

// Mistake: a fix that moves step() and update() out of the loop, as it
// should, and zero_grad() into it, "so each micro-batch starts clean". The
// scaler now ends one iteration per call, but only the last micro-batch's
// gradient is stepped on, and an overflow in an earlier one is zeroed away.
AccumulationResult accumulate_and_step(mpt::Mlp& net, mpt::Optimizer& opt, mpt::GradScaler& scaler,
                                       const std::vector<mpt::Dataset>& micro_batches) {
  const float k = static_cast<float>(micro_batches.size());
  AccumulationResult result;
  for (const mpt::Dataset& b : micro_batches) {
    opt.zero_grad();
    const mpt::Tensor& out = net.forward(b.x);
    const float loss = mpt::mse_loss(out, b.targets) / k;
    result.loss += loss;
    (void)scaler.scale(loss);
    net.backward(mpt::mse_backward(out, b.targets, scaler.get_scale() / k));
  }
  result.stepped = scaler.step(opt);
  scaler.update();
  net.refresh_model_copies();
  return result;
}

}  // namespace mpt::ex02
