// Chapter 02 — loss scaling and FP32 master weights: the activations.
// Depends on: module.hpp, layer_math.hpp (the formulas).
//
// Elementwise layers compute in FP32 from widened inputs and store their
// result in the dtype the policy gives their op ("relu", "gelu").
#pragma once

#include "mpt/nn/layers/layer_math.hpp"
#include "mpt/nn/module.hpp"

namespace mpt {

/// torch.nn.ReLU: max(x, 0), a NaN kept as NaN (PyTorch's clamp_min).
class ReLU final : public Module {
 public:
  /// "ReLU".
  const char* kind() const override { return "ReLU"; }
  /// The output (backward needs only its sign pattern, as PyTorch saves the result).
  std::vector<const Tensor*> saved() const override { return {&y_}; }

 protected:
  /// max(x, 0) in FP32, stored in the policy's output dtype (exact).
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  /// dy where the output is positive, else 0 — PyTorch's threshold_backward —
  /// in the dtype the input was read in.
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  Tensor y_;
  OpPrecision op_{};
};

/// torch.nn.GELU(approximate='none' | 'tanh').
class GELU final : public Module {
 public:
  /// Exact (erf) by default, as PyTorch's.
  explicit GELU(GeluApproximation a = GeluApproximation::none) : approximation_(a) {}
  /// "GELU".
  const char* kind() const override { return "GELU"; }
  /// Which GELU.
  GeluApproximation approximation() const { return approximation_; }
  /// The input (backward evaluates gelu'(x)).
  std::vector<const Tensor*> saved() const override { return {&x_}; }

 protected:
  /// gelu(x) in FP32 from the widened x, stored in the policy's output dtype.
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  /// dy·gelu'(x) in FP32, stored in the dtype the input was read in.
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  GeluApproximation approximation_;
  Tensor x_;
  OpPrecision op_{};
};

}  // namespace mpt
