// Chapter 02 — loss scaling and FP32 master weights: SGD.
// Depends on: sgd.hpp.
//
// The update rule follows PyTorch's _single_tensor_sgd line by line,
// including the order of operations and which scalars are float.
#include "mpt/optim/sgd.hpp"

#include <stdexcept>
#include <string>
#include <utility>

namespace mpt {

// --- SGD -------------------------------------------------------------------------

SGD::SGD(std::vector<Parameter*> params, Options options) : Optimizer(std::move(params)), options_(options) {
  detail::require_option(options_.lr >= 0.0, "Invalid learning rate: " + detail::option_text(options_.lr));
  detail::require_option(options_.momentum >= 0.0,
                         "Invalid momentum value: " + detail::option_text(options_.momentum));
  detail::require_option(options_.weight_decay >= 0.0,
                         "Invalid weight_decay value: " + detail::option_text(options_.weight_decay));
  detail::require_option(!options_.nesterov || (options_.momentum > 0.0 && options_.dampening == 0.0),
                         "Nesterov momentum requires a momentum and zero dampening");
}

void SGD::set_lr(double lr) {
  detail::require_option(lr >= 0.0, "Invalid learning rate: " + detail::option_text(lr));
  options_.lr = lr;
}

void SGD::step() {
  const bool use_momentum = options_.momentum != 0.0;
  const bool first = momentum_.empty();
  if (use_momentum && first) momentum_.resize(params_.size());
  // PyTorch passes the Python floats as kernel scalars: float for fp32 tensors.
  const auto wd = static_cast<float>(options_.weight_decay);
  const auto mu = static_cast<float>(options_.momentum);
  const auto keep = static_cast<float>(1.0 - options_.dampening);
  const auto neg_lr = static_cast<float>(-options_.lr);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    check_grad_shape(p);
    // Every update is elementwise: work on the flattened tensors, whatever
    // their rank (a convolution's weight is 4-D).
    const Eigen::Index n = p.grad.numel();
    MatrixF g = Eigen::Map<const MatrixF>(std::as_const(p.grad).f32_data(), 1, n);
    if (wd != 0.0f) g += wd * Eigen::Map<const MatrixF>(std::as_const(p.master).f32_data(), 1, n);
    if (use_momentum) {
      MatrixF& buf = momentum_[i];
      if (first) buf = g;              // torch.clone(grad): no dampening on step 1
      else buf = mu * buf + keep * g;  // buf.mul_(momentum).add_(grad, alpha=1-dampening)
      if (options_.nesterov) g += mu * buf;
      else g = buf;
    }
    Eigen::Map<MatrixF>(p.master.f32_data(), 1, n) += neg_lr * g;  // param.add_(grad, alpha=-lr)
  }
}

void SGD::set_momentum_buffers(std::vector<MatrixF> buffers) {
  if (buffers.empty()) {
    momentum_.clear();
    return;
  }
  if (options_.momentum == 0.0)
    throw std::invalid_argument("SGD momentum buffers given to an SGD without momentum; give none");
  if (buffers.size() != params_.size())
    throw std::invalid_argument("SGD momentum buffers: " + std::to_string(buffers.size()) + " given for " +
                                std::to_string(params_.size()) + " parameters; give one per parameter");
  for (std::size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i].size() != params_[i]->master.numel())
      throw std::invalid_argument("SGD momentum buffer of " + params_[i]->name + ": " +
                                  std::to_string(buffers[i].size()) + " values, but the parameter has " +
                                  std::to_string(params_[i]->master.numel()));
  for (MatrixF& b : buffers) b.resize(1, b.size());
  momentum_ = std::move(buffers);
}

std::size_t SGD::state_bytes() const {
  std::size_t n = 0;
  for (const MatrixF& b : momentum_) n += static_cast<std::size_t>(b.size()) * sizeof(float);
  return n;
}

}  // namespace mpt
