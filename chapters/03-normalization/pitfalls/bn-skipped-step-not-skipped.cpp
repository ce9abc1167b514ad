// Chapter 03 — pitfall bn-skipped-step-not-skipped: a skipped step still updates the running stats
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// ../training.hpp (BnRun, scaled_step, evaluate, nonfinite_running_stats),
// ../../02-loss-scaling/training.hpp (blobs()), mpt/amp/grad_scaler.hpp,
// mpt/core/policy.hpp (uniform_policy), mpt/nn/layers/batch_norm.hpp;
// <cmath>, <cstdint>, <string>, <utility>, <vector>.
//
// The GradScaler protects the weights: a step whose gradients hold inf or
// NaN is skipped. But BatchNorm updates its running estimates in the
// forward pass, before anyone knows the step will be skipped. A batch that
// overflows in forward (one corrupted sample beyond fp16's 65504 becomes inf
// when the batch is converted to fp16) has an inf batch mean and a NaN
// variance, and running = 0.9·running + 0.1·batch folds them in for good.
// Training recovers at once — it normalizes with batch statistics — but
// eval normalizes with the running estimates: NaN from the first BatchNorm
// on, passed through every ReLU (as PyTorch's ReLU passes it) to all the
// logits, and the network predicts one class for every input.
// pytorch/pytorch#88474 reports exactly this, with an input of
// data.half() * 100000; pytorch/pytorch#90342 is the same family. The fix
// leaves the running estimates alone for a batch whose statistics are not
// finite (BatchNorm::Options::guard_running_update). FP32 statistics fix the
// variant where only the statistics overflow (finite fp16 inputs whose x²
// overflows, bn-variance-fp16); an input that is already inf needs the
// guard.
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../../02-loss-scaling/training.hpp"
#include "../training.hpp"
#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/nn/layers/batch_norm.hpp"

