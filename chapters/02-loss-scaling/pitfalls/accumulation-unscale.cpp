// Chapter 02 — pitfall accumulation-unscale: gradient accumulation: unscale once, after the last micro-batch
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// ../training.hpp (blobs()), mpt/amp/grad_scaler.hpp,
// mpt/amp/scaler_math.hpp (inverse_scale), mpt/nn/data/data.hpp,
// mpt/nn/layers/losses.hpp (cross_entropy_loss, cross_entropy_backward),
// mpt/nn/models/mlp.hpp, mpt/optim/sgd.hpp; <cmath>, <cstddef>, <stdexcept>,
// <string>, <utility>, <vector>.
//
// Gradients accumulated over micro-batches must stay scaled by one constant
// S until the last one is in; unscaling in between divides the earlier
// micro-batches' share of .grad again and again (PyTorch refuses a second
// unscale_ for that reason).
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../training.hpp"
#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/amp/scaler_math.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch02 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace accumulation_unscale {

// ---------------------------------------------------------------------------
// The constants, what a run measures, and the gradient it should use.

constexpr int kMicroBatches = 4;
constexpr Eigen::Index kMicroBatch = 16;  // effective batch 64
constexpr int kAccumulationSteps = 100;
constexpr double kAccumulationLr = 0.05;

struct AccumulationRun {
  double refusals = 0, first_rel_error = 0, first_norm_ratio = 0, scale = 0;
  std::string message;
};

/// The gradients of a parameter list, copied (to compare them later).
std::vector<MatrixF> grads_of(const std::vector<Parameter*>& params) {
  std::vector<MatrixF> g;
  for (const Parameter* p : params) g.push_back(p->grad.f32());
  return g;
}

/// ||a - b|| / ||b|| over a list of matrices (in double).
double relative_difference(const std::vector<MatrixF>& a, const std::vector<MatrixF>& b) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (a[i].cast<double>() - b[i].cast<double>()).squaredNorm();
    ref += b[i].cast<double>().squaredNorm();
  }
  return std::sqrt(diff) / std::sqrt(ref);
}

double norm_of(const std::vector<MatrixF>& a) {
  double sq = 0;
  for (const MatrixF& m : a) sq += m.cast<double>().squaredNorm();
  return std::sqrt(sq);
}

/// The gradient the first optimizer step should use: the four micro-batches
/// of step 1 as one batch of 64 through the same fp16 network (same seed), in
/// one backward pass from the scaled loss, unscaled once. Accumulating
/// micro-batches must give this gradient, up to rounding.
std::vector<MatrixF> effective_batch_gradient() {
  BlobsRun run(DType::f16, kAccumulationLr, kMicroBatch);
  Dataset all;
  all.num_classes = blobs().train.num_classes;
  all.x.resize(kMicroBatch * kMicroBatches, blobs().train.x.cols());
  for (int k = 0; k < kMicroBatches; ++k) {
    const Dataset b = run.batches.next();
    all.x.middleRows(k * kMicroBatch, kMicroBatch) = b.x;
    all.labels.insert(all.labels.end(), b.labels.begin(), b.labels.end());
  }
  const float scale = GradScaler::Options{}.init_scale;
  run.opt.zero_grad();
  const Tensor& out = run.net.forward(all.x);
  run.net.backward(cross_entropy_backward(out, all.labels, scale));
  for (Parameter* p : run.net.parameters()) p->grad.f32() *= mpt::inverse_scale(scale);
  return grads_of(run.net.parameters());
}

/// The forward and backward pass of the next micro-batch from S * loss / K:
/// adds its share of the effective batch's gradient, scaled by S, into .grad.
void micro_batch_backward(BlobsRun& run, GradScaler& scaler) {
  const Dataset b = run.batches.next();
  const Tensor& out = run.net.forward(b.x);
  (void)scaler.scale(cross_entropy_loss(out, b.labels) / kMicroBatches);
  run.net.backward(cross_entropy_backward(out, b.labels, scaler.get_scale() / kMicroBatches));
}

/// The outcomes of both runs, next to the FP32 baseline (defined after the
/// runs).
RunResult accumulation_outcomes(const AccumulationRun& r, BlobsRun& run, std::string setup);

// ---------------------------------------------------------------------------
// The broken run (the loop of both runs).

/// The loop of both runs; `unscale_each` (after every micro-batch) is the bug.
RunResult accumulation_run(bool unscale_each, std::string setup) {
  const std::vector<MatrixF> reference = effective_batch_gradient();
  BlobsRun run(DType::f16, kAccumulationLr, kMicroBatch);
  SGD& opt = run.opt;
  AccumulationRun r;
  GradScaler scaler;
  for (int step = 1; step <= kAccumulationSteps; ++step) {
    opt.zero_grad();
    if (unscale_each) {
      //! [accumulation-unscale-broken]
      for (int k = 0; k < kMicroBatches; ++k) {
        micro_batch_backward(run, scaler);  // .grad += S * (its gradient) / 4
        try {
          scaler.unscale(opt);  // every micro-batch: refused from the second on ...
        } catch (const std::logic_error& e) {
          if (r.refusals++ == 0) r.message = e.what();
          const float inv = mpt::inverse_scale(scaler.get_scale());  // ... so do what it would do
          for (Parameter* p : opt.params()) p->grad.f32() *= inv;
        }
      }
      scaler.step(opt);
      scaler.update();
      //! [accumulation-unscale-broken]
    } else {
      //! [accumulation-unscale-fixed]
      for (int k = 0; k < kMicroBatches; ++k)
        micro_batch_backward(run, scaler);  // .grad += S * (its gradient) / 4
      // the gradients stay scaled, by one constant S, until all are in
      scaler.unscale(opt);  // once per effective batch (here it could clip)
      scaler.step(opt);
      scaler.update();
      //! [accumulation-unscale-fixed]
    }
    if (step == 1) {
      const std::vector<MatrixF> used = grads_of(opt.params());
      r.first_rel_error = relative_difference(used, reference);
      r.first_norm_ratio = norm_of(used) / norm_of(reference);
    }
    run.net.refresh_model_copies();
  }
  r.scale = scaler.get_scale();
  return accumulation_outcomes(r, run, std::move(setup));
}

