// Chapter 04 — numerically stable softmax, log-softmax and cross-entropy: the ops.
// Depends on: softmax.hpp, softmax_math.hpp (every row is one of its
// functions, in float), the core tier (Context, Policy, trace).
#include "mpt/nn/layers/softmax.hpp"

#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace mpt {

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::none: return "none";
    case Reduction::mean: return "mean";
    case Reduction::sum: return "sum";
  }
  return "?";
}

namespace {

// The policy's answer for `op`; only f32 compute exists for these ops.
OpPrecision decide_f32(Context& ctx, const char* op, std::string_view path, DType input) {
  const OpPrecision q = ctx.decide(op, path, {input});
  if (q.compute != DType::f32)
    throw std::invalid_argument(
        std::string(op) + ": the policy asks for " + std::string(dtype_name(q.compute)) + " compute; " + op +
        " computes its max, sum of exponentials and log in f32 (autocast's FP32 list); "
        "low-precision exponentials are Chapter 4's pitfalls, not a policy choice");
  return q;
}

// Rows of the last dimension: {rows, width}.
std::pair<std::int64_t, std::int64_t> rows_of(const Tensor& x, const char* op, const char* name) {
  if (x.dim() < 1)
    throw std::invalid_argument(
        std::string(op) + ": " + name +
        " is a scalar; give a tensor of at least one dimension (the last is reduced over)");
  const std::int64_t width = x.shape().back();
  return {width == 0 ? 0 : x.numel() / width, width};
}

enum class SoftmaxKind : std::uint8_t { softmax, log_softmax };

Tensor softmax_forward(const Tensor& x, Context& ctx, std::string_view path, SoftmaxKind kind) {
  const char* op = kind == SoftmaxKind::softmax ? "softmax" : "log_softmax";
  const auto [rows, width] = rows_of(x, op, "x");
  const OpPrecision q = decide_f32(ctx, op, path, x.dtype());
  const Tensor xc = ctx.cast(x, q.input, path, Phase::forward, "x");
  const std::vector<float> z = widened(xc);
  std::vector<float> y(z.size());
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* row = z.data() + i * width;
    float* out = y.data() + i * width;
    const auto value = [row](std::int64_t j) { return row[j]; };
    const auto store = [out](std::int64_t j, float v) { out[j] = v; };
    if (kind == SoftmaxKind::softmax) softmax_row<float>(value, width, store);
    else log_softmax_row<float>(value, width, store);
  }
  Tensor out = Tensor::from_f32(y.data(), x.shape(), q.output);
  if (ctx.tracing())
    ctx.record({Phase::forward, std::string(path), op, {traced("x", xc)}, q.compute, {traced("y", out)}});
  return out;
}

Tensor softmax_backward_impl(const Tensor& y, const Tensor& dy, DType input_dtype, Context& ctx,
                             std::string_view path, SoftmaxKind kind) {
  const char* op = kind == SoftmaxKind::softmax ? "softmax" : "log_softmax";
  const auto [rows, width] = rows_of(y, op, "y");
  if (dy.shape() != y.shape())
    throw std::invalid_argument(std::string(op) + ": dy is " + shape_string(dy.shape()) +
                                " but the output y is " + shape_string(y.shape()) + "; give dy of y's shape");
  const OpPrecision q = decide_f32(ctx, op, path, input_dtype);
  const std::vector<float> yf = widened(y), g = widened(dy);
  std::vector<float> dx(yf.size());
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* yr = yf.data() + i * width;
    const float* gr = g.data() + i * width;
    float* out = dx.data() + i * width;
    const auto yv = [yr](std::int64_t j) { return yr[j]; };
    const auto gv = [gr](std::int64_t j) { return gr[j]; };
    const auto store = [out](std::int64_t j, float v) { out[j] = v; };
    if (kind == SoftmaxKind::softmax) softmax_backward_row<float>(yv, gv, width, store);
    else log_softmax_backward_row<float>(yv, gv, width, store);
  }
  // dx for the input as the op read it (q.input), then the cast's backward.
  Tensor out = Tensor::from_f32(dx.data(), y.shape(), q.input);
  if (ctx.tracing())
    ctx.record({Phase::backward,
                std::string(path),
                op,
                {traced("y", y), traced("dy", dy)},
                q.compute,
                {traced("dx", out)}});
  return ctx.cast(out, input_dtype, path, Phase::backward, "dx");
}

// ---------------------------------------------------------------------------
// The losses' checks: logits [N, K], N targets in [0, K) or ignore_index.

