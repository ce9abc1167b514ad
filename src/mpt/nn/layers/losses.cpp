// Chapter 02 — loss scaling and FP32 master weights: the losses.
// Depends on: losses.hpp.
#include "mpt/nn/layers/losses.hpp"

#include <stdexcept>
#include <string>

namespace mpt {

float cross_entropy_loss(const Tensor& logits, const std::vector<int>& labels) {
  return layer_math::cross_entropy_forward<float>(logits.to_matrix(), labels);
}

Tensor cross_entropy_backward(const Tensor& logits, const std::vector<int>& labels, float dloss) {
  return Tensor::from_matrix(layer_math::cross_entropy_backward<float>(logits.to_matrix(), labels, dloss),
                             logits.dtype());
}

float mse_loss(const Tensor& pred, const MatrixF& target) {
  return layer_math::mse_forward<float>(pred.to_matrix(), target);
}

Tensor mse_backward(const Tensor& pred, const MatrixF& target, float dloss) {
  return Tensor::from_matrix(layer_math::mse_backward<float>(pred.to_matrix(), target, dloss), pred.dtype());
}

namespace {

// The loss op's input as the policy wants it read; only f32 compute exists.
Tensor loss_input(const Tensor& x, const char* op, std::string_view path, Phase phase, Context& ctx,
                  OpPrecision& q) {
  q = ctx.decide(op, path, {x.dtype()});
  if (q.compute != DType::f32)
    throw std::invalid_argument(std::string(op) + ": the policy asks for " +
                                std::string(dtype_name(q.compute)) + " compute; the loss computes in f32");
  return ctx.cast(x, q.input, path, phase, "x");
}

void trace_loss(Context& ctx, Phase phase, std::string_view path, const char* op, const OpPrecision& q,
                const Tensor& in, const Tensor* grad) {
  if (!ctx.tracing()) return;
  TraceEntry e{phase, std::string(path), op, {traced("x", in)}, q.compute, {}};
  if (grad) e.outputs.push_back(traced("dx", *grad));
  else e.outputs.push_back({"loss", DType::f32, {}, sizeof(float)});
  ctx.record(std::move(e));
}

}  // namespace

float cross_entropy_loss(const Tensor& logits, const std::vector<int>& labels, Context& ctx,
                         std::string_view path) {
  OpPrecision q;
  const Tensor z = loss_input(logits, "cross_entropy", path, Phase::forward, ctx, q);
  const float loss = cross_entropy_loss(z, labels);
  trace_loss(ctx, Phase::forward, path, "cross_entropy", q, z, nullptr);
  return loss;
}

Tensor cross_entropy_backward(const Tensor& logits, const std::vector<int>& labels, float dloss, Context& ctx,
                              std::string_view path) {
  OpPrecision q;
  const Tensor z = loss_input(logits, "cross_entropy", path, Phase::backward, ctx, q);
  const Tensor dz = cross_entropy_backward(z, labels, dloss);
  trace_loss(ctx, Phase::backward, path, "cross_entropy", q, z, &dz);
  return ctx.cast(dz, logits.dtype(), path, Phase::backward, "dx");
}

float mse_loss(const Tensor& pred, const MatrixF& target, Context& ctx, std::string_view path) {
  OpPrecision q;
  const Tensor p = loss_input(pred, "mse_loss", path, Phase::forward, ctx, q);
  const float loss = mse_loss(p, target);
  trace_loss(ctx, Phase::forward, path, "mse_loss", q, p, nullptr);
  return loss;
}

Tensor mse_backward(const Tensor& pred, const MatrixF& target, float dloss, Context& ctx,
                    std::string_view path) {
  OpPrecision q;
  const Tensor p = loss_input(pred, "mse_loss", path, Phase::backward, ctx, q);
  const Tensor dp = mse_backward(p, target, dloss);
  trace_loss(ctx, Phase::backward, path, "mse_loss", q, p, &dp);
  return ctx.cast(dp, pred.dtype(), path, Phase::backward, "dx");
}

double accuracy(const Tensor& logits, const std::vector<int>& labels) {
  layer_math::check_labels(logits.rows(), logits.cols(), labels);
  if (logits.rows() == 0) return 0.0;
  const MatrixF z = logits.to_matrix();
  Eigen::Index hits = 0;
  for (Eigen::Index i = 0; i < z.rows(); ++i) {
    Eigen::Index arg = 0;
    z.row(i).maxCoeff(&arg);
    hits += arg == labels[static_cast<std::size_t>(i)];
  }
  return static_cast<double>(hits) / static_cast<double>(z.rows());
}

}  // namespace mpt
