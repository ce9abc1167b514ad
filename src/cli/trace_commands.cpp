// All chapters — `mpt trace`: where each value of a chapter's model is stored
// in which dtype, from the precision trace of one training step. Chapter 2's
// MLP, Chapter 3's digits CNN and Chapter 4's tiny Transformer, built by
// the model factory (a later chapter adds its model there).
// Depends on: command.hpp (registry), cli_support.hpp, CLI11, nlohmann_json,
// and the mpt library's nn tier (Model, the model factory, Mlp's
// Activation, TransformerConfig's defaults, trace_step), core tier
// (DType, policies, the trace and its renderings, Rng); trace_commands.hpp
// (what it offers `mpt policy show --model`).
//
// The model runs one forward, cross-entropy loss and backward on a seeded
// batch with a Trace attached; every line printed comes from that trace or
// from the model's parameters, nothing is computed here.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli_support.hpp"
#include "command.hpp"
#include "mpt/core/cost_model.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/fp8/linear_scaling.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/nn/models/model_factory.hpp"
#include "mpt/nn/models/transformer.hpp"
#include "trace_commands.hpp"

namespace {

using mpt::cli::joined;
using mpt::cli::UsageError;

/// The models `mpt trace` knows: the model factory's (Chapter 2's MLP,
/// Chapter 3's digits CNN, Chapter 4's tiny Transformer).
const std::vector<std::string>& kModels = mpt::model_names();
/// The tiny Transformer `mpt trace` runs: TransformerConfig's defaults
/// (D = 64, H = 4, L = 2, V = 96) on sequences of kTraceTokens tokens.
constexpr int kTraceTokens = 8;
/// The most weights, and the most activations of one layer (batch times
/// size), an MLP of `mpt trace` may have: 2^24, as `mpt op`'s inputs.
constexpr std::int64_t kMaxTraceElements = std::int64_t{1} << 24;
/// The activations of the Chapter 2 MLP, by the names --activation takes.
const std::vector<std::string> kActivations = {"relu", "gelu", "gelu_tanh"};

struct TraceArgs {
  std::string model = "mlp";
  std::string sizes = "8,32,32,4";
  std::string batch = "4";
  std::string dtype = "f16";
  std::string keep_f32;
  std::string keep_f32_ops;
  std::string policy;  // Chapter 6: the policy string of mpt train, instead of the three options above
  std::string gpu;     // Chapter 6: also the cost model's estimate on this GPU
  bool sizes_given = false, activation_given = false, dtype_given = false;
  std::string activation = "relu";
  std::string seed = "1";
  bool forward_only = false;
  bool json = false;
  std::string dot;
  std::string rankdir = "LR";
};

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> items;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) items.push_back(item);
  if (!text.empty() && text.back() == ',') items.push_back("");
  return items;
}

std::vector<int> parse_sizes(const std::string& text) {
  std::vector<int> sizes;
  for (const std::string& item : split_commas(text)) {
    long long v = 0;
    if (!mpt::cli::parse_integer(item, 1, 65536, v))
      throw UsageError("--sizes: '" + item +
                       "' is not a layer size; give whole numbers from 1 to 65536 "
                       "separated by commas, inputs first, e.g. --sizes 8,32,32,4");
    sizes.push_back(static_cast<int>(v));
  }
  if (sizes.size() < 2)
    throw UsageError("--sizes: '" + text + "' names " + std::to_string(sizes.size()) +
                     " size(s); give at least the inputs and the outputs, e.g. --sizes 8,32,32,4");
  // Each size is bounded, their products are not: 65536,65536 would be 2^32
  // weights (16 GiB).
  double weights = 0;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) weights += double(sizes[i]) * sizes[i + 1];
  if (weights > double(kMaxTraceElements))
    throw UsageError("--sizes: '" + text + "' makes " + std::to_string(static_cast<long long>(weights)) +
                     " weights, more than the " + std::to_string(kMaxTraceElements) +
                     " `mpt trace` takes; give smaller sizes, e.g. --sizes 8,32,32,4");
  return sizes;
}

mpt::Activation activation_named(const std::string& name) {
  if (name == "relu") return mpt::Activation::relu;
  if (name == "gelu") return mpt::Activation::gelu;
  if (name == "gelu_tanh") return mpt::Activation::gelu_tanh;
  throw UsageError("--activation: unknown activation '" + name + "'; valid: " + joined(kActivations));
}

