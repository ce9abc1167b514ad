// Chapter 02 — loss scaling and FP32 master weights.
// Depends on: mlp.hpp, layers.hpp, data.hpp (Rng).
#include "mpt/nn/mlp.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "mpt/nn/data.hpp"

namespace mpt {

namespace {

GeluApproximation gelu_kind(Activation a) {
  return a == Activation::gelu_tanh ? GeluApproximation::tanh : GeluApproximation::none;
}

}  // namespace

Mlp::Mlp(MlpConfig config) : config_(std::move(config)) {
  const auto& s = config_.sizes;
  if (s.size() < 2)
    throw std::invalid_argument("Mlp: sizes needs at least {inputs, outputs}, got " +
                                std::to_string(s.size()) + " entries");
  for (int v : s)
    if (v < 1) throw std::invalid_argument("Mlp: every layer size must be >= 1, got " + std::to_string(v));
  Rng rng(config_.seed);
  const std::size_t layers = s.size() - 1;
  params_.reserve(2 * layers);  // never reallocated: optimizers keep pointers
  for (std::size_t l = 0; l < layers; ++l) {
    // nn.Linear's default: kaiming_uniform(a=√5) for W and U(±1/√in) for b,
    // which are both uniform in ±1/√in.
    const double bound = 1.0 / std::sqrt(static_cast<double>(s[l]));
    MatrixF w(s[l + 1], s[l]), b(1, s[l + 1]);
    for (Eigen::Index i = 0; i < w.size(); ++i) w.data()[i] = static_cast<float>(rng.uniform(-bound, bound));
    for (Eigen::Index i = 0; i < b.size(); ++i) b.data()[i] = static_cast<float>(rng.uniform(-bound, bound));
    if (config_.zero_init_output && l + 1 == layers) {
      w.setZero();
      b.setZero();
    }
    const std::string name = "fc" + std::to_string(l + 1);
    params_.push_back(make_parameter(name + ".weight", std::move(w), config_.precision));
    params_.push_back(make_parameter(name + ".bias", std::move(b), config_.precision));
  }
  for (Parameter& p : params_) {
    seen_.push_back(model_copy(p).to_fp32());
    // Without masters the weights ARE the rounded copy from the start.
    if (config_.master_weights == MasterWeights::none) p.master = seen_.back();
  }
  inputs_.resize(layers);
  pre_act_.resize(layers);
}

std::vector<Parameter*> Mlp::parameters() {
  std::vector<Parameter*> out;
  for (Parameter& p : params_) out.push_back(&p);
  return out;
}

const Tensor& Mlp::forward(const MatrixF& x) {
  const std::size_t layers = num_layers();
  if (x.cols() != config_.sizes.front())
    throw std::invalid_argument("Mlp::forward: x has " + std::to_string(x.cols()) +
                                " columns, the network takes " + std::to_string(config_.sizes.front()));
  const Precision p = config_.precision;
  inputs_[0] = Tensor::from_fp32(x, p);
  for (std::size_t l = 0; l < layers; ++l) {
    Tensor z = linear_forward(inputs_[l], params_[2 * l], params_[2 * l + 1]);  // [B, out_l]
    pre_act_[l] = Tensor();
    if (l + 1 == layers) {
      logits_ = std::move(z);
      break;
    }
    if (config_.activation == Activation::relu) {
      // ReLU's backward needs only its output (PyTorch saves the result):
      // the pre-activation is freed here and not counted.
      inputs_[l + 1] = relu_forward(z);
    } else {
      inputs_[l + 1] = gelu_forward(z, gelu_kind(config_.activation));
      pre_act_[l] = std::move(z);  // GELU's backward needs its input
    }
  }
  have_forward_ = true;
  return logits_;
}

void Mlp::backward(const Tensor& dlogits) {
  if (!have_forward_) throw std::logic_error("Mlp::backward: call forward() first");
  const Precision p = config_.precision;
  if (dlogits.rows() != logits_.rows() || dlogits.cols() != logits_.cols())
    throw std::invalid_argument("Mlp::backward: dlogits is " +
                                shape_string(dlogits.rows(), dlogits.cols()) + " but the logits are " +
                                shape_string(logits_.rows(), logits_.cols()));
  act_grads_.clear();
  act_grads_.push_back(dlogits.precision() == p ? dlogits : Tensor::from_fp32(dlogits.to_fp32(), p));
  Tensor dz = act_grads_.back();  // gradient w.r.t. Linear l's output
  for (std::size_t l = num_layers(); l-- > 0;) {
    Tensor da = linear_backward(inputs_[l], dz, params_[2 * l], params_[2 * l + 1], l > 0);
    if (l == 0) break;
    // da: gradient w.r.t. the activation output inputs_[l]; back through it.
    if (config_.activation == Activation::relu) dz = relu_backward(inputs_[l], da);
    else dz = gelu_backward(pre_act_[l - 1], da, gelu_kind(config_.activation));
    act_grads_.push_back(std::move(da));
    act_grads_.push_back(dz);
  }
}

RefreshStats Mlp::refresh_model_copies() {
  RefreshStats st;
  for (std::size_t k = 0; k < params_.size(); ++k) {
    Parameter& param = params_[k];
    MatrixF& seen = seen_[k];  // what forward read before this step
    refresh_model_copy(param);
    MatrixF now = model_copy(param).to_fp32();
    const bool no_master = config_.master_weights == MasterWeights::none;
    for (Eigen::Index i = 0; i < now.size(); ++i) {
      const bool moved = param.master.data()[i] != seen.data()[i];
      const bool changed = now.data()[i] != seen.data()[i];
      st.changed += changed;
      st.lost += no_master && moved && !changed;
    }
    st.elements += static_cast<std::size_t>(now.size());
    // Without masters the weights are what the copy holds: the rounding is final.
    if (no_master) param.master = now;
    seen = std::move(now);
  }
  return st;
}

std::size_t Mlp::activation_bytes() const {
  std::size_t n = logits_.bytes();
  for (const Tensor& t : inputs_) n += t.bytes();
  for (const Tensor& t : pre_act_) n += t.bytes();
  return n;
}

}  // namespace mpt
