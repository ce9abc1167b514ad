// Chapter 02 — pitfall static-scale-too-large: a static loss scale that steps through an overflow
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// ../training.hpp (plain_step, scaled_backward, blobs()),
// mpt/amp/grad_scaler.hpp (GradScaler, StaticScaler); <algorithm>, <cmath>,
// <string>, <utility>.
//
// A constant scale that fits the first steps' gradients is overflowed by a
// later batch's (fp16's max is 65504). A scaler that steps anyway (NVIDIA
// apex with a fixed loss_scale) sends the inf into the weights and turns them
// to NaN; the dynamic scaler skips such a step and halves the scale.
// ch02_numbers static-scale separates the two decisions (a constant scale;
// no skip) with a third scaler, a constant scale that skips.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "../training.hpp"
#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"

namespace mpt::ch02 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace static_scale_too_large {

// ---------------------------------------------------------------------------
// The constants and the loop of both runs.

// kStaticScale, kStaticSteps, kStaticBatch, kStaticLr: ../training.hpp
// (ch02_numbers grad-growth repeats this run).

struct StaticRun {
  double overflows = 0, first_overflow = 0, skipped = 0, scale = 0;
  double step1_gradient = 0;  ///< the largest scaled gradient of step 1
  double peak_before = 0;     ///< the largest scaled gradient of the steps before the first overflow
};

/// The loop of both runs: kStaticSteps loss-scaled steps, counting the steps
/// whose scaled gradients overflowed. A StaticScaler's step() unscales and
/// checks, then steps anyway; a GradScaler's skips such a step, and its
/// update() then halves the scale.
template <class Scaler>
StaticRun static_scale_run(BlobsRun& run, Scaler& scaler) {
  StaticRun r;
  for (int step = 1; step <= kStaticSteps; ++step) {
    scaled_backward(run.net, run.opt, run.batches, scaler);
    const double largest = largest_gradient(run.net);  // scaled, before step() unscales
    if (step == 1) r.step1_gradient = largest;
    if (r.overflows == 0 && std::isfinite(largest)) r.peak_before = std::max(r.peak_before, largest);
    r.skipped += !scaler.step(run.opt);
    if (*scaler.found_inf(run.opt) && r.overflows++ == 0) r.first_overflow = step;
    scaler.update();
    run.net.refresh_model_copies();
  }
  r.scale = scaler.get_scale();
  return r;
}

/// The outcomes of both runs, next to the FP32 baseline (defined after the
/// runs).
RunResult static_outcomes(const StaticRun& r, BlobsRun& run, std::string setup);

// ---------------------------------------------------------------------------
// The broken run.

RunResult static_scale_broken() {
  BlobsRun run(DType::f16, kStaticLr, kStaticBatch);
  //! [static-scale-too-large-broken]
  StaticScaler scaler(kStaticScale);  // constant scale; step() never skips
  // 200 steps of forward, S * loss, backward, step(), update(): each step()
  // unscales and checks, then steps anyway, inf or not.
  const StaticRun r = static_scale_run(run, scaler);
  //! [static-scale-too-large-broken]
  return static_outcomes(r, run, "fp16 MLP on the blobs, static loss scale 2^18, no step skipping");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult static_scale_fixed() {
  BlobsRun run(DType::f16, kStaticLr, kStaticBatch);
  //! [static-scale-too-large-fixed]
  GradScaler::Options o;
  o.init_scale = kStaticScale;  // the same start; the scale now moves
  GradScaler scaler(o);
  // The same loop: step() now skips a step whose gradients hold inf/NaN, and
  // update() then halves the scale.
  const StaticRun r = static_scale_run(run, scaler);
  //! [static-scale-too-large-fixed]
  return static_outcomes(r, run, "the same run with a GradScaler starting at 2^18 (dynamic)");
}

// ---------------------------------------------------------------------------
// The outcomes.

/// The FP32 baseline: no scaling at all.
double blobs_fp32_accuracy(double lr, int steps, Eigen::Index batch) {
  BlobsRun run(DType::f32, lr, batch);
  for (int step = 0; step < steps; ++step) plain_step(run.net, run.opt, run.batches);
  return set_accuracy(run.net, blobs().test);
}

RunResult static_outcomes(const StaticRun& r, BlobsRun& run, std::string setup) {
  static const double base_accuracy = blobs_fp32_accuracy(kStaticLr, kStaticSteps, kStaticBatch);
  const double bad = nonfinite_weights(run.net);
  const double loss = set_loss(run.net, blobs().train);
  const double acc = set_accuracy(run.net, blobs().test);
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"steps", kStaticSteps, "iterations (SGD, momentum 0.9, lr " + num(kStaticLr) + ", batch 64)"},
      {"initial_scale", kStaticScale, "the loss scale of step 1"},
      {"step1_max_gradient", r.step1_gradient, "largest |scaled gradient| of step 1 (activation or weight)"},
      {"peak_gradient_before_overflow", r.peak_before, "the largest of the steps before the first overflow"},
      {"final_scale", r.scale, "the loss scale after the last step"},
      {"overflow_steps", r.overflows, "steps whose scaled gradients held inf/NaN"},
      {"first_overflow_step", r.first_overflow, "the first of them (0: none)"},
      {"skipped_steps", r.skipped, "optimizer steps skipped"},
      {"nonfinite_weights", bad, "master weights that are inf or NaN at the end"},
      {"train_loss", loss, "cross-entropy on the training set at the end"},
      {"test_accuracy", acc, "on 256 held-out samples (4 classes: chance is 0.25)"},
      {"fp32_test_accuracy", base_accuracy, "the FP32 baseline, no scaling"},
  };
  out.explanation =
      r.skipped == 0
          ? "The scale " + num(kStaticScale) + " held the gradients until step " + num(r.first_overflow) +
                ", when the largest scaled gradient passed fp16's max 65504 and became inf. Nothing "
                "skipped the step, so the inf went into the weights (" +
                num(bad) + " are now inf/NaN); from then on every forward pass computes NaN, which is why " +
                num(r.overflows) + " steps count as overflowing."
          : "The scaler found inf/NaN in " + num(r.overflows) + " step(s), the first at step " +
                num(r.first_overflow) + ", skipped each and halved the scale (now " + num(r.scale) + "); " +
                num(bad) + " weights are inf/NaN, and the accuracy is " + pct(acc) + " against FP32's " +
                pct(base_accuracy) + ".";
  return out;
}

}  // namespace static_scale_too_large
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall static_scale_too_large_pitfall() {
  using namespace static_scale_too_large;
  return Pitfall{
      "static-scale-too-large",
      2,
      "a static loss scale that steps through an overflow: inf reaches the weights",
      "A constant scale that fits the first steps' gradients is overflowed by a later batch's (fp16's "
      "max is 65504); a scaler that steps anyway, as apex's static loss scale does, sends the inf into "
      "the weights and turns them to NaN, while the dynamic scaler skips that step and halves the scale.",
      static_scale_broken,
      static_scale_fixed,
      {
          check(
              "no step was skipped although some overflowed",
              [](const RunResult& r) { return r.get("overflow_steps") > 0 && r.get("skipped_steps") == 0; }),
          check("weights became inf/NaN", [](const RunResult& r) { return r.get("nonfinite_weights") > 0; }),
          check("the loss is NaN", [](const RunResult& r) { return std::isnan(r.get("train_loss")); }),
      },
      {
          check("every overflowing step was skipped, and there were some",
                [](const RunResult& r) {
                  return r.get("overflow_steps") > 0 && r.get("skipped_steps") == r.get("overflow_steps");
                }),
          check("the scale backed off below its start",
                [](const RunResult& r) { return r.get("final_scale") < r.get("initial_scale"); }),
          check("every weight is finite", [](const RunResult& r) { return r.get("nonfinite_weights") == 0; }),
          check("the accuracy is within 0.02 of FP32's",
                [](const RunResult& r) {
                  return std::fabs(r.get("test_accuracy") - r.get("fp32_test_accuracy")) <= 0.02;
                }),
      },
      {
          // Both runs are the same run until the first overflow.
          check("the scale fitted at first: the first overflow comes after step 1",
                [](const RunResult& r) { return r.get("first_overflow_step") > 1; }),
      }};
}

}  // namespace mpt::ch02
