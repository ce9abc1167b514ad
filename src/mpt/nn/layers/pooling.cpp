// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the pooling
// layers, Flatten and Unflatten.
// Depends on: pooling.hpp, conv_math.hpp.
#include "mpt/nn/layers/pooling.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mpt {

namespace {

std::string who(const char* kind, const std::string& path) {
  return path.empty() ? std::string(kind) : std::string(kind) + " " + path;
}

conv_math::Window2d pool_window(const char* kind, int kernel, int stride, int padding) {
  if (kernel < 1 || stride < 0)
    throw std::invalid_argument(std::string(kind) +
                                ": kernel_size must be >= 1 and stride >= 0 (0: = kernel_size), got " +
                                std::to_string(kernel) + " and " + std::to_string(stride));
  if (padding < 0 || padding > kernel / 2)
    throw std::invalid_argument(std::string(kind) + ": padding must be in 0.." + std::to_string(kernel / 2) +
                                " (at most half the kernel size " + std::to_string(kernel) + "), got " +
                                std::to_string(padding));
  return {kernel, stride == 0 ? kernel : stride, padding};
}

conv_math::Geometry pool_geometry(const std::string& name, const Shape& x, const conv_math::Window2d& win) {
  if (x.size() != 4)
    throw std::invalid_argument(name + ": x is " + shape_string(x) + "; pooling takes [N, C, H, W]");
  conv_math::Geometry g;
  g.n = x[0];
  g.c = x[1];
  g.h = x[2];
  g.w = x[3];
  g.win = win;
  if (g.oh() < 1 || g.ow() < 1)
    throw std::invalid_argument(name + ": x is " + shape_string(x) + " but the window is " +
                                std::to_string(win.kernel) + "x" + std::to_string(win.kernel) +
                                " with padding " + std::to_string(win.padding) +
                                "; H and W + 2*padding must be >= kernel_size");
  return g;
}

void require_f32_pooling(const OpPrecision& q, const char* op) {
  if (q.compute != DType::f32)
    throw std::invalid_argument(std::string(op) + ": the policy asks for " +
                                std::string(dtype_name(q.compute)) + " compute; it computes in f32");
}

void require_dy_shape(const std::string& name, const Tensor& dy, const Shape& want) {
  if (dy.shape() != want)
    throw std::invalid_argument(name + ": dy is " + shape_string(dy.shape()) + ", expected " +
                                shape_string(want));
}

Shape pooled_shape(const conv_math::Geometry& g) { return {g.n, g.c, g.oh(), g.ow()}; }

void trace_pooling(Context& ctx, Phase phase, const std::string& path, const char* op, const OpPrecision& q,
                   std::vector<TracedValue> in, const Tensor& out, const char* out_name) {
  if (ctx.tracing()) ctx.record({phase, path, op, std::move(in), q.compute, {traced(out_name, out)}});
}

}  // namespace

// --- MaxPool2d ---------------------------------------------------------------------------

MaxPool2d::MaxPool2d(int kernel_size, int stride, int padding)
    : win_(pool_window("MaxPool2d", kernel_size, stride, padding)) {}

Tensor MaxPool2d::forward_impl(const Tensor& x, Context& ctx) {
  const conv_math::Geometry g = pool_geometry(who(kind(), path()), x.shape(), win_);
  op_ = ctx.decide("max_pool2d", path(), {x.dtype()});
  require_f32_pooling(op_, "max_pool2d");
  x_ = ctx.cast(x, op_.input, path(), Phase::forward, "x");
  const std::vector<float> xw = widened(x_);
  const conv_math::MaxPool<float> r = conv_math::max_pool2d_forward<float>(xw.data(), g);
  Tensor y = Tensor::from_f32(r.y.data(), pooled_shape(g), op_.output);
  trace_pooling(ctx, Phase::forward, path(), "max_pool2d", op_, {traced("x", x_)}, y, "y");
  return y;
}

Tensor MaxPool2d::backward_impl(const Tensor& dy, Context& ctx) {
  const std::string name = who(kind(), path());
  const conv_math::Geometry g = pool_geometry(name, x_.shape(), win_);
  require_dy_shape(name, dy, pooled_shape(g));
  if (!input_grad()) return {};
  // The argmax again, by the forward's scan over the same values.
  const std::vector<float> xw = widened(x_);
  const conv_math::MaxPool<float> r = conv_math::max_pool2d_forward<float>(xw.data(), g);
  const std::vector<float> dyw = widened(dy);
  const ConstMatrixMap<float> d(dyw.data(), g.n, g.c * g.out_plane());
  const MatrixF dx = conv_math::max_pool2d_backward<float>(d, r.argmax, g);
  Tensor out = Tensor::from_f32(dx.data(), x_.shape(), op_.input);
  trace_pooling(ctx, Phase::backward, path(), "max_pool2d", op_, {traced("dy", dy), traced("x", x_)}, out,
                "dx");
  return out;
}

