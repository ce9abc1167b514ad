// Chapter 06 — pitfall name-substring-policy: a per-layer policy chosen by name substring
// Depends on: common.hpp (check, num, this entry's declaration),
// mpt/core/cost_model.hpp, mpt/core/policy.hpp, mpt/core/policy_string.hpp,
// mpt/core/trace.hpp, mpt/nn/model.hpp (trace_step), mpt/nn/models/transformer.hpp;
// <memory>, <set>, <string>, <string_view>, <vector>.
//
// The mission's source text picks layers for FP32 with a substring of the
// module's name (`if 'bn' in name`, `if 'ffn' in name`). A substring knows
// nothing of a path's structure: on a Transformer of 12 blocks, "block1" is
// also a substring of "block10" and "block11", so a rule meant for one block
// silently keeps three in FP32, and nothing says so. Chapter 6's path
// patterns match whole `.`-separated segments: `f16+block1=f32` covers
// block1 and the layers under it, and never block10.
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common.hpp"
#include "mpt/core/cost_model.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/nn/model.hpp"
#include "mpt/nn/models/transformer.hpp"

namespace mpt::ch06 {
namespace {
namespace name_substring_policy {

constexpr int kBlocks = 12;  // block0 .. block11: "block1" is a prefix of two other names
constexpr int kTokens = 8;

/// The mission source's way: f16 everywhere, f32 wherever the module's name
/// contains `needle` (Python's `needle in name`).
class SubstringPolicy final : public Policy {
 public:
  explicit SubstringPolicy(std::string needle)
      : needle_(std::move(needle)), f16_(uniform_policy(DType::f16)), f32_(uniform_policy(DType::f32)) {}
  std::string describe() const override { return "f16; f32 where the name contains '" + needle_ + "'"; }

 protected:
  OpPrecision decide_op(const OpInfo& /*op*/, const OpQuery& q) const override {
    return pick(q.path).decide(q);
  }
  DType parameter_dtype_of(const OpInfo& op, std::string_view path) const override {
    return pick(path).parameter_dtype(op.name, path);
  }

 private:
  const Policy& pick(std::string_view path) const {
    //! [name-substring-policy-broken]
    // `if 'block1' in name:` keep it in FP32
    const bool keep = path.find(needle_) != std::string_view::npos;
    //! [name-substring-policy-broken]
    return keep ? *f32_ : *f16_;
  }
  std::string needle_;
  std::shared_ptr<const Policy> f16_, f32_;
};

std::shared_ptr<const Policy> fixed_policy() {
  //! [name-substring-policy-fixed]
  // a path pattern: whole segments, so "block1" covers block1.* and never block10
  return parse_policy_string("f16+block1=f32").make();
  //! [name-substring-policy-fixed]
}

RunResult run(const std::shared_ptr<const Policy>& policy, std::string setup) {
  TransformerConfig c;
  c.vocab_size = 32;
  c.context = kTokens;
  c.d_model = 16;
  c.num_heads = 2;
  c.num_layers = kBlocks;
  c.policy = policy;
  c.seed = 1;
  TinyTransformer net(c);
  MatrixF ids(1, kTokens);
  std::vector<int> targets;
  for (int t = 0; t < kTokens; ++t) {
    ids(0, t) = static_cast<float>((5 * t + 2) % c.vocab_size);
    targets.push_back((3 * t + 1) % c.vocab_size);
  }
  const Trace trace = trace_step(net, ids, targets);
  // The blocks whose MLP input projection read f32 activations: kept in FP32.
  std::set<int> f32_blocks;
  for (const TraceEntry& e : trace.entries())
    if (e.phase == Phase::forward && e.op == "linear" && e.inputs.front().dtype == DType::f32)
      for (int b = 0; b < kBlocks; ++b)
        if (e.path == "block" + std::to_string(b) + ".mlp.fc1") f32_blocks.insert(b);
  std::string which;
  for (int b : f32_blocks) which += (which.empty() ? "block" : ", block") + std::to_string(b);
  const StepCost cost = estimate_cost(trace, gpu_spec("h100-sxm"));
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"blocks", kBlocks, "Transformer blocks (block0 to block11)"},
      {"f32_blocks", static_cast<double>(f32_blocks.size()),
       "blocks whose layers ran in FP32 (from the trace)"},
      {"block1_f32", f32_blocks.count(1) != 0 ? 1.0 : 0.0, "1 when block1, the block meant, ran in FP32"},
      {"other_f32_blocks", static_cast<double>(f32_blocks.size() - f32_blocks.count(1)),
       "blocks other than block1 in FP32"},
      {"step_bytes", cost.bytes, "bytes the step's ops read and wrote (cost model)"},
      {"step_seconds_h100", cost.seconds, "the cost model's step time on an H100 SXM"},
  };
  r.explanation = "The trace shows FP32 in " + (which.empty() ? std::string("no block") : which) + ": " +
                  num(r.get("f32_blocks")) + " of " + std::to_string(kBlocks) +
                  " blocks, for a rule meant for one.";
  return r;
}

RunResult broken_run() {
  return run(
      std::make_shared<SubstringPolicy>("block1"),
      "a Transformer of 12 blocks (D 16, 8 tokens), f16 with FP32 wherever the name contains 'block1'");
}

RunResult fixed_run() {
  return run(fixed_policy(), "the same with the policy string f16+block1=f32 (a path pattern, by segments)");
}

}  // namespace name_substring_policy
}  // namespace

Pitfall name_substring_policy_pitfall() {
  using namespace name_substring_policy;
  return Pitfall{
      "name-substring-policy",
      6,
      "a per-layer policy by name substring: 'block1' in name also catches block10 and block11",
      "A substring test does not know a path's segments: 'block1' is inside 'block10' and 'block11', so the "
      "rule keeps three blocks in FP32 instead of one, silently. Match paths by segments (f16+block1=f32).",
      broken_run,
      fixed_run,
      {
          check("blocks other than block1 run in FP32",
                [](const RunResult& r) { return r.get("other_f32_blocks") > 0; }),
          check("three blocks in FP32", [](const RunResult& r) { return r.get("f32_blocks") == 3; }),
      },
      {
          check("exactly one block in FP32", [](const RunResult& r) { return r.get("f32_blocks") == 1; }),
      },
      {
          check("block1, the block meant, runs in FP32",
                [](const RunResult& r) { return r.get("block1_f32") == 1; }),
      }};
}

}  // namespace mpt::ch06
