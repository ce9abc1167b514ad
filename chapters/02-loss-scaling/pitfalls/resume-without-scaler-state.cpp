// Chapter 02 — pitfall resume-without-scaler-state: a checkpoint without the GradScaler's state.
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// ../training.hpp (Batches, batch_loss, batch_loss_backward, mlp_config),
// mpt/amp/grad_scaler.hpp (state_dict, load_state_dict), mpt/nn/data/data.hpp
// (make_tiny_target_regression), mpt/nn/models/mlp.hpp, mpt/optim/sgd.hpp;
// <algorithm>, <cmath>, <cstddef>, <string>, <utility>, <vector>.
//
// A dynamic scale is learned state: the scaler spent its first iterations
// finding a scale that fits the gradients and has counted clean steps toward
// the next growth since. A checkpoint that keeps the model and the optimizer
// but not scaler.state_dict() resumes with a fresh scaler at 2^16 and a
// tracker of 0, and the resumed run skips its first iterations again while
// the scale falls back. PyTorch's AMP notes: save scaler.state_dict() with the
// checkpoint and load it on resume.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "../training.hpp"
#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch02 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace resume_without_scaler_state {

// ---------------------------------------------------------------------------
// The constants, the data, the checkpoint, and what a run measures.

constexpr int kStepsBeforeCheckpoint = 40;  ///< iterations before the checkpoint
constexpr int kStepsAfterResume = 20;       ///< iterations after it (K)
constexpr Eigen::Index kResumeBatch = 64;
constexpr double kResumeLr = 1e-4;
constexpr double kResumeTargetScale = 100.0;

/// The teacher regression with targets in the hundreds: S = 2^16 overflows
/// at first, and the scale settles a few halvings lower.
const Dataset& resume_targets() {
  static const Dataset d = [] {
    TinyTargetOptions o;
    o.target_scale = kResumeTargetScale;
    return make_tiny_target_regression(o);
  }();
  return d;
}

/// The fp16 MLP 8-32-32-4 (weights from seed 3) both runs train, and its
/// plain SGD (no momentum: the optimizer keeps no state, so model and
/// optimizer are restored completely and only the scaler can differ).
Mlp resume_net() { return Mlp(mlp_config({8, 32, 32, 4}, DType::f16, 3)); }
SGD resume_sgd(Mlp& net) {
  SgdOptions o;
  o.lr = kResumeLr;
  return SGD(net.parameters(), o);
}

/// What a training script saves: the FP32 masters, the optimizer's state
/// (none for plain SGD), the data order, and the scaler's state_dict().
struct Checkpoint {
  std::vector<MatrixF> masters;  ///< every parameter's FP32 master, in order
  Batches batches;               ///< the sampler where it stopped
  std::string scaler;            ///< scaler.state_dict() after update()
};

/// One iteration: forward, scaled backward, step (skipped on inf), update,
/// refresh. Returns the batch's loss; `skipped` says whether step() was skipped.
float train_step(Mlp& net, SGD& opt, Batches& batches, GradScaler& scaler, bool& skipped) {
  const Dataset b = batches.next();
  const Tensor& out = net.forward(b.x);
  const float loss = batch_loss(out, b);
  (void)scaler.scale(loss);
  opt.zero_grad();
  net.backward(batch_loss_backward(out, b, scaler.get_scale()));
  skipped = !scaler.step(opt);
  scaler.update();
  net.refresh_model_copies();
  return loss;
}

