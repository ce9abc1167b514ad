// Chapter 03 — `mpt op`: the runnable ops (see op_runners.hpp).
// Depends on: op_runners.hpp, cli_support.hpp (UsageError, number parsing),
// and the mpt library's nn tier (Linear, ReLU, GELU, the losses), core tier
// (Context, Policy, Rng, Tensor).
//
// A runner checks its own options and the input's shape first, then takes
// its blocks of stdin, builds the layer with the call's policy, runs it
// forward (and backward) exactly as a model would, and returns what the
// layer stored: nothing here computes a value of its own.
#include "op_runners.hpp"

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_support.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/random.hpp"
#include "mpt/nn/activations.hpp"
#include "mpt/nn/layer_math.hpp"
#include "mpt/nn/linear.hpp"
#include "mpt/nn/losses.hpp"

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

namespace {

// ---------------------------------------------------------------------------
// What every runner needs.

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
  Rng rng(seed);
  Linear layer(static_cast<int>(c.shape[1]), out_features, rng);
  layer.apply_policy(*c.policy);
  Context ctx(c.policy);
  const Tensor x = input(c, in, c.shape);
  const Tensor y = layer.forward(x, ctx);
  std::vector<OpOutput> out = {{"y", y}, {"weight", layer.weight.weights()}, {"bias", layer.bias.weights()}};
  if (c.backward) {
    const Tensor dx = layer.backward(output_gradient(in, y, y.shape()), ctx);
    out.push_back({"dx", dx});
    out.push_back({"dweight", layer.weight.grad});
    out.push_back({"dbias", layer.bias.grad});
  }
  return out;
}

// ---------------------------------------------------------------------------
// relu, gelu: elementwise, any shape (the layer sees one row of all elements)

std::vector<OpOutput> run_pointwise(const OpCall& c, StdinNumbers& in, Module& layer) {
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
// mse_loss, cross_entropy: the loss (f32, a scalar); with --backward dy is
// one number, the gradient arriving at the loss (1, or a loss scale S)

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

std::vector<int> class_ids(const OpCall& c) {
  const std::int64_t rows = c.shape[0], classes = c.shape[1];
  const std::string valid = "give one class id per row of x, each from 0 to " + std::to_string(classes - 1) +
                            ", separated by commas (e.g. --targets " + (classes > 1 ? "1,0" : "0,0") +
                            " for 2 rows)";
  const std::string& text = required_option(c, "--targets", "the class of each row of x; " + valid);
  std::vector<int> ids;
  std::string item;
  std::istringstream items(text);
  while (std::getline(items, item, ',')) {
    long long v = 0;
    if (!parse_integer(item, 0, classes - 1, v))
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

std::vector<OpOutput> run_cross_entropy(const OpCall& c, StdinNumbers& in) {
  require_dims(c, 2, "cross_entropy", "logits x [B, C]");
  const std::vector<int> ids = class_ids(c);
  const Tensor x = input(c, in, c.shape);
  Context ctx(c.policy);
  std::vector<OpOutput> out = {{"loss", scalar(cross_entropy_loss(x, ids, ctx))}};
  if (c.backward) out.push_back({"dx", cross_entropy_backward(x, ids, loss_gradient(in), ctx)});
  return out;
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
      {"relu", "x, any shape", "y; --backward: dx", "--shape 2x3", {}, false, run_relu},
      {"gelu",
       "x, any shape",
       "y; --backward: dx",
       "--shape 2x3 --approximate tanh",
       {{"--approximate", "A", "none (exact, erf) or tanh, as torch.nn.GELU(approximate=...)", "none"}},
       false,
       run_gelu},
      {"cross_entropy",
       "logits x [B, C]; class ids from --targets",
       "loss (f32, the mean over rows); --backward: dx",
       "--shape 2x3 --targets 2,0",
       {{"--targets", "IDS", "the class id of each row of x, 0 to C-1, separated by commas; required", ""}},
       false,
       run_cross_entropy},
      {"mse_loss",
       "x, any shape; then a target of the same shape (stdin, f32)",
       "loss (f32, the mean over all elements); --backward: dx",
       "--shape 2x3",
       {},
       false,
       run_mse_loss},
  };
  return table;
}

}  // namespace mpt::cli::op
