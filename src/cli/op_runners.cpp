// All chapters — `mpt op`: the runnable ops (see op_runners.hpp).
// Depends on: op_runners.hpp, cli_support.hpp (UsageError, number parsing),
// and the mpt library's nn tier (Linear, ReLU, GELU, the losses of Chapter 2;
// BatchNorm, LayerNorm, Conv2d, MaxPool2d, AvgPool2d of Chapter 3; softmax,
// log_softmax, cross_entropy's options and nll_loss of Chapter 4), core tier
// (Context, Policy, Rng, Tensor). Chapter 3 made the table; each chapter
// adds its ops to it.
//
// A runner checks its own options and the input's shape first, then takes
// its blocks of stdin, builds the layer with the call's policy, runs it
// forward (and backward) exactly as a model would, and returns what the
// layer stored: nothing here computes a value of its own.
#include "op_runners.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_support.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/random.hpp"
#include "mpt/nn/layers/activations.hpp"
#include "mpt/nn/layers/attention.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/conv.hpp"
#include "mpt/nn/layers/layer_math.hpp"
#include "mpt/nn/layers/layer_norm.hpp"
#include "mpt/nn/layers/linear.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/layers/pooling.hpp"
#include "mpt/nn/layers/softmax.hpp"

namespace mpt::cli::op {

// ---------------------------------------------------------------------------
// stdin, block by block.

StdinNumbers::StdinNumbers(std::istream& in, bool backward) : in_(in), backward_(backward) {}

void StdinNumbers::read_all() {
  if (read_) return;
  read_ = true;
  std::string token;
  while (in_ >> token) {
    float v = 0;
    if (!parse_number(token, v))
      throw UsageError("stdin: " + not_a_number(token, "(input " + std::to_string(values_.size() + 1) + ")"));
    values_.push_back(v);
  }
}

std::string StdinNumbers::expected() const {
  std::int64_t total = 0;
  std::string list;
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    std::istringstream count(blocks_[i]);
    std::int64_t n = 0;
    count >> n;
    total += n;
    list += (i == 0 ? "" : ", then ") + blocks_[i];
  }
  const bool more = backward_ && !dy_taken_;
  return std::string(more ? "at least " : "") + std::to_string(total) + " number" + (total == 1 ? "" : "s") +
         ", " + list + (more ? ", then dy (the output's gradient, for --backward)" : "");
}

std::vector<std::vector<float>> StdinNumbers::take(const std::vector<Block>& blocks) {
  read_all();
  std::size_t n = 0;
  for (const Block& b : blocks) {
    const auto k = static_cast<std::size_t>(numel(b.shape));
    blocks_.push_back(std::to_string(k) + " for " + b.name + " (" + shape_string(b.shape) + ")");
    dy_taken_ = dy_taken_ || b.name == "dy";
    n += k;
  }
  if (values_.size() - used_ < n)
    throw UsageError("stdin: expected " + expected() + "; got " + std::to_string(values_.size()));
  std::vector<std::vector<float>> out;
  for (const Block& b : blocks) {
    const auto k = static_cast<std::ptrdiff_t>(numel(b.shape));
    const auto first = values_.begin() + static_cast<std::ptrdiff_t>(used_);
    out.emplace_back(first, first + k);
    used_ += static_cast<std::size_t>(k);
  }
  return out;
}

std::vector<float> StdinNumbers::take(const std::string& name, const Shape& shape) {
  return take(std::vector<Block>{{name, shape}}).front();
}

void StdinNumbers::finish() {
  read_all();
  if (used_ != values_.size())
    throw UsageError("stdin: expected " + expected() + "; got " + std::to_string(values_.size()));
}

Shape parse_shape(const std::string& flag, const std::string& text) {
  const std::string hint = "give the sizes, each from 1, separated by x, e.g. " + flag + " 8x4x3x3";
  if (text.empty()) throw UsageError("missing " + flag + "; " + hint);
  Shape shape;
  std::string item;
  std::istringstream items(text);
  while (std::getline(items, item, 'x')) {
    long long v = 0;
    if (!parse_integer(item, 1, kMaxElements, v))
      throw UsageError(flag + ": '" + text + "' is not a shape ('" + item + "' is no size); " + hint);
    shape.push_back(v);
  }
  if (text.back() == 'x') throw UsageError(flag + ": '" + text + "' ends with x; " + hint);
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (n > kMaxElements / d)
      throw UsageError(flag + ": '" + text + "' has more than " + std::to_string(kMaxElements) +
                       " elements, the most `mpt op` takes");
    n *= d;
  }
  return shape;
}

