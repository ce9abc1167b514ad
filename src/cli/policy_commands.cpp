// Chapter 06 — `mpt policy show`: what a policy does with every op the
// library knows, for inputs of one dtype; `mpt policy search`: a policy
// found by measurement, compared with the presets.
// Depends on: command.hpp (registry), cli_support.hpp, CLI11, nlohmann-json,
// and the mpt library's policy string, autocast lists, presets, cost model
// and (search) the train tier's policy_search.hpp; trace_commands.hpp (show --model).
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
#include "mpt/core/cost_model.hpp"
#include "mpt/core/ops.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/presets.hpp"
#include "mpt/core/text.hpp"
#include "mpt/train/policy_search.hpp"
#include "trace_commands.hpp"

namespace {

using mpt::cli::UsageError;

struct PolicyShowArgs {
  std::string policy, inputs = "f32", model;
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
    // Chapter 7: a GEMM that can run in FP8 (a Linear layer) may hear
    // another answer than F.linear: shown as a row of its own where it does.
    if (op.name == "linear") {
      ShownOp g;
      g.op = "linear (Linear layer)";
      g.runs = true;
      try {
        mpt::OpQuery q{op.name, "", query_inputs(op, x, *policy), true};
        g.d = policy->decide(q);
      } catch (const std::invalid_argument& e) {
        g.refused = e.what();
      }
      if (g.refused.empty() && mpt::is_fp8(g.d.input)) rows.push_back(std::move(g));
    }
  }
  const mpt::PolicyNeeds needs = spec.needs();
  // --model: the model's traced step under the policy, made before anything
  // is printed (a pattern that selects none of its paths is bad input).
  std::ostringstream trace;
  if (!a.model.empty()) mpt::cli::trace_under_policy(a.model, a.policy, a.json, trace);
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
    if (!a.model.empty()) j["trace"] = Json::parse(trace.str());
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "policy " << spec.text() << ": " << policy->describe() << "\n";
  if (!needs.origin.empty()) std::cout << needs.origin << "\n";
  std::cout << "asks a run for: " << (needs.master_weights ? "FP32 master weights" : "no master weights")
            << ", scaler " << (needs.scaler.empty() ? "of your choice" : needs.scaler) << "\n"
            << "inputs arriving in " << mpt::dtype_name(x)
            << " (parameters in the dtype the policy gives them); * = no layer runs it yet\n\n";
  std::cout << std::left << std::setw(36) << "op" << std::setw(20) << "list" << std::setw(7) << "reads"
            << std::setw(9) << "computes"
            << "stores\n";
  for (const ShownOp& r : rows) {
    std::cout << std::setw(36) << (r.op + (r.runs ? "" : " *")) << std::setw(20)
              << (r.list.empty() ? "-" : r.list);
    if (r.refused.empty())
      std::cout << std::setw(7) << mpt::dtype_name(r.d.input) << std::setw(9) << mpt::dtype_name(r.d.compute)
                << mpt::dtype_name(r.d.output) << "\n";
    else std::cout << "refused: " << r.refused << "\n";
  }
  if (!a.model.empty())
    std::cout << "\none training step of the " << a.model << " under it (mpt trace --model " << a.model
              << " --policy " << spec.text() << "):\n"
              << trace.str();
  return 0;
}

// --- mpt policy search ----------------------------------------------------

struct PolicySearchArgs {
  std::string model, budget, steps = "30", seeds = "2", dtype = "f16", scaler = "dynamic", gpu = "h100-sxm",
                             depth = "0";
  bool compare = false, json = false;
};

// The policies a search is compared with: apex's O1-O3, Keras's
// mixed_float16, and the rule of thumb of the mission's source text for the
// model's task (vision: BatchNorm in FP32, by the layers' names; language:
// the Transformer's FFN in FP32).
std::vector<std::string> comparison_policies(const std::string& model) {
  std::vector<std::string> p = {"O1", "O2", "O3", "mixed_float16"};
  if (model == "cnn") p.emplace_back("f16+bn*=f32");
  if (model == "transformer") p.emplace_back("f16+block*.mlp=f32");
  return p;
}

nlohmann::ordered_json evaluation_json(const mpt::train::Evaluation& e) {
  return {{"policy", e.policy},
          {"final_losses", e.final_losses},
          {"mean_loss", e.mean_loss},
          {"spread", e.spread},
          {"skipped", e.skipped},
          {"finite", e.finite},
          {"grad_error", e.grad_error},
          {"activation_bytes", e.activation_bytes},
          {"weight_bytes", e.weight_bytes},
          {"seconds", e.seconds}};
}

