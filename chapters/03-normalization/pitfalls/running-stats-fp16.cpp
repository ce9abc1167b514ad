// Chapter 03 — pitfall running-stats-fp16: BatchNorm's running estimates in fp16 stall
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// ../training.hpp (bn_mlp, BnRun, scaled_step, evaluate), mpt/amp/grad_scaler.hpp,
// mpt/core/policy.hpp (KeepF32Policy, uniform_policy), mpt/nn/layers/batch_norm.hpp,
// mpt/nn/data/data.hpp (make_blobs, train_test_split); <algorithm>, <cmath>,
// <cstddef>, <memory>, <string>, <utility>, <vector>.
//
// model.half() converts a BatchNorm's running_mean and running_var to fp16
// too. Each training step moves them by momentum·(batch − running) = 0.1 of
// the gap, computed in FP32 and rounded into fp16; once that step is below
// half an fp16 ulp of the running value, it rounds away, and the estimate
// stops short of the statistic it tracks. With input features near 3000
// (raw sensor counts, say), where fp16's spacing is 2, the running means
// stall about 10 below the features' means: training normalizes with batch
// statistics and looks fine, but eval normalizes with the stalled estimates,
// shifts every feature and loses accuracy on held-out data. Keeping the
// norms in FP32 (apex's keep_batchnorm_fp32; here KeepF32Policy by op
// batch_norm) keeps the updates.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../training.hpp"
#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/layers/batch_norm.hpp"

