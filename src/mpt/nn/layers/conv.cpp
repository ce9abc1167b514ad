// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the Conv2d layer.
// Depends on: conv.hpp, conv_math.hpp, gemm.hpp; Chapter 1's rounding
// (gradients rounded into the weights' dtype).
#include "mpt/nn/layers/conv.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mpt/formats/rounding.hpp"
#include "mpt/nn/cpu/gemm.hpp"

namespace mpt {

namespace {

void check_options(const Conv2dOptions& o) {
  if (o.stride < 1 || o.padding < 0)
    throw std::invalid_argument("Conv2d: stride must be >= 1 and padding >= 0, got stride " +
                                std::to_string(o.stride) + " and padding " + std::to_string(o.padding));
}

// The values of a tensor widened to f32 (exact).
}  // namespace

Conv2d::Conv2d(int in_channels, int out_channels, int kernel_size, Rng& rng, Conv2dOptions options)
    : options_(options) {
  if (in_channels < 1 || out_channels < 1 || kernel_size < 1)
    throw std::invalid_argument("Conv2d: in_channels, out_channels and kernel_size must be >= 1, got " +
                                std::to_string(in_channels) + ", " + std::to_string(out_channels) + ", " +
                                std::to_string(kernel_size));
  check_options(options);
  const double fan_in = static_cast<double>(in_channels) * kernel_size * kernel_size;
  const double bound = 1.0 / std::sqrt(fan_in);
  weight =
      Parameter("weight", uniform_f32({out_channels, in_channels, kernel_size, kernel_size}, bound, rng));
  if (options.bias) bias = Parameter("bias", uniform_f32({out_channels}, bound, rng));
}

Conv2d::Conv2d(Tensor w, Tensor b, Conv2dOptions options) : options_(options) {
  check_options(options);
  if (w.dim() != 4 || w.size(2) != w.size(3) || w.numel() == 0)
    throw std::invalid_argument("Conv2d: weight must be [out, in, k, k] with a square kernel, got " +
                                shape_string(w.shape()));
  if (options.bias && (b.dim() != 1 || b.size(0) != w.size(0)))
    throw std::invalid_argument("Conv2d: bias must be [" + std::to_string(w.size(0)) + "] for weight " +
                                shape_string(w.shape()) + ", got " + shape_string(b.shape()));
  if (!options.bias && b.numel() != 0)
    throw std::invalid_argument("Conv2d: options.bias is false but a bias " + shape_string(b.shape()) +
                                " was given; pass Tensor() or set options.bias");
  weight = Parameter("weight", std::move(w));
  if (options.bias) bias = Parameter("bias", std::move(b));
}

std::vector<Parameter*> Conv2d::parameters() {
  if (options_.bias) return {&weight, &bias};
  return {&weight};
}

void Conv2d::set_path(std::string p) {
  Module::set_path(std::move(p));
  weight.name = path().empty() ? "weight" : path() + ".weight";
  bias.name = path().empty() ? "bias" : path() + ".bias";
}

void Conv2d::apply_policy(const Policy& policy) {
  const DType d = policy.parameter_dtype("conv2d", path());
  weight.set_model_dtype(d);
  if (options_.bias) bias.set_model_dtype(d);
}

std::string Conv2d::who() const { return path().empty() ? "Conv2d" : "Conv2d " + path(); }

conv_math::Geometry Conv2d::geometry(const Tensor& x) const {
  const std::int64_t c = in_channels(), k = kernel_size();
  if (x.dim() != 4 || x.size(1) != c)
    throw std::invalid_argument(who() + ": x is " + shape_string(x.shape()) + " but the layer takes [N, " +
                                std::to_string(c) + ", H, W]");
  conv_math::Geometry g;
  g.n = x.size(0);
  g.c = c;
  g.h = x.size(2);
  g.w = x.size(3);
  g.win = {k, options_.stride, options_.padding};
  if (g.h + 2 * g.win.padding < k || g.w + 2 * g.win.padding < k)
    throw std::invalid_argument(who() + ": the padded input is " + std::to_string(g.h + 2 * g.win.padding) +
                                "x" + std::to_string(g.w + 2 * g.win.padding) + " but the kernel is " +
                                std::to_string(k) + "x" + std::to_string(k) +
                                "; H and W + 2*padding must be >= kernel_size");
  return g;
}

Tensor Conv2d::forward_impl(const Tensor& x, Context& ctx) {
  const conv_math::Geometry g = geometry(x);
  op_ = ctx.decide("conv2d", path(), {x.dtype(), weight.weights().dtype()});
  if (op_.compute != DType::f32)
    throw std::invalid_argument("conv2d: the policy asks for " + std::string(dtype_name(op_.compute)) +
                                " compute; conv2d accumulates in f32 (as linear does)");
  x_ = ctx.cast(x, op_.input, path(), Phase::forward, "x");
  const Tensor w = weight.read(op_.input, ctx, path(), Phase::forward, "weight");
  Tensor b;
  if (options_.bias) b = bias.read(op_.input, ctx, path(), Phase::forward, "bias");
  // The column matrix in the input dtype: every entry is a value x_ holds
  // (or a padding zero), so storing it rounds nothing.
  const std::vector<float> xw = widened(x_);
  const MatrixF colsf = conv_math::im2col<float>(xw.data(), g);
  const Tensor cols = Tensor::from_matrix(colsf, op_.input);
  // [N·H'·W', out] = cols [N·H'·W', C·k·k] · Wᵀ [C·k·k, out] + b: one GEMM
  // with FP32 accumulation, kept in FP32 (the accumulator) ...
  const std::int64_t out = out_channels();
  const Tensor acc =
      gemm(cols, Op::N, w.reshaped({out, g.patch()}), Op::T, DType::f32, options_.bias ? &b : nullptr);
  // ... laid out as NCHW and rounded once into the output dtype (rounding
  // commutes with the permutation: this is the GEMM's one rounding).
  const MatrixF yf = conv_math::rows_to_nchw<float>(acc.f32_data(), g.n, out, g.out_plane());
  Tensor y = Tensor::from_f32(yf.data(), {g.n, out, g.oh(), g.ow()}, op_.output);
  if (ctx.tracing()) {
    TraceEntry e{Phase::forward, path(), "conv2d", {traced("x", x_), traced("weight", w)}, op_.compute, {}};
    if (options_.bias) e.inputs.push_back(traced("bias", b));
    e.outputs.push_back(traced("y", y));
    ctx.record(std::move(e));
  }
  return y;
}

Tensor Conv2d::backward_impl(const Tensor& dy_out, Context& ctx) {
  const conv_math::Geometry g = geometry(x_);
  const std::int64_t out = out_channels();
  const Shape want{g.n, out, g.oh(), g.ow()};
  if (dy_out.shape() != want)
    throw std::invalid_argument(who() + ": dy is " + shape_string(dy_out.shape()) + ", expected " +
                                shape_string(want));
  // The backward GEMMs read dy in the forward's input dtype, like x and W.
  const Tensor dy = ctx.cast(dy_out, op_.input, path(), Phase::backward, "dy");
  const Tensor w = weight.read(op_.input, ctx, path(), Phase::backward, "weight");
  const DType wd = w.dtype();  // the weight's gradient passes through the dtype it was read in
  // dY as rows [N·H'·W', out]: values dy holds, so exact in f32.
  const std::vector<float> dyw = widened(dy);
  const MatrixF d = conv_math::nchw_to_rows<float>(dyw.data(), g.n, out, g.out_plane());
  // The column matrix again, from the saved input (exact, as in forward).
  const std::vector<float> xw = widened(x_);
  const MatrixF cols = conv_math::im2col<float>(xw.data(), g);
  // dW [out, C·k·k] = dYᵀ · cols: FP32 accumulation, rounded into the
  // dtype the weight was read in, added to the FP32 grad.
  MatrixF dw;
  multiply_into(dw, d, Op::T, cols, Op::N);
  weight.accumulate_grad(dw.data(), dw.size(), w);
  // db [out] = Σ dY: an FP32 reduction, rounded into the dtype forward read the bias in.
  if (options_.bias) {
    MatrixF db = d.colwise().sum();
    bias.accumulate_grad(db.data(), db.size(), op_.input);
  }
  Tensor dx;
  if (input_grad()) {
    // dcols [N·H'·W', C·k·k] = dY · W with FP32 accumulation, scattered back
    // (overlapping windows summed in FP32), rounded once into x's dtype.
    const Tensor drows = Tensor::from_matrix(d, op_.input);  // exact: dy's own values
    const Tensor dcols = gemm(drows, Op::N, w.reshaped({out, g.patch()}), Op::N, DType::f32);
    const MatrixF dxf = conv_math::col2im<float>(dcols.f32_data(), g);
    dx = Tensor::from_f32(dxf.data(), x_.shape(), op_.input);
  }
  if (ctx.tracing()) {
    TraceEntry e{Phase::backward, path(), "conv2d", {traced("dy", dy), traced("x", x_), traced("weight", w)},
                 op_.compute,     {}};
    if (input_grad()) e.outputs.push_back(traced("dx", dx));
    e.outputs.push_back({"weight.grad", wd, weight.master.shape(),
                         static_cast<std::size_t>(weight.master.numel()) * bytes_per_element(wd)});
    if (options_.bias) {
      const DType bd = bias.model_dtype();
      e.outputs.push_back({"bias.grad", bd, bias.master.shape(),
                           static_cast<std::size_t>(bias.master.numel()) * bytes_per_element(bd)});
    }
    ctx.record(std::move(e));
  }
  return dx;
}

}  // namespace mpt