std::string microseconds(double s) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(2) << s * 1e6 << " us";
  return o.str();
}

int cmd_policy_search(const PolicySearchArgs& a) {
  namespace tr = mpt::train;
  tr::SearchOptions o;
  if (a.model.empty()) throw UsageError("missing --model; give mlp, cnn or transformer");
  if (a.budget.empty())
    throw UsageError(
        "missing --budget; give the relative increase of the final loss allowed, e.g. --budget 0.02");
  o.model = a.model;
  if (!mpt::cli::parse_number(a.budget, o.budget))
    throw UsageError("--budget: " + mpt::cli::not_a_number(a.budget));
  o.steps = mpt::cli::whole_option("--steps", a.steps, 1, 100000);
  o.seeds = static_cast<int>(mpt::cli::whole_option("--seeds", a.seeds, 1, 64));
  o.depth = static_cast<int>(mpt::cli::whole_option("--depth", a.depth, 0, 16));
  if (a.dtype != "f16" && a.dtype != "bf16")
    throw UsageError("--dtype: " + mpt::shown(a.dtype) +
                     " is not one the search lowers to; valid: f16, bf16");
  o.low = mpt::dtype_named(a.dtype);
  o.scaler = a.scaler;
  o.gpu = a.gpu;
  mpt::cli::invalid_argument_is_usage_error([&] { tr::check_search_options(o); });
  const tr::SearchResult r = tr::search_policy(o);
  std::vector<tr::Evaluation> compared;
  if (a.compare) {
    const std::vector<float> g32 = tr::reference_gradients(o);
    for (const std::string& p : comparison_policies(o.model))
      compared.push_back(tr::evaluate_policy(o, p, g32));
  }
  if (a.json) {
    using Json = nlohmann::ordered_json;
    Json layers = Json::array();
    for (const tr::LayerResult& l : r.layers)
      layers.push_back({{"path", l.path},
                        {"ops", l.ops},
                        {"loss_change", l.loss_change},
                        {"grad_error", l.grad_error},
                        {"loss_when_tried", l.loss_when_tried},
                        {"lowered", l.lowered}});
    Json cmp = Json::array();
    for (const tr::Evaluation& e : compared) cmp.push_back(evaluation_json(e));
    Json j = {{"model", o.model},
              {"dtype", mpt::dtype_name(o.low)},
              {"scaler", o.scaler},
              {"budget", o.budget},
              {"steps", o.steps},
              {"seeds", o.seeds},
              {"depth", o.depth},
              {"gpu", o.gpu},
              {"loss_limit", r.loss_limit},
              {"fp32", evaluation_json(r.fp32)},
              {"layers", layers},
              {"policy", r.policy},
              {"found", evaluation_json(r.found)},
              {"evaluations", r.evaluations},
              {"compare", cmp}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  const auto out = mpt::cli::outcome_text;
  std::cout << "policy search on the " << o.model << ": layers"
            << (o.depth > 0 ? " (op paths cut to " + std::to_string(o.depth) + " segments)" : std::string())
            << " lowered to " << mpt::dtype_name(o.low) << " one at a time, " << o.steps << " steps x "
            << o.seeds << " seeds per candidate, scaler " << o.scaler << "\n"
            << "FP32 final loss " << out(r.fp32.mean_loss) << " (spread " << out(r.fp32.spread)
            << " over the seeds); budget " << out(o.budget) << " of it: a candidate may reach "
            << out(r.loss_limit) << "\n\n";
  std::vector<std::vector<std::string>> rows = {
      {"layer", "ops", "loss change alone", "gradient error alone", "loss with it (greedy)", "verdict"}};
  for (const tr::LayerResult& l : r.layers)
    rows.push_back({l.path, l.ops, out(l.loss_change), out(l.grad_error), out(l.loss_when_tried),
                    l.lowered ? std::string(mpt::dtype_name(o.low)) : "f32"});
  std::cout << mpt::cli::table(rows, "llrrrl") << "\n";
  std::cout << "found: " << r.policy << "\n  (" << r.evaluations << " candidates of " << o.seeds
            << (o.seeds == 1 ? " run" : " runs") << " each; reuse it with mpt train --policy '" << r.policy
            << "')\n";
  std::vector<const tr::Evaluation*> shown = {&r.fp32, &r.found};
  for (const tr::Evaluation& e : compared) shown.push_back(&e);
  const mpt::GpuSpec& gpu = mpt::gpu_spec(o.gpu);
  std::vector<std::vector<std::string>> cmp = {{"policy", "final loss", "spread", "skipped",
                                                "activation bytes", "weight bytes",
                                                "step on " + std::string(gpu.name), "in budget"}};
  for (const tr::Evaluation* e : shown)
    cmp.push_back({e->policy, out(e->mean_loss), out(e->spread), std::to_string(e->skipped),
                   out(e->activation_bytes), out(e->weight_bytes), microseconds(e->seconds),
                   e->finite && e->mean_loss <= r.loss_limit ? "yes" : "no"});
  std::cout << "\n"
            << mpt::cli::table(cmp, "lrrrrrrl")
            << "(step time: the cost model's roofline estimate from a traced step, " << gpu.what << ", "
            << gpu.source << ")\n";
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
                   "jmp:params=float32,compute=float16, f16+keep-f32:softmax, fp8:delayed, ...")
      ->required()
      ->type_name("POLICY");
  show->add_option("--inputs", a->inputs, "the dtype the ops' inputs arrive in: f32, f16 or bf16")
      ->capture_default_str()
      ->type_name("DTYPE");
  show->add_option("--model", a->model,
                   "also one training step of this model under the policy, as mpt trace --model M --policy "
                   "POLICY prints it: mlp, cnn, transformer (its patterns must select the model's paths)")
      ->type_name("M");
  show->add_flag(
      "--json", a->json,
      "the same as JSON: {\"policy\", \"describe\", [\"params\", \"compute\", \"output\", \"jmp_str\" "
      "for jmp], \"needs\": {\"master_weights\", \"scaler\"}, \"origin\", \"ops\": [{\"op\", \"list\", "
      "\"input\", \"compute\", \"output\", \"reads\" (or \"refused\"), \"runs\"}], with --model \"trace\": "
      "what mpt trace --json prints}");
  handlers.on(show, [a] { return cmd_policy_show(*a); });

  auto b = std::make_shared<PolicySearchArgs>();
  auto* search = policy->add_subcommand(
      "search",
      "Find a policy by measurement: the sensitivity of the loss and the first step's gradient to lowering "
      "each layer alone, then greedily the lowest-precision assignment whose final loss (the mean of the "
      "last 5 steps' losses, over the seeds) stays within --budget of FP32's; prints the policy string it "
      "found, the table, and (--compare) apex's O1-O3, Keras's mixed_float16 and the task's rule of thumb "
      "measured the same way, with bytes and the cost model's step time.");
  search->add_option("--model", b->model, "the model: mlp, cnn or transformer (with its chapter's data)")
      ->type_name("M");
  search->add_option("--budget", b->budget, "the relative increase of FP32's final loss allowed, e.g. 0.02")
      ->type_name("X");
  search->add_option("--steps", b->steps, "steps of every run")->capture_default_str()->type_name("N");
  search->add_option("--seeds", b->seeds, "runs per candidate (seeds from the chapter's)")
      ->capture_default_str()
      ->type_name("K");
  search->add_option("--dtype", b->dtype, "the dtype layers are lowered to: f16 or bf16")
      ->capture_default_str()
      ->type_name("DTYPE");
  search
      ->add_option("--scaler", b->scaler, "every run's scaler: dynamic, static:S, none (a preset's own wins)")
      ->capture_default_str()
      ->type_name("S");
  search->add_option("--gpu", b->gpu, "the cost model's GPU: h100-sxm, h200-sxm")
      ->capture_default_str()
      ->type_name("GPU");
  search
      ->add_option(
          "--depth", b->depth,
          "how finely the model is cut into layers: 0, every op path; D, the paths cut to their first "
          "D segments (block0.attn.q is in block0.attn at 2, in block0 at 1): fewer candidates")
      ->capture_default_str()
      ->type_name("D");
  search->add_flag("--compare", b->compare,
                   "also measure O1, O2, O3, mixed_float16 and the task's rule of thumb");
  search->add_flag("--json", b->json,
                   "the same as JSON: {\"model\", \"dtype\", \"scaler\", \"budget\", \"steps\", \"seeds\", "
                   "\"depth\", \"gpu\", "
                   "\"loss_limit\", \"fp32\", \"layers\": [{\"path\", \"ops\", \"loss_change\", "
                   "\"grad_error\", \"loss_when_tried\", \"lowered\"}], \"policy\", \"found\", "
                   "\"evaluations\", \"compare\"}; an evaluation is {\"policy\", \"final_losses\", "
                   "\"mean_loss\", \"spread\", \"skipped\", \"finite\", \"grad_error\", "
                   "\"activation_bytes\", \"weight_bytes\", \"seconds\"}");
  handlers.on(search, [b] { return cmd_policy_search(*b); });
}

}  // namespace

// Chapter 6's first family.
const mpt::cli::Registration policy_registered{{6, 1}, "policy", add_policy_commands};
