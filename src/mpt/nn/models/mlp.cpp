// Chapter 02 — loss scaling and FP32 master weights: the MLP.
// Depends on: mlp.hpp, linear.hpp, activations.hpp; the core tier (random.hpp).
#include "mpt/nn/models/mlp.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "mpt/core/random.hpp"
#include "mpt/nn/layers/activations.hpp"
#include "mpt/nn/layers/linear.hpp"

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

Mlp::Mlp(MlpConfig config)
    : Model("Mlp", policy_of(checked(config)), checked(config).sizes.front(), config.master_weights),
      config_(std::move(config)) {
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
  finish();
}

}  // namespace mpt