struct Setup;
std::unique_ptr<mpt::Model> make_model(const Setup& s);

/// The model of the arguments, with every option checked before it runs.
struct Setup {
  bool cnn = false;
  bool transformer = false;
  mpt::MlpConfig config;  // the MLP's; for the CNN only dtype, policy and seed are read
  std::int64_t batch = 0;
  std::uint64_t seed = 0;
  std::string policy_text;  // Chapter 7: the canonical policy string, when one was given (fp8:RECIPE)
};

Setup setup_of(const TraceArgs& a) {
  bool known = false;
  for (const std::string& m : kModels) known = known || m == a.model;
  if (!known) throw UsageError("--model: unknown model '" + a.model + "'; valid models: " + joined(kModels));
  Setup s;
  s.cnn = a.model == "cnn";
  s.transformer = a.model == "transformer";
  if (s.cnn && (a.sizes_given || a.activation_given))
    throw UsageError(std::string("--model cnn: ") + (a.sizes_given ? "--sizes" : "--activation") +
                     " applies to --model mlp only; the digits CNN is fixed (64 inputs, 10 classes)");
  if (s.transformer && (a.sizes_given || a.activation_given))
    throw UsageError(std::string("--model transformer: ") + (a.sizes_given ? "--sizes" : "--activation") +
                     " applies to --model mlp only; the tiny Transformer is fixed (V 96, D 64, 4 heads, 2 "
                     "blocks, " +
                     std::to_string(kTraceTokens) + " tokens per sequence)");
  const int vocab = mpt::TransformerConfig{}.vocab_size;
  s.config.sizes = s.cnn           ? std::vector<int>{64, 10}
                   : s.transformer ? std::vector<int>{kTraceTokens, vocab}
                                   : parse_sizes(a.sizes);
  s.config.activation = activation_named(a.activation);
  try {
    s.config.dtype = mpt::dtype_named(a.dtype);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--dtype: ") + e.what());
  }
  long long v = 0;
  if (!mpt::cli::parse_integer(a.batch, 1, 4096, v))
    throw UsageError("--batch: '" + a.batch + "' is not a batch size; give a whole number from 1 to 4096");
  s.batch = v;
  for (const int size : s.config.sizes)
    if (double(s.batch) * size > double(kMaxTraceElements))
      throw UsageError("--batch " + a.batch + " --sizes " + a.sizes + ": a layer of " + std::to_string(size) +
                       " makes " + std::to_string(s.batch * size) + " activations, more than the " +
                       std::to_string(kMaxTraceElements) +
                       " `mpt trace` takes; give a smaller batch or sizes");
  if (!mpt::cli::parse_integer(a.seed, 0, std::numeric_limits<long long>::max(), v))
    throw UsageError("--seed: '" + a.seed + "' is not a seed; give a whole number from 0");
  s.seed = static_cast<std::uint64_t>(v);
  s.config.seed = s.seed;
  if (!a.policy.empty()) {
    // One grammar for every command: the policy string of mpt train.
    if (a.dtype_given || !a.keep_f32.empty() || !a.keep_f32_ops.empty())
      throw UsageError(std::string("--policy excludes ") +
                       (a.dtype_given         ? "--dtype"
                        : !a.keep_f32.empty() ? "--keep-f32"
                                              : "--keep-f32-ops") +
                       "; write it into the policy string, e.g. f16+keep-f32-layers:fc3+keep-f32:batch_norm");
    const mpt::PolicySpec spec =
        mpt::cli::invalid_argument_is_usage_error([&] { return mpt::parse_policy_string(a.policy); });
    std::vector<std::string> paths = make_model(s)->paths();
    paths.emplace_back("loss");
    mpt::cli::invalid_argument_is_usage_error([&] { mpt::check_patterns_select(spec, paths); });
    s.config.policy = spec.make();
    s.policy_text = spec.text();
    return s;
  }
  std::vector<std::string> keep, keep_ops;
  if (!a.keep_f32.empty()) {
    // The paths must be layers of this model: build it once to ask.
    const std::vector<std::string> valid = make_model(s)->paths();
    keep = split_commas(a.keep_f32);
    for (const std::string& p : keep) {
      bool found = false;
      for (const std::string& q : valid) found = found || q == p;
      if (!found)
        throw UsageError("--keep-f32: '" + p +
                         "' is not a layer of this model; valid layers: " + joined(valid));
    }
  }
  if (!a.keep_f32_ops.empty()) {
    keep_ops = split_commas(a.keep_f32_ops);
    for (const std::string& o : keep_ops) {
      try {
        (void)mpt::op_info(o);
      } catch (const std::invalid_argument& e) {
        throw UsageError(std::string("--keep-f32-ops: ") + e.what());
      }
    }
  }
  if (!keep.empty() || !keep_ops.empty())
    s.config.policy =
        std::make_shared<mpt::KeepF32Policy>(mpt::uniform_policy(s.config.dtype), keep, keep_ops);
  return s;
}