namespace mpt::ch03 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace running_stats_fp16 {

// ---------------------------------------------------------------------------
// The data, the constants, and the loop of every run.

constexpr double kOffset = 3000;  ///< where the features sit
constexpr double kSpread = 4;     ///< the blobs' spread (their centres within ±2 spreads)
constexpr int kSteps = 200;
constexpr Eigen::Index kBatch = 64;
constexpr double kLr = 0.05;
constexpr int kWatchedSteps = 50;        ///< the last steps whose running-mean updates are counted
constexpr int kTrainAccuracySteps = 24;  ///< the last steps whose batch accuracies make the training accuracy
const std::vector<int> kSizes = {8, 32, 32, 4};
constexpr std::uint64_t kSeed = 7;

/// Four classes of blobs in 8 features that sit near 3000 with a spread of a
/// few units, split 768 / 256.
const Split& sensor_data() {
  static const Split s = [] {
    BlobsOptions o;
    o.samples = 1024;
    o.center_range = 2 * kSpread;
    o.spread = kSpread;
    o.seed = 31;
    Dataset d = make_blobs(o);
    d.x.array() += static_cast<float>(kOffset);
    d.name = "sensor blobs";
    return train_test_split(d, 0.25, 5);
  }();
  return s;
}

/// What a run measured.
struct StatsRun {
  double lost_updates = 0;  ///< fraction of bn0's running-mean updates of the watched steps that rounded away
  double worst_gap = 0;     ///< max over bn0's channels of |running mean − feature mean| / feature std
  double worst_gap_units = 0;   ///< that gap in the features' units
  double running_at_worst = 0;  ///< the running mean of that channel
  double train_accuracy = 0;    ///< mean batch accuracy (training mode) of the last steps
  double test_accuracy = 0;     ///< eval mode, held-out set
  double skipped = 0;           ///< optimizer steps the scaler skipped
};

/// The training loop of every run: kSteps loss-scaled steps (the FP32
/// baseline passes a disabled scaler), watching bn0's running means.
StatsRun train_and_measure(BnRun& run, GradScaler& scaler) {
  const Split& data = sensor_data();
  BatchNorm& bn0 = *batch_norms(run.net).front();
  StatsRun r;
  double watched = 0, lost = 0, correct = 0;
  for (int step = 1; step <= kSteps; ++step) {
    const Dataset b = run.batches.next();
    const Tensor before = bn0.running_mean.clone();
    const StepResult s = scaled_step(run, scaler, b);
    r.skipped += !s.stepped;
    if (step > kSteps - kTrainAccuracySteps) correct += s.accuracy;
    if (step > kSteps - kWatchedSteps) {
      for (std::int64_t c = 0; c < before.numel(); ++c) {
        // An update that should move the estimate (the batch mean differs
        // from it) but leaves it where it was.
        const bool should_move = bn0.mean().value(c) != before.value(c);
        watched += should_move;
        lost += should_move && bn0.running_mean.value(c) == before.value(c);
      }
    }
  }
  r.lost_updates = watched > 0 ? lost / watched : 0;
  r.train_accuracy = correct / kTrainAccuracySteps;
  const MatrixF& x = data.train.x;
  for (Eigen::Index c = 0; c < x.cols(); ++c) {
    const double mean = x.col(c).cast<double>().mean();
    const double std = std::sqrt((x.col(c).cast<double>().array() - mean).square().mean());
    const double running = bn0.running_mean.value(static_cast<std::int64_t>(c));
    const double gap = std::fabs(running - mean);
    if (gap / std > r.worst_gap) {
      r.worst_gap = gap / std;
      r.worst_gap_units = gap;
      r.running_at_worst = running;
    }
  }
  r.test_accuracy = evaluate(run, data.test).accuracy;
  return r;
}

/// The outcomes of both runs, next to the FP32 baseline (defined after the runs).
RunResult stats_outcomes(const StatsRun& r, std::string setup);

// ---------------------------------------------------------------------------
// The broken run.

RunResult running_stats_broken() {
  //! [running-stats-fp16-broken]
  // model.half(): every op stores fp16, and so do bn0's running_mean and running_var.
  const std::shared_ptr<const Policy> policy = uniform_policy(DType::f16);
  //! [running-stats-fp16-broken]
  BnRun run(sensor_data().train, kSizes, kSeed, BatchNorm::Options{}, policy, DType::f16, kLr, kBatch);
  GradScaler scaler;
  return stats_outcomes(
      train_and_measure(run, scaler),
      "fp16 MLP with BatchNorm (inputs, then after each hidden Linear) on 8 features near " + num(kOffset) +
          ", GradScaler; running estimates in fp16");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult running_stats_fixed() {
  //! [running-stats-fp16-fixed]
  // The same fp16 model with the norms in FP32 (apex's keep_batchnorm_fp32):
  // FP32 running estimates, parameters and outputs for every batch_norm.
  const std::shared_ptr<const Policy> policy = std::make_shared<KeepF32Policy>(
      uniform_policy(DType::f16), std::vector<std::string>{}, std::vector<std::string>{"batch_norm"});
  //! [running-stats-fp16-fixed]
  BnRun run(sensor_data().train, kSizes, kSeed, BatchNorm::Options{}, policy, DType::f16, kLr, kBatch);
  GradScaler scaler;
  return stats_outcomes(train_and_measure(run, scaler),
                        "the same fp16 model and data with every BatchNorm kept in FP32 (KeepF32Policy by op "
                        "batch_norm)");
}

// ---------------------------------------------------------------------------
// The outcomes.

/// The FP32 baseline: the same model, data, seed and batches in FP32,
/// without a scaler.
double fp32_test_accuracy() {
  BnRun run(sensor_data().train, kSizes, kSeed, BatchNorm::Options{}, uniform_policy(DType::f32), DType::f32,
            kLr, kBatch);
  GradScaler off = no_scaler();
  return train_and_measure(run, off).test_accuracy;
}

/// Two binomial standard errors of an accuracy p measured on the held-out
/// set: how far two evaluations of equally good models can differ by the
/// draw of the samples alone.
double accuracy_noise(double p) {
  return 2 * std::sqrt(p * (1 - p) / static_cast<double>(sensor_data().test.size()));
}

RunResult stats_outcomes(const StatsRun& r, std::string setup) {
  static const double base = fp32_test_accuracy();
  const double half_ulp = fp16_ulp(r.running_at_worst) / 2;
  const double momentum = *BatchNorm::Options{}.momentum;
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"feature_offset", kOffset, "where the input features sit"},
      {"lost_running_updates", r.lost_updates,
       "share of bn0's running-mean updates in the last " + std::to_string(kWatchedSteps) +
           " steps that rounded away"},
      {"running_mean_gap", r.worst_gap_units, "|running mean − feature mean| of bn0's worst channel (below)"},
      {"running_mean_gap_stds", r.worst_gap,
       "the largest such gap over bn0's channels, in the feature's standard deviations"},
      {"skipped_steps", r.skipped, "optimizer steps the GradScaler skipped"},
      {"train_accuracy", r.train_accuracy,
       "batch accuracy in training mode (batch statistics), last " + std::to_string(kTrainAccuracySteps) +
           " steps"},
      {"test_accuracy", r.test_accuracy, "eval mode (running estimates), 256 held-out samples (chance 0.25)"},
      {"fp32_test_accuracy", base, "the FP32 baseline, eval mode"},
      {"accuracy_noise", accuracy_noise(base),
       "two binomial standard errors of an accuracy like the baseline's on 256 samples"},
  };
  const double gap = r.test_accuracy - base;
  std::string points = pct(std::fabs(gap));
  points.pop_back();  // "1.2%" -> "1.2": a difference of two percentages
  const std::string versus = points + " points " + (gap < 0 ? "below" : "above") + " the FP32 baseline's " +
                             pct(base) + " (two standard errors of such an accuracy on " +
                             num(static_cast<double>(sensor_data().test.size())) +
                             " samples: " + pct(accuracy_noise(base)) + ")";
  out.explanation =
      r.lost_updates > 0
          ? "At bn0's running mean " + num(r.running_at_worst) + " fp16's spacing is " +
                num(fp16_ulp(r.running_at_worst)) + ": an update " + num(momentum) +
                "·(batch − running) below half of it (" + num(half_ulp) +
                ") rounds away, so the estimate stops about " + num(half_ulp / momentum) +
                " short of the batch means; " + pct(r.lost_updates) +
                " of the last updates were lost and it sits " + num(r.worst_gap_units) + " (" +
                num(r.worst_gap) +
                " std) from the feature's mean. Training normalizes with batch statistics (" +
                pct(r.train_accuracy) +
                "); eval uses the stalled estimates and shifts the features: " + pct(r.test_accuracy) + ", " +
                versus + "."
          : "In FP32 the spacing at " + num(r.running_at_worst) + " is " +
                num(std::nextafter(static_cast<float>(r.running_at_worst), 1e30f) -
                    static_cast<float>(r.running_at_worst)) +
                ", and every update moves the estimate: it ends " + num(r.worst_gap_units) + " (" +
                num(r.worst_gap) + " std) from the feature's mean at most, and eval accuracy is " +
                pct(r.test_accuracy) + ", " + versus + ".";
  return out;
}

}  // namespace running_stats_fp16
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall running_stats_fp16_pitfall() {
  using namespace running_stats_fp16;
  return Pitfall{
      "running-stats-fp16",
      3,
      "BatchNorm's running estimates in fp16 stall short of the statistics",
      "model.half() stores a BatchNorm's running mean and variance in fp16; each step moves them by "
      "momentum·(batch − running), and once that is below half an fp16 ulp of the running value (at 3000 "
      "the spacing is 2) it rounds away and the estimate stalls short of the statistic. Training uses batch "
      "statistics and looks fine; eval uses the stalled estimates and loses accuracy. Keep the norms, their "
      "running estimates included, in FP32 (apex's keep_batchnorm_fp32).",
      running_stats_broken,
      running_stats_fixed,
      {
          check("most running-mean updates of the last steps rounded away",
                [](const RunResult& r) { return r.get("lost_running_updates") > 0.5; }),
          check("a running mean is off its feature's mean by more than half a std",
                [](const RunResult& r) { return r.get("running_mean_gap_stds") > 0.5; }),
          check(
              "eval accuracy at least 0.1 below the FP32 baseline's",
              [](const RunResult& r) { return r.get("test_accuracy") < r.get("fp32_test_accuracy") - 0.1; }),
      },
      {
          check("no running-mean update rounded away",
                [](const RunResult& r) { return r.get("lost_running_updates") == 0; }),
          check("every running mean within 0.2 std of its feature's mean",
                [](const RunResult& r) { return r.get("running_mean_gap_stds") <= 0.2; }),
          check("eval accuracy within two standard errors (on 256 samples) of the FP32 baseline's",
                [](const RunResult& r) {
                  return std::fabs(r.get("test_accuracy") - r.get("fp32_test_accuracy")) <=
                         r.get("accuracy_noise");
                }),
      },
      {
          check("training accuracy looks fine: at least 0.85 with batch statistics",
                [](const RunResult& r) { return r.get("train_accuracy") >= 0.85; }),
      }};
}

}  // namespace mpt::ch03