namespace mpt::ch03 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace bn_skipped_step_not_skipped {

// ---------------------------------------------------------------------------
// The constants and the loop of every run.

constexpr int kSteps = 200;
constexpr Eigen::Index kBatch = 64;
constexpr double kLr = 0.05;
constexpr int kCorruptStep = 60;         ///< the step whose batch holds the corrupted sample
constexpr float kCorruptValue = 1e5f;    ///< the corrupted feature's value (fp16's max is 65504)
constexpr int kTrainAccuracySteps = 24;  ///< the last steps whose batch accuracies make the training accuracy
const std::vector<int> kSizes = {8, 32, 32, 4};
constexpr std::uint64_t kSeed = 7;

/// What a run measured.
struct SkipRun {
  double corrupt_skipped = 0;   ///< 1 when the scaler skipped the corrupted step
  double corrupt_stats = 0;     ///< bn0 channels whose batch mean or 1/std was inf/NaN at that step
  double skipped = 0;           ///< optimizer steps skipped in all
  double guarded = 0;           ///< running updates the guard left out (over every BatchNorm)
  double nonfinite_stats = 0;   ///< running estimates that are inf/NaN at the end
  double train_accuracy = 0;    ///< mean batch accuracy (training mode) of the last steps
  double test_accuracy = 0;     ///< eval mode, held-out set
  double nonfinite_logits = 0;  ///< eval logits that are inf/NaN
  double classes = 0;           ///< distinct classes eval predicts for the held-out set
};

/// The training loop of every run: kSteps loss-scaled steps on the blobs;
/// with `corrupt`, the batch of step kCorruptStep has one feature of one
/// sample replaced by kCorruptValue (a sensor glitch, a bad record).
SkipRun train_through_glitch(BnRun& run, GradScaler& scaler, bool corrupt) {
  SkipRun r;
  double correct = 0;
  for (int step = 1; step <= kSteps; ++step) {
    Dataset b = run.batches.next();
    if (corrupt && step == kCorruptStep) b.x(0, 3) = kCorruptValue;  // inf once the batch is fp16
    const StepResult s = scaled_step(run, scaler, b);
    r.skipped += !s.stepped;
    if (step == kCorruptStep) {
      r.corrupt_skipped = !s.stepped;
      const BatchNorm& bn0 = *batch_norms(run.net).front();
      for (std::int64_t c = 0; c < bn0.mean().numel(); ++c)
        r.corrupt_stats += !std::isfinite(bn0.mean().value(c)) || !std::isfinite(bn0.invstd().value(c));
    }
    for (BatchNorm* bn : batch_norms(run.net)) r.guarded += bn->running_update_skipped();
    if (step > kSteps - kTrainAccuracySteps) correct += s.accuracy;
  }
  r.train_accuracy = correct / kTrainAccuracySteps;
  r.nonfinite_stats = nonfinite_running_stats(run);
  const Evaluation e = evaluate(run, ch02::blobs().test);
  r.test_accuracy = e.accuracy;
  r.nonfinite_logits = e.nonfinite;
  r.classes = e.classes_predicted;
  return r;
}

/// The outcomes of both runs, next to the FP32 baseline (defined after the runs).
RunResult skip_outcomes(const SkipRun& r, std::string setup);

// ---------------------------------------------------------------------------
// The broken run.

RunResult skipped_step_broken() {
  //! [bn-skipped-step-not-skipped-broken]
  BatchNorm::Options o;  // PyTorch's BatchNorm: every training forward updates the running estimates
  BnRun run(ch02::blobs().train, kSizes, kSeed, o, uniform_policy(DType::f16), DType::f16, kLr, kBatch);
  GradScaler scaler;  // skips the step whose gradients are inf/NaN, after bn0 has folded in the inf batch
  //! [bn-skipped-step-not-skipped-broken]
  return skip_outcomes(train_through_glitch(run, scaler, true),
                       "fp16 MLP with BatchNorm on the blobs, GradScaler; one sample of step " +
                           std::to_string(kCorruptStep) + " has a feature of " + num(kCorruptValue) +
                           " (inf in fp16)");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult skipped_step_fixed() {
  //! [bn-skipped-step-not-skipped-fixed]
  BatchNorm::Options o;
  o.guard_running_update = true;  // a batch with inf/NaN statistics leaves the running estimates alone
  BnRun run(ch02::blobs().train, kSizes, kSeed, o, uniform_policy(DType::f16), DType::f16, kLr, kBatch);
  GradScaler scaler;
  //! [bn-skipped-step-not-skipped-fixed]
  return skip_outcomes(train_through_glitch(run, scaler, true),
                       "the same run and glitch with BatchNorm::Options::guard_running_update");
}

// ---------------------------------------------------------------------------
// The outcomes.

/// The FP32 baseline: the same model, seed and batches in FP32 without the
/// glitch, without a scaler.
double fp32_test_accuracy() {
  BnRun run(ch02::blobs().train, kSizes, kSeed, BatchNorm::Options{}, uniform_policy(DType::f32), DType::f32,
            kLr, kBatch);
  GradScaler off = no_scaler();
  return train_through_glitch(run, off, false).test_accuracy;
}

RunResult skip_outcomes(const SkipRun& r, std::string setup) {
  static const double base = fp32_test_accuracy();
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"corrupted_step", kCorruptStep, "the step whose batch holds the corrupted sample"},
      {"corrupted_batch_stats", r.corrupt_stats,
       "bn0 channels whose batch mean or 1/std was inf/NaN at that step"},
      {"corrupted_step_skipped", r.corrupt_skipped, "1: the GradScaler skipped that step"},
      {"skipped_steps", r.skipped, "optimizer steps skipped in all"},
      {"guarded_updates", r.guarded, "running updates left out by the guard (all BatchNorms)"},
      {"nonfinite_running_stats", r.nonfinite_stats,
       "running means and variances that are inf/NaN at the end"},
      {"train_accuracy", r.train_accuracy,
       "batch accuracy in training mode (batch statistics), last " + std::to_string(kTrainAccuracySteps) +
           " steps"},
      {"test_accuracy", r.test_accuracy, "eval mode (running estimates), 256 held-out samples (chance 0.25)"},
      {"nonfinite_eval_logits", r.nonfinite_logits, "eval logits that are inf/NaN"},
      {"eval_classes_predicted", r.classes, "distinct classes eval predicts for the held-out samples (of 4)"},
      {"fp32_test_accuracy", base, "the FP32 baseline (no glitch), eval mode"},
  };
  out.explanation =
      r.guarded == 0
          ? "The corrupted value is inf in fp16, and bn0's batch statistics were inf/NaN in " +
                num(r.corrupt_stats) +
                " channel(s); bn0 folded them into its running estimates during the forward pass (and bn1 "
                "the "
                "NaN that followed), and the scaler skipped only the optimizer step (" +
                num(r.skipped) + " skipped in all). " + num(r.nonfinite_stats) +
                " running estimates are now inf/NaN and stay so (0.9·NaN + 0.1·batch is NaN). Training "
                "normalizes with batch statistics and recovers (" +
                pct(r.train_accuracy) +
                "); eval normalizes with the running estimates, so bn0's output is NaN, and ReLU passes "
                "NaN on as PyTorch's does: " +
                num(r.nonfinite_logits) +
                " eval logits are NaN, and the output no longer depends on the input: " + num(r.classes) +
                " class predicted for every held-out sample, " + pct(r.test_accuracy) + " accuracy."
          : "The guard saw the non-finite batch statistics and left the running estimates alone (" +
                num(r.guarded) + " update(s) left out); the scaler skipped the step as before (" +
                num(r.skipped) + " skipped in all), and eval accuracy is " + pct(r.test_accuracy) +
                " against FP32's " + pct(base) + ".";
  return out;
}

}  // namespace bn_skipped_step_not_skipped
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall bn_skipped_step_not_skipped_pitfall() {
  using namespace bn_skipped_step_not_skipped;
  return Pitfall{
      "bn-skipped-step-not-skipped",
      3,
      "a skipped step still updates BatchNorm's running estimates",
      "The GradScaler skips a step whose gradients are inf/NaN, but BatchNorm has already folded that "
      "batch's statistics into its running estimates during the forward pass: an input that overflows "
      "fp16 makes them inf/NaN for good. Training (batch statistics) recovers; eval (running estimates) "
      "gives NaN. Skip the running update for a non-finite batch (guard_running_update). FP32 statistics "
      "already fix the variant where only the statistics overflow (finite inputs whose squares overflow "
      "fp16); an input that is inf needs the guard.",
      skipped_step_broken,
      skipped_step_fixed,
      {
          check("running estimates are inf/NaN",
                [](const RunResult& r) { return r.get("nonfinite_running_stats") > 0; }),
          check("eval logits are NaN (ReLU hides no NaN)",
                [](const RunResult& r) { return r.get("nonfinite_eval_logits") > 0; }),
          check("eval predicts the same class for every held-out sample",
                [](const RunResult& r) { return r.get("eval_classes_predicted") == 1; }),
          check("eval accuracy is far below training accuracy (by more than 0.3)",
                [](const RunResult& r) { return r.get("test_accuracy") < r.get("train_accuracy") - 0.3; }),
      },
      {
          check("the guard left the corrupted batch out of the running estimates",
                [](const RunResult& r) { return r.get("guarded_updates") > 0; }),
          check("every running estimate is finite",
                [](const RunResult& r) { return r.get("nonfinite_running_stats") == 0; }),
          check("eval accuracy within 0.03 of the FP32 baseline's",
                [](const RunResult& r) {
                  return std::fabs(r.get("test_accuracy") - r.get("fp32_test_accuracy")) <= 0.03;
                }),
      },
      {
          check("the corrupted batch overflowed in forward: bn0's batch statistics were inf/NaN",
                [](const RunResult& r) { return r.get("corrupted_batch_stats") > 0; }),
          check("the GradScaler skipped the corrupted step",
                [](const RunResult& r) { return r.get("corrupted_step_skipped") == 1; }),
          check("training recovers: accuracy of at least 0.85 with batch statistics",
                [](const RunResult& r) { return r.get("train_accuracy") >= 0.85; }),
      }};
}

}  // namespace mpt::ch03
