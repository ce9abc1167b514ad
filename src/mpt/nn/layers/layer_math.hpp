// Chapter 02 — loss scaling and FP32 master weights: the layers' formulas.
// Depends on: gemm.hpp (matmul, Op), tensor.hpp (Mat), softmax_math.hpp (the
// cross-entropy rows, shared with Chapter 4).
//
// The math of every layer and loss of Chapter 2, written once and templated
// on the scalar: the layers (linear.hpp, activations.hpp, losses.hpp) run it
// in float on widened tensors, the tests run it in double and check every
// backward against central finite differences.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/core/tensor.hpp"
#include "mpt/nn/cpu/gemm.hpp"
#include "mpt/nn/layers/softmax_math.hpp"

namespace mpt {

/// Which GELU, with PyTorch's names (torch.nn.GELU(approximate=...)).
enum class GeluApproximation : std::uint8_t {
  none,  ///< exact: 0.5·x·(1 + erf(x/√2)); PyTorch's default
  tanh,  ///< 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), as in GPT-2 and llm.c
};

namespace layer_math {

/// Linear forward. x [B, in], w [out, in], b [1, out] → y [B, out] = x·wᵀ + b.
template <typename T>
Mat<T> linear_forward(const Mat<T>& x, const Mat<T>& w, const Mat<T>& b) {
  Mat<T> y = matmul<T>(x, Op::N, w, Op::T);
  y.rowwise() += b.row(0);
  return y;
}

/// The three gradients of a Linear layer.
template <typename T>
struct LinearGrads {
  Mat<T> dx;  ///< [B, in]   = dy · w
  Mat<T> dw;  ///< [out, in] = dyᵀ · x
  Mat<T> db;  ///< [1, out]  = Σ over the batch of dy
};

/// Linear backward. x [B, in], w [out, in], dy [B, out].
template <typename T>
LinearGrads<T> linear_backward(const Mat<T>& x, const Mat<T>& w, const Mat<T>& dy) {
  return {matmul<T>(dy, Op::N, w, Op::N), matmul<T>(dy, Op::T, x, Op::N), dy.colwise().sum()};
}

/// ReLU forward, elementwise: 0 where x <= 0, else x. A NaN stays NaN, as
/// in PyTorch (relu is clamp_min(x, 0), which propagates NaN): a
/// mixed-precision library must never turn a NaN into a quiet 0.
template <typename T>
Mat<T> relu_forward(const Mat<T>& x) {
  return x.unaryExpr([](T v) { return v <= T(0) ? T(0) : v; });
}

/// ReLU backward: 0 where the ReLU's output (equivalently its input) is
/// <= 0, else dy — PyTorch's threshold_backward(dy, y, 0) on the saved
/// output (tools/autograd/derivatives.yaml; aten/src/ATen/native/
/// Activation.cpp), so a NaN output passes dy through.
template <typename T>
Mat<T> relu_backward(const Mat<T>& y, const Mat<T>& dy) {
  return dy.binaryExpr(y, [](T g, T v) { return v <= T(0) ? T(0) : g; });
}

/// GELU of one value.
template <typename T>
T gelu(T x, GeluApproximation a) {
  if (a == GeluApproximation::tanh) {
    const T k = T(0.7978845608028654);  // √(2/π)
    return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
  }
  return T(0.5) * x * (T(1) + std::erf(x * T(0.7071067811865476)));  // x/√2
}

/// dGELU/dx of one value.
template <typename T>
T gelu_grad(T x, GeluApproximation a) {
  if (a == GeluApproximation::tanh) {
    const T k = T(0.7978845608028654);
    const T t = std::tanh(k * (x + T(0.044715) * x * x * x));
    return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k * (T(1) + T(3 * 0.044715) * x * x);
  }
  // Φ(x) + x·φ(x), φ the standard normal density.
  const T cdf = T(0.5) * (T(1) + std::erf(x * T(0.7071067811865476)));
  const T pdf = T(0.3989422804014327) * std::exp(T(-0.5) * x * x);  // 1/√(2π)
  return cdf + x * pdf;
}

/// GELU forward, elementwise.
template <typename T>
Mat<T> gelu_forward(const Mat<T>& x, GeluApproximation a) {
  return x.unaryExpr([a](T v) { return gelu(v, a); });
}

/// GELU backward: dy ⊙ gelu'(x), x the GELU's saved input.
template <typename T>
Mat<T> gelu_backward(const Mat<T>& x, const Mat<T>& dy, GeluApproximation a) {
  return dy.binaryExpr(x, [a](T g, T v) { return g * gelu_grad(v, a); });
}

/// Throws std::invalid_argument unless labels has one class id in
/// [0, classes) per row (PyTorch: "Target 10 is out of bounds.").
inline void check_labels(Eigen::Index rows, Eigen::Index classes, const std::vector<int>& labels) {
  if (static_cast<Eigen::Index>(labels.size()) != rows)
    throw std::invalid_argument("cross_entropy: " + std::to_string(labels.size()) + " labels for " +
                                std::to_string(rows) + " rows of logits");
  for (int y : labels)
    if (y < 0 || y >= classes)
      throw std::invalid_argument("cross_entropy: target " + std::to_string(y) +
                                  " is out of bounds (classes 0.." + std::to_string(classes - 1) + ")");
}

/// Mean softmax cross-entropy (PyTorch's F.cross_entropy, reduction='mean').
/// logits [B, C], labels B class ids. One implementation with Chapter 4's:
/// cross_entropy_rows of softmax_math.hpp with its default options (no
/// ignored class, no label smoothing), whose order of operations is this
/// function's: each row's max first (so nothing overflows), Σ exp(z − max)
/// left to right, log(sum) − (z_y − max), the rows' sum divided by B.
template <typename T>
T cross_entropy_forward(const Mat<T>& logits, const std::vector<int>& labels) {
  check_labels(logits.rows(), logits.cols(), labels);
  const auto logit = [&](std::int64_t i, std::int64_t j) { return logits(i, j); };
  const auto target = [&](std::int64_t i) { return std::int64_t{labels[static_cast<std::size_t>(i)]}; };
  const LossTotal<T> t =
      cross_entropy_rows<T>(logit, logits.rows(), logits.cols(), target, -100, T(0), [](std::int64_t, T) {});
  return reduce_loss(t, Reduction::mean);
}

/// Gradient of dloss · cross_entropy_forward: [B, C] = (softmax − onehot)·(dloss/B).
/// dloss is the gradient arriving from above: 1 for the plain loss, the loss
/// scale S when the loss was multiplied by S (GradScaler::scale). Chapter 4's
/// cross_entropy_backward_row with its default options.
template <typename T>
Mat<T> cross_entropy_backward(const Mat<T>& logits, const std::vector<int>& labels, T dloss) {
  check_labels(logits.rows(), logits.cols(), labels);
  const T g = row_gradient(dloss, logits.rows(), Reduction::mean);
  Mat<T> d(logits.rows(), logits.cols());
  for (Eigen::Index i = 0; i < logits.rows(); ++i)
    cross_entropy_backward_row<T>([&](std::int64_t j) { return logits(i, j); }, logits.cols(),
                                  labels[static_cast<std::size_t>(i)], -100, T(0), g,
                                  [&](std::int64_t j, T v) { d(i, j) = v; });
  return d;
}

/// Throws std::invalid_argument unless prediction and target have one shape.
inline void check_same_shape(Eigen::Index r1, Eigen::Index c1, Eigen::Index r2, Eigen::Index c2) {
  if (r1 != r2 || c1 != c2)
    throw std::invalid_argument("mse: prediction is " + shape_string(r1, c1) + " but target is " +
                                shape_string(r2, c2));
}

/// Mean squared error over all elements (PyTorch's MSELoss, reduction='mean').
template <typename T>
T mse_forward(const Mat<T>& pred, const Mat<T>& target) {
  check_same_shape(pred.rows(), pred.cols(), target.rows(), target.cols());
  return (pred - target).squaredNorm() / T(pred.size());
}

/// Gradient of dloss · mse_forward: 2·dloss·(pred − target)/N, N all elements.
template <typename T>
Mat<T> mse_backward(const Mat<T>& pred, const Mat<T>& target, T dloss) {
  check_same_shape(pred.rows(), pred.cols(), target.rows(), target.cols());
  return (pred - target) * (T(2) * dloss / T(pred.size()));
}

}  // namespace layer_math

}  // namespace mpt