// --- AvgPool2d ---------------------------------------------------------------------------

AvgPool2d::AvgPool2d(int kernel_size, int stride, int padding)
    : win_(pool_window("AvgPool2d", kernel_size, stride, padding)) {}

Tensor AvgPool2d::forward_impl(const Tensor& x, Context& ctx) {
  const conv_math::Geometry g = pool_geometry(who(kind(), path()), x.shape(), win_);
  op_ = ctx.decide("avg_pool2d", path(), {x.dtype()});
  require_f32_pooling(op_, "avg_pool2d");
  const Tensor xi = ctx.cast(x, op_.input, path(), Phase::forward, "x");
  x_shape_ = x.shape();
  const std::vector<float> xw = widened(xi);
  const MatrixF y = conv_math::avg_pool2d_forward<float>(xw.data(), g);
  Tensor out = Tensor::from_f32(y.data(), pooled_shape(g), op_.output);
  trace_pooling(ctx, Phase::forward, path(), "avg_pool2d", op_, {traced("x", xi)}, out, "y");
  return out;
}

Tensor AvgPool2d::backward_impl(const Tensor& dy, Context& ctx) {
  const std::string name = who(kind(), path());
  const conv_math::Geometry g = pool_geometry(name, x_shape_, win_);
  require_dy_shape(name, dy, pooled_shape(g));
  if (!input_grad()) return {};
  const std::vector<float> dyw = widened(dy);
  const ConstMatrixMap<float> d(dyw.data(), g.n, g.c * g.out_plane());
  const MatrixF dx = conv_math::avg_pool2d_backward<float>(d, g);
  Tensor out = Tensor::from_f32(dx.data(), x_shape_, op_.input);
  trace_pooling(ctx, Phase::backward, path(), "avg_pool2d", op_, {traced("dy", dy)}, out, "dx");
  return out;
}

// --- Flatten, Unflatten ------------------------------------------------------------------

Tensor Flatten::forward_impl(const Tensor& x, Context&) {
  if (x.dim() < 2)
    throw std::invalid_argument(who(kind(), path()) + ": x is " + shape_string(x.shape()) +
                                "; Flatten takes [N, ...] with at least 2 dimensions");
  x_shape_ = x.shape();
  return x.reshaped({x.size(0), x.numel() / std::max<std::int64_t>(x.size(0), 1)});
}

Tensor Flatten::backward_impl(const Tensor& dy, Context&) {
  const std::int64_t n = x_shape_.at(0);
  require_dy_shape(who(kind(), path()), dy, {n, numel(x_shape_) / std::max<std::int64_t>(n, 1)});
  if (!input_grad()) return {};
  return dy.reshaped(x_shape_);
}

Unflatten::Unflatten(Shape per_sample) : per_sample_(std::move(per_sample)) {
  if (per_sample_.empty())
    throw std::invalid_argument(
        "Unflatten: the per-sample shape is empty; give at least one size, e.g. {1, 8, 8}");
  for (std::int64_t s : per_sample_)
    if (s < 1) throw std::invalid_argument("Unflatten: sizes must be >= 1, got " + shape_string(per_sample_));
}

Tensor Unflatten::forward_impl(const Tensor& x, Context&) {
  const std::int64_t per = numel(per_sample_);
  if (x.dim() != 2 || x.size(1) != per)
    throw std::invalid_argument(who(kind(), path()) + ": x is " + shape_string(x.shape()) +
                                " but the layer takes [N, " + std::to_string(per) + "] (samples of " +
                                shape_string(per_sample_) + ")");
  x_shape_ = x.shape();
  Shape s{x.size(0)};
  s.insert(s.end(), per_sample_.begin(), per_sample_.end());
  return x.reshaped(std::move(s));
}

Tensor Unflatten::backward_impl(const Tensor& dy, Context&) {
  Shape want{x_shape_.at(0)};
  want.insert(want.end(), per_sample_.begin(), per_sample_.end());
  require_dy_shape(who(kind(), path()), dy, want);
  if (!input_grad()) return {};
  return dy.reshaped(x_shape_);
}

}  // namespace mpt
