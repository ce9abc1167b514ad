// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the pooling
// layers and the reshapes between images and rows (Flatten, Unflatten).
// Depends on: module.hpp, conv_math.hpp (the pooling formulas).
//
// Pooling asks the policy for its op ("max_pool2d", "avg_pool2d"), computes
// in FP32 from widened inputs and stores its result in the policy's output
// dtype. Flatten and Unflatten are views: they share the buffer, ask no
// policy, cast nothing and record no trace entry (a reshape is no op of the
// precision story).
#pragma once

#include "mpt/core/tensor.hpp"
#include "mpt/nn/layers/conv_math.hpp"
#include "mpt/nn/module.hpp"

namespace mpt {

/// torch.nn.MaxPool2d(kernel_size, stride, padding) with dilation 1 and
/// ceil_mode=False: x [N, C, H, W] → [N, C, H', W'], the largest value of
/// each window (see conv_math::max_pool2d_forward for ties and NaN, which
/// follow PyTorch's CPU kernel).
class MaxPool2d final : public Module {
 public:
  /// stride 0 means stride = kernel_size (PyTorch's default, stride=None).
  /// Throws std::invalid_argument unless kernel_size >= 1, stride >= 0 and
  /// 0 <= padding <= kernel_size / 2 (PyTorch's "pad should be at most half
  /// of effective kernel size").
  explicit MaxPool2d(int kernel_size, int stride = 0, int padding = 0);
  /// "MaxPool2d".
  const char* kind() const override { return "MaxPool2d"; }
  /// The window.
  const conv_math::Window2d& window() const { return win_; }
  /// The input as the op read it: backward finds each window's argmax again
  /// in it, with the same scan as forward.
  std::vector<const Tensor*> saved() const override { return {&x_}; }

 protected:
  /// The window maxima in FP32 (exact: each is one of the widened inputs),
  /// stored in the policy's output dtype.
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  /// dy routed to each window's argmax (summed in FP32 where windows
  /// overlap), zero elsewhere, stored in the dtype x was read in.
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  conv_math::Window2d win_;
  Tensor x_;
  OpPrecision op_{};
};

/// torch.nn.AvgPool2d(kernel_size, stride, padding) with ceil_mode=False
/// and count_include_pad=True (PyTorch's default): every window's sum
/// divided by kernel_size², padding counted as zeros.
class AvgPool2d final : public Module {
 public:
  /// As MaxPool2d's.
  explicit AvgPool2d(int kernel_size, int stride = 0, int padding = 0);
  /// "AvgPool2d".
  const char* kind() const override { return "AvgPool2d"; }
  /// The window.
  const conv_math::Window2d& window() const { return win_; }
  /// Nothing: backward needs only the input's shape.
  std::vector<const Tensor*> saved() const override { return {}; }

 protected:
  /// Sums in FP32 from widened inputs, one division, rounded into the
  /// policy's output dtype.
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  /// dy / k² spread over each window (summed in FP32 where windows overlap),
  /// stored in the dtype x was read in.
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  conv_math::Window2d win_;
  Shape x_shape_;
  OpPrecision op_{};
};

/// torch.nn.Flatten() (start_dim=1): [N, d1, d2, ...] → [N, d1·d2·...],
/// the same buffer under another shape.
class Flatten final : public Module {
 public:
  /// "Flatten".
  const char* kind() const override { return "Flatten"; }

 protected:
  /// x reshaped (shared buffer). Throws std::invalid_argument for a tensor
  /// with fewer than 2 dimensions.
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  /// dy reshaped back to the input's shape.
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  Shape x_shape_;
};

/// torch.nn.Unflatten(1, per_sample): [N, Π per_sample] → [N, per_sample...],
/// the same buffer under another shape. Unflatten({1, 8, 8}) turns the
/// digits' rows of 64 pixels into 1×8×8 images.
class Unflatten final : public Module {
 public:
  /// Throws std::invalid_argument for an empty shape or a size below 1.
  explicit Unflatten(Shape per_sample);
  /// "Unflatten".
  const char* kind() const override { return "Unflatten"; }
  /// The shape of one sample.
  const Shape& per_sample() const { return per_sample_; }

 protected:
  /// x [N, Π per_sample] reshaped (shared buffer). Throws
  /// std::invalid_argument for any other shape.
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  /// dy reshaped back to [N, Π per_sample].
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  Shape per_sample_;
  Shape x_shape_;
};

}  // namespace mpt
