// Chapter 02 — loss scaling and FP32 master weights.
// Depends on: layers.hpp, gemm.hpp.
//
// Every function here has the same shape: widen the stored inputs to FP32
// (exact), run layer_math<float> or one GEMM, round the result into the
// run's precision. The rounding points are the whole point of the file.
#include "mpt/nn/layers.hpp"

#include <utility>

namespace mpt {

namespace {

void require_precision(Precision have, Precision want, const std::string& what) {
  if (have != want)
    throw std::invalid_argument(what + " is " + std::string(precision_name(have)) +
                                " but the layer computes in " +
                                std::string(precision_name(want)) +
                                "; every operand of a layer shares the run's precision");
}

void require_shape(const std::string& what, Eigen::Index r, Eigen::Index c, Eigen::Index want_r,
                   Eigen::Index want_c) {
  if (r != want_r || c != want_c)
    throw std::invalid_argument(what + " is " + shape_string(r, c) + ", expected " +
                                shape_string(want_r, want_c));
}

// grad += widen(round(g into p)): the low-precision gradient reaching FP32.
void accumulate_grad(Parameter& param, const MatrixF& g, Precision p) {
  require_shape(param.name + ".grad", param.grad.rows(), param.grad.cols(), g.rows(), g.cols());
  if (p == Precision::fp32) param.grad += g;
  else param.grad += Tensor::from_fp32(g, p).to_fp32();
}

}  // namespace

// --- parameters ----------------------------------------------------------------

Parameter make_parameter(std::string name, MatrixF init, Precision p) {
  Parameter param;
  param.name = std::move(name);
  param.grad = MatrixF::Zero(init.rows(), init.cols());
  param.master = std::move(init);
  if (p == Precision::fp16) param.model_fp16 = Tensor::from_fp32(param.master, p).fp16();
  if (p == Precision::bf16) param.model_bf16 = Tensor::from_fp32(param.master, p).bf16();
  return param;
}

Precision model_precision(const Parameter& p) {
  if (p.model_fp16.size() > 0) return Precision::fp16;
  if (p.model_bf16.size() > 0) return Precision::bf16;
  return Precision::fp32;
}

MatrixRef model_copy(const Parameter& p) {
  switch (model_precision(p)) {
    case Precision::fp16: return p.model_fp16;
    case Precision::bf16: return p.model_bf16;
    case Precision::fp32: break;
  }
  return p.master;
}

void refresh_model_copy(Parameter& p) {
  switch (model_precision(p)) {
    case Precision::fp16: p.model_fp16 = Tensor::from_fp32(p.master, Precision::fp16).fp16(); break;
    case Precision::bf16: p.model_bf16 = Tensor::from_fp32(p.master, Precision::bf16).bf16(); break;
    case Precision::fp32: break;
  }
}

// --- Linear ----------------------------------------------------------------------

Tensor linear_forward(const Tensor& x, const Parameter& weight, const Parameter& bias) {
  const Precision p = x.precision();
  require_precision(model_precision(weight), p, weight.name);
  require_precision(model_precision(bias), p, bias.name);
  require_shape(weight.name, weight.master.rows(), weight.master.cols(), weight.master.rows(),
                x.cols());
  // y [B, out] = x [B, in] · Wᵀ [in, out] + b: one GEMM, bias in the epilogue.
  return gemm_bias(x, Op::N, model_copy(weight), Op::T, model_copy(bias), p);
}

Tensor linear_backward(const Tensor& x, const Tensor& dy, Parameter& weight, Parameter& bias,
                       bool want_dx) {
  const Precision p = dy.precision();
  require_precision(x.precision(), p, "the saved input");
  require_precision(model_precision(weight), p, weight.name);
  require_precision(model_precision(bias), p, bias.name);
  require_shape("dy", dy.rows(), dy.cols(), x.rows(), weight.master.rows());
  // dW [out, in] = dyᵀ [out, B] · x [B, in]; FP32 accumulation, stored in p.
  const MatrixF dyf = dy.to_fp32();
  accumulate_grad(weight, matmul<float>(dyf, Op::T, x.to_fp32(), Op::N), p);
  // db [1, out] = Σ_B dy: an FP32 reduction, stored in p.
  accumulate_grad(bias, dyf.colwise().sum(), p);
  if (!want_dx) return Tensor(p, 0, 0);
  // dx [B, in] = dy [B, out] · W [out, in].
  return gemm(dy, Op::N, model_copy(weight), Op::N, p);
}

// --- activations -------------------------------------------------------------------

Tensor relu_forward(const Tensor& x) {
  return Tensor::from_fp32(layer_math::relu_forward<float>(x.to_fp32()), x.precision());
}

Tensor relu_backward(const Tensor& y, const Tensor& dy) {
  require_shape("dy", dy.rows(), dy.cols(), y.rows(), y.cols());
  return Tensor::from_fp32(layer_math::relu_backward<float>(y.to_fp32(), dy.to_fp32()),
                           dy.precision());
}

Tensor gelu_forward(const Tensor& x, GeluApproximation a) {
  return Tensor::from_fp32(layer_math::gelu_forward<float>(x.to_fp32(), a), x.precision());
}

Tensor gelu_backward(const Tensor& x, const Tensor& dy, GeluApproximation a) {
  require_shape("dy", dy.rows(), dy.cols(), x.rows(), x.cols());
  return Tensor::from_fp32(layer_math::gelu_backward<float>(x.to_fp32(), dy.to_fp32(), a),
                           dy.precision());
}

// --- losses ----------------------------------------------------------------------------

float cross_entropy_loss(const Tensor& logits, const std::vector<int>& labels) {
  return layer_math::cross_entropy_forward<float>(logits.to_fp32(), labels);
}

Tensor cross_entropy_backward(const Tensor& logits, const std::vector<int>& labels, float dloss) {
  return Tensor::from_fp32(
      layer_math::cross_entropy_backward<float>(logits.to_fp32(), labels, dloss),
      logits.precision());
}

float mse_loss(const Tensor& pred, const MatrixF& target) {
  return layer_math::mse_forward<float>(pred.to_fp32(), target);
}

Tensor mse_backward(const Tensor& pred, const MatrixF& target, float dloss) {
  return Tensor::from_fp32(layer_math::mse_backward<float>(pred.to_fp32(), target, dloss),
                           pred.precision());
}

double accuracy(const Tensor& logits, const std::vector<int>& labels) {
  layer_math::check_labels(logits.rows(), logits.cols(), labels);
  if (logits.rows() == 0) return 0.0;
  const MatrixF z = logits.to_fp32();
  Eigen::Index hits = 0;
  for (Eigen::Index i = 0; i < z.rows(); ++i) {
    Eigen::Index arg = 0;
    z.row(i).maxCoeff(&arg);
    hits += arg == labels[static_cast<std::size_t>(i)];
  }
  return static_cast<double>(hits) / static_cast<double>(z.rows());
}

}  // namespace mpt