/// The run without interruption: the checkpoint at kStepsBeforeCheckpoint,
/// then the losses and skips of the next kStepsAfterResume iterations.
struct Uninterrupted {
  Checkpoint checkpoint;
  float scale = 0;     ///< the scale in the checkpoint
  double tracker = 0;  ///< the growth tracker in the checkpoint
  double skipped_before = 0;
  double skipped_after = 0;
  std::vector<float> losses_after;
};
Uninterrupted uninterrupted_run() {
  Mlp net = resume_net();
  SGD opt = resume_sgd(net);
  Batches batches(resume_targets(), kResumeBatch, kBatchSeed);
  GradScaler scaler;
  Uninterrupted u{Checkpoint{{}, batches, ""}, 0.0f, 0.0, 0.0, 0.0, {}};
  bool skipped = false;
  for (int it = 1; it <= kStepsBeforeCheckpoint; ++it) {
    train_step(net, opt, batches, scaler, skipped);
    u.skipped_before += skipped;
  }
  for (const Parameter* p : net.parameters()) u.checkpoint.masters.emplace_back(p->master.f32());
  u.checkpoint.batches = batches;
  u.checkpoint.scaler = scaler.state_dict();
  u.scale = scaler.get_scale();
  u.tracker = scaler.growth_tracker();
  for (int it = 1; it <= kStepsAfterResume; ++it) {
    u.losses_after.push_back(train_step(net, opt, batches, scaler, skipped));
    u.skipped_after += skipped;
  }
  return u;
}

/// What the resumed run measured.
struct Resumed {
  float scale = 0;     ///< right after resume, before the first iteration
  double tracker = 0;  ///< likewise
  double skipped = 0;  ///< in the kStepsAfterResume iterations
  std::vector<float> losses;
};

/// The outcomes of both runs (defined after the runs).
RunResult resume_outcomes(const Resumed& r, std::string setup);

/// A fresh model and optimizer with the checkpoint's masters, then the
/// kStepsAfterResume iterations with `scaler` as the resume left it.
Resumed resume_and_train(const Checkpoint& ckpt, GradScaler& scaler) {
  Mlp net = resume_net();
  SGD opt = resume_sgd(net);
  const std::vector<Parameter*> params = net.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) params[i]->master.f32() = ckpt.masters[i];
  net.refresh_model_copies();
  Batches batches = ckpt.batches;
  Resumed r;
  r.scale = scaler.get_scale();
  r.tracker = scaler.growth_tracker();
  bool skipped = false;
  for (int it = 1; it <= kStepsAfterResume; ++it) {
    r.losses.push_back(train_step(net, opt, batches, scaler, skipped));
    r.skipped += skipped;
  }
  return r;
}

const Uninterrupted& uninterrupted() {
  static const Uninterrupted u = uninterrupted_run();  // deterministic: run it once
  return u;
}

// ---------------------------------------------------------------------------
// The broken run.

