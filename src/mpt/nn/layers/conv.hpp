// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the Conv2d layer.
// Depends on: module.hpp, parameter.hpp, conv_math.hpp (the formulas),
// gemm.hpp (in conv.cpp); the core tier's Rng (the initialisation).
//
// A convolution as im2col and one GEMM, as Caffe and PyTorch's CPU
// slow_conv2d compute it: the input's windows are copied into a column
// matrix in the dtype the policy gives the op "conv2d" (a copy of values
// that dtype holds, so nothing is rounded), multiplied with the weights in
// FP32 with the bias added to the FP32 accumulator, and the result rounded
// once into the output dtype — a Linear over the windows.
#pragma once

#include <cstdint>

#include "mpt/core/random.hpp"
#include "mpt/nn/layers/conv_math.hpp"
#include "mpt/nn/module.hpp"
#include "mpt/nn/parameter.hpp"

namespace mpt {

/// What torch.nn.Conv2d calls stride, padding and bias (the same in both
/// spatial dimensions; groups 1, dilation 1, zero padding).
struct Conv2dOptions {
  int stride = 1;    ///< the window's step, >= 1
  int padding = 0;   ///< zeros added on each side, >= 0
  bool bias = true;  ///< whether the layer has a bias
};

/// torch.nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding,
/// bias): weight [out, in, k, k], bias [out]; x [N, in, H, W] →
/// y [N, out, H', W'] with H' = (H + 2p − k)/s + 1 (floor), W' likewise.
class Conv2d final : public Module {
 public:
  /// Weight and bias uniform in ±1/√(in·k·k) from `rng`, the weight's
  /// elements first, then the bias'. This is PyTorch's default
  /// (_ConvNd.reset_parameters in torch/nn/modules/conv.py:
  /// kaiming_uniform_(a=√5) for the weight, whose bound
  /// √(6/((1 + a²)·fan_in)) is 1/√fan_in, and U(±1/√fan_in) for the bias,
  /// fan_in = in·k·k). Throws std::invalid_argument unless the sizes are
  /// >= 1, stride >= 1 and padding >= 0.
  Conv2d(int in_channels, int out_channels, int kernel_size, Rng& rng, Conv2dOptions options = {});
  /// Given initial values (f32): weight [out, in, k, k] and bias [out]; with
  /// options.bias false, bias must be empty (Tensor()).
  Conv2d(Tensor weight, Tensor bias, Conv2dOptions options = {});

  /// "Conv2d".
  const char* kind() const override { return "Conv2d"; }
  /// The weight, [out, in, k, k].
  Parameter weight;
  /// The bias, [out]; empty (and not among parameters()) without one.
  Parameter bias;

  /// in_channels.
  std::int64_t in_channels() const { return weight.master.size(1); }
  /// out_channels.
  std::int64_t out_channels() const { return weight.master.size(0); }
  /// kernel_size.
  std::int64_t kernel_size() const { return weight.master.size(2); }
  /// Stride, padding, bias.
  const Conv2dOptions& options() const { return options_; }

  /// The weight, and the bias when there is one.
  std::vector<Parameter*> parameters() override;
  /// Model copies in Policy::parameter_dtype("conv2d", path()).
  void apply_policy(const Policy& policy) override;
  /// The input as the forward read it (backward rebuilds the column matrix
  /// from it, k² times smaller than keeping the columns; PyTorch's autograd
  /// also keeps the convolution's input).
  std::vector<const Tensor*> saved() const override { return {&x_}; }
  /// Names the parameters "<path>.weight" and "<path>.bias".
  void set_path(std::string path) override;

 protected:
  /// x [N, in, H, W] cast to the policy's input dtype; the column matrix in
  /// that dtype; one GEMM (FP32 accumulation, bias in the epilogue); the
  /// result rounded once into the output dtype, laid out [N, out, H', W'].
  /// Throws std::invalid_argument for a wrong shape or a kernel larger than
  /// the padded input, and for a policy asking for anything but f32 compute.
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  /// With dY the gradient as [N·H'·W', out] rows, read in the forward's
  /// input dtype: dW = dYᵀ · cols and db = Σ dY, FP32 accumulation, rounded
  /// into the weights' dtype and added into their FP32 grads (as Linear);
  /// dx = col2im(dY · W), summed in FP32 and rounded once into the dtype x
  /// was read in.
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  conv_math::Geometry geometry(const Tensor& x) const;
  std::string who() const;
  Conv2dOptions options_;
  Tensor x_;          // the input as the forward read it
  OpPrecision op_{};  // the forward's decision
};

}  // namespace mpt