std::pair<std::int64_t, std::int64_t> check_loss_input(const Tensor& x, const std::vector<int>& targets,
                                                       int ignore_index, const char* op, const char* name) {
  if (x.dim() != 2)
    throw std::invalid_argument(std::string(op) + ": " + name + " are " + shape_string(x.shape()) +
                                "; give " + name + " [N, K], 2 dimensions");
  const std::int64_t rows = x.shape()[0], classes = x.shape()[1];
  if (static_cast<std::int64_t>(targets.size()) != rows)
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(targets.size()) + " targets for " +
                                std::to_string(rows) + " rows of " + name + " " + shape_string(x.shape()) +
                                "; give one class id per row");
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const int t = targets[i];
    if (t != ignore_index && (t < 0 || t >= classes))
      throw std::invalid_argument(std::string(op) + ": target " + std::to_string(t) + " (row " +
                                  std::to_string(i) + ") is out of bounds; give a class in 0.." +
                                  std::to_string(classes - 1) + " or ignore_index " +
                                  std::to_string(ignore_index));
  }
  return {rows, classes};
}

void check_smoothing(float eps) {
  if (!(eps >= 0.0f && eps <= 1.0f)) {
    std::ostringstream o;
    o << eps;
    throw std::invalid_argument("cross_entropy: label_smoothing must be in [0, 1], got " + o.str());
  }
}

void check_reduction(Reduction r, const char* op) {
  if (r != Reduction::none && r != Reduction::mean && r != Reduction::sum)
    throw std::invalid_argument(std::string(op) + ": unknown reduction; give none, mean or sum");
}

Shape loss_shape(Reduction r, std::int64_t rows) { return r == Reduction::none ? Shape{rows} : Shape{}; }

// dloss as the reduction shapes the loss: one value for mean and sum, N for none.
std::vector<float> loss_gradient(const Tensor& dloss, Reduction r, std::int64_t rows, const char* op) {
  const std::int64_t want = r == Reduction::none ? rows : 1;
  if (dloss.numel() != want)
    throw std::invalid_argument(std::string(op) + ": dloss is " + shape_string(dloss.shape()) +
                                " for reduction " + reduction_name(r) + "; give the loss's shape, " +
                                shape_string(loss_shape(r, rows)));
  return widened(dloss);
}

void trace_loss(Context& ctx, Phase phase, std::string_view path, const char* op, const OpPrecision& q,
                const Tensor& in, const Tensor* dloss, const Tensor& out) {
  if (!ctx.tracing()) return;
  TraceEntry e{phase, std::string(path), op, {traced("x", in)}, q.compute, {}};
  if (dloss) e.inputs.push_back(traced("dloss", *dloss));
  e.outputs.push_back(traced(dloss ? "dx" : "loss", out));
  ctx.record(std::move(e));
}

}  // namespace

Tensor softmax(const Tensor& x, Context& ctx, std::string_view path) {
  return softmax_forward(x, ctx, path, SoftmaxKind::softmax);
}

Tensor log_softmax(const Tensor& x, Context& ctx, std::string_view path) {
  return softmax_forward(x, ctx, path, SoftmaxKind::log_softmax);
}

Tensor softmax_backward(const Tensor& y, const Tensor& dy, DType input_dtype, Context& ctx,
                        std::string_view path) {
  return softmax_backward_impl(y, dy, input_dtype, ctx, path, SoftmaxKind::softmax);
}

Tensor log_softmax_backward(const Tensor& y, const Tensor& dy, DType input_dtype, Context& ctx,
                            std::string_view path) {
  return softmax_backward_impl(y, dy, input_dtype, ctx, path, SoftmaxKind::log_softmax);
}

Tensor cross_entropy(const Tensor& logits, const std::vector<int>& targets,
                     const CrossEntropyOptions& options, Context& ctx, std::string_view path) {
  const auto [rows, classes] =
      check_loss_input(logits, targets, options.ignore_index, "cross_entropy", "logits");
  check_smoothing(options.label_smoothing);
  check_reduction(options.reduction, "cross_entropy");
  const OpPrecision q = decide_f32(ctx, "cross_entropy", path, logits.dtype());
  const Tensor zc = ctx.cast(logits, q.input, path, Phase::forward, "x");
  const std::vector<float> z = widened(zc);
  std::vector<float> per_row(static_cast<std::size_t>(rows));
  const auto k = classes;
  const LossTotal<float> t = cross_entropy_rows<float>(
      [&](std::int64_t i, std::int64_t j) { return z[static_cast<std::size_t>(i * k + j)]; }, rows, classes,
      [&](std::int64_t i) { return std::int64_t{targets[static_cast<std::size_t>(i)]}; },
      options.ignore_index, options.label_smoothing,
      [&](std::int64_t i, float v) { per_row[static_cast<std::size_t>(i)] = v; });
  Tensor out;
  if (options.reduction == Reduction::none) {
    out = Tensor::from_f32(per_row.data(), {rows}, DType::f32);
  } else {
    const float v = reduce_loss(t, options.reduction);
    out = Tensor::from_f32(&v, {}, DType::f32);
  }
  trace_loss(ctx, Phase::forward, path, "cross_entropy", q, zc, nullptr, out);
  return out;
}

