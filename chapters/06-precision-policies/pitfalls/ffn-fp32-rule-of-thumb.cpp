// Chapter 06 — pitfall ffn-fp32-rule-of-thumb: "keep the Transformer's FFN in FP32", measured
// Depends on: common.hpp (check, num, this entry's declaration),
// ../../04-softmax-attention/training.hpp (train_lm: Chapter 4's training
// loop of the tiny Transformer on the licence corpus),
// ../../04-softmax-attention/seed_statistics.hpp (paired_difference, the
// sign test), mpt/core/cost_model.hpp, mpt/core/policy_string.hpp,
// mpt/core/trace.hpp, mpt/nn/model.hpp (trace_step),
// mpt/nn/models/transformer.hpp; <algorithm>, <cmath>, <string>, <vector>.
//
// The mission's source text recommends keeping the Transformer's FFN (its
// MLP blocks) in FP32 when training in fp16. A rule of thumb costs something
// certain and buys something uncertain: every block's MLP moves its
// activations in FP32 and runs its products off the tensor cores, and what
// the final loss gains has to be measured. Both policies are trained here
// from the same seeds: a seed draws the initial weights, the batches and the
// validation windows, so each seed gives a pair of runs that differ only in
// precision. The comparison is the paired difference d_k = (this policy's
// final loss − the other's) at seed k (seed_statistics.hpp): its mean,
// standard deviation and 95% interval, Student's t, and the sign test. What
// the seed does to both runs alike cancels in d_k, so the spread of the
// losses across seeds is not the yardstick; the spread of d is.
//
// The criterion, stated once: the dearer policy (more bytes per step) is
// kept only where its final loss is shown lower at the same seeds, that is
// where the 95% interval of (dearer − cheaper) lies below 0; otherwise the
// cheaper policy is kept. On this model the rule's interval is not below 0,
// so f16 throughout (with FP32 masters and the dynamic scaler, as both runs
// have) is the policy to keep. That is not a proof that the rule buys
// nothing: a gain smaller than the interval's half-width would usually go
// unseen with this many seeds.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../../04-softmax-attention/seed_statistics.hpp"
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

// Eight pairs: Student's t has 7 degrees of freedom, and the sign test can
// reach 5% (only when all eight differences share a sign: 2/2^8).
constexpr int kSeeds = 8;
constexpr int kSteps = 30;
// The final loss is read on this many validation batches of 4 × 16 tokens,
// the same windows for both runs of a pair: a run's loss on a few pages of
// the corpus rather than on one short passage.
constexpr int kEvalBatches = 16;

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
  c.eval_batches = kEvalBatches;
  c.seed = seed;
  return c;
}

struct Measured {
  std::vector<double> final_loss;    // per seed: the validation loss after the last step
  std::vector<double> initial_loss;  // per seed: the validation loss before training
  int skipped = 0;                   // over the seeds
  bool finite = true;
  double bytes = 0, seconds = 0;  // one traced step, cost model on an H100 SXM
};

