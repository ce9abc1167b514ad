// Chapter 02 — loss scaling and FP32 master weights: the MLP.
// Depends on: mlp.hpp, linear.hpp, activations.hpp, losses.hpp (trace_step);
// the core tier (random.hpp).
#include "mpt/nn/mlp.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "mpt/core/random.hpp"
#include "mpt/nn/activations.hpp"
#include "mpt/nn/linear.hpp"
#include "mpt/nn/losses.hpp"

namespace mpt {

namespace {

const MlpConfig& checked(const MlpConfig& c) {
  if (c.sizes.size() < 2)
    throw std::invalid_argument("Mlp: sizes needs at least {inputs, outputs}, got " +
                                std::to_string(c.sizes.size()) + " entries");
  for (int v : c.sizes)
    if (v < 1) throw std::invalid_argument("Mlp: every layer size must be >= 1, got " + std::to_string(v));
  return c;
}

std::shared_ptr<const Policy> policy_of(const MlpConfig& c) {
  return c.policy ? c.policy : uniform_policy(c.dtype);
}

}  // namespace

Mlp::Mlp(MlpConfig config) : config_(std::move(config)), ctx_(policy_of(checked(config_))) {
  const auto& s = config_.sizes;
  Rng rng(config_.seed);
  const std::size_t layers = s.size() - 1;
  for (std::size_t l = 0; l < layers; ++l) {
    const std::string i = std::to_string(l + 1);
    Linear& fc = emplace<Linear>("fc" + i, s[l], s[l + 1], rng);
    if (l == 0) fc.set_input_grad(false);  // the input is data: no dx
    if (l + 1 == layers) {
      if (config_.zero_init_output) {
        fc.weight.master.fill_zero();
        fc.bias.master.fill_zero();
      }
      break;
    }
    if (config_.activation == Activation::relu) emplace<ReLU>("relu" + i);
    else
      emplace<GELU>("gelu" + i, config_.activation == Activation::gelu_tanh ? GeluApproximation::tanh
                                                                            : GeluApproximation::none);
  }
  keep_output_gradients(true);
  set_policy(ctx_.shared_policy());
}

void Mlp::set_policy(std::shared_ptr<const Policy> policy) {
  ctx_ = Context(std::move(policy));
  apply_policy(ctx_.policy());
  // Without masters the weights ARE the rounded copy from the start.
  if (config_.master_weights == MasterWeights::none)
    for (Parameter* p : parameters()) p->master = p->weights().to(DType::f32);
}

const Tensor& Mlp::forward(const MatrixF& x) {
  if (x.cols() != config_.sizes.front())
    throw std::invalid_argument("Mlp::forward: x has " + std::to_string(x.cols()) +
                                " columns, the network takes " + std::to_string(config_.sizes.front()));
  logits_ = Sequential::forward(Tensor::from_matrix(x, DType::f32), ctx_);
  have_forward_ = true;
  return logits_;
}

void Mlp::backward(const Tensor& dlogits) {
  if (!have_forward_) throw std::logic_error("Mlp::backward: call forward() first");
  if (dlogits.shape() != logits_.shape())
    throw std::invalid_argument("Mlp::backward: dlogits is " + shape_string(dlogits.shape()) +
                                " but the logits are " + shape_string(logits_.shape()));
  (void)Sequential::backward(dlogits, ctx_);
}

RefreshStats Mlp::refresh_model_copies() {
  RefreshStats st;
  for (Parameter* p : parameters()) st += p->refresh(config_.master_weights);
  return st;
}

std::size_t Mlp::activation_bytes() const {
  std::vector<const Tensor*> kept = saved();
  kept.push_back(&logits_);
  return distinct_bytes(kept);
}

Trace trace_step(Mlp& net, const MatrixF& x, const std::vector<int>& labels, bool forward_only) {
  Trace trace;
  Context& ctx = net.context();
  Trace* before = ctx.trace();
  ctx.set_trace(&trace);
  try {
    const Tensor& logits = net.forward(x);
    (void)cross_entropy_loss(logits, labels, ctx);
    if (!forward_only) net.backward(cross_entropy_backward(logits, labels, 1.0f, ctx));
  } catch (...) {
    ctx.set_trace(before);
    throw;
  }
  ctx.set_trace(before);
  return trace;
}

}  // namespace mpt
