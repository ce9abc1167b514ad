// Chapter 02 — loss scaling and FP32 master weights: the Linear layer.
// Depends on: linear.hpp, gemm.hpp; Chapter 1's rounding (gradients rounded
// into the weights' dtype).
#include "mpt/nn/layers/linear.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "mpt/formats/rounding.hpp"
#include "mpt/nn/cpu/gemm.hpp"

namespace mpt {

namespace {

void require_shape(const std::string& what, const Shape& have, const Shape& want) {
  if (have != want)
    throw std::invalid_argument(what + " is " + shape_string(have) + ", expected " + shape_string(want));
}

void require_f32_linear(const OpPrecision& q) {
  if (q.compute != DType::f32)
    throw std::invalid_argument("linear: the policy asks for " + std::string(dtype_name(q.compute)) +
                                " compute; linear accumulates in f32 (the FP16-accumulating GEMM is "
                                "the pitfall gemm_fp16_accumulate, not a policy choice)");
}

}  // namespace

Linear::Linear(int in_features, int out_features, Rng& rng) {
  if (in_features < 1 || out_features < 1)
    throw std::invalid_argument("Linear: sizes must be >= 1, got " + std::to_string(in_features) + " -> " +
                                std::to_string(out_features));
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  Tensor w = uniform_f32({out_features, in_features}, bound, rng);
  Tensor b = uniform_f32({out_features}, bound, rng);
  weight = Parameter("weight", std::move(w));
  bias = Parameter("bias", std::move(b));
}

Linear::Linear(Tensor w, Tensor b) {
  if (w.dim() != 2 || b.dim() != 1 || b.size(0) != w.size(0))
    throw std::invalid_argument("Linear: weight must be [out, in] and bias [out]; got " +
                                shape_string(w.shape()) + " and " + shape_string(b.shape()));
  weight = Parameter("weight", std::move(w));
  bias = Parameter("bias", std::move(b));
}

void Linear::set_path(std::string p) {
  Module::set_path(std::move(p));
  weight.name = path().empty() ? "weight" : path() + ".weight";
  bias.name = path().empty() ? "bias" : path() + ".bias";
}

void Linear::apply_policy(const Policy& policy) {
  const DType d = policy.parameter_dtype("linear", path());
  weight.set_model_dtype(d);
  bias.set_model_dtype(d);
}

Tensor Linear::forward_impl(const Tensor& x, Context& ctx) {
  if (x.dim() != 2 || x.size(1) != weight.master.size(1))
    throw std::invalid_argument(weight.name + ": x is " + shape_string(x.shape()) +
                                " but the layer takes [B, " + std::to_string(weight.master.size(1)) + "]");
  op_ = ctx.decide("linear", path(), {x.dtype(), weight.weights().dtype()});
  require_f32_linear(op_);
  x_ = ctx.cast(x, op_.input, path(), Phase::forward, "x");
  const Tensor w = weight.read(op_.input, ctx, path(), Phase::forward, "weight");
  const Tensor b = bias.read(op_.input, ctx, path(), Phase::forward, "bias");
  // y [B, out] = x [B, in] · Wᵀ [in, out] + b: one GEMM, bias in the epilogue
  // (gemm()'s, on the operands widened once for forward and backward).
  x_f32_.emplace(x_);
  w_read_ = w;
  w_version_ = w.version();
  w_f32_.emplace(w_read_);
  Tensor y = gemm(*x_f32_, Op::N, *w_f32_, Op::T, op_.output, &b);
  if (ctx.tracing())
    ctx.record({Phase::forward,
                path(),
                "linear",
                {traced("x", x_), traced("weight", w), traced("bias", b)},
                op_.compute,
                {traced("y", y)}});
  return y;
}

Tensor Linear::backward_impl(const Tensor& dy_out, Context& ctx) {
  const std::int64_t batch = x_.size(0), out = weight.master.size(0);
  require_shape("dy", dy_out.shape(), {batch, out});
  // The backward GEMMs read dy in the forward's input dtype, like x and W.
  const Tensor dy = ctx.cast(dy_out, op_.input, path(), Phase::backward, "dy");
  const Tensor w = weight.read(op_.input, ctx, path(), Phase::backward, "weight");
  // The gradients pass through the dtype the weights were read in: op_.input.
  const DType wd = w.dtype(), bd = op_.input;
  // dW [out, in] = dyᵀ [out, B] · x [B, in]: FP32 accumulation, rounded into
  // the dtype the weight was read in, added to the FP32 grad.
  // x and W as forward widened them (W again if it changed since).
  if (!x_f32_) x_f32_.emplace(x_);
  if (!w_f32_ || !w.shares_storage_with(w_read_) || w.version() != w_version_) {
    w_read_ = w;
    w_f32_.emplace(w_read_);
  }
  const F32Matrix dyf(dy);
  MatrixF dw;
  multiply_into(dw, dyf.map(), Op::T, x_f32_->map(), Op::N);
  require_shape(weight.name + ".grad", weight.grad.shape(), weight.master.shape());
  weight.accumulate_grad(dw.data(), dw.size(), w);
  // db [out] = Σ_B dy: an FP32 reduction, rounded into the dtype forward read the bias in.
  MatrixF db = dyf.map().colwise().sum();
  bias.accumulate_grad(db.data(), db.size(), bd);
  Tensor dx;
  // dx [B, in] = dy [B, out] · W [out, in], stored in the input's dtype.
  if (input_grad()) dx = gemm(dyf, Op::N, *w_f32_, Op::N, op_.input);
  x_f32_.reset();
  w_f32_.reset();
  w_read_ = Tensor();
  if (ctx.tracing()) {
    TraceEntry e{Phase::backward, path(), "linear", {traced("dy", dy), traced("x", x_), traced("weight", w)},
                 op_.compute,     {}};
    if (input_grad()) e.outputs.push_back(traced("dx", dx));
    e.outputs.push_back({"weight.grad", wd, weight.master.shape(),
                         static_cast<std::size_t>(weight.master.numel()) * bytes_per_element(wd)});
    e.outputs.push_back({"bias.grad", bd, bias.master.shape(),
                         static_cast<std::size_t>(bias.master.numel()) * bytes_per_element(bd)});
    ctx.record(std::move(e));
  }
  return dx;
}

}  // namespace mpt
