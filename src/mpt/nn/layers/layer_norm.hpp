// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the LayerNorm layer.
// Depends on: module.hpp, parameter.hpp; norm_math.hpp and welford.hpp (the
// formulas, in layer_norm.cpp).
//
// torch.nn.LayerNorm(normalized_shape, eps, elementwise_affine)
// (torch/nn/modules/normalization.py; aten/src/ATen/native/layer_norm.cpp):
// every row — the last normalized_shape.size() dimensions of x, which must
// equal normalized_shape — is normalized with its own mean and biased
// variance, y = (x − mean)/√(var + eps)·γ + β, with γ and β of shape
// normalized_shape. No running estimates: training and eval are the same.
//
// Precision as BatchNorm's: statistics from the widened input with double
// sums, rounded once into FP32, and normalization in FP32, whatever the
// policy stores; γ's and β's model
// copies in Policy::parameter_dtype("layer_norm", path).
#pragma once

#include <string>
#include <vector>

#include "mpt/nn/module.hpp"
#include "mpt/nn/parameter.hpp"

namespace mpt {

/// torch.nn.LayerNorm over the last dimensions.
class LayerNorm final : public Module {
 public:
  /// PyTorch's constructor arguments.
  struct Options {
    double eps = 1e-5;               ///< added to the variance inside the square root (>= 0)
    bool elementwise_affine = true;  ///< learnable γ (1) and β (0) of shape normalized_shape
  };

  /// Normalizes over the last dims equal to normalized_shape, default options.
  /// Throws std::invalid_argument unless normalized_shape is non-empty with
  /// every size >= 1.
  explicit LayerNorm(Shape normalized_shape);
  /// With options; also throws for an eps that is negative or not finite.
  LayerNorm(Shape normalized_shape, Options options);

  /// "LayerNorm".
  const char* kind() const override { return "LayerNorm"; }
  /// The shape of the normalized trailing dimensions.
  const Shape& normalized_shape() const { return normalized_shape_; }
  /// The options it was made with.
  const Options& options() const { return options_; }

  /// γ, normalized_shape, FP32 master 1 (empty without elementwise_affine).
  Parameter weight;
  /// β, normalized_shape, FP32 master 0 (empty without elementwise_affine).
  Parameter bias;

  /// The last forward's mean of every row, f32 [rows] (rows = x's elements
  /// divided by normalized_shape's).
  const Tensor& mean() const { return mean_; }
  /// The last forward's 1/√(biased variance + eps) of every row, f32 [rows].
  const Tensor& rstd() const { return rstd_; }

  /// {weight, bias}, or none without elementwise_affine.
  std::vector<Parameter*> parameters() override;
  /// γ's and β's model copies in Policy::parameter_dtype("layer_norm", path()).
  void apply_policy(const Policy& policy) override;
  /// What backward reads: the input as forward read it, the rows' mean and rstd.
  std::vector<const Tensor*> saved() const override { return {&x_, &mean_, &rstd_}; }
  /// Names the parameters "<path>.weight" and "<path>.bias".
  void set_path(std::string path) override;

 protected:
  /// x in the policy's input dtype, statistics and normalization in f32, y
  /// in the policy's output dtype.
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  /// dx (in the dtype x was read in), and dγ = Σ_rows dy·x̂, dβ = Σ_rows dy
  /// summed in FP32, rounded into the parameters' model dtype and added into
  /// their grad.
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  std::string who() const;

  Shape normalized_shape_;
  Options options_;
  Tensor x_, mean_, rstd_;
  OpPrecision op_{};
};

}  // namespace mpt
