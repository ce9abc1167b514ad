// Chapter 02 — loss scaling and FP32 master weights: the Linear layer.
// Depends on: linear.hpp, gemm.hpp; Chapter 1's rounding (gradients rounded
// into the weights' dtype).
#include "mpt/nn/layers/linear.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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
  op_ = ctx.decide_fp8_gemm("linear", path(), {x.dtype(), weight.weights().dtype()});
  require_f32_linear(op_);
  fp8_ran_ = is_fp8(op_.input);
  if (fp8_ran_) return forward_fp8(x, ctx);
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
  const std::int64_t batch = fp8_ran_ ? fp8_batch_ : x_.size(0), out = weight.master.size(0);
  require_shape("dy", dy_out.shape(), {batch, out});
  if (fp8_ran_) return backward_fp8(dy_out, ctx);
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

// --- Chapter 7: the FP8 GEMMs ---------------------------------------------------------

const char* fp8_role_name(Fp8Role r) {
  switch (r) {
    case Fp8Role::input: return "input";
    case Fp8Role::weight: return "weight";
    case Fp8Role::grad_output: return "grad_output";
  }
  return "?";
}

// y = x·Wᵀ + b through the layer's FP8 state: x and W (the FP32 master,
// the policy's model copy) quantized there, the bias read in the output
// dtype and added to the descaled FP32 accumulator.
Tensor Linear::forward_fp8(const Tensor& x, Context& ctx) {
  if (!fp8)
    throw std::invalid_argument(weight.name + ": the policy asks for an FP8 GEMM (" +
                                std::string(dtype_name(op_.input)) +
                                ") but the layer has no FP8 scaling state (fp8::attach_fp8)");
  if (fp8->forward_dtype() != op_.input)
    throw std::invalid_argument(weight.name + ": the policy reads " + std::string(dtype_name(op_.input)) +
                                " but the FP8 recipe stores the input in " +
                                std::string(dtype_name(fp8->forward_dtype())));
  x_ = Tensor();  // the FP8 state keeps its own copies
  x_f32_.reset();
  w_f32_.reset();
  w_read_ = Tensor();
  fp8_batch_ = x.size(0);
  const Tensor b = bias.read(op_.output, ctx, path(), Phase::forward, "bias");
  LinearFp8::Forward f = fp8->forward(x, weight.master, b, op_.output);
  if (ctx.tracing())
    ctx.record({Phase::forward,
                path(),
                "linear",
                {f.x, f.weight, traced("bias", b)},
                op_.compute,
                {traced("y", f.y)}});
  return std::move(f.y);
}

// dx = dy·W and dW = dyᵀ·x as FP8 GEMMs in the layer's FP8 state; db = Σ_B
// dy in FP32 from dy as it arrived (not from its FP8 copy). dW and db are
// added into the FP32 grads as FP32 (the master was read).
Tensor Linear::backward_fp8(const Tensor& dy_out, Context& ctx) {
  LinearFp8::Backward g = fp8->backward(dy_out, input_grad(), op_.output);
  require_shape(weight.name + ".grad", weight.grad.shape(), weight.master.shape());
  weight.accumulate_grad(g.dw.data(), static_cast<std::int64_t>(g.dw.size()), DType::f32);
  const F32Matrix dyf(dy_out);
  MatrixF db = dyf.map().colwise().sum();
  bias.accumulate_grad(db.data(), db.size(), DType::f32);
  if (ctx.tracing()) {
    TraceEntry e{Phase::backward, path(), "linear", {g.dy, g.x, g.weight}, op_.compute, {}};
    if (input_grad()) e.outputs.push_back(traced("dx", g.dx));
    e.outputs.push_back({"weight.grad", DType::f32, weight.master.shape(),
                         static_cast<std::size_t>(weight.master.numel()) * bytes_per_element(DType::f32)});
    e.outputs.push_back({"bias.grad", DType::f32, bias.master.shape(),
                         static_cast<std::size_t>(bias.master.numel()) * bytes_per_element(DType::f32)});
    ctx.record(std::move(e));
  }
  return std::move(g.dx);
}

}  // namespace mpt
