// Chapter 06 — `mpt policy show`: what a policy does with every op the
// library knows, for inputs of one dtype.
// Depends on: command.hpp (registry), cli_support.hpp, CLI11, nlohmann-json,
// and the mpt library's policy string, autocast lists and presets.
//
// For each op of the table: the autocast list it is on (for an autocast
// base), and the dtypes it reads, computes and stores when its floating
// inputs arrive in --inputs (parameters in the dtype the policy gives them),
// or the line it is refused with (a banned op, a product of mixed dtypes).
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "command.hpp"
#include "mpt/core/autocast.hpp"
#include "mpt/core/ops.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/presets.hpp"

namespace {

using mpt::cli::UsageError;

struct PolicyShowArgs {
  std::string policy, inputs = "f32";
  bool json = false;
};

// The floating inputs an op of this kind is asked about: the activation,
// then its parameters (in the policy's dtype for them) or its other operands.
std::vector<mpt::DType> query_inputs(const mpt::OpInfo& op, mpt::DType x, const mpt::Policy& p) {
  const std::string n(op.name);
  if (n == "linear" || n == "conv2d" || op.kind == mpt::OpKind::normalization)
    return {x, p.parameter_dtype(op.name, "")};
  if (n == "embedding") return {p.parameter_dtype(op.name, "")};
  if (n == "scaled_dot_product_attention") return {x, x, x};
  if (n == "matmul" || n == "bmm" || n == "add" || n == "mul" || n == "cat") return {x, x};
  return {x};
}

struct ShownOp {
  std::string op, list, refused;
  bool runs = false;
  mpt::OpPrecision d{mpt::DType::f32, mpt::DType::f32, mpt::DType::f32};
};

int cmd_policy_show(const PolicyShowArgs& a) {
  const mpt::PolicySpec spec =
      mpt::cli::invalid_argument_is_usage_error([&] { return mpt::parse_policy_string(a.policy); });
  mpt::DType x = mpt::DType::f32;
  try {
    x = mpt::dtype_named(a.inputs);
  } catch (const std::invalid_argument&) {
    x = mpt::DType::e4m3;  // refused just below
  }
  if (x != mpt::DType::f32 && x != mpt::DType::f16 && x != mpt::DType::bf16)
    throw UsageError("--inputs: '" + a.inputs + "' is not one of f32, f16, bf16");
  const std::shared_ptr<const mpt::Policy> policy =
      mpt::cli::invalid_argument_is_usage_error([&] { return spec.make(); });
  // The autocast device whose lists apply, when the base is an autocast
  // policy (O1 is CUDA's), from the base's name: clauses may wrap it.
  const mpt::AutocastDevice device = spec.base && spec.base->canonical.rfind("autocast:cpu", 0) == 0
                                         ? mpt::AutocastDevice::cpu
                                         : mpt::AutocastDevice::cuda;
  std::vector<ShownOp> rows;
  for (const mpt::OpInfo& op : mpt::known_ops()) {
    ShownOp r;
    r.op = std::string(op.name);
    r.runs = op.chapter != 0;
    if (spec.base && spec.base->autocast)
      r.list = std::string(mpt::cast_list_name(mpt::autocast_list(device, op.name)));
    try {
      r.d = policy->decide({op.name, "", query_inputs(op, x, *policy)});
    } catch (const std::invalid_argument& e) {
      r.refused = e.what();
    }
    rows.push_back(std::move(r));
  }
  const mpt::PolicyNeeds needs = spec.needs();
  if (a.json) {
    using Json = nlohmann::ordered_json;
    Json ops = Json::array();
    for (const ShownOp& r : rows) {
      Json o = {{"op", r.op},
                {"list", r.list.empty() ? Json(nullptr) : Json(r.list)},
                {"input", mpt::dtype_name(x)}};
      if (r.refused.empty()) {
        o["compute"] = mpt::dtype_name(r.d.compute);
        o["output"] = mpt::dtype_name(r.d.output);
        o["reads"] = mpt::dtype_name(r.d.input);
      } else {
        o["refused"] = r.refused;
      }
      o["runs"] = r.runs;
      ops.push_back(std::move(o));
    }
    Json j = {{"policy", spec.text()}, {"describe", policy->describe()}};
    if (spec.base && spec.base->canonical.rfind("jmp:", 0) == 0) {
      const mpt::JmpSpec jmp = mpt::parse_jmp(spec.base->canonical.substr(4));
      j["params"] = mpt::dtype_name(jmp.params);
      j["compute"] = mpt::dtype_name(jmp.compute);
      j["output"] = mpt::dtype_name(jmp.output);
      j["jmp_str"] = jmp.jmp_text();
    }
    j["needs"] = {{"master_weights", needs.master_weights},
                  {"scaler", needs.scaler.empty() ? Json(nullptr) : Json(needs.scaler)}};
    j["origin"] = needs.origin.empty() ? Json(nullptr) : Json(needs.origin);
    j["ops"] = std::move(ops);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "policy " << spec.text() << ": " << policy->describe() << "\n";
  if (!needs.origin.empty()) std::cout << needs.origin << "\n";
  std::cout << "asks a run for: " << (needs.master_weights ? "FP32 master weights" : "no master weights")
            << ", scaler " << (needs.scaler.empty() ? "of your choice" : needs.scaler) << "\n"
            << "inputs arriving in " << mpt::dtype_name(x)
            << " (parameters in the dtype the policy gives them); * = no layer runs it yet\n\n";
  std::cout << std::left << std::setw(34) << "op" << std::setw(20) << "list" << std::setw(7) << "reads"
            << std::setw(9) << "computes"
            << "stores\n";
  for (const ShownOp& r : rows) {
    std::cout << std::setw(34) << (r.op + (r.runs ? "" : " *")) << std::setw(20)
              << (r.list.empty() ? "-" : r.list);
    if (r.refused.empty())
      std::cout << std::setw(7) << mpt::dtype_name(r.d.input) << std::setw(9) << mpt::dtype_name(r.d.compute)
                << mpt::dtype_name(r.d.output) << "\n";
    else std::cout << "refused: " << r.refused << "\n";
  }
  return 0;
}

void add_policy_commands(CLI::App& app, mpt::cli::Handlers& handlers) {
  auto* policy =
      app.add_subcommand("policy", "Chapter 6's precision policies: presets, autocast lists, rules")
          ->require_subcommand(1);
  auto a = std::make_shared<PolicyShowArgs>();
  auto* show = policy->add_subcommand(
      "show",
      "For every op the library knows, the autocast list it is on (autocast bases) and the dtypes it "
      "reads, computes and stores under POLICY when its inputs arrive in --inputs; also what the policy "
      "asks of a training run (master weights, a scaler) and where a preset comes from.");
  show->add_option("POLICY", a->policy,
                   "a policy string as mpt train takes it: f16, O1, autocast:cpu:bf16, mixed_float16, "
                   "jmp:params=float32,compute=float16, f16+keep-f32:softmax, ...")
      ->required()
      ->type_name("POLICY");
  show->add_option("--inputs", a->inputs, "the dtype the ops' inputs arrive in: f32, f16 or bf16")
      ->capture_default_str()
      ->type_name("DTYPE");
  show->add_flag(
      "--json", a->json,
      "the same as JSON: {\"policy\", \"describe\", [\"params\", \"compute\", \"output\", \"jmp_str\" "
      "for jmp], \"needs\": {\"master_weights\", \"scaler\"}, \"origin\", \"ops\": [{\"op\", \"list\", "
      "\"input\", \"compute\", \"output\", \"reads\" (or \"refused\"), \"runs\"}]}");
  handlers.on(show, [a] { return cmd_policy_show(*a); });
}

}  // namespace

// Chapter 6's first family.
const mpt::cli::Registration policy_registered{{6, 1}, "policy", add_policy_commands};
