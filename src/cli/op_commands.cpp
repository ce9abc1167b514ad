// Chapter 03 — `mpt op`: every op of the library from the command line, one
// subcommand per entry of op_table(): `mpt op list`, `mpt op NAME --shape S
// --dtype D [--policy P] [--train|--eval] [--backward] [--json]`.
// Depends on: command.hpp (registry), cli_support.hpp, op_runners.hpp (the
// table), CLI11, nlohmann_json, and the mpt library's core tier (the op
// table, DType, policies, Tensor) and explain (shortest_decimal).
//
// Everything is checked and every number on stdin read before the first
// line of output; every value printed is one the layer stored.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli_support.hpp"
#include "command.hpp"
#include "mpt/core/ops.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/formats/explain.hpp"
#include "op_runners.hpp"

namespace {

using Json = nlohmann::ordered_json;  // keeps the outputs in the runner's order
using mpt::cli::joined;
using mpt::cli::UsageError;
using mpt::cli::op::OpCall;
using mpt::cli::op::OpEntry;
using mpt::cli::op::OpOutput;

constexpr const char* kPolicyChoices =
    "valid: uniform (every op stores --dtype and computes in f32), keep-f32:OP[,OP...] (those ops "
    "read, compute and store f32 inside the uniform policy), or a policy string as mpt train takes it, "
    "e.g. keep-f32:linear, O1, autocast:cpu:bf16";

// ---------------------------------------------------------------------------
// The table, in the order of known_ops().

std::vector<const OpEntry*> runnable_ops() {
  std::vector<const OpEntry*> out;
  for (const mpt::OpInfo& info : mpt::known_ops())
    for (const OpEntry& e : mpt::cli::op::op_table())
      if (e.name == info.name) out.push_back(&e);
  if (out.size() != mpt::cli::op::op_table().size())
    throw std::logic_error("mpt op: an entry of op_table() is not one of known_ops(): " + mpt::op_names());
  for (const OpEntry* e : out)
    if (mpt::op_info(e->name).chapter == 0)
      throw std::logic_error("mpt op: '" + e->name + "' runs, but its row in known_ops() says chapter 0");
  return out;
}

std::vector<std::string> runnable_names() {
  std::vector<std::string> names;
  for (const OpEntry* e : runnable_ops()) names.push_back(e->name);
  return names;
}

// ---------------------------------------------------------------------------
// The common options.

std::shared_ptr<const mpt::Policy> parse_policy(const std::string& text, mpt::DType d) {
  if (text == "uniform") return mpt::uniform_policy(d);
  if (text.empty()) throw UsageError("--policy: unknown policy ''; " + std::string(kPolicyChoices));
  // The policy string of the library (policy_string.hpp), the one grammar of
  // mpt train and mpt trace; the older spelling keep-f32:OP[,OP...] takes
  // --dtype's uniform policy as its base.
  const std::string full =
      text.rfind("keep-f32:", 0) == 0 ? std::string(mpt::dtype_name(d)) + "+" + text : text;
  try {
    return mpt::parse_policy_string(full).make();
  } catch (const std::invalid_argument& e) {
    throw UsageError("--policy: " + std::string(e.what()));
  }
}

struct OpArgs {
  std::string shape, dtype = "f32", policy = "uniform";
  bool train = false, eval = false, backward = false, json = false;
  std::map<std::string, std::string> options;  // the entry's own, by flag
};

OpCall call_of(const OpEntry& e, const OpArgs& a) {
  OpCall c;
  c.shape = mpt::cli::op::parse_shape("--shape", a.shape);
  try {
    c.dtype = mpt::dtype_named(a.dtype);
  } catch (const std::invalid_argument& err) {
    throw UsageError(std::string("--dtype: ") + err.what());
  }
  c.policy = parse_policy(a.policy, c.dtype);
  if (a.train && a.eval)
    throw UsageError("--train and --eval exclude each other; give one of them (default: --train)");
  c.train = !a.eval;
  c.backward = a.backward;
  for (const mpt::cli::op::OpOption& o : e.options) {
    const std::string& given = a.options.at(o.flag);
    c.options[o.flag] = given.empty() ? o.default_value : given;
  }
  return c;
}

// ---------------------------------------------------------------------------
// Output.

std::string value_text(float v) { return mpt::shortest_decimal(v); }

// One line per run of the last dimension, indented: a matrix reads as one.
std::string text_of(const std::vector<OpOutput>& outputs) {
  std::string s;
  for (const OpOutput& o : outputs) {
    const mpt::Tensor& t = o.value;
    if (!s.empty()) s += "\n";
    s += o.name + ": " + std::string(mpt::dtype_name(t.dtype())) + " " + mpt::shape_string(t.shape()) + "\n";
    const std::int64_t row = t.dim() == 0 ? 1 : t.shape().back();
    for (std::int64_t i = 0; i < t.numel(); ++i)
      s += (i % row == 0 ? "  " : " ") + value_text(t.value(i)) + (i % row == row - 1 ? "\n" : "");
  }
  return s;
}

// A value as the shortest decimal that reads back as the same float: the
// double nearest that decimal, which nlohmann writes back as that decimal.
// JSON has no inf or NaN: they are null.
Json json_value(float v) {
  if (!std::isfinite(v)) return nullptr;
  return std::strtod(value_text(v).c_str(), nullptr);
}

std::string json_of(const std::vector<OpOutput>& outputs) {
  Json j = Json::object();
  for (const OpOutput& o : outputs) {
    Json values = Json::array();
    for (std::int64_t i = 0; i < o.value.numel(); ++i) values.push_back(json_value(o.value.value(i)));
    j[o.name] = {{"dtype", mpt::dtype_name(o.value.dtype())}, {"shape", o.value.shape()}, {"values", values}};
  }
  return j.dump(2) + "\n";
}

// ---------------------------------------------------------------------------
// The subcommands.

int cmd_run(const OpEntry& e, const OpArgs& a, const std::string& stray) {
  if (!stray.empty())
    throw UsageError("op " + e.name + ": unexpected argument '" + stray +
                     "'; the input comes on stdin (see mpt op " + e.name + " --help)");
  const OpCall c = call_of(e, a);
  mpt::cli::op::StdinNumbers in(std::cin, c.backward);
  const std::vector<OpOutput> outputs =
      mpt::cli::invalid_argument_is_usage_error([&] { return e.run(c, in); });
  in.finish();
  std::cout << (a.json ? json_of(outputs) : text_of(outputs));
  return 0;
}

int cmd_list() {
  const std::vector<const OpEntry*> ops = runnable_ops();
  std::vector<std::vector<std::string>> rows = {{"op", "chapter", "inputs", "outputs", "what"}};
  for (const OpEntry* e : ops) {
    const mpt::OpInfo& info = mpt::op_info(e->name);
    rows.push_back({e->name, std::to_string(info.chapter), e->inputs, e->outputs, std::string(info.what)});
  }
  std::cout << mpt::cli::table(rows, "lrlll");
  std::vector<std::vector<std::string>> rest = {{"op", "chapter", "what"}};
  for (const mpt::OpInfo& info : mpt::known_ops()) {
    bool runs = false;
    for (const OpEntry* e : ops) runs = runs || e->name == info.name;
    if (runs) continue;
    rest.push_back({std::string(info.name), info.chapter == 0 ? "-" : std::to_string(info.chapter),
                    std::string(info.what)});
  }
  if (rest.size() > 1)
    std::cout << "\nnot runnable from the command line yet (policies may already name them; chapter -: no "
                 "layer of the library runs it yet):\n"
              << mpt::cli::table(rest, "lrl");
  std::cout << "\nrun one: mpt op NAME --shape SHAPE [options] < numbers    (mpt op NAME --help)\n";
  return 0;
}

int cmd_op_name(const std::string& name) {
  const std::string valid = "runnable ops: " + joined(runnable_names()) + " (mpt op list)";
  if (name.empty()) throw UsageError("op: missing op name; give list or an op; " + valid);
  for (const mpt::OpInfo& info : mpt::known_ops())
    if (info.name == name)
      throw UsageError("op: '" + name + "' is a known op but not runnable from the command line yet; " +
                       valid);
  throw UsageError("op: unknown op '" + name + "'; " + valid);
}

std::string modes_text() {
  std::vector<std::string> modal;
  for (const OpEntry* e : runnable_ops())
    if (e->has_modes) modal.push_back(e->name);
  return modal.empty() ? "none of the runnable ops has modes yet" : "ops with modes: " + joined(modal);
}

void add_op(CLI::App& op, mpt::cli::Handlers& handlers, const OpEntry& e,
            const std::shared_ptr<const std::string>& stray) {
  auto a = std::make_shared<OpArgs>();
  const mpt::OpInfo& info = mpt::op_info(e.name);
  auto* sub = op.add_subcommand(
      e.name, "Run " + e.name + " (" + std::string(info.what) + ") on the numbers on stdin: " + e.inputs +
                  ". Prints " + e.outputs + ". Example: mpt op " + e.name + " " + e.example + " < numbers");
  sub->add_option("--shape", a->shape, "the input's shape, sizes separated by x (8x4x3x3); required")
      ->type_name("SHAPE");
  sub->add_option("--dtype", a->dtype,
                  "the input's dtype (its numbers are rounded into it, RNE) and the uniform policy's: " +
                      mpt::dtype_names())
      ->capture_default_str()
      ->type_name("D");
  sub->add_option("--policy", a->policy,
                  "uniform (the uniform policy of --dtype), keep-f32:OP[,OP...] (KeepF32Policy by op "
                  "name over it: those ops read, compute and store f32), or any policy string of mpt train "
                  "(e.g. O1, autocast:cpu:bf16, f16+keep-f32:softmax); --dtype is then the inputs' dtype")
      ->capture_default_str()
      ->type_name("P");
  sub->add_flag("--train", a->train, "train mode (the default); " + modes_text());
  sub->add_flag("--eval", a->eval,
                "eval mode; ops without modes run the same in both, as PyTorch's modules do");
  sub->add_flag("--backward", a->backward,
                "after the input, read the output's gradient dy (its shape; one number, the gradient "
                "arriving at the loss, for a loss) and print the gradients too");
  sub->add_flag(
      "--json", a->json,
      "{\"NAME\": {\"dtype\": \"f16\", \"shape\": [2, 3], \"values\": [...]}} per output, in order; "
      "values flattened, last dimension fastest; inf and NaN as null");
  for (const mpt::cli::op::OpOption& o : e.options) {
    std::string& value = a->options[o.flag];
    sub->add_option(o.flag, value, o.help)->type_name(o.type_name)->default_str(o.default_value);
  }
  handlers.on(sub, [&e, a, stray] { return cmd_run(e, *a, *stray); });
}

void add_op_commands(CLI::App& app, mpt::cli::Handlers& handlers) {
  auto* op = app.add_subcommand(
      "op",
      "Run one op of the library from the command line: `mpt op list`, then `mpt op NAME --shape SHAPE "
      "[--dtype D] [--policy P] [--train|--eval] [--backward] [--json]`. The input comes on stdin as "
      "whitespace-separated numbers (decimal or hex-float), exactly as many as --shape has elements, "
      "last dimension fastest; each is read as fp32 and rounded (RNE) into --dtype. An op may read "
      "more blocks after it (mse_loss: its target), and with --backward the output's gradient comes "
      "last. Every output is printed by name (y, dx, weight, ...) with its dtype and shape, then its "
      "stored values widened to float as the shortest decimals that read back as the same float, one "
      "line per run of the last dimension; --json gives the same as JSON, inf and NaN as null. linear "
      "and conv2d draw their parameters from --seed with the layer's own initialiser and print them; "
      "the norms' weight and bias start at 1 and 0, as PyTorch's. Bad shapes, counts, numbers or names: "
      "one line on stderr, exit status 2.");
  auto name = std::make_shared<std::string>();
  op->add_option("NAME", *name, "an op name: list, or one of the subcommands below");
  handlers.on(op, [name] { return cmd_op_name(*name); });

  auto* list = op->add_subcommand(
      "list", "The runnable ops: name, chapter, inputs, outputs, what; then every known op not runnable yet");
  handlers.on(list, [name] {
    if (!name->empty()) throw UsageError("op list: unexpected argument '" + *name + "'; it takes none");
    return cmd_list();
  });
  for (const OpEntry* e : runnable_ops()) add_op(*op, handlers, *e, name);
}

// Chapter 3's first family.
const mpt::cli::Registration op_registered{{3, 1}, "op", add_op_commands};

}  // namespace
