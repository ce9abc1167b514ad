// Chapter 02 — pitfall fp16-weights-no-master: fp16 weights without FP32 master weights: small updates lost
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// ../training.hpp (plain_step, blobs()), mpt/nn/models/mlp.hpp (MasterWeights);
// Eigen (the weights as one vector); <cmath>, <string>, <utility>, <vector>.
//
// SGD with a small learning rate: most updates are smaller than half the
// fp16 spacing at their weight and round back to the old weight. With the
// weights only in fp16 they are lost for good; with an FP32 master they
// accumulate until they show in the fp16 copy.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "../training.hpp"
#include "common.hpp"
#include "mpt/nn/models/mlp.hpp"

namespace mpt::ch02 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace fp16_weights_no_master {

// ---------------------------------------------------------------------------
// The constants and the training of both runs.

constexpr int kMasterSteps = 1500;
constexpr double kMasterLr = 1e-4;
constexpr Eigen::Index kMasterBatch = 16;

struct MasterRun {
  double initial_loss = 0, loss = 0, accuracy = 0, lost = 0, weight_change = 0;
};

/// Every weight of the network, in parameter order, in double.
Eigen::VectorXd weights_of(Mlp& net) {
  std::vector<double> w;
  for (const Parameter* p : net.parameters()) {
    const MatrixF m = p->master.f32();
    w.insert(w.end(), m.data(), m.data() + m.size());
  }
  return Eigen::Map<const Eigen::VectorXd>(w.data(), static_cast<Eigen::Index>(w.size()));
}

/// Plain SGD training without loss scaling (cross-entropy gradients of the
/// blobs fit fp16 as they are), in any precision and weight mode.
MasterRun train_blobs_small_lr(DType p, MasterWeights mw) {
  BlobsRun run(p, kMasterLr, kMasterBatch, mw);
  MasterRun r;
  r.initial_loss = set_loss(run.net, blobs().train);
  const Eigen::VectorXd start = weights_of(run.net);
  for (int step = 0; step < kMasterSteps; ++step) {
    const RefreshStats st = plain_step(run.net, run.opt, run.batches);
    r.lost += static_cast<double>(st.lost) / static_cast<double>(st.elements) / kMasterSteps;
  }
  r.loss = set_loss(run.net, blobs().train);
  r.accuracy = set_accuracy(run.net, blobs().test);
  // What training moved the weights the optimizer keeps (the FP32 masters,
  // or, without them, the fp16 weights), relative to where they started.
  r.weight_change = (weights_of(run.net) - start).norm() / start.norm();
  return r;
}

/// The outcomes of both runs, next to the FP32 baseline (defined after the
/// runs).
RunResult master_outcomes(const MasterRun& r, std::string setup);

// ---------------------------------------------------------------------------
// The broken run.

RunResult fp16_weights_no_master_broken() {
  MasterRun r;
  //! [fp16-weights-no-master-broken]
  // The weights exist only in fp16: after each step they are rounded, and
  // the rounded value is all that is kept.
  r = train_blobs_small_lr(DType::f16, MasterWeights::none);
  //! [fp16-weights-no-master-broken]
  return master_outcomes(r, "fp16 MLP on the blobs, fp16 weights only, SGD lr 1e-4");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult fp16_weights_no_master_fixed() {
  MasterRun r;
  //! [fp16-weights-no-master-fixed]
  // FP32 master weights take the updates; the fp16 copy is refreshed from them.
  r = train_blobs_small_lr(DType::f16, MasterWeights::fp32);
  //! [fp16-weights-no-master-fixed]
  return master_outcomes(r, "the same run with FP32 master weights");
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult master_outcomes(const MasterRun& r, std::string setup) {
  static const MasterRun base = train_blobs_small_lr(DType::f32, MasterWeights::fp32);
  const double progress = (r.initial_loss - r.loss) / (base.initial_loss - base.loss);
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"steps", kMasterSteps, "SGD steps, momentum 0.9, lr " + num(kMasterLr) + ", batch 16"},
      {"lost_update_fraction", r.lost,
       "weights the optimizer moved but that rounded back to their old value, mean per step"},
      {"weight_change", r.weight_change,
       "||W_end - W_start|| / ||W_start||, every weight the optimizer keeps"},
      {"fp32_weight_change", base.weight_change, "the same in the FP32 baseline"},
      {"initial_loss", r.initial_loss, "training-set cross-entropy before the first step"},
      {"train_loss", r.loss, "the same after the last step"},
      {"fp32_train_loss", base.loss, "the FP32 baseline after the last step"},
      {"progress_vs_fp32", progress, "(initial - final loss) / the same for FP32"},
      {"test_accuracy", r.accuracy, "on 256 held-out samples"},
      {"fp32_test_accuracy", base.accuracy, "the FP32 baseline"},
      {"accuracy_gap", base.accuracy - r.accuracy, "fp32_test_accuracy - test_accuracy"},
  };
  out.explanation =
      r.lost > 0 ? "On an average step " + pct(r.lost) +
                       " of the weight updates were smaller than half the "
                       "fp16 spacing at their weight and rounded away; the loss fell " +
                       pct(progress) + " as far as FP32's, and the accuracy is " +
                       num(base.accuracy - r.accuracy) + " lower."
                 : "The FP32 masters keep every update, however small; the fp16 copies follow them: the "
                   "loss fell " +
                       pct(progress) + " as far as FP32's, and the accuracy is " + pct(r.accuracy) +
                       " against FP32's " + pct(base.accuracy) + ".";
  return out;
}

}  // namespace fp16_weights_no_master
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall fp16_weights_no_master_pitfall() {
  using namespace fp16_weights_no_master;
  return Pitfall{
      "fp16-weights-no-master",
      2,
      "fp16 weights without FP32 master weights: small updates lost",
      "An update smaller than half the fp16 spacing at its weight rounds back to the old weight; "
      "with the weights only in fp16 it is lost for good, with an FP32 master it accumulates until "
      "it shows in the fp16 copy.",
      fp16_weights_no_master_broken,
      fp16_weights_no_master_fixed,
      {
          check("more than half of the updates were lost",
                [](const RunResult& r) { return r.get("lost_update_fraction") > 0.5; }),
          check("the loss fell less than half as far as FP32's",
                [](const RunResult& r) { return r.get("progress_vs_fp32") < 0.5; }),
          check("the accuracy trails FP32 by more than 0.1",
                [](const RunResult& r) { return r.get("accuracy_gap") > 0.1; }),
      },
      {
          check("the weights moved as far as FP32's (weight change within 2%)",
                [](const RunResult& r) {
                  return within(r.get("weight_change"), r.get("fp32_weight_change"), 0.02);
                }),
          check(
              "the loss is within 2% of FP32's",
              [](const RunResult& r) { return within(r.get("train_loss"), r.get("fp32_train_loss"), 0.02); }),
          check("the accuracy is within 0.02 of FP32's",
                [](const RunResult& r) { return std::fabs(r.get("accuracy_gap")) <= 0.02; }),
      },
      {}};
}

}  // namespace mpt::ch02