std::unique_ptr<mpt::Model> make_model(const Setup& s) {
  mpt::ModelSpec m;
  m.name = s.transformer ? "transformer" : s.cnn ? "cnn" : "mlp";
  m.policy = s.config.policy;
  m.dtype = s.config.dtype;
  m.seed = s.config.seed;
  if (!s.cnn && !s.transformer) {
    m.mlp_sizes = s.config.sizes;
    m.mlp_activation = s.config.activation;
  }
  std::unique_ptr<mpt::Model> model = mpt::make_model(m);
  // Chapter 7: under fp8:RECIPE each Linear gets its scaling state (the
  // Linears keep it; the traced step quantizes with the fresh scales of 1).
  (void)mpt::fp8::attach_fp8(*model, s.policy_text);
  return model;
}

std::string sizes_text(const std::vector<int>& sizes) {
  std::string s;
  for (int v : sizes) s += (s.empty() ? "" : "-") + std::to_string(v);
  return s;
}

int cmd_trace(const TraceArgs& a, std::ostream& os = std::cout) {
  const Setup s = setup_of(a);  // every option checked before anything runs
  const mpt::GpuSpec* gpu =
      a.gpu.empty() ? nullptr : &mpt::cli::invalid_argument_is_usage_error([&]() -> const mpt::GpuSpec& {
        try {
          return mpt::gpu_spec(a.gpu);
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument(std::string("--gpu: ") + e.what());
        }
      });
  const std::unique_ptr<mpt::Model> model = make_model(s);
  mpt::Model& net = *model;
  // A seeded batch: standard-normal inputs, labels uniform over the outputs
  // (the Transformer: token ids uniform over the vocabulary, one label per
  // position).
  mpt::Rng rng(s.seed);
  mpt::MatrixF x(s.batch, s.config.sizes.front());
  for (Eigen::Index i = 0; i < x.size(); ++i)
    x.data()[i] = s.transformer
                      ? static_cast<float>(rng.below(static_cast<std::uint64_t>(s.config.sizes.back())))
                      : static_cast<float>(rng.normal());
  std::vector<int> labels(static_cast<std::size_t>(s.batch * (s.transformer ? kTraceTokens : 1)));
  for (int& y : labels) y = static_cast<int>(rng.below(static_cast<std::uint64_t>(s.config.sizes.back())));
  // A policy that refuses an op (a banned op, a product of mixed dtypes where
  // autocast is off) refuses it here: bad input, one line, exit 2.
  const mpt::Trace trace = mpt::cli::invalid_argument_is_usage_error([&] {
    try {
      return mpt::trace_step(net, x, labels, a.forward_only);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("the policy refuses an op of the step: ") + e.what());
    }
  });
  const std::string policy = net.context().policy().describe();
  const std::string title =
      (s.cnn           ? std::string("digits CNN 1x8x8 -> conv-bn-relu-pool x2 -> fc 10")
       : s.transformer ? "tiny Transformer V 96, D 64, 4 heads, 2 blocks, " + std::to_string(kTraceTokens) +
                             " tokens per sequence"
                       : "MLP " + sizes_text(s.config.sizes) + " (" + a.activation + ")") +
      ", batch " + std::to_string(s.batch) + ", policy: " + policy;
  if (!a.dot.empty()) {
    std::string graph = mpt::render_dot(trace, title);
    const std::string lr = "rankdir=LR";
    const std::size_t at = graph.find(lr);
    if (a.rankdir == "TB" && at != std::string::npos) graph.replace(at, lr.size(), "rankdir=TB");
    mpt::cli::write_atomically(a.dot, graph);
  }

  if (a.json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(mpt::render_json(trace));
    nlohmann::ordered_json params = nlohmann::ordered_json::array();
    for (const mpt::Parameter* p : net.parameters())
      params.push_back({{"name", p->name},
                        {"shape", p->master.shape()},
                        {"model_dtype", mpt::dtype_name(p->model_dtype())},
                        {"model_bytes", p->model_bytes()},
                        {"master_bytes", p->master.bytes()},
                        {"grad_bytes", p->grad.bytes()}});
    nlohmann::ordered_json out = {{"model", title},
                                  {"policy", policy},
                                  {"trace", j},
                                  {"parameters", params},
                                  {"activation_bytes", net.activation_bytes()}};
    if (gpu != nullptr) {
      const mpt::StepCost c = mpt::estimate_cost(trace, *gpu);
      nlohmann::ordered_json ops = nlohmann::ordered_json::array();
      for (const mpt::OpCost& o : c.ops)
        ops.push_back({{"phase", mpt::phase_name(o.phase)},
                       {"path", o.path},
                       {"op", o.op},
                       {"bytes", o.bytes},
                       {"flops", o.flops},
                       {"unit", mpt::unit_name(o.unit)},
                       {"seconds", o.seconds},
                       {"memory_bound", o.memory_bound}});
      out["cost"] = {{"gpu", c.gpu},
                     {"bytes", c.bytes},
                     {"flops", c.flops},
                     {"tensor_flops", c.tensor_flops},
                     {"seconds", c.seconds},
                     {"forward_seconds", c.forward_seconds},
                     {"ops", ops}};
    }
    os << out.dump(2) << "\n";
    return 0;
  }
  os << "mpt trace: " << title << "\n\n" << mpt::render_text(trace);
  std::vector<std::vector<std::string>> rows = {
      {"parameter", "shape", "model copy", "bytes", "master", "grad"}};
  for (const mpt::Parameter* p : net.parameters())
    rows.push_back({p->name, mpt::shape_string(p->master.shape()),
                    std::string(mpt::dtype_name(p->model_dtype())) +
                        (p->model_dtype() == mpt::DType::f32 ? " (the master)" : ""),
                    std::to_string(p->model_bytes()), "f32 " + std::to_string(p->master.bytes()),
                    "f32 " + std::to_string(p->grad.bytes())});
  os << "\n" << mpt::cli::table(rows, "lllrrr");
  os << "\nactivations kept for backward: " << net.activation_bytes() << " bytes\n";
  if (gpu != nullptr) {
    const mpt::StepCost c = mpt::estimate_cost(trace, *gpu);
    std::vector<std::vector<std::string>> cost = {
        {"phase", "path", "op", "bytes", "FLOPs", "unit", "ns", "bound"}};
    for (const mpt::OpCost& o : c.ops)
      cost.push_back({mpt::phase_name(o.phase), o.path, o.op, mpt::cli::outcome_text(o.bytes),
                      mpt::cli::outcome_text(o.flops), std::string(mpt::unit_name(o.unit)),
                      mpt::cli::outcome_text(o.seconds * 1e9), o.memory_bound ? "memory" : "arithmetic"});
    os << "\ncost model on " << gpu->what << " (roofline per op, no launch cost; " << gpu->source << "):\n"
       << mpt::cli::table(cost, "lllrrlrl") << "step: " << mpt::cli::outcome_text(c.bytes) << " bytes, "
       << mpt::cli::outcome_text(c.flops) << " FLOPs (" << mpt::cli::outcome_text(c.tensor_flops)
       << " on tensor cores), " << mpt::cli::outcome_text(c.seconds * 1e6) << " us (forward "
       << mpt::cli::outcome_text(c.forward_seconds * 1e6) << " us)\n";
  }
  if (!a.dot.empty()) os << "graph written to " << a.dot << " (render: dot -Tsvg " << a.dot << ")\n";
  return 0;
}

