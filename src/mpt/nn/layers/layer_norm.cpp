// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the LayerNorm layer.
// Depends on: layer_norm.hpp, norm_cpu.hpp (the forward, one row at a
// time), norm_math.hpp, welford.hpp; Chapter 1's rounding (gradients
// rounded into the parameters' dtype).
#include "mpt/nn/layers/layer_norm.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "mpt/formats/rounding.hpp"
#include "mpt/nn/cpu/norm_cpu.hpp"
#include "mpt/nn/layers/norm_math.hpp"
#include "mpt/nn/layers/welford.hpp"

namespace mpt {

namespace {

void require_f32_layer_norm(const OpPrecision& q) {
  if (q.compute != DType::f32)
    throw std::invalid_argument("layer_norm: the policy asks for " + std::string(dtype_name(q.compute)) +
                                " compute; layer_norm computes its statistics in f32; FP16 statistics are "
                                "Chapter 3's pitfalls, not a policy choice");
}

}  // namespace

LayerNorm::LayerNorm(Shape normalized_shape) : LayerNorm(std::move(normalized_shape), Options{}) {}

LayerNorm::LayerNorm(Shape normalized_shape, Options options)
    : normalized_shape_(std::move(normalized_shape)), options_(options) {
  bool ok = !normalized_shape_.empty();
  for (std::int64_t s : normalized_shape_) ok = ok && s >= 1;
  if (!ok)
    throw std::invalid_argument(
        "LayerNorm: normalized_shape must have at least one dimension, every size >= 1; got " +
        shape_string(normalized_shape_));
  if (!std::isfinite(options_.eps) || options_.eps < 0) {
    std::ostringstream o;
    o << options_.eps;
    throw std::invalid_argument("LayerNorm: eps must be finite and >= 0, got " + o.str());
  }
  if (options_.elementwise_affine) {
    const std::vector<float> ones(static_cast<std::size_t>(numel(normalized_shape_)), 1.0f);
    weight = Parameter("weight", Tensor::from_f32(ones.data(), normalized_shape_, DType::f32));
    bias = Parameter("bias", Tensor(DType::f32, normalized_shape_));
  }
}

std::string LayerNorm::who() const { return path().empty() ? "LayerNorm" : "LayerNorm " + path(); }

std::vector<Parameter*> LayerNorm::parameters() {
  if (!options_.elementwise_affine) return {};
  return {&weight, &bias};
}

void LayerNorm::set_path(std::string p) {
  Module::set_path(std::move(p));
  weight.name = path().empty() ? "weight" : path() + ".weight";
  bias.name = path().empty() ? "bias" : path() + ".bias";
}

void LayerNorm::apply_policy(const Policy& policy) {
  if (!options_.elementwise_affine) return;
  const DType d = policy.parameter_dtype("layer_norm", path());
  weight.set_model_dtype(d);
  bias.set_model_dtype(d);
}

Tensor LayerNorm::forward_impl(const Tensor& x, Context& ctx) {
  const std::size_t k = normalized_shape_.size();
  bool ok = static_cast<std::size_t>(x.dim()) >= k;
  for (std::size_t d = 0; ok && d < k; ++d) ok = x.shape()[x.shape().size() - k + d] == normalized_shape_[d];
  if (!ok)
    throw std::invalid_argument(who() + ": x is " + shape_string(x.shape()) + " but its last " +
                                std::to_string(k) + " dims must be normalized_shape " +
                                shape_string(normalized_shape_));
  for (std::int64_t s : x.shape())
    if (s < 1)
      throw std::invalid_argument(who() + ": x is " + shape_string(x.shape()) + "; every size must be >= 1");
  const bool affine = options_.elementwise_affine;
  std::vector<DType> inputs{x.dtype()};
  if (affine) inputs.push_back(weight.weights().dtype());
  op_ = ctx.decide("layer_norm", path(), inputs);
  require_f32_layer_norm(op_);
  x_ = ctx.cast(x, op_.input, path(), Phase::forward, "x");
  const std::int64_t d = numel(normalized_shape_), rows = x.numel() / d;
  const norm_math::Layout l{1, rows, d};
  std::vector<float> w, b;
  Tensor wt, bt;  // γ and β as the op reads them (Parameter::read_for_norm)
  if (affine) {
    wt = weight.read_for_norm(op_.input, ctx, path(), Phase::forward, "weight");
    bt = bias.read_for_norm(op_.input, ctx, path(), Phase::forward, "bias");
    w = widened(wt);
    b = widened(bt);
  }
  // The statistics of each row (double sums, rounded once into FP32),
  // whatever dtype x is stored in, and y from them in FP32: norm_math's
  // formulas, one row at a time (norm_cpu.hpp).
  std::vector<norm_math::Statistics> stats(static_cast<std::size_t>(rows));
  std::vector<float> mean(stats.size()), rstd(stats.size());
  Tensor out = norm_cpu::forward(x_, l, norm_math::AffineAxis::inner, affine ? w.data() : nullptr,
                                 affine ? b.data() : nullptr, static_cast<float>(options_.eps), op_.output,
                                 stats.data(), mean.data(), rstd.data());
  mean_ = Tensor::from_f32(mean.data(), {rows}, DType::f32);
  rstd_ = Tensor::from_f32(rstd.data(), {rows}, DType::f32);
  if (ctx.tracing()) {
    TraceEntry e{Phase::forward, path(),
                 "layer_norm",   {traced("x", x_)},
                 op_.compute,    {traced("y", out), traced("mean", mean_), traced("rstd", rstd_)}};
    if (affine) {
      e.inputs.push_back(traced("weight", wt));
      e.inputs.push_back(traced("bias", bt));
    }
    ctx.record(std::move(e));
  }
  return out;
}

Tensor LayerNorm::backward_impl(const Tensor& dy, Context& ctx) {
  if (dy.shape() != x_.shape())
    throw std::invalid_argument(who() + ": dy is " + shape_string(dy.shape()) + ", expected " +
                                shape_string(x_.shape()));
  const std::int64_t d = numel(normalized_shape_);
  const norm_math::Layout l{1, x_.numel() / d, d};
  const std::vector<float> xf = widened(x_), dyf = widened(dy), mean = widened(mean_), rstd = widened(rstd_);
  const bool affine = options_.elementwise_affine;
  std::vector<float> w, dw, db, dx;
  Tensor wt;  // γ as the op reads it, again (Linear reads its weight again in backward too)
  if (affine) {
    wt = weight.read_for_norm(op_.input, ctx, path(), Phase::backward, "weight");
    w = widened(wt);
    dw.resize(w.size());
    db.resize(w.size());
  }
  if (input_grad()) dx.resize(xf.size());
  norm_math::backward(xf.data(), dyf.data(), l, mean.data(), rstd.data(), affine ? w.data() : nullptr,
                      norm_math::AffineAxis::inner, true, input_grad() ? dx.data() : nullptr,
                      affine ? dw.data() : nullptr, affine ? db.data() : nullptr);
  const DType wd = weight.model_dtype(), bd = bias.model_dtype();
  if (affine) {
    // The gradients pass through the dtype γ and β were read in (and the
    // stored dtype, where that differs: Parameter::accumulate_grad).
    weight.accumulate_grad(dw.data(), static_cast<std::int64_t>(dw.size()), wt);
    bias.accumulate_grad(db.data(), static_cast<std::int64_t>(db.size()), bias.norm_read_dtype(op_.input));
  }
  Tensor out;
  if (input_grad()) out = Tensor::from_f32(dx.data(), x_.shape(), op_.input);
  if (ctx.tracing()) {
    TraceEntry e{Phase::backward, path(), "layer_norm", {traced("dy", dy), traced("x", x_)}, op_.compute, {}};
    if (affine) e.inputs.push_back(traced("weight", wt));
    if (input_grad()) e.outputs.push_back(traced("dx", out));
    if (affine) {
      e.outputs.push_back({"weight.grad", wd, weight.master.shape(),
                           static_cast<std::size_t>(weight.master.numel()) * bytes_per_element(wd)});
      e.outputs.push_back({"bias.grad", bd, bias.master.shape(),
                           static_cast<std::size_t>(bias.master.numel()) * bytes_per_element(bd)});
    }
    ctx.record(std::move(e));
  }
  return out;
}

}  // namespace mpt