Measured measure(const std::string& policy) {
  Measured m;
  for (int s = 1; s <= kSeeds; ++s) {
    const ch04::LmRun run = train_lm(ch04::licence_corpus(), config_for(static_cast<std::uint64_t>(s)),
                                     parse_policy_string(policy).make(), ch04::ScalerMode::dynamic);
    m.final_loss.push_back(run.final_valid());
    m.initial_loss.push_back(run.valid.front().loss);
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
// The sample standard deviation (n − 1).
double sd(const std::vector<double>& v) {
  const double m = mean(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return std::sqrt(ss / static_cast<double>(v.size() - 1));
}

// With n pairs, when the sign test reaches p < 0.05: how many differences may
// go against the rest.
std::string sign_test_reach_text(int n) {
  int k = -1;  // the most that may go against the rest
  while (k + 1 <= n / 2 && ch04::sign_test_p(k + 1, n) < 0.05) ++k;
  if (k < 0) return "never";
  if (k == 0) return "only when all of them share a sign";
  return "only when at most " + std::to_string(k) + " go against the rest";
}

// What the paired interval says, in words.
std::string interval_verdict(const ch04::PairedDifference& d) {
  if (d.ci_high < 0) return "The interval lies below 0: these seeds show this policy's final loss lower.";
  if (d.ci_low > 0) return "The interval lies above 0: these seeds show this policy's final loss higher.";
  return "The interval contains 0: these seeds show no difference either way. They cannot show that there "
         "is none: a mean difference smaller than the interval's half-width, " +
         num((d.ci_high - d.ci_low) / 2) + ", would usually go unseen.";
}

RunResult run(bool rule, std::string setup) {
  const Both& b = both();
  const Measured& me = rule ? b.ffn32 : b.f16;
  const Measured& other = rule ? b.f16 : b.ffn32;
  // Paired differences, seed by seed: this policy minus the other.
  const ch04::PairedDifference d = ch04::paired_difference(me.final_loss, other.final_loss);
  double initial_gap = 0;  // the pairs must start from the same weights
  for (int s = 0; s < kSeeds; ++s)
    initial_gap = std::max(initial_gap, std::fabs(me.initial_loss[s] - other.initial_loss[s]));
  const bool dearer = me.bytes > other.bytes;
  const bool kept = dearer ? d.ci_high < 0 : !(d.ci_low > 0);
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"seeds", kSeeds, "pairs: the same weights, batches and validation windows"},
      {"mean_final_loss", mean(me.final_loss), "validation loss after the last step, mean over the seeds"},
      {"seed_sd", sd(me.final_loss), "its sd over the seeds: what the seed alone moves"},
      {"mean_paired_difference", d.mean, "mean of d = this policy − the other, at the same seed"},
      {"paired_sd", d.sd, "sd of d over the seeds (n − 1)"},
      {"paired_ci_low", d.ci_low, "95% interval of the mean of d (Student's t): low end"},
      {"paired_ci_high", d.ci_high, "its high end"},
      {"paired_t", d.t, "t = mean/(sd/√n), n − 1 degrees of freedom"},
      {"paired_p", d.p_t, "two-sided p of t"},
      {"seeds_higher", static_cast<double>(d.positive),
       "seeds where this policy's final loss is the higher (d > 0)"},
      {"sign_test_p", d.p_sign, "the sign test's exact two-sided p"},
      {"initial_gap", initial_gap, "largest |this − the other| of the untrained loss at one seed"},
      {"initial_sd", sd(me.initial_loss), "sd of the untrained loss over the seeds"},
      {"skipped_steps", static_cast<double>(me.skipped), "steps the scaler skipped, over the seeds"},
      {"all_finite", me.finite ? 1.0 : 0.0, "1 when every seed's final loss is finite"},
      {"initial_loss", mean(me.initial_loss), "validation loss before training, mean over the seeds"},
      {"step_bytes", me.bytes, "bytes of one traced step (cost model)"},
      {"bytes_vs_other", me.bytes / other.bytes, "this policy's step bytes / the other's"},
      {"step_seconds_h100", me.seconds, "the cost model's step time on an H100 SXM"},
      {"seconds_vs_other", me.seconds / other.seconds, "this policy's step time / the other's (cost model)"},
  };
  r.explanation =
      "Paired by seed over " + std::to_string(d.n) +
      " seeds, d = this policy's final loss − the other's has mean " + num(d.mean) + " and sd " + num(d.sd) +
      "; the 95% interval of the mean is [" + num(d.ci_low) + ", " + num(d.ci_high) + "] (t = " + num(d.t) +
      ", " + std::to_string(d.df) + " degrees of freedom, p = " + num(d.p_t) + "). d > 0 at " +
      std::to_string(d.positive) + " of " + std::to_string(d.n) + " seeds: sign test p = " + num(d.p_sign) +
      ", and with " + std::to_string(d.n) + " pairs that test reaches 5% " + sign_test_reach_text(d.n) +
      ". " + interval_verdict(d) +
      " Unpaired, the yardstick would be the spread across seeds: the seed alone moves this policy's "
      "final loss with sd " +
      num(sd(me.final_loss)) + ", " + num(sd(me.final_loss) / d.sd) +
      " times the sd of d. This policy's step moves " + num(me.bytes / other.bytes) +
      " times the other's bytes; by the criterion (keep the dearer policy only where its loss is shown "
      "lower) it is " +
      (kept ? "kept." : "not kept.");
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
      "tensor cores) and buys something uncertain. Trained from the same seeds, the tiny Transformer's final "
      "losses with and without the rule differ, seed by seed, by amounts whose 95% interval contains 0: keep "
      "the dearer policy only where its paired gain is shown.",
      [] {
        return run(true,
                   "tiny Transformer (D 16, 2 blocks, 16 tokens), " + std::to_string(kSteps) +
                       " AdamW steps x " + std::to_string(kSeeds) + " seeds, loss on " +
                       std::to_string(kEvalBatches) +
                       " validation batches, FP32 masters and the dynamic scaler, policy f16+block*.mlp=f32");
      },
      [] { return run(false, "the same runs and seeds with the policy f16"); },
      {
          check("the rule moves more bytes per step than f16 throughout",
                [](const RunResult& r) { return r.get("bytes_vs_other") > 1.1; }),
          check("and its step takes longer on the cost model",
                [](const RunResult& r) { return r.get("seconds_vs_other") > 1; }),
          check(
              "and the criterion does not keep it: it is the dearer policy, and the 95% interval of its "
              "paired difference (rule − f16) does not lie below 0",
              [](const RunResult& r) { return r.get("bytes_vs_other") > 1 && r.get("paired_ci_high") >= 0; }),
      },
      {
          check("f16 throughout moves fewer bytes",
                [](const RunResult& r) { return r.get("bytes_vs_other") < 1; }),
          check("and its step is shorter on the cost model",
                [](const RunResult& r) { return r.get("seconds_vs_other") < 1; }),
          check(
              "and the criterion keeps it: it is the cheaper policy, and the 95% interval of its paired "
              "difference (f16 − rule) does not lie above 0",
              [](const RunResult& r) { return r.get("bytes_vs_other") < 1 && r.get("paired_ci_low") <= 0; }),
      },
      {
          check("the runs are paired: at every seed both policies start from the same weights (their "
                "untrained losses differ by a tenth of what the seed moves them, their sd, or less)",
                [](const RunResult& r) { return r.get("initial_gap") <= r.get("initial_sd") / 10; }),
          check("every run ends finite", [](const RunResult& r) { return r.get("all_finite") == 1; }),
          check("the runs train: the final loss is 0.3 below the untrained one",
                [](const RunResult& r) { return r.get("mean_final_loss") < r.get("initial_loss") - 0.3; }),
      }};
}

}  // namespace mpt::ch06
