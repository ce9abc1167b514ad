// Chapter 02 — loss scaling and FP32 master weights: AdamW.
// Depends on: adamw.hpp; Chapter 1 rounding (the fp16-state AdamW).
//
// The update rule follows PyTorch's _single_tensor_adam (decoupled weight
// decay) line by line, including the order of operations and which scalars
// are computed in double.
#include "mpt/optim/adamw.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "mpt/formats/rounding.hpp"

namespace mpt {

// --- AdamW -------------------------------------------------------------------------

AdamW::AdamW(std::vector<Parameter*> params, Options options)
    : Optimizer(std::move(params)), options_(options) {
  detail::require_option(options_.lr >= 0.0, "Invalid learning rate: " + detail::option_text(options_.lr));
  detail::require_option(options_.eps >= 0.0, "Invalid epsilon value: " + detail::option_text(options_.eps));
  detail::require_option(options_.beta1 >= 0.0 && options_.beta1 < 1.0,
                         "Invalid beta parameter at index 0: " + detail::option_text(options_.beta1));
  detail::require_option(options_.beta2 >= 0.0 && options_.beta2 < 1.0,
                         "Invalid beta parameter at index 1: " + detail::option_text(options_.beta2));
  detail::require_option(options_.weight_decay >= 0.0,
                         "Invalid weight_decay value: " + detail::option_text(options_.weight_decay));
  for (Parameter* p : params_) {
    m_.emplace_back(options_.state_dtype, p->master.shape());
    v_.emplace_back(options_.state_dtype, p->master.shape());
  }
}

void AdamW::set_lr(double lr) {
  detail::require_option(lr >= 0.0, "Invalid learning rate: " + detail::option_text(lr));
  options_.lr = lr;
}

void AdamW::step() {
  ++t_;
  const Options& o = options_;
  const DType sp = o.state_dtype;
  const Format& sf = format_of(sp);
  // r(): the rounding every intermediate of the Adam arithmetic goes
  // through — the identity for fp32, fp16/bf16 rounding for the pitfall.
  const auto r = [&](float x) { return sp == DType::f32 ? x : round_value(x, sf); };
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
    // Elementwise, on the flattened tensors whatever their rank.
    const Eigen::Index n = p.master.numel();
    MatrixF m(1, n), v(1, n);
    m_[i].to_f32(m.data());
    v_[i].to_f32(v.data());
    float* w = p.master.f32_data();
    if (o.weight_decay != 0.0) Eigen::Map<MatrixF>(w, 1, n) *= decay;  // param.mul_(1 - lr * weight_decay)
    const float* grad = std::as_const(p.grad).f32_data();
    for (Eigen::Index k = 0; k < m.size(); ++k) {
      const float g = r(grad[k]);
      float& mk = m.data()[k];
      float& vk = v.data()[k];
      // exp_avg.lerp_(grad, 1 - beta1): PyTorch's lerp picks its formula by the weight.
      mk = w1 < 0.5f ? r(mk + r(w1 * r(g - mk))) : r(g - r(r(g - mk) * r(1.0f - w1)));
      // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
      vk = r(r(vk * beta2) + r(r(w2 * g) * g));
      // denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
      const float denom = r(r(r(std::sqrt(vk)) / bc2_sqrt) + eps);
      // param.addcdiv_(exp_avg, denom, value=-step_size)
      w[k] -= r(step_size * r(mk / denom));
    }
    m_[i].assign(m.data(), m.size());  // values are already in state_dtype: exact
    v_[i].assign(v.data(), v.size());
  }
}

void AdamW::set_state(std::int64_t steps, const std::vector<MatrixF>& m, const std::vector<MatrixF>& v) {
  if (steps < 0)
    throw std::invalid_argument("AdamW state: step count " + std::to_string(steps) +
                                " is negative; give >= 0");
  if (m.size() != params_.size() || v.size() != params_.size())
    throw std::invalid_argument("AdamW state: " + std::to_string(m.size()) + " first and " +
                                std::to_string(v.size()) + " second moments for " +
                                std::to_string(params_.size()) +
                                " parameters; give one of each per parameter");
  const Format& sf = format_of(options_.state_dtype);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = params_[i]->name;
    const Eigen::Index n = params_[i]->master.numel();
    for (const MatrixF* t : {&m[i], &v[i]}) {
      const char* which = t == &m[i] ? "first moment" : "second moment";
      if (t->size() != n)
        throw std::invalid_argument("AdamW " + std::string(which) + " of " + name + ": " +
                                    std::to_string(t->size()) + " values, but the parameter has " +
                                    std::to_string(n));
      for (Eigen::Index k = 0; k < n; ++k) {
        const float x = t->data()[k];
        if (!std::isfinite(x) || (t == &v[i] && x < 0.0f) ||
            (options_.state_dtype != DType::f32 && round_value(x, sf) != x))
          throw std::invalid_argument("AdamW " + std::string(which) + " of " + name + ": value " +
                                      detail::option_text(x) + " at " + std::to_string(k) +
                                      " is not a finite " + std::string(dtype_name(options_.state_dtype)) +
                                      (t == &v[i] ? " value >= 0" : " value"));
      }
    }
  }
  t_ = steps;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    m_[i].assign(m[i].data(), m[i].size());
    v_[i].assign(v[i].data(), v[i].size());
  }
}

std::size_t AdamW::state_bytes() const {
  std::size_t n = 0;
  for (std::size_t i = 0; i < m_.size(); ++i) n += m_[i].bytes() + v_[i].bytes();
  return n;
}

}  // namespace mpt