RunResult accumulation_unscale_broken() {
  return accumulation_run(true, "fp16 MLP on the blobs, 4 accumulated micro-batches, unscaled after each");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult accumulation_unscale_fixed() {
  return accumulation_run(false, "the same accumulation, unscaled once after the last micro-batch");
}

// ---------------------------------------------------------------------------
// The outcomes.

/// The FP32 baseline: the same accumulation, nothing to scale.
double accumulation_fp32_loss() {
  BlobsRun run(DType::f32, kAccumulationLr, kMicroBatch);
  for (int step = 0; step < kAccumulationSteps; ++step) {
    run.opt.zero_grad();
    for (int k = 0; k < kMicroBatches; ++k) {
      const Dataset b = run.batches.next();
      const Tensor& out = run.net.forward(b.x);
      run.net.backward(cross_entropy_backward(out, b.labels, 1.0f / kMicroBatches));
    }
    run.opt.step();
    run.net.refresh_model_copies();
  }
  return set_loss(run.net, blobs().train);
}

RunResult accumulation_outcomes(const AccumulationRun& r, BlobsRun& run, std::string setup) {
  static const double base = accumulation_fp32_loss();
  const double loss = set_loss(run.net, blobs().train);
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"micro_batches", kMicroBatches, "micro-batches of 16 per optimizer step (effective batch 64)"},
      {"steps", kAccumulationSteps, "optimizer steps (SGD, momentum 0.9, lr " + num(kAccumulationLr) + ")"},
      {"loss_scale", r.scale, "the GradScaler's scale at the end"},
      {"unscale_refusals", r.refusals, "unscale() calls the scaler refused (logic_error)"},
      {"first_step_grad_error", r.first_rel_error,
       "||g_used - g_64|| / ||g_64|| at step 1; g_64: the same 64 samples in one backward pass"},
      {"first_step_norm_ratio", r.first_norm_ratio, "||g_used|| / ||g_64|| at step 1"},
      {"train_loss", loss, "cross-entropy on the training set at the end"},
      {"fp32_train_loss", base, "the FP32 baseline (the same accumulation)"},
      {"loss_ratio", loss / base, "train_loss / fp32_train_loss"},
  };
  out.explanation =
      r.refusals > 0
          ? "The second unscale() of an iteration was refused (" + r.message +
                "). Unscaling by hand instead divides what .grad holds, and it holds the earlier "
                "micro-batches too: micro-batch k of 4 ends up divided by S^(4-k+1), so only the "
                "last one counts. The step-1 gradient was off by " +
                num(r.first_rel_error) + " relative, with " + num(r.first_norm_ratio) + " of the norm."
          : "One unscale() after the last micro-batch: the step-1 gradient matches the gradient of "
            "the 64 samples in one pass to " +
                num(r.first_rel_error) +
                " relative (rounding), and "
                "the loss ends at " +
                num(loss / base) + " times FP32's.";
  return out;
}

}  // namespace accumulation_unscale
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall accumulation_unscale_pitfall() {
  using namespace accumulation_unscale;
  return Pitfall{
      "accumulation-unscale",
      2,
      "gradient accumulation: unscale once, after the last micro-batch",
      "Accumulated gradients must stay scaled by one constant S until the effective batch is "
      "complete; unscaling in between divides the earlier micro-batches' share of .grad again with "
      "every later unscale (PyTorch refuses a second unscale_ for that reason).",
      accumulation_unscale_broken,
      accumulation_unscale_fixed,
      {
          check("the scaler refused the second unscale() of an iteration",
                [](const RunResult& r) { return r.get("unscale_refusals") > 0; }),
          check("the step-1 gradient is off by more than 50% (relative)",
                [](const RunResult& r) { return r.get("first_step_grad_error") > 0.5; }),
          check("training lags: the loss ends more than 10% above FP32's",
                [](const RunResult& r) { return r.get("loss_ratio") > 1.1; }),
      },
      {
          check("no call was refused", [](const RunResult& r) { return r.get("unscale_refusals") == 0; }),
          check("the step-1 gradient is the one-pass gradient of the 64 samples, within 1%",
                [](const RunResult& r) { return r.get("first_step_grad_error") < 0.01; }),
          check("the loss is within 5% of FP32's",
                [](const RunResult& r) { return within(r.get("loss_ratio"), 1.0, 0.05); }),
      },
      {}};
}

}  // namespace mpt::ch02
