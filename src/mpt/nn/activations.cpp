// Chapter 02 — loss scaling and FP32 master weights: the activations.
// Depends on: activations.hpp.
#include "mpt/nn/activations.hpp"

#include <stdexcept>
#include <string>

namespace mpt {

namespace {

void require_same_shape(const Tensor& dy, const Tensor& saved, const char* who) {
  if (dy.shape() != saved.shape())
    throw std::invalid_argument(std::string(who) + ": dy is " + shape_string(dy.shape()) + ", expected " +
                                shape_string(saved.shape()));
}

void require_f32_compute(const OpPrecision& q, const char* op) {
  if (q.compute != DType::f32)
    throw std::invalid_argument(std::string(op) + ": the policy asks for " +
                                std::string(dtype_name(q.compute)) + " compute; it computes in f32");
}

void trace(Context& ctx, Phase phase, const std::string& path, const char* op, const OpPrecision& q,
           std::vector<TracedValue> in, const Tensor& out, const char* out_name) {
  if (ctx.tracing()) ctx.record({phase, path, op, std::move(in), q.compute, {traced(out_name, out)}});
}

}  // namespace

// --- ReLU ----------------------------------------------------------------------------

Tensor ReLU::forward_impl(const Tensor& x, Context& ctx) {
  op_ = ctx.decide("relu", path(), {x.dtype()});
  require_f32_compute(op_, "relu");
  const Tensor xi = ctx.cast(x, op_.input, path(), Phase::forward, "x");
  const MatrixF y = layer_math::relu_forward<float>(xi.to_matrix());
  y_ = Tensor::from_matrix(y, op_.output);
  trace(ctx, Phase::forward, path(), "relu", op_, {traced("x", xi)}, y_, "y");
  return y_;
}

Tensor ReLU::backward_impl(const Tensor& dy, Context& ctx) {
  require_same_shape(dy, y_, "relu");
  const MatrixF dx = layer_math::relu_backward<float>(y_.to_matrix(), dy.to_matrix());
  Tensor out = Tensor::from_matrix(dx, op_.input);
  trace(ctx, Phase::backward, path(), "relu", op_, {traced("dy", dy), traced("y", y_)}, out, "dx");
  return out;
}

// --- GELU ----------------------------------------------------------------------------

Tensor GELU::forward_impl(const Tensor& x, Context& ctx) {
  op_ = ctx.decide("gelu", path(), {x.dtype()});
  require_f32_compute(op_, "gelu");
  x_ = ctx.cast(x, op_.input, path(), Phase::forward, "x");
  const MatrixF y = layer_math::gelu_forward<float>(x_.to_matrix(), approximation_);
  Tensor out = Tensor::from_matrix(y, op_.output);
  trace(ctx, Phase::forward, path(), "gelu", op_, {traced("x", x_)}, out, "y");
  return out;
}

Tensor GELU::backward_impl(const Tensor& dy, Context& ctx) {
  require_same_shape(dy, x_, "gelu");
  const MatrixF dx = layer_math::gelu_backward<float>(x_.to_matrix(), dy.to_matrix(), approximation_);
  Tensor out = Tensor::from_matrix(dx, op_.input);
  trace(ctx, Phase::backward, path(), "gelu", op_, {traced("dy", dy), traced("x", x_)}, out, "dx");
  return out;
}

}  // namespace mpt
