// Chapter 06 — pitfall ffn-fp32-rule-of-thumb: "keep the Transformer's FFN in FP32", measured
// Depends on: common.hpp (check, num, this entry's declaration),
// ../../04-softmax-attention/training.hpp (train_lm: Chapter 4's training
// loop of the tiny Transformer on the licence corpus), mpt/core/cost_model.hpp,
// mpt/core/policy_string.hpp, mpt/core/trace.hpp, mpt/nn/model.hpp
// (trace_step), mpt/nn/models/transformer.hpp; <algorithm>, <cmath>, <memory>,
// <string>, <vector>.
//
// The mission's source text recommends keeping the Transformer's FFN (its
// MLP blocks) in FP32 when training in fp16. A rule of thumb costs something
// certain and buys something uncertain: every block's MLP moves its
// activations in FP32 and runs its products off the tensor cores, and what
// the final loss gains may be less than what the seed alone changes. Both
// policies are trained here on the same seeds (paired runs: the same
// weights and the same batches), their final losses compared seed by seed,
// and their cost read from a traced step. The fix is not a different rule
// but the measurement: on this model the rule costs bytes and buys nothing
// the seeds can tell apart, so f16 throughout (with FP32 masters and the
// dynamic scaler, as both runs have) is the policy to keep.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../../04-softmax-attention/training.hpp"
#include "common.hpp"
#include "mpt/core/cost_model.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/nn/model.hpp"
#include "mpt/nn/models/transformer.hpp"

namespace mpt::ch06 {
namespace {
namespace ffn_fp32_rule_of_thumb {

constexpr int kSeeds = 3;
constexpr int kSteps = 30;

ch04::LmConfig config_for(std::uint64_t seed) {
  ch04::LmConfig c;
  c.model.d_model = 16;
  c.model.num_heads = 2;
  c.model.num_layers = 2;
  c.model.context = 16;
  c.batch = 4;
  c.steps = kSteps;
  c.adam.lr = 0.01;
  c.eval_every = kSteps;
  c.eval_batches = 2;
  c.seed = seed;
  return c;
}

struct Measured {
  std::vector<double> final_loss;  // per seed: the validation loss after the last step
  double first_loss = 0;           // the first seed's validation loss before training
  int skipped = 0;                 // over the seeds
  bool finite = true;
  double bytes = 0, seconds = 0;  // one traced step, cost model on an H100 SXM
};

Measured measure(const std::string& policy) {
  Measured m;
  for (int s = 1; s <= kSeeds; ++s) {
    const ch04::LmRun run = train_lm(ch04::licence_corpus(), config_for(static_cast<std::uint64_t>(s)),
                                     parse_policy_string(policy).make(), ch04::ScalerMode::dynamic);
    m.final_loss.push_back(run.final_valid());
    if (s == 1) m.first_loss = run.valid.front().loss;
    m.skipped += run.skipped;
    m.finite = m.finite && std::isfinite(run.final_valid());
  }
  TransformerConfig c = config_for(1).model;
  c.vocab_size = ch04::licence_corpus().vocab_size();
  c.policy = parse_policy_string(policy).make();
  c.seed = 1;
  TinyTransformer net(c);
  MatrixF ids(4, c.context);
  std::vector<int> targets;
  for (Eigen::Index i = 0; i < ids.size(); ++i) {
    ids.data()[i] = static_cast<float>((7 * i + 3) % c.vocab_size);
    targets.push_back(static_cast<int>((5 * i + 1) % c.vocab_size));
  }
  const StepCost cost = estimate_cost(trace_step(net, ids, targets), gpu_spec("h100-sxm"));
  m.bytes = cost.bytes;
  m.seconds = cost.seconds;
  return m;
}

std::string policy_text(bool rule) {
  if (rule) {
    //! [ffn-fp32-rule-of-thumb-broken]
    // the rule of thumb: fp16, but every block's FFN (its MLP) in FP32
    return "f16+block*.mlp=f32";
    //! [ffn-fp32-rule-of-thumb-broken]
  }
  //! [ffn-fp32-rule-of-thumb-fixed]
  // what the paired runs support on this model: fp16 throughout
  return "f16";
  //! [ffn-fp32-rule-of-thumb-fixed]
}

// Both policies, measured once (each run of the pitfall reports both).
struct Both {
  Measured ffn32, f16;
};
const Both& both() {
  static const Both b{measure(policy_text(true)), measure(policy_text(false))};
  return b;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}
double spread(const std::vector<double>& v) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *hi - *lo;
}

RunResult run(bool rule, std::string setup) {
  const Both& b = both();
  const Measured& me = rule ? b.ffn32 : b.f16;
  const Measured& other = rule ? b.f16 : b.ffn32;
  // Paired differences, seed by seed: this run minus the other policy.
  std::vector<double> d;
  for (int s = 0; s < kSeeds; ++s) d.push_back(me.final_loss[s] - other.final_loss[s]);
  double largest = 0;
  for (double x : d) largest = std::max(largest, std::fabs(x));
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"seeds", kSeeds, "paired runs: the same weights and batches under both policies"},
      {"mean_final_loss", mean(me.final_loss), "validation loss after the last step, mean over the seeds"},
      {"seed_spread", spread(me.final_loss), "max − min of that loss over the seeds"},
      {"largest_paired_difference", largest,
       "the largest |this policy − the other| of one seed's final loss"},
      {"mean_paired_difference", mean(d), "the mean of (this policy − the other) over the seeds"},
      {"skipped_steps", static_cast<double>(me.skipped), "steps the scaler skipped, over the seeds"},
      {"all_finite", me.finite ? 1.0 : 0.0, "1 when every seed's final loss is finite"},
      {"initial_loss", me.first_loss, "the first seed's validation loss before training"},
      {"step_bytes", me.bytes, "bytes of one traced step (cost model)"},
      {"bytes_vs_other", me.bytes / other.bytes, "this policy's step bytes / the other's"},
      {"step_seconds_h100", me.seconds, "the cost model's step time on an H100 SXM"},
      {"seconds_vs_other", me.seconds / other.seconds, "this policy's step time / the other's (cost model)"},
  };
  r.explanation = "Paired over " + std::to_string(kSeeds) + " seeds, the final losses differ by at most " +
                  num(largest) + ", while the seeds alone spread them over " + num(spread(me.final_loss)) +
                  "; the step moves " + num(me.bytes / other.bytes) + " times the bytes of the other policy.";
  return r;
}

}  // namespace ffn_fp32_rule_of_thumb
}  // namespace