namespace {

// ---------------------------------------------------------------------------
// What every runner needs.

/// UsageError unless `count` (the elements of what the op would allocate:
/// its weight, its output) is at most kMaxElements, the bound --shape has.
void require_at_most_max_elements(double count, const std::string& what) {
  if (count > static_cast<double>(kMaxElements))
    throw UsageError(what + " would have " + std::to_string(static_cast<long long>(count)) +
                     " elements, more than the " + std::to_string(kMaxElements) +
                     " `mpt op` takes; give smaller sizes");
}

/// UsageError unless the input has `dims` dimensions.
void require_dims(const OpCall& c, std::size_t dims, const std::string& op, const std::string& rule) {
  if (c.shape.size() != dims)
    throw UsageError("--shape " + shape_string(c.shape) + ": " + op + " takes " + rule + ", " +
                     std::to_string(dims) + " dimensions; this shape has " + std::to_string(c.shape.size()));
}

/// An option's text, or a UsageError saying what it is for when missing.
const std::string& required_option(const OpCall& c, const std::string& flag, const std::string& what) {
  const std::string& v = c.options.at(flag);
  if (v.empty()) throw UsageError("missing " + flag + "; give " + what);
  return v;
}

long long integer_option(const OpCall& c, const std::string& flag, long long lo, long long hi,
                         const std::string& what) {
  const std::string& text = required_option(c, flag, what);
  long long v = 0;
  if (!parse_integer(text, lo, hi, v))
    throw UsageError(flag + ": '" + text + "' is not " + what + " (a whole number from " +
                     std::to_string(lo) + " to " + std::to_string(hi) + ")");
  return v;
}

std::uint64_t seed_of(const OpCall& c) {
  const std::string& text = c.options.at("--seed");
  long long v = 0;
  if (!parse_integer(text, 0, std::numeric_limits<long long>::max(), v))
    throw UsageError("--seed: '" + text + "' is not a seed; give a whole number from 0");
  return static_cast<std::uint64_t>(v);
}

/// A number option: decimal or hex-float, all of the text.
double number_option(const OpCall& c, const std::string& flag) {
  const std::string& text = c.options.at(flag);
  double v = 0;
  if (!parse_number(text, v)) throw UsageError(flag + ": " + not_a_number(text));
  return v;
}

/// `count` numbers separated by commas (--running-mean 0.5,-1), or
/// `fallback` each when the option is not given.
std::vector<float> number_list_option(const OpCall& c, const std::string& flag, std::int64_t count,
                                      float fallback, const std::string& what) {
  const std::string& text = c.options.at(flag);
  const auto n = static_cast<std::size_t>(count);
  if (text.empty()) return std::vector<float>(n, fallback);
  const std::string valid = "give " + std::to_string(count) + " number(s) separated by commas, " + what;
  std::vector<float> values;
  std::string item;
  std::istringstream items(text);
  while (std::getline(items, item, ',')) {
    float v = 0;
    if (!parse_number(item, v)) throw UsageError(flag + ": " + not_a_number(item) + "; " + valid);
    values.push_back(v);
  }
  if (text.back() == ',') throw UsageError(flag + ": '" + text + "' ends with a comma; " + valid);
  if (values.size() != n)
    throw UsageError(flag + ": " + std::to_string(values.size()) + " number(s); " + valid);
  return values;
}

/// The layer in the call's policy and mode, as a model would set it up.
void prepare(Module& layer, const OpCall& c) {
  layer.apply_policy(*c.policy);
  layer.train(c.train);
}

/// The parameter gradients after a backward: dweight, dbias (FP32, as the
/// optimizer reads them).
void push_parameter_grads(std::vector<OpOutput>& out, const Parameter& weight, const Parameter& bias) {
  out.push_back({"dweight", weight.grad});
  out.push_back({"dbias", bias.grad});
}

/// The input block "x": numel(--shape) numbers rounded (RNE) into --dtype,
/// as a tensor of shape `as` (the layer's view of --shape).
Tensor input(const OpCall& c, StdinNumbers& in, const Shape& as) {
  const std::vector<float> v = in.take("x", c.shape);
  return Tensor::from_f32(v.data(), as, c.dtype);
}

/// The output gradient block "dy", shaped as `printed` (the output's shape
/// as it is printed), rounded into y's dtype (autograd gives a gradient its
/// tensor's dtype) and shaped as y itself.
Tensor output_gradient(StdinNumbers& in, const Tensor& y, const Shape& printed) {
  const std::vector<float> v = in.take("dy", printed);
  return Tensor::from_f32(v.data(), y.shape(), y.dtype());
}

OpOption seed_option() {
  return {"--seed", "S", "seed of the layer's own initialiser (its parameters are printed too)", "0"};
}

// ---------------------------------------------------------------------------
// linear

std::vector<OpOutput> run_linear(const OpCall& c, StdinNumbers& in) {
  require_dims(c, 2, "linear", "x [B, in]");
  const auto out_features = static_cast<int>(
      integer_option(c, "--out-features", 1, 65536, "the number of output features, e.g. --out-features 4"));
  const std::uint64_t seed = seed_of(c);
  if (c.shape[1] > 65536)
    throw UsageError("--shape " + shape_string(c.shape) + ": linear takes at most 65536 input features");
  const std::string sizes =
      "--shape " + shape_string(c.shape) + " --out-features " + std::to_string(out_features);
  require_at_most_max_elements(static_cast<double>(c.shape[1]) * out_features, sizes + ": the weight");
  require_at_most_max_elements(static_cast<double>(c.shape[0]) * out_features, sizes + ": the output");
  Rng rng(seed);
  Linear layer(static_cast<int>(c.shape[1]), out_features, rng);
  prepare(layer, c);
  Context ctx(c.policy);
  const Tensor x = input(c, in, c.shape);
  const Tensor y = layer.forward(x, ctx);
  std::vector<OpOutput> out = {{"y", y}, {"weight", layer.weight.weights()}, {"bias", layer.bias.weights()}};
  if (c.backward) {
    const Tensor dx = layer.backward(output_gradient(in, y, y.shape()), ctx);
    out.push_back({"dx", dx});
    push_parameter_grads(out, layer.weight, layer.bias);
  }
  return out;
}

// ---------------------------------------------------------------------------
// relu, gelu: elementwise, any shape (the layer sees one row of all elements)

std::vector<OpOutput> run_pointwise(const OpCall& c, StdinNumbers& in, Module& layer) {
  prepare(layer, c);
  Context ctx(c.policy);
  const Shape row = {1, numel(c.shape)};
  const Tensor y = layer.forward(input(c, in, row), ctx);
  std::vector<OpOutput> out = {{"y", y.reshaped(c.shape)}};
  if (c.backward)
    out.push_back({"dx", layer.backward(output_gradient(in, y, c.shape), ctx).reshaped(c.shape)});
  return out;
}

std::vector<OpOutput> run_relu(const OpCall& c, StdinNumbers& in) {
  ReLU layer;
  return run_pointwise(c, in, layer);
}

std::vector<OpOutput> run_gelu(const OpCall& c, StdinNumbers& in) {
  const std::string& a = c.options.at("--approximate");
  if (a != "none" && a != "tanh")
    throw UsageError("--approximate: unknown approximation '" + a + "'; valid: none, tanh");
  GELU layer(a == "tanh" ? GeluApproximation::tanh : GeluApproximation::none);
  return run_pointwise(c, in, layer);
}

// ---------------------------------------------------------------------------
// mse_loss, cross_entropy, nll_loss: the loss (f32, a scalar, or one per row
// for --reduction none); with --backward dy is the gradient arriving at the
// loss (1, or a loss scale S): one number, or one per row for none

Tensor scalar(float v) {
  Tensor t(DType::f32, {});
  t.assign(&v, 1);
  return t;
}

float loss_gradient(StdinNumbers& in) { return in.take("dy", {})[0]; }

std::vector<OpOutput> run_mse_loss(const OpCall& c, StdinNumbers& in) {
  // x and its target follow each other; the mean runs over every element.
  const std::vector<std::vector<float>> v = in.take({{"x", c.shape}, {"target", c.shape}});
  const Tensor x = Tensor::from_f32(v[0].data(), {1, numel(c.shape)}, c.dtype);
  const std::vector<float>& t = v[1];  // FP32, as the library takes it
  const MatrixF target = Eigen::Map<const MatrixF>(t.data(), 1, static_cast<Eigen::Index>(t.size()));
  Context ctx(c.policy);
  std::vector<OpOutput> out = {{"loss", scalar(mse_loss(x, target, ctx))}};
  if (c.backward) out.push_back({"dx", mse_backward(x, target, loss_gradient(in), ctx).reshaped(c.shape)});
  return out;
}

// --ignore-index: any whole number (PyTorch's default -100).
int ignore_index_of(const OpCall& c) {
  return static_cast<int>(integer_option(c, "--ignore-index", std::numeric_limits<int>::min(),
                                         std::numeric_limits<int>::max(),
                                         "a class id to ignore, e.g. --ignore-index -100"));
}

std::vector<int> class_ids(const OpCall& c, int ignore_index) {
  const std::int64_t rows = c.shape[0], classes = c.shape[1];
  const std::string valid = "give one class id per row of x, each from 0 to " + std::to_string(classes - 1) +
                            " or the --ignore-index " + std::to_string(ignore_index) +
                            ", separated by commas (e.g. --targets " + (classes > 1 ? "1,0" : "0,0") +
                            " for 2 rows)";
  const std::string& text = required_option(c, "--targets", "the class of each row of x; " + valid);
  std::vector<int> ids;
  std::string item;
  std::istringstream items(text);
  while (std::getline(items, item, ',')) {
    long long v = 0;
    const bool ignored = parse_integer(item, ignore_index, ignore_index, v);
    if (!ignored && !parse_integer(item, 0, classes - 1, v))
      throw UsageError("--targets: '" + item + "' is not a class of x (--shape " + shape_string(c.shape) +
                       "); " + valid);
    ids.push_back(static_cast<int>(v));
  }
  if (text.back() == ',') throw UsageError("--targets: '" + text + "' ends with a comma; " + valid);
  if (static_cast<std::int64_t>(ids.size()) != rows)
    throw UsageError("--targets: " + std::to_string(ids.size()) + " class id(s) for " + std::to_string(rows) +
                     " row(s) of x (--shape " + shape_string(c.shape) + "); " + valid);
  return ids;
}

Reduction reduction_of(const OpCall& c) {
  const std::string& r = c.options.at("--reduction");
  if (r == "mean") return Reduction::mean;
  if (r == "sum") return Reduction::sum;
  if (r == "none") return Reduction::none;
  throw UsageError("--reduction: unknown reduction '" + r + "'; valid: mean, sum, none");
}

// dy of a loss: one number for mean and sum, one per row for none.
Tensor loss_gradient(StdinNumbers& in, Reduction r, std::int64_t rows) {
  const Shape s = r == Reduction::none ? Shape{rows} : Shape{};
  const std::vector<float> v = in.take("dy", s);
  return Tensor::from_f32(v.data(), s, DType::f32);
}

std::vector<OpOutput> run_cross_entropy(const OpCall& c, StdinNumbers& in) {
  require_dims(c, 2, "cross_entropy", "logits x [B, C]");
  CrossEntropyOptions o;
  o.ignore_index = ignore_index_of(c);
  const double eps = number_option(c, "--label-smoothing");
  if (!(eps >= 0 && eps <= 1))
    throw UsageError("--label-smoothing: '" + c.options.at("--label-smoothing") +
                     "' is not a label smoothing; give a number from 0 to 1");
  o.label_smoothing = static_cast<float>(eps);
  o.reduction = reduction_of(c);
  const std::vector<int> ids = class_ids(c, o.ignore_index);
  const Tensor x = input(c, in, c.shape);
  Context ctx(c.policy);
  std::vector<OpOutput> out = {{"loss", cross_entropy(x, ids, o, ctx)}};
  if (c.backward)
    out.push_back({"dx", cross_entropy_backward(x, ids, o, loss_gradient(in, o.reduction, c.shape[0]), ctx)});
  return out;
}

std::vector<OpOutput> run_nll_loss(const OpCall& c, StdinNumbers& in) {
  require_dims(c, 2, "nll_loss", "log-probabilities x [B, C]");
  NllLossOptions o;
  o.ignore_index = ignore_index_of(c);
  o.reduction = reduction_of(c);
  const std::vector<int> ids = class_ids(c, o.ignore_index);
  const Tensor x = input(c, in, c.shape);
  Context ctx(c.policy);
  std::vector<OpOutput> out = {{"loss", nll_loss(x, ids, o, ctx)}};
  if (c.backward)
    out.push_back({"dx", nll_loss_backward(x, ids, o, loss_gradient(in, o.reduction, c.shape[0]), ctx)});
  return out;
}

// ---------------------------------------------------------------------------
// softmax, log_softmax: over the last dimension of any shape

std::vector<OpOutput> run_softmax_kind(const OpCall& c, StdinNumbers& in, bool log) {
  Context ctx(c.policy);
  const Tensor x = input(c, in, c.shape);
  const Tensor y = log ? log_softmax(x, ctx) : softmax(x, ctx);
  std::vector<OpOutput> out = {{"y", y}};
  if (c.backward) {
    const Tensor dy = output_gradient(in, y, y.shape());
    out.push_back(
        {"dx", log ? log_softmax_backward(y, dy, x.dtype(), ctx) : softmax_backward(y, dy, x.dtype(), ctx)});
  }
  return out;
}

std::vector<OpOutput> run_softmax(const OpCall& c, StdinNumbers& in) {
  return run_softmax_kind(c, in, false);
}

std::vector<OpOutput> run_log_softmax(const OpCall& c, StdinNumbers& in) {
  return run_softmax_kind(c, in, true);
}

// ---------------------------------------------------------------------------
// scaled_dot_product_attention: self-attention shapes, q, k and v on stdin

bool bool_option(const OpCall& c, const std::string& flag) {
  const std::string& v = c.options.at(flag);
  if (v == "true") return true;
  if (v == "false") return false;
  throw UsageError(flag + ": '" + v + "' is not a choice; give true or false");
}

std::vector<OpOutput> run_attention(const OpCall& c, StdinNumbers& in) {
  if (c.shape.size() != 3 && c.shape.size() != 4)
    throw UsageError(
        "--shape " + shape_string(c.shape) +
        ": scaled_dot_product_attention takes q, k and v of one shape [N, L, D] or [B, H, L, D]; "
        "this shape has " +
        std::to_string(c.shape.size()) + " dimension(s)");
  AttentionOptions o;
  o.is_causal = bool_option(c, "--is-causal");
  o.scale_q_first = !bool_option(c, "--scale-after");
  if (!c.options.at("--scale").empty()) {
    const double scale = number_option(c, "--scale");
    if (!std::isfinite(scale))
      throw UsageError("--scale: '" + c.options.at("--scale") + "' is not a scale; give a finite number");
    o.scale = scale;
  }
  const std::vector<std::vector<float>> v = in.take({{"q", c.shape}, {"k", c.shape}, {"v", c.shape}});
  const Tensor q = Tensor::from_f32(v[0].data(), c.shape, c.dtype);
  const Tensor k = Tensor::from_f32(v[1].data(), c.shape, c.dtype);
  const Tensor val = Tensor::from_f32(v[2].data(), c.shape, c.dtype);
  Context ctx(c.policy);
  const AttentionResult r = scaled_dot_product_attention(q, k, val, AttentionMask(), o, ctx, "attention");
  std::vector<OpOutput> out = {{"out", r.out}, {"probs", r.saved.probs}};
  if (c.backward) {
    const Tensor dy = output_gradient(in, r.out, r.out.shape());
    const AttentionGrads g = scaled_dot_product_attention_backward(r.saved, dy, ctx, "attention");
    out.push_back({"dq", g.dq});
    out.push_back({"dk", g.dk});
    out.push_back({"dv", g.dv});
  }
  return out;
}

// ---------------------------------------------------------------------------
// batch_norm, layer_norm: statistics in FP32 whatever the policy stores

double eps_of(const OpCall& c) {
  const double eps = number_option(c, "--eps");
  if (!(std::isfinite(eps) && eps >= 0))
    throw UsageError("--eps: '" + c.options.at("--eps") + "' is not an eps; give a finite number >= 0");
  return eps;
}

std::vector<OpOutput> run_batch_norm(const OpCall& c, StdinNumbers& in) {
  if (c.shape.size() < 2 || c.shape.size() > 4)
    throw UsageError("--shape " + shape_string(c.shape) +
                     ": batch_norm takes x [N, C], [N, C, L] or [N, C, H, W]; this shape has " +
                     std::to_string(c.shape.size()) + " dimension(s)");
  const std::int64_t channels = c.shape[1];
  BatchNorm::Options o;
  o.eps = eps_of(c);
  const std::string& m = c.options.at("--momentum");
  if (m == "none") {
    o.momentum = std::nullopt;
  } else {
    const double v = number_option(c, "--momentum");
    if (!(v >= 0 && v <= 1))
      throw UsageError("--momentum: '" + m +
                       "' is not a momentum; give a number from 0 to 1, or none (the cumulative average)");
    o.momentum = v;
  }
  const std::vector<float> rm = number_list_option(c, "--running-mean", channels, 0.0f, "one per channel");
  const std::vector<float> rv = number_list_option(c, "--running-var", channels, 1.0f, "one per channel");
  BatchNorm layer(static_cast<int>(channels), o);
  prepare(layer, c);
  // The estimates before this forward, rounded into their dtype.
  layer.running_mean.assign(rm.data(), channels);
  layer.running_var.assign(rv.data(), channels);
  Context ctx(c.policy);
  const Tensor x = input(c, in, c.shape);
  const Tensor y = layer.forward(x, ctx);
  std::vector<OpOutput> out = {{"y", y}};
  // The batch statistics, when this forward normalized with them (training).
  if (c.train) {
    out.push_back({"mean", layer.mean()});
    out.push_back({"invstd", layer.invstd()});
  }
  out.push_back({"running_mean", layer.running_mean});
  out.push_back({"running_var", layer.running_var});
  if (c.backward) {
    out.push_back({"dx", layer.backward(output_gradient(in, y, y.shape()), ctx)});
    push_parameter_grads(out, layer.weight, layer.bias);
  }
  return out;
}

std::vector<OpOutput> run_layer_norm(const OpCall& c, StdinNumbers& in) {
  const std::string& text = c.options.at("--normalized-shape");
  const Shape normalized = text.empty() ? Shape{c.shape.back()} : parse_shape("--normalized-shape", text);
  const bool trailing = normalized.size() <= c.shape.size() &&
                        std::equal(normalized.rbegin(), normalized.rend(), c.shape.rbegin());
  if (!trailing)
    throw UsageError("--normalized-shape " + shape_string(normalized) + ": layer_norm normalizes over the " +
                     "last dimensions of x, and --shape " + shape_string(c.shape) +
                     " does not end with these; give the trailing sizes of --shape (default: the last)");
  LayerNorm::Options o;
  o.eps = eps_of(c);
  LayerNorm layer(normalized, o);
  prepare(layer, c);
  Context ctx(c.policy);
  const Tensor y = layer.forward(input(c, in, c.shape), ctx);
  std::vector<OpOutput> out = {{"y", y}, {"mean", layer.mean()}, {"rstd", layer.rstd()}};
  if (c.backward) {
    out.push_back({"dx", layer.backward(output_gradient(in, y, y.shape()), ctx)});
    push_parameter_grads(out, layer.weight, layer.bias);
  }
  return out;
}

// ---------------------------------------------------------------------------
// conv2d, max_pool2d, avg_pool2d: x [N, C, H, W]

constexpr long long kMaxWindow = 1024;

int kernel_of(const OpCall& c) {
  return static_cast<int>(
      integer_option(c, "--kernel-size", 1, kMaxWindow, "the kernel's size (square), e.g. --kernel-size 3"));
}

int padding_of(const OpCall& c) {
  return static_cast<int>(
      integer_option(c, "--padding", 0, kMaxWindow, "the zeros added on each side, e.g. --padding 1"));
}

std::vector<OpOutput> run_conv2d(const OpCall& c, StdinNumbers& in) {
  require_dims(c, 4, "conv2d", "x [N, C, H, W]");
  const auto out_channels = static_cast<int>(
      integer_option(c, "--out-channels", 1, 65536, "the number of output channels, e.g. --out-channels 4"));
  const int kernel = kernel_of(c);
  Conv2dOptions o;
  o.stride =
      static_cast<int>(integer_option(c, "--stride", 1, kMaxWindow, "the window's step, e.g. --stride 2"));
  o.padding = padding_of(c);
  const std::uint64_t seed = seed_of(c);
  if (c.shape[1] > 65536)
    throw UsageError("--shape " + shape_string(c.shape) + ": conv2d takes at most 65536 input channels");
  {
    const std::string sizes = "--shape " + shape_string(c.shape) + " --out-channels " +
                              std::to_string(out_channels) + " --kernel-size " + std::to_string(kernel);
    const double k2 = static_cast<double>(kernel) * kernel;
    require_at_most_max_elements(static_cast<double>(out_channels) * static_cast<double>(c.shape[1]) * k2,
                                 sizes + ": the weight");
    // Output positions (stride >= 1): at most the padded input's.
    const double positions = static_cast<double>(c.shape[0]) *
                             (static_cast<double>(c.shape[2]) + 2.0 * o.padding) *
                             (static_cast<double>(c.shape[3]) + 2.0 * o.padding);
    require_at_most_max_elements(positions * out_channels, sizes + ": the output");
    require_at_most_max_elements(positions * static_cast<double>(c.shape[1]) * k2,
                                 sizes + ": the unfolded input");
  }
  Rng rng(seed);
  Conv2d layer(static_cast<int>(c.shape[1]), out_channels, kernel, rng, o);
  prepare(layer, c);
  Context ctx(c.policy);
  const Tensor y = layer.forward(input(c, in, c.shape), ctx);
  std::vector<OpOutput> out = {{"y", y}, {"weight", layer.weight.weights()}, {"bias", layer.bias.weights()}};
  if (c.backward) {
    out.push_back({"dx", layer.backward(output_gradient(in, y, y.shape()), ctx)});
    push_parameter_grads(out, layer.weight, layer.bias);
  }
  return out;
}

// A layer without parameters on x as --shape gives it: y; --backward: dx.
std::vector<OpOutput> run_layer(const OpCall& c, StdinNumbers& in, Module& layer) {
  prepare(layer, c);
  Context ctx(c.policy);
  const Tensor y = layer.forward(input(c, in, c.shape), ctx);
  std::vector<OpOutput> out = {{"y", y}};
  if (c.backward) out.push_back({"dx", layer.backward(output_gradient(in, y, y.shape()), ctx)});
  return out;
}

template <class Pool>
std::vector<OpOutput> run_pool(const OpCall& c, StdinNumbers& in, const char* op) {
  require_dims(c, 4, op, "x [N, C, H, W]");
  const int kernel = kernel_of(c);
  // 0 is the layer's "stride = kernel_size" (PyTorch's stride=None).
  const int stride = c.options.at("--stride").empty()
                         ? 0
                         : static_cast<int>(integer_option(c, "--stride", 1, kMaxWindow,
                                                           "the window's step, e.g. --stride 2"));
  Pool layer(kernel, stride, padding_of(c));
  return run_layer(c, in, layer);
}

std::vector<OpOutput> run_max_pool2d(const OpCall& c, StdinNumbers& in) {
  return run_pool<MaxPool2d>(c, in, "max_pool2d");
}

std::vector<OpOutput> run_avg_pool2d(const OpCall& c, StdinNumbers& in) {
  return run_pool<AvgPool2d>(c, in, "avg_pool2d");
}

}  // namespace

