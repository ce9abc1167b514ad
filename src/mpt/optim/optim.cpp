// Chapter 02 — loss scaling and FP32 master weights.
// Depends on: optim.hpp; Chapter 1 rounding (the fp16-state AdamW).
//
// The update rules follow PyTorch's _single_tensor_sgd and
// _single_tensor_adam (decoupled weight decay) line by line, including the
// order of operations and which scalars are computed in double.
#include "mpt/optim/optim.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

#include "mpt/formats/rounding.hpp"

namespace mpt {

namespace {

// PyTorch prints its hyperparameters with Python's repr; %g is close enough.
std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

void check_grad_shape(const Parameter& p) {
  if (p.grad.rows() != p.master.rows() || p.grad.cols() != p.master.cols())
    throw std::invalid_argument("parameter " + p.name + ": grad is " +
                                shape_string(p.grad.rows(), p.grad.cols()) + " but the weights are " +
                                shape_string(p.master.rows(), p.master.cols()));
}

}  // namespace

// --- SGD -------------------------------------------------------------------------

SGD::SGD(std::vector<Parameter*> params, Options options)
    : Optimizer(std::move(params)), options_(options) {
  require(options_.lr >= 0.0, "Invalid learning rate: " + num(options_.lr));
  require(options_.momentum >= 0.0, "Invalid momentum value: " + num(options_.momentum));
  require(options_.weight_decay >= 0.0, "Invalid weight_decay value: " + num(options_.weight_decay));
  require(!options_.nesterov || (options_.momentum > 0.0 && options_.dampening == 0.0),
          "Nesterov momentum requires a momentum and zero dampening");
}

void SGD::set_lr(double lr) {
  require(lr >= 0.0, "Invalid learning rate: " + num(lr));
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
    MatrixF g = p.grad;
    if (wd != 0.0f) g += wd * p.master;  // grad.add(param, alpha=weight_decay)
    if (use_momentum) {
      MatrixF& buf = momentum_[i];
      if (first) buf = g;                 // torch.clone(grad): no dampening on step 1
      else buf = mu * buf + keep * g;     // buf.mul_(momentum).add_(grad, alpha=1-dampening)
      if (options_.nesterov) g += mu * buf;
      else g = buf;
    }
    p.master += neg_lr * g;               // param.add_(grad, alpha=-lr)
  }
}

std::size_t SGD::state_bytes() const {
  std::size_t n = 0;
  for (const MatrixF& b : momentum_) n += static_cast<std::size_t>(b.size()) * sizeof(float);
  return n;
}

// --- AdamW -------------------------------------------------------------------------

AdamW::AdamW(std::vector<Parameter*> params, Options options)
    : Optimizer(std::move(params)), options_(options) {
  require(options_.lr >= 0.0, "Invalid learning rate: " + num(options_.lr));
  require(options_.eps >= 0.0, "Invalid epsilon value: " + num(options_.eps));
  require(options_.beta1 >= 0.0 && options_.beta1 < 1.0,
          "Invalid beta parameter at index 0: " + num(options_.beta1));
  require(options_.beta2 >= 0.0 && options_.beta2 < 1.0,
          "Invalid beta parameter at index 1: " + num(options_.beta2));
  require(options_.weight_decay >= 0.0, "Invalid weight_decay value: " + num(options_.weight_decay));
  for (Parameter* p : params_) {
    m_.emplace_back(options_.state_format, p->master.rows(), p->master.cols());
    v_.emplace_back(options_.state_format, p->master.rows(), p->master.cols());
  }
}

void AdamW::set_lr(double lr) {
  require(lr >= 0.0, "Invalid learning rate: " + num(lr));
  options_.lr = lr;
}

void AdamW::step() {
  ++t_;
  const Options& o = options_;
  const Precision sp = o.state_format;
  const Format& sf = format_of(sp);
  // r(): the rounding every intermediate of the Adam arithmetic goes
  // through — the identity for fp32, fp16/bf16 rounding for the pitfall.
  const auto r = [&](float x) { return sp == Precision::fp32 ? x : round_value(x, sf); };
  // Scalars as Python computes them (double), then handed to the kernels.
  const double t = static_cast<double>(t_);
  const double bias_correction1 = 1.0 - std::pow(o.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(o.beta2, t);
  const float step_size = r(static_cast<float>(o.lr / bias_correction1));
  const float bc2_sqrt = r(static_cast<float>(std::sqrt(bias_correction2)));
  const float decay = static_cast<float>(1.0 - o.lr * o.weight_decay);  // applied to the FP32 master
  const float w1 = r(static_cast<float>(1.0 - o.beta1));
  const float beta2 = r(static_cast<float>(o.beta2));
  const float w2 = r(static_cast<float>(1.0 - o.beta2));
  const float eps = r(static_cast<float>(o.eps));  // 1e-8 → 0 in fp16

  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    check_grad_shape(p);
    MatrixF m = m_[i].to_fp32(), v = v_[i].to_fp32();
    if (o.weight_decay != 0.0) p.master *= decay;  // param.mul_(1 - lr * weight_decay)
    for (Eigen::Index k = 0; k < p.master.size(); ++k) {
      const float g = r(p.grad.data()[k]);
      float& mk = m.data()[k];
      float& vk = v.data()[k];
      // exp_avg.lerp_(grad, 1 - beta1): PyTorch's lerp picks its formula by the weight.
      mk = w1 < 0.5f ? r(mk + r(w1 * r(g - mk))) : r(g - r(r(g - mk) * r(1.0f - w1)));
      // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
      vk = r(r(vk * beta2) + r(r(w2 * g) * g));
      // denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
      const float denom = r(r(r(std::sqrt(vk)) / bc2_sqrt) + eps);
      // param.addcdiv_(exp_avg, denom, value=-step_size)
      p.master.data()[k] -= r(step_size * r(mk / denom));
    }
    m_[i].assign(m);  // values are already in state_format: exact
    v_[i].assign(v);
  }
}

std::size_t AdamW::state_bytes() const {
  std::size_t n = 0;
  for (std::size_t i = 0; i < m_.size(); ++i) n += m_[i].bytes() + v_[i].bytes();
  return n;
}

}  // namespace mpt
