// Chapter 02 — loss scaling and FP32 master weights: the activations.
// Depends on: activations.hpp.
#include "mpt/nn/layers/activations.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace mpt {

namespace {

// An elementwise op's matrix view of a tensor of any rank: [N, C, H, W] (a
// convolution's output) is read as [N, C·H·W], the same buffer.
Tensor as_rows(const Tensor& t) {
  if (t.dim() <= 2) return t;
  const std::int64_t n = t.size(0);
  return t.reshaped({n, n == 0 ? 0 : t.numel() / n});
}

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
  const MatrixF y = layer_math::relu_forward<float>(as_rows(xi).to_matrix());
  y_ = Tensor::from_matrix(y, op_.output).reshaped(xi.shape());
  trace(ctx, Phase::forward, path(), "relu", op_, {traced("x", xi)}, y_, "y");
  return y_;
}

Tensor ReLU::backward_impl(const Tensor& dy, Context& ctx) {
  require_same_shape(dy, y_, "relu");
  const MatrixF dx = layer_math::relu_backward<float>(as_rows(y_).to_matrix(), as_rows(dy).to_matrix());
  Tensor out = Tensor::from_matrix(dx, op_.input).reshaped(y_.shape());
  trace(ctx, Phase::backward, path(), "relu", op_, {traced("dy", dy), traced("y", y_)}, out, "dx");
  return out;
}

// --- GELU ----------------------------------------------------------------------------

Tensor GELU::forward_impl(const Tensor& x, Context& ctx) {
  op_ = ctx.decide("gelu", path(), {x.dtype()});
  require_f32_compute(op_, "gelu");
  x_ = ctx.cast(x, op_.input, path(), Phase::forward, "x");
  const MatrixF y = layer_math::gelu_forward<float>(as_rows(x_).to_matrix(), approximation_);
  Tensor out = Tensor::from_matrix(y, op_.output).reshaped(x_.shape());
  trace(ctx, Phase::forward, path(), "gelu", op_, {traced("x", x_)}, out, "y");
  return out;
}

Tensor GELU::backward_impl(const Tensor& dy, Context& ctx) {
  require_same_shape(dy, x_, "gelu");
  const MatrixF dx =
      layer_math::gelu_backward<float>(as_rows(x_).to_matrix(), as_rows(dy).to_matrix(), approximation_);
  Tensor out = Tensor::from_matrix(dx, op_.input).reshaped(x_.shape());
  trace(ctx, Phase::backward, path(), "gelu", op_, {traced("dy", dy), traced("x", x_)}, out, "dx");
  return out;
}

}  // namespace mpt