Tensor cross_entropy_backward(const Tensor& logits, const std::vector<int>& targets,
                              const CrossEntropyOptions& options, const Tensor& dloss, Context& ctx,
                              std::string_view path) {
  const auto [rows, classes] =
      check_loss_input(logits, targets, options.ignore_index, "cross_entropy", "logits");
  check_smoothing(options.label_smoothing);
  check_reduction(options.reduction, "cross_entropy");
  const std::vector<float> d = loss_gradient(dloss, options.reduction, rows, "cross_entropy");
  const OpPrecision q = decide_f32(ctx, "cross_entropy", path, logits.dtype());
  const Tensor zc = ctx.cast(logits, q.input, path, Phase::backward, "x");
  const std::vector<float> z = widened(zc);
  const auto at = [&](const std::vector<int>& v, std::int64_t i) {
    return std::int64_t{v[static_cast<std::size_t>(i)]};
  };
  const std::int64_t count =
      counted_rows([&](std::int64_t i) { return at(targets, i); }, rows, options.ignore_index);
  std::vector<float> dz(z.size());
  for (std::int64_t i = 0; i < rows; ++i) {
    const float g = options.reduction == Reduction::none ? d[static_cast<std::size_t>(i)]
                                                         : row_gradient(d[0], count, options.reduction);
    const float* row = z.data() + i * classes;
    float* out = dz.data() + i * classes;
    cross_entropy_backward_row<float>([row](std::int64_t j) { return row[j]; }, classes, at(targets, i),
                                      options.ignore_index, options.label_smoothing, g,
                                      [out](std::int64_t j, float v) { out[j] = v; });
  }
  const Tensor dx = Tensor::from_f32(dz.data(), logits.shape(), q.input);
  trace_loss(ctx, Phase::backward, path, "cross_entropy", q, zc, &dloss, dx);
  return ctx.cast(dx, logits.dtype(), path, Phase::backward, "dx");
}

Tensor nll_loss(const Tensor& log_probs, const std::vector<int>& targets, const NllLossOptions& options,
                Context& ctx, std::string_view path) {
  const auto [rows, classes] =
      check_loss_input(log_probs, targets, options.ignore_index, "nll_loss", "log_probs");
  check_reduction(options.reduction, "nll_loss");
  const OpPrecision q = decide_f32(ctx, "nll_loss", path, log_probs.dtype());
  const Tensor xc = ctx.cast(log_probs, q.input, path, Phase::forward, "x");
  const std::vector<float> x = widened(xc);
  std::vector<float> per_row(static_cast<std::size_t>(rows));
  LossTotal<float> t;
  for (std::int64_t i = 0; i < rows; ++i) {
    const int y = targets[static_cast<std::size_t>(i)];
    if (y == options.ignore_index) continue;  // 0 in per_row
    const float* row = x.data() + i * classes;
    const float loss = nll_loss_row<float>([row](std::int64_t j) { return row[j]; }, y);
    per_row[static_cast<std::size_t>(i)] = loss;
    t.sum += loss;
    ++t.count;
  }
  Tensor out;
  if (options.reduction == Reduction::none) {
    out = Tensor::from_f32(per_row.data(), {rows}, DType::f32);
  } else {
    const float v = reduce_loss(t, options.reduction);
    out = Tensor::from_f32(&v, {}, DType::f32);
  }
  trace_loss(ctx, Phase::forward, path, "nll_loss", q, xc, nullptr, out);
  return out;
}

Tensor nll_loss_backward(const Tensor& log_probs, const std::vector<int>& targets,
                         const NllLossOptions& options, const Tensor& dloss, Context& ctx,
                         std::string_view path) {
  const auto [rows, classes] =
      check_loss_input(log_probs, targets, options.ignore_index, "nll_loss", "log_probs");
  check_reduction(options.reduction, "nll_loss");
  const std::vector<float> d = loss_gradient(dloss, options.reduction, rows, "nll_loss");
  const OpPrecision q = decide_f32(ctx, "nll_loss", path, log_probs.dtype());
  const Tensor xc = ctx.cast(log_probs, q.input, path, Phase::backward, "x");
  const std::int64_t count =
      counted_rows([&](std::int64_t i) { return std::int64_t{targets[static_cast<std::size_t>(i)]}; }, rows,
                   options.ignore_index);
  std::vector<float> dx(static_cast<std::size_t>(log_probs.numel()));
  for (std::int64_t i = 0; i < rows; ++i) {
    const float g = options.reduction == Reduction::none ? d[static_cast<std::size_t>(i)]
                                                         : row_gradient(d[0], count, options.reduction);
    float* out = dx.data() + i * classes;
    nll_loss_backward_row<float>(classes, targets[static_cast<std::size_t>(i)], options.ignore_index, g,
                                 [out](std::int64_t j, float v) { out[j] = v; });
  }
  const Tensor out = Tensor::from_f32(dx.data(), log_probs.shape(), q.input);
  trace_loss(ctx, Phase::backward, path, "nll_loss", q, xc, &dloss, out);
  return ctx.cast(out, log_probs.dtype(), path, Phase::backward, "dx");
}

}  // namespace mpt
