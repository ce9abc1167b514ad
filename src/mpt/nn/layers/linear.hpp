// Chapter 02 — loss scaling and FP32 master weights: the Linear layer.
// Depends on: module.hpp, gemm.hpp, layer_math.hpp (the formulas),
// parameter.hpp; the core tier's Rng (the initialisation).
//
// y = x Wᵀ + b as one GEMM: inputs read in the dtype the policy gives the
// op "linear", products summed in FP32, the bias added to the FP32
// accumulator, the result rounded once into the output dtype.
#pragma once

#include <cstdint>
#include <optional>

#include "mpt/core/random.hpp"
#include "mpt/nn/cpu/gemm.hpp"
#include "mpt/nn/module.hpp"
#include "mpt/nn/parameter.hpp"

namespace mpt {

/// torch.nn.Linear(in_features, out_features): weight [out, in], bias [out].
class Linear final : public Module {
 public:
  /// Weight and bias uniform in ±1/√in from `rng` (PyTorch's default:
  /// kaiming_uniform(a=√5) for W and U(±1/√in) for b, both uniform in
  /// ±1/√in), the weight's elements first, then the bias'. Throws
  /// std::invalid_argument unless both sizes are >= 1.
  Linear(int in_features, int out_features, Rng& rng);
  /// Given initial values: weight [out, in] and bias [out] (both f32).
  Linear(Tensor weight, Tensor bias);

  /// "Linear".
  const char* kind() const override { return "Linear"; }
  /// The weight, [out, in].
  Parameter weight;
  /// The bias, [out].
  Parameter bias;

  std::vector<Parameter*> parameters() override { return {&weight, &bias}; }
  /// Both model copies in Policy::parameter_dtype("linear", path()).
  void apply_policy(const Policy& policy) override;
  /// The input as the GEMM read it (kept for dW).
  std::vector<const Tensor*> saved() const override { return {&x_}; }
  /// Names the parameters "<path>.weight" and "<path>.bias".
  void set_path(std::string path) override;

 protected:
  /// x [B, in] cast to the policy's input dtype, y [B, out] in its output dtype.
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  /// dW [out, in] = dyᵀ·x and db [out] = Σ_B dy, FP32 accumulation, rounded
  /// into the weights' dtype (the gradient of an f16 weight is an f16 tensor)
  /// and then *added* into the FP32 grads (PyTorch's .grad accumulation);
  /// dx [B, in] = dy·W stored in the dtype x was read in. dy is read in that
  /// dtype too (a GEMM takes both inputs in one format).
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  Tensor x_;          // the input as the forward GEMM read it
  OpPrecision op_{};  // the forward's decision
  // The CPU emulation's widened operands, from forward to backward: x_ and
  // the weights forward read, widened to FP32 once a step instead of once
  // per GEMM (the bits are the same; a GPU reads fp16 operands in place).
  // Released at the end of backward, so that no copy of an f32 master is
  // held while the optimizer writes it.
  std::optional<F32Matrix> x_f32_, w_f32_;
  Tensor w_read_;                // the weights forward read (w_f32_ is theirs)
  std::uint64_t w_version_ = 0;  // their version then
};

}  // namespace mpt