Pitfall ffn_fp32_rule_of_thumb_pitfall() {
  using namespace ffn_fp32_rule_of_thumb;
  return Pitfall{
      "ffn-fp32-rule-of-thumb",
      6,
      "'keep the Transformer's FFN in FP32': more bytes for a loss the seeds cannot tell apart",
      "A rule of thumb costs something certain (every MLP block's activations in FP32, its products off the "
      "tensor cores) and buys something uncertain. Trained on the same seeds, the tiny Transformer ends "
      "within the seed-to-seed spread with and without the rule: measure before keeping layers in FP32.",
      [] {
        return run(true,
                   "tiny Transformer (D 16, 2 blocks, 16 tokens), 30 AdamW steps x 3 seeds, FP32 masters "
                   "and the dynamic scaler, policy f16+block*.mlp=f32");
      },
      [] { return run(false, "the same runs and seeds with the policy f16"); },
      {
          check("the rule moves more bytes per step than f16 throughout",
                [](const RunResult& r) { return r.get("bytes_vs_other") > 1.1; }),
          check("and its step takes longer on the cost model",
                [](const RunResult& r) { return r.get("seconds_vs_other") > 1; }),
      },
      {
          check("f16 throughout moves fewer bytes",
                [](const RunResult& r) { return r.get("bytes_vs_other") < 1; }),
          check("and its step is shorter on the cost model",
                [](const RunResult& r) { return r.get("seconds_vs_other") < 1; }),
      },
      {
          check("what the rule buys is within the seeds' spread: every seed's final loss within it of the "
                "other "
                "policy's",
                [](const RunResult& r) { return r.get("largest_paired_difference") < r.get("seed_spread"); }),
          check("every run ends finite", [](const RunResult& r) { return r.get("all_finite") == 1; }),
          check("the runs train: the final loss is 0.3 below the untrained one",
                [](const RunResult& r) { return r.get("mean_final_loss") < r.get("initial_loss") - 0.3; }),
      }};
}

}  // namespace mpt::ch06