void add_trace_commands(CLI::App& app, mpt::cli::Handlers& handlers) {
  auto a = std::make_shared<TraceArgs>();
  auto* trace = app.add_subcommand(
      "trace",
      "Show where each value of a chapter's model is stored in which dtype: one training step "
      "(forward, cross-entropy loss, backward) on a seeded batch with the precision trace on, one line "
      "per op and per cast at an op boundary (what it read, the dtype it computed in, what it wrote and "
      "how many bytes), then every parameter's model copy, master and gradient.");
  trace->add_option("--model", a->model, "the model: " + joined(kModels))->capture_default_str();
  auto* sizes = trace->add_option("--sizes", a->sizes, "the MLP's layer sizes, inputs first")
                    ->capture_default_str()
                    ->type_name("LIST");
  auto* activation = trace
                         ->add_option("--activation", a->activation,
                                      "the MLP's, between its Linear layers: " + joined(kActivations))
                         ->capture_default_str();
  auto* dtype = trace->add_option("--dtype", a->dtype, "the uniform policy's dtype: " + mpt::dtype_names())
                    ->capture_default_str();
  trace
      ->add_option(
          "--keep-f32", a->keep_f32,
          "layers kept in f32 inside the uniform policy (KeepF32Policy), by path, e.g. fc3 or fc1,fc3, "
          "or bn1,bn2 in the CNN (apex's keep_batchnorm_fp32)")
      ->type_name("PATHS");
  trace
      ->add_option(
          "--keep-f32-ops", a->keep_f32_ops,
          "ops kept in f32 inside the uniform policy (KeepF32Policy), by PyTorch name, e.g. batch_norm, or "
          "layer_norm,scaled_dot_product_attention in the Transformer")
      ->type_name("OPS");
  trace
      ->add_option("--policy", a->policy,
                   "instead of --dtype, --keep-f32 and --keep-f32-ops: any policy string of mpt train "
                   "(O1, autocast:cpu:bf16, mixed_float16, f16+block*.mlp=f32, ...); its layer patterns must "
                   "select layers of the model")
      ->type_name("P");
  trace->add_option("--batch", a->batch, "rows of the batch (1 to 4096)")
      ->capture_default_str()
      ->type_name("N");
  trace->add_option("--seed", a->seed, "seed of the weights and the batch")
      ->capture_default_str()
      ->type_name("N");
  trace->add_flag("--forward-only", a->forward_only, "trace the forward pass and the loss only");
  trace
      ->add_option("--gpu", a->gpu,
                   "also the cost model per op: bytes, FLOPs, the unit, a roofline time on this GPU "
                   "(h100-sxm, h200-sxm)")
      ->type_name("GPU");
  trace->add_flag("--json", a->json,
                  "the same as JSON: {\"model\", \"policy\", \"trace\": {\"entries\": [{\"phase\", \"path\", "
                  "\"op\", \"inputs\", \"compute\", \"outputs\", \"bytes_written\"}], \"casts\", "
                  "\"cast_bytes\"}, \"parameters\", \"activation_bytes\", with --gpu \"cost\": {\"gpu\", "
                  "\"bytes\", \"flops\", \"tensor_flops\", \"seconds\", \"forward_seconds\", \"ops\"}}");
  trace
      ->add_option("--dot", a->dot,
                   "also write the trace as a Graphviz graph to this file (written atomically)")
      ->type_name("FILE.dot")
      ->check(mpt::cli::non_empty("a file name"));
  trace
      ->add_option("--rankdir", a->rankdir,
                   "the graph's direction: LR (left to right, the default) or TB (top to bottom, for "
                   "long models)")
      ->check(CLI::IsMember({"LR", "TB"}))
      ->capture_default_str();
  handlers.on(trace, [a, sizes, activation, dtype] {
    a->sizes_given = sizes->count() > 0;
    a->activation_given = activation->count() > 0;
    a->dtype_given = dtype->count() > 0;
    return cmd_trace(*a);
  });
}

// Chapter 2's second family: after `scaler`.
const mpt::cli::Registration trace_registered{{2, 2}, "trace", add_trace_commands};

}  // namespace

void mpt::cli::trace_under_policy(const std::string& model, const std::string& policy, bool json,
                                  std::ostream& out) {
  TraceArgs a;
  a.model = model;
  a.policy = policy;
  a.json = json;
  // The whole output is made before any of it is written: a refusal leaves `out` as it was.
  std::ostringstream text;
  (void)cmd_trace(a, text);
  out << text.str();
}