RunResult resume_without_scaler_state_broken() {
  const Checkpoint& ckpt = uninterrupted().checkpoint;
  //! [resume-without-scaler-state-broken]
  // Resume: model masters and optimizer state from the checkpoint, and
  GradScaler scaler;  // a fresh scaler: scale 2^16, growth tracker 0
  //! [resume-without-scaler-state-broken]
  return resume_outcomes(resume_and_train(ckpt, scaler),
                         "fp16 MLP, regression with targets ~100, SGD, GradScaler; resumed after " +
                             std::to_string(kStepsBeforeCheckpoint) +
                             " iterations from a checkpoint of the masters and the optimizer only");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult resume_without_scaler_state_fixed() {
  const Checkpoint& ckpt = uninterrupted().checkpoint;
  //! [resume-without-scaler-state-fixed]
  // Save: checkpoint.scaler = scaler.state_dict();  (after update())
  // Resume: model masters and optimizer state from the checkpoint, and
  GradScaler scaler;
  scaler.load_state_dict(ckpt.scaler);  // the scale and the tracker where they were
  //! [resume-without-scaler-state-fixed]
  return resume_outcomes(resume_and_train(ckpt, scaler),
                         "the same resume, the checkpoint also holding scaler.state_dict(), loaded with "
                         "load_state_dict()");
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult resume_outcomes(const Resumed& r, std::string setup) {
  const Uninterrupted& u = uninterrupted();
  double first_difference = 0, max_difference = 0;
  for (std::size_t i = 0; i < r.losses.size(); ++i) {
    const double d = std::fabs(static_cast<double>(r.losses[i]) - u.losses_after[i]) / u.losses_after[i];
    if (d > 0 && first_difference == 0) first_difference = static_cast<double>(i + 1);
    max_difference = std::max(max_difference, d);
  }
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"steps_before_checkpoint", kStepsBeforeCheckpoint, "iterations before the checkpoint (SGD, batch 64)"},
      {"skipped_before_checkpoint", u.skipped_before,
       "iterations skipped before it (the scale falling from 2^16)"},
      {"saved_scale", u.scale, "the scale when the checkpoint was taken"},
      {"saved_growth_tracker", u.tracker, "clean steps the scaler had counted toward growth"},
      {"growth_interval", GradScaler::Options{}.growth_interval,
       "clean steps in a row before the scale grows"},
      {"scale_after_resume", r.scale, "the scale the resumed run starts with"},
      {"growth_tracker_after_resume", r.tracker, "the tracker the resumed run starts with"},
      {"steps_after_resume", kStepsAfterResume, "iterations compared after the resume"},
      {"skipped_after_resume", r.skipped, "iterations the resumed run skipped in them"},
      {"uninterrupted_skipped", u.skipped_after, "iterations the uninterrupted run skipped in the same span"},
      {"first_differing_step", first_difference,
       "first iteration after the resume whose loss (its batch's, before its update) differs from the "
       "uninterrupted run's (0: none)"},
      {"max_loss_difference", max_difference,
       "largest |loss - uninterrupted loss| / uninterrupted loss over those iterations"},
  };
  out.explanation =
      r.scale != u.scale
          ? "The checkpoint was taken at scale " + num(u.scale) + " with " + num(u.tracker) +
                " clean steps counted; the fresh scaler started again at " + num(r.scale) +
                " with a tracker of " + num(r.tracker) + ", skipped " + num(r.skipped) + " of the first " +
                num(kStepsAfterResume) + " iterations (the uninterrupted run " + num(u.skipped_after) +
                ") while the scale fell back, and the losses left the uninterrupted run's at iteration " +
                num(first_difference) + " after the resume."
          : "The scaler resumed at the saved scale " + num(r.scale) + " with its " + num(r.tracker) +
                " clean steps, skipped " + num(r.skipped) + " iterations as the uninterrupted run did, and " +
                (max_difference == 0
                     ? std::string("every loss after the resume equals the uninterrupted run's, bit for bit.")
                     : "the losses differ by at most " + num(max_difference) + " (relative).");
  return out;
}

}  // namespace resume_without_scaler_state
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall resume_without_scaler_state_pitfall() {
  using namespace resume_without_scaler_state;
  return Pitfall{
      "resume-without-scaler-state",
      2,
      "a checkpoint without the scaler's state: the resumed run skips steps again",
      "A dynamic loss scale is learned state: a checkpoint of the model and the optimizer without "
      "scaler.state_dict() resumes at 2^16 with a growth tracker of 0, so the resumed run skips "
      "iterations again while the scale falls back, and it no longer follows the uninterrupted run.",
      resume_without_scaler_state_broken,
      resume_without_scaler_state_fixed,
      {
          check("the resumed run starts at a scale other than the saved one",
                [](const RunResult& r) { return r.get("scale_after_resume") != r.get("saved_scale"); }),
          check("the growth tracker starts again at 0",
                [](const RunResult& r) { return r.get("growth_tracker_after_resume") == 0; }),
          check("the resumed run skips iterations the uninterrupted run did not",
                [](const RunResult& r) {
                  return r.get("skipped_after_resume") > r.get("uninterrupted_skipped");
                }),
          check("its losses leave the uninterrupted run's at the second iteration after the resume, the "
                "first after a skipped step",
                [](const RunResult& r) { return r.get("first_differing_step") == 2; }),
      },
      {
          check("the resumed run starts at the saved scale",
                [](const RunResult& r) { return r.get("scale_after_resume") == r.get("saved_scale"); }),
          check("the growth tracker continues from the saved count",
                [](const RunResult& r) {
                  return r.get("growth_tracker_after_resume") == r.get("saved_growth_tracker");
                }),
          check("it skips no more iterations than the uninterrupted run",
                [](const RunResult& r) {
                  return r.get("skipped_after_resume") == r.get("uninterrupted_skipped");
                }),
          check("every loss after the resume equals the uninterrupted run's, bit for bit",
                [](const RunResult& r) { return r.get("max_loss_difference") == 0; }),
      },
      {}};
}

}  // namespace mpt::ch02