// ---------------------------------------------------------------------------
// The table.

const std::vector<OpEntry>& op_table() {
  static const std::vector<OpEntry> table = {
      {"linear",
       "x [B, in]",
       "y [B, out], weight [out, in], bias [out]; --backward: dx, dweight, dbias",
       "--shape 2x3 --out-features 4 --seed 1",
       {{"--out-features", "N", "output features of the layer (its weight is [N, in]); required", ""},
        seed_option()},
       false,
       run_linear},
      {"conv2d",
       "x [N, C, H, W]",
       "y [N, out, H', W'], weight [out, C, k, k], bias [out]; --backward: dx, dweight, dbias",
       "--shape 1x1x4x4 --out-channels 2 --kernel-size 3 --padding 1",
       {{"--out-channels", "N", "output channels (the weight is [N, C, k, k]); required", ""},
        {"--kernel-size", "K", "the kernel's size k (square); required", ""},
        {"--stride", "S", "the window's step", "1"},
        {"--padding", "P", "zeros added on each side of H and W", "0"},
        seed_option()},
       false,
       run_conv2d},
      {"scaled_dot_product_attention",
       "q, k, v of one shape [N, L, D] or [B, H, L, D] (self-attention), one after the other",
       "out (q's shape), probs [..., L, L]; --backward: dq, dk, dv",
       "--shape 1x3x2 --is-causal true",
       {{"--is-causal", "B", "true: query i sees keys 0..i (torch's is_causal); false: every key", "false"},
        {"--scale", "S", "the factor on Q K^T (default 1/sqrt(D))", ""},
        {"--scale-after", "B",
         "true: Q K^T stored unscaled in the input's dtype, then scaled; false: Q scaled first (the default)",
         "false"}},
       false,
       run_attention},
      {"relu", "x, any shape", "y; --backward: dx", "--shape 2x3", {}, false, run_relu},
      {"gelu",
       "x, any shape",
       "y; --backward: dx",
       "--shape 2x3 --approximate tanh",
       {{"--approximate", "A", "none (exact, erf) or tanh, as torch.nn.GELU(approximate=...)", "none"}},
       false,
       run_gelu},
      {"layer_norm",
       "x, any shape; normalized over its last dimension(s)",
       "y, mean [rows], rstd [rows] (f32); --backward: dx, dweight, dbias",
       "--shape 2x4",
       {{"--normalized-shape", "SHAPE", "the trailing sizes of --shape normalized over (default: the last)",
         ""},
        {"--eps", "E", "added to the variance inside the square root", "1e-05"}},
       false,
       run_layer_norm},
      {"batch_norm",
       "x [N, C], [N, C, L] or [N, C, H, W]; statistics per channel",
       "y; --train: mean, invstd (f32, the batch's); running_mean, running_var; --backward: dx, dweight, "
       "dbias",
       "--shape 4x2 --train --running-mean 0.5,0",
       {{"--eps", "E", "added to the variance inside the square root", "1e-05"},
        {"--momentum", "M",
         "weight of the batch in the running estimates, 0 to 1; none: the cumulative average", "0.1"},
        {"--running-mean", "LIST", "the running mean before this forward, one per channel (default: 0s)", ""},
        {"--running-var", "LIST", "the running variance before this forward, one per channel (default: 1s)",
         ""}},
       true,
       run_batch_norm},
      {"softmax",
       "x, any shape; over its last dimension",
       "y; --backward: dx (dy as y)",
       "--shape 2x3",
       {},
       false,
       run_softmax},
      {"log_softmax",
       "x, any shape; over its last dimension",
       "y; --backward: dx (dy as y)",
       "--shape 2x3",
       {},
       false,
       run_log_softmax},
      {"cross_entropy",
       "logits x [B, C]; class ids from --targets",
       "loss (f32; the mean over rows not ignored, the sum, or [B] for none); --backward: dx",
       "--shape 2x3 --targets 2,0",
       {{"--targets", "IDS",
         "the class id of each row of x, 0 to C-1 or the --ignore-index, separated by commas; required", ""},
        {"--ignore-index", "N", "a target that adds no loss and no gradient, and is not counted by the mean",
         "-100"},
        {"--label-smoothing", "E", "the target is (1-E) onehot + E/C, E from 0 to 1", "0"},
        {"--reduction", "R", "mean, sum or none (one loss per row)", "mean"}},
       false,
       run_cross_entropy},
      {"nll_loss",
       "log-probabilities x [B, C]; class ids from --targets",
       "loss (f32; the mean over rows not ignored, the sum, or [B] for none); --backward: dx",
       "--shape 2x3 --targets 2,0",
       {{"--targets", "IDS",
         "the class id of each row of x, 0 to C-1 or the --ignore-index, separated by commas; required", ""},
        {"--ignore-index", "N", "a target that adds no loss and no gradient, and is not counted by the mean",
         "-100"},
        {"--reduction", "R", "mean, sum or none (one loss per row)", "mean"}},
       false,
       run_nll_loss},
      {"mse_loss",
       "x, any shape; then a target of the same shape (stdin, f32)",
       "loss (f32, the mean over all elements); --backward: dx",
       "--shape 2x3",
       {},
       false,
       run_mse_loss},
      {"max_pool2d",
       "x [N, C, H, W]",
       "y [N, C, H', W']; --backward: dx",
       "--shape 1x1x4x4 --kernel-size 2",
       {{"--kernel-size", "K", "the window's size (square); required", ""},
        {"--stride", "S", "the window's step (default: the kernel size)", ""},
        {"--padding", "P", "padding on each side (never the maximum), at most K/2", "0"}},
       false,
       run_max_pool2d},
      {"avg_pool2d",
       "x [N, C, H, W]",
       "y [N, C, H', W']; --backward: dx",
       "--shape 1x1x4x4 --kernel-size 2",
       {{"--kernel-size", "K", "the window's size (square); required", ""},
        {"--stride", "S", "the window's step (default: the kernel size)", ""},
        {"--padding", "P", "zeros on each side, counted in the average, at most K/2", "0"}},
       false,
       run_avg_pool2d},
  };
  return table;
}

}  // namespace mpt::cli::op
