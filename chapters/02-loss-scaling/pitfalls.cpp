// Chapter 02 — loss scaling and FP32 master weights: the chapter's pitfalls.
// Depends on: the Chapter 2 training stack (mpt/mlp.hpp, layers.hpp, optim.hpp,
// grad_scaler.hpp, data.hpp), Chapter 1 (format.hpp, rounding.hpp, pitfall.hpp),
// training.hpp (batching, the training steps, and the runs shared with
// numbers.cpp), and
// chapters.hpp (the declaration).
//
// Every run trains a small MLP on one of the synthetic sets of data.hpp (no
// data file needed), seeded, in a fraction of a second. Each pitfall also
// trains an FP32 baseline where its checks need one ("tracks FP32"), with the
// same seed, batches and hyperparameters; a baseline is deterministic, so it
// is trained once per process and shared by the broken and the fixed run. The `//! [id-broken]` /
// `//! [id-fixed]` markers delimit the code the chapter text shows through
// Doxygen \snippet.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "chapters.hpp"
#include "mpt/nn/data.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/amp/scaler_math.hpp"
#include "mpt/nn/losses.hpp"
#include "mpt/nn/mlp.hpp"
#include "mpt/optim/adamw.hpp"
#include "mpt/optim/sgd.hpp"
#include "mpt/formats/rounding.hpp"
#include "training.hpp"

namespace mpt {
namespace {

// ---------------------------------------------------------------------------
// Small tools shared by the runs.

/// A number for generated text: up to 6 significant digits.
std::string num(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}
/// A percentage with one decimal: 0.9426 -> "94.3%".
std::string pct(double fraction) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * fraction);
  return buf;
}

/// The loss over a whole set, one forward pass (batch_loss: training.hpp).
double set_loss(Mlp& net, const Dataset& d) { return batch_loss(net.forward(d.x), d); }
double set_accuracy(Mlp& net, const Dataset& d) { return accuracy(net.forward(d.x), d.labels); }

/// Fraction of exact zeros among the dense activation gradients of the last
/// backward(): dlogits and the gradients w.r.t. each activation's output.
/// The gradients behind a ReLU (every other tensor of activation_gradients())
/// are left out: the ReLU zeroes them in every precision.
double dense_zero_fraction(const std::vector<Tensor>& grads) {
  double zeros = 0, n = 0;
  for (std::size_t k = 0; k < grads.size(); k += (k == 0 ? 1 : 2)) {
    const MatrixF g = grads[k].to_matrix();
    zeros += static_cast<double>((g.array() == 0.0f).count());
    n += static_cast<double>(g.size());
  }
  return n > 0 ? zeros / n : 0.0;
}

/// Master weights that are inf or NaN.
double nonfinite_weights(Mlp& net) {
  double n = 0;
  for (const Parameter* p : net.parameters())
    n += static_cast<double>((!p->master.f32().array().isFinite()).count());
  return n;
}

/// L2 norm over every gradient, summed in double.
double grad_norm(const std::vector<Parameter*>& params) {
  double sq = 0;
  for (const Parameter* p : params) sq += p->grad.f32().cast<double>().squaredNorm();
  return std::sqrt(sq);
}

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

/// torch.nn.utils.clip_grad_norm_(params, max_norm) with the L2 norm, the way
/// PyTorch computes it: the total norm over all gradients together,
/// clip_coef = max_norm / (total + 1e-6), clamped to at most 1, and every
/// gradient multiplied by it (so a norm below max_norm is left alone, and an
/// inf norm makes the coefficient 0). PyTorch sums in the gradients' dtype;
/// this sums the squares in double and rounds the norm once to FP32.
/// \return the total norm before clipping, as PyTorch returns it.
float clip_grad_norm(const std::vector<Parameter*>& params, float max_norm) {
  const float total = static_cast<float>(grad_norm(params));
  const float coef = max_norm / (total + 1e-6f);
  const float clamped = std::min(coef, 1.0f);  // torch.clamp(clip_coef, max=1.0)
  for (Parameter* p : params) p->grad.f32() *= clamped;
  return total;
}

// --- the blobs runs --------------------------------------------------------

/// An SGD run on the blobs: the network, its optimizer and its batches.
struct BlobsRun {
  Mlp net;
  SGD opt;
  Batches batches;
  BlobsRun(DType p, double lr, Eigen::Index batch, MasterWeights mw = MasterWeights::fp32)
      : net([&] {
          MlpConfig c = mlp_config(kBlobsNet, p, kBlobsSeed);
          c.master_weights = mw;
          return c;
        }()),
        opt(net.parameters(), [lr] {
          SgdOptions o;
          o.lr = lr;
          o.momentum = 0.9;
          return o;
        }()),
        batches(blobs().train, batch, kBatchSeed) {}
};

// Check helpers: each reads outcomes by name, so a renamed outcome makes the
// check fail loudly instead of silently passing.
Check check(std::string claim, std::function<bool(const RunResult&)> holds) {
  return Check{std::move(claim), std::move(holds)};
}
bool within(double x, double target, double rel) { return std::fabs(x - target) <= rel * std::fabs(target); }

// ---------------------------------------------------------------------------
// 1. no-loss-scaling: the small gradients of a regression with tiny targets
// flush to zero in fp16 and the hidden layers stop learning.

constexpr int kUnderflowSteps = kTinyTargetSteps;
constexpr double kUnderflowLr = kTinyTargetLr;

/// What one tiny-target run measured.
struct UnderflowRun {
  double zero_fraction = 0, relative_loss = 0, fc1_change = 0, skipped = 0, scale = 1;
};

/// What every tiny-target run measures at its end: the final loss relative
/// to the targets' power, and how far the first layer moved from `fc1` (its
/// weights before the first step).
void measure_end(UnderflowRun& r, Mlp& net, const MatrixF& fc1) {
  r.relative_loss = set_loss(net, tiny_targets()) / target_power(tiny_targets());
  r.fc1_change = (net.parameters()[0]->master.f32() - fc1).norm() / fc1.norm();
}

/// A tiny-target run without loss scaling: in fp16 the broken run, in FP32
/// the baseline of both runs (FP32 holds these gradients).
UnderflowRun tiny_target_unscaled(DType p) {
  TinyTargetRun run(p);
  Mlp& net = run.net;
  AdamW& opt = run.opt;
  const MatrixF fc1 = net.parameters()[0]->master.f32();
  UnderflowRun r;
  //! [no-loss-scaling-broken]
  // fp16 activations and gradients, FP32 master weights, no loss scaling:
  // the backward pass starts from dloss = 1.
  for (int step = 0; step < kUnderflowSteps; ++step) {
    const Dataset b = run.batches.next();
    const Tensor& out = net.forward(b.x);
    opt.zero_grad();
    net.backward(mse_backward(out, b.targets));  // gradients stored in fp16
    r.zero_fraction += dense_zero_fraction(net.activation_gradients()) / kUnderflowSteps;
    opt.step();
    net.refresh_model_copies();
  }
  //! [no-loss-scaling-broken]
  measure_end(r, net, fc1);
  return r;
}

RunResult underflow_outcomes(const UnderflowRun& r, std::string setup) {
  static const UnderflowRun base = tiny_target_unscaled(DType::f32);  // deterministic: train it once
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"steps", kUnderflowSteps, "optimizer steps attempted (AdamW, lr " + num(kUnderflowLr) + ")"},
      {"loss_scale", r.scale, "scale after the last step (1: none)"},
      {"skipped_steps", r.skipped, "steps the scaler skipped (inf/NaN gradients)"},
      {"zero_fraction", r.zero_fraction, "activation gradients that are exactly 0, mean over steps"},
      {"fp32_zero_fraction", base.zero_fraction, "the same in the FP32 baseline"},
      {"fc1_weight_change", r.fc1_change, "||W1_end - W1_start|| / ||W1_start||, first layer"},
      {"fp32_fc1_weight_change", base.fc1_change, "the same in the FP32 baseline"},
      {"relative_loss", r.relative_loss, "final MSE / mean target^2 (1: predicts 0)"},
      {"fp32_relative_loss", base.relative_loss, "the same in the FP32 baseline"},
      {"loss_ratio", r.relative_loss / base.relative_loss, "relative_loss / fp32_relative_loss"},
  };
  out.explanation =
      r.scale == 1.0
          ? pct(r.zero_fraction) + " of the activation gradients were stored as 0 (FP32: " +
                pct(base.zero_fraction) + "): at or below 2^-25, half fp16's smallest subnormal, they flush. "
                "The first layer's weights moved " + num(r.fc1_change) + " relative (FP32: " +
                num(base.fc1_change) + "), and the loss ended " + num(r.relative_loss / base.relative_loss) +
                " times FP32's."
          : "Scaled by " + num(r.scale) + ", only " + pct(r.zero_fraction) +
                " of the activation gradients are 0 (FP32: " + pct(base.zero_fraction) + "); " +
                num(r.skipped) + " steps were skipped, and the loss ends at " +
                num(r.relative_loss / base.relative_loss) + " times FP32's.";
  return out;
}

RunResult no_loss_scaling_broken() {
  return underflow_outcomes(tiny_target_unscaled(DType::f16),
                            "fp16 MLP 8-32-32-4 on the tiny-target regression, no loss scaling");
}

RunResult no_loss_scaling_fixed() {
  TinyTargetRun run(DType::f16);
  Mlp& net = run.net;
  AdamW& opt = run.opt;
  Batches& batches = run.batches;
  const MatrixF fc1 = net.parameters()[0]->master.f32();
  UnderflowRun r;
  //! [no-loss-scaling-fixed]
  GradScaler scaler;  // PyTorch's defaults: scale 2^16, x2 after 2000 clean steps, /2 on overflow
  for (int step = 0; step < kUnderflowSteps; ++step) {
    const Dataset b = batches.next();
    const Tensor& out = net.forward(b.x);
    (void)scaler.scale(mse_loss(out, b.targets));  // S * loss, in FP32
    opt.zero_grad();
    // Backward from S * loss: its derivative with respect to the loss is S,
    // and the chain rule carries the factor S into every gradient.
    net.backward(mse_backward(out, b.targets, scaler.get_scale()));
    r.zero_fraction += dense_zero_fraction(net.activation_gradients()) / kUnderflowSteps;
    r.skipped += !scaler.step(opt);  // unscale in FP32, skip the step on inf/NaN
    scaler.update();
    net.refresh_model_copies();
  }
  //! [no-loss-scaling-fixed]
  r.scale = scaler.get_scale();
  measure_end(r, net, fc1);
  return underflow_outcomes(r, "the same fp16 run with a GradScaler (dynamic loss scaling)");
}

// ---------------------------------------------------------------------------
// 2. static-scale-too-large: a constant scale that fits the early gradients
// overflows once they grow; without skipping, the inf reaches the weights.

constexpr float kStaticScale = 262144.0f;  // 2^18
constexpr int kStaticSteps = 200;
constexpr Eigen::Index kStaticBatch = 64;
constexpr double kStaticLr = 0.05;

struct StaticRun {
  double overflows = 0, first_overflow = 0, skipped = 0, scale = 0;
};

/// The FP32 baseline: no scaling at all.
double blobs_fp32_accuracy(double lr, int steps, Eigen::Index batch) {
  BlobsRun run(DType::f32, lr, batch);
  for (int step = 0; step < steps; ++step) plain_step(run.net, run.opt, run.batches);
  return set_accuracy(run.net, blobs().test);
}

/// The loop of both runs: kStaticSteps loss-scaled steps, counting the steps
/// whose scaled gradients overflowed. A StaticScaler's step() unscales and
/// checks, then steps anyway; a GradScaler's skips such a step, and its
/// update() then halves the scale.
template <class Scaler>
StaticRun static_scale_run(BlobsRun& run, Scaler& scaler) {
  StaticRun r;
  for (int step = 1; step <= kStaticSteps; ++step) {
    scaled_backward(run.net, run.opt, run.batches, scaler);
    r.skipped += !scaler.step(run.opt);
    if (*scaler.found_inf(run.opt) && r.overflows++ == 0) r.first_overflow = step;
    scaler.update();
    run.net.refresh_model_copies();
  }
  r.scale = scaler.get_scale();
  return r;
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
                "skipped the step, so the inf went into the weights (" + num(bad) +
                " are now inf/NaN); from then on every forward pass computes NaN, which is why " +
                num(r.overflows) + " steps count as overflowing."
          : "The scaler found inf/NaN in " + num(r.overflows) + " step(s), the first at step " +
                num(r.first_overflow) + ", skipped each and halved the scale (now " + num(r.scale) +
                "); the weights stayed finite and the accuracy matches FP32's.";
  return out;
}

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
// 3. update-forgotten: without update() the scaler's per-optimizer state is
// never reset, and the next iteration's step() refuses to run.

constexpr int kForgetIterations = 10;

struct ForgetRun {
  double completed = 0, steps = 0, errors = 0, first_error = 0;
  std::string message;
};

RunResult forget_outcomes(const ForgetRun& r, const GradScaler& scaler, std::string setup) {
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"iterations", kForgetIterations, "iterations the loop was written for"},
      {"iterations_completed", r.completed, "iterations that ran to the end"},
      {"optimizer_steps", r.steps, "optimizer steps taken"},
      {"misuse_errors", r.errors, "std::logic_error thrown by the scaler"},
      {"first_error_iteration", r.first_error, "iteration of the first error (0: none)"},
      {"growth_tracker", static_cast<double>(scaler.growth_tracker()), "clean steps the scaler has counted"},
      {"scale", scaler.get_scale(), "the scale at the end"},
  };
  out.explanation =
      r.errors > 0
          ? "iteration " + num(r.first_error) + " stopped with: " + r.message
          : "update() ended every iteration: the scaler counted " + num(scaler.growth_tracker()) +
                " clean steps toward the next growth (at 2000), and no call was refused.";
  return out;
}

/// The loop of both runs; `call_update` is the fix.
RunResult update_forgotten_run(bool call_update, std::string setup) {
  BlobsRun run(DType::f16, 0.05, 64);
  Mlp& net = run.net;
  SGD& opt = run.opt;
  ForgetRun r;
  GradScaler scaler;
  for (int it = 1; it <= kForgetIterations; ++it) {
    try {
      scaled_backward(net, opt, run.batches, scaler);  // forward, S * loss, backward
      if (!call_update) {
        //! [update-forgotten-broken]
        // The end of every iteration:
        r.steps += scaler.step(opt);  // marks opt as stepped until update()
        // scaler.update() forgotten: the next iteration's step() throws
        //! [update-forgotten-broken]
      } else {
        //! [update-forgotten-fixed]
        // The end of every iteration:
        r.steps += scaler.step(opt);
        scaler.update();  // after step(), every iteration
        //! [update-forgotten-fixed]
      }
      net.refresh_model_copies();
      ++r.completed;
    } catch (const std::logic_error& e) {  // a training script would stop here
      if (r.errors++ == 0) r.first_error = it, r.message = e.what();
      break;
    }
  }
  return forget_outcomes(r, scaler, std::move(setup));
}

RunResult update_forgotten_broken() {
  return update_forgotten_run(false, "fp16 MLP on the blobs with a GradScaler; the loop never calls update()");
}
RunResult update_forgotten_fixed() {
  return update_forgotten_run(true, "the same loop with scaler.update() after scaler.step()");
}

// ---------------------------------------------------------------------------
// 4. clip-before-unscale: clipping measures the norm of the *scaled*
// gradients, S times the true norm, so it clips (almost) every step, to a
// true norm of max_norm / S.

constexpr float kMaxNorm = 1.0f;
constexpr int kClipSteps = 200;
constexpr Eigen::Index kClipBatch = 64;
constexpr double kClipLr = 0.05;

struct ClipRun {
  double first_seen = 0, first_applied = 0, clipped = 0, scale = 0;
};

/// The FP32 baseline clips correctly (nothing to unscale).
struct ClipBaseline {
  double first_norm = 0, loss = 0, accuracy = 0, clipped = 0;
};
ClipBaseline clip_fp32() {
  BlobsRun run(DType::f32, kClipLr, kClipBatch);
  ClipBaseline r;
  for (int step = 1; step <= kClipSteps; ++step)
    plain_step(run.net, run.opt, run.batches, [&] {
      const float norm = clip_grad_norm(run.net.parameters(), kMaxNorm);
      if (step == 1) r.first_norm = norm;
      r.clipped += norm > kMaxNorm;
    });
  r.loss = set_loss(run.net, blobs().train);
  r.accuracy = set_accuracy(run.net, blobs().test);
  return r;
}

RunResult clip_outcomes(const ClipRun& r, BlobsRun& run, std::string setup) {
  static const ClipBaseline base = clip_fp32();
  const double ratio = r.first_seen / base.first_norm;
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"loss_scale", r.scale, "the GradScaler's scale at the end"},
      {"max_norm", kMaxNorm, "clip_grad_norm's threshold"},
      {"fp32_first_norm", base.first_norm, "true gradient norm at step 1 (FP32 baseline)"},
      {"first_norm_seen_by_clip", r.first_seen, "the norm clip_grad_norm measured at step 1"},
      {"seen_over_true", ratio, "first_norm_seen_by_clip / fp32_first_norm"},
      {"effective_max_norm", kMaxNorm / ratio, "the threshold it amounts to on the true norm"},
      {"first_applied_norm", r.first_applied, "norm of the gradient optimizer.step() used at step 1"},
      {"clipped_fraction", r.clipped / kClipSteps, "steps on which clipping changed the gradients"},
      {"fp32_clipped_fraction", base.clipped / kClipSteps, "the same in the FP32 baseline"},
      {"train_loss", set_loss(run.net, blobs().train), "cross-entropy on the training set at the end"},
      {"fp32_train_loss", base.loss, "the same in the FP32 baseline"},
      {"test_accuracy", set_accuracy(run.net, blobs().test), "on 256 held-out samples"},
      {"fp32_test_accuracy", base.accuracy, "the same in the FP32 baseline"},
  };
  out.explanation =
      ratio > 2
          ? "Clipping saw the norm of S*g, " + num(ratio) + " times the true norm, so it clipped " +
                pct(r.clipped / kClipSteps) + " of the steps down to norm " + num(kMaxNorm) +
                "; step() then divided by S, leaving the optimizer a gradient of norm " +
                num(r.first_applied) + ": the threshold on the true gradient was max_norm / S = " +
                num(kMaxNorm / ratio) + ", and training crawled."
          : "After unscale() the clip sees the true norm (" + num(r.first_seen) + " at step 1, FP32: " +
                num(base.first_norm) + ") and clips " + pct(r.clipped / kClipSteps) +
                " of the steps, as the FP32 run does (" + pct(base.clipped / kClipSteps) + ").";
  return out;
}

/// The loop of both runs; `unscale_first` is the fix.
RunResult clip_run(bool unscale_first, std::string setup) {
  BlobsRun run(DType::f16, kClipLr, kClipBatch);
  Mlp& net = run.net;
  SGD& opt = run.opt;
  ClipRun r;
  GradScaler scaler;
  for (int step = 1; step <= kClipSteps; ++step) {
    scaled_backward(net, opt, run.batches, scaler);  // forward, S * loss, backward
    float seen = 0;  // the norm clip_grad_norm measured
    if (!unscale_first) {
      //! [clip-before-unscale-broken]
      // The gradients are still multiplied by S here.
      seen = clip_grad_norm(net.parameters(), kMaxNorm);
      scaler.step(opt);  // unscales what the clip left: norm max_norm / S
      scaler.update();
      //! [clip-before-unscale-broken]
    } else {
      //! [clip-before-unscale-fixed]
      scaler.unscale(opt);  // first: the gradients are the true ones again
      seen = clip_grad_norm(net.parameters(), kMaxNorm);
      scaler.step(opt);  // knows unscale() ran; does not divide again
      scaler.update();
      //! [clip-before-unscale-fixed]
    }
    if (step == 1) r.first_seen = seen, r.first_applied = grad_norm(net.parameters());
    r.clipped += seen > kMaxNorm;
    net.refresh_model_copies();
  }
  r.scale = scaler.get_scale();
  return clip_outcomes(r, run, std::move(setup));
}

RunResult clip_before_unscale_broken() {
  return clip_run(false, "fp16 MLP on the blobs, GradScaler, clip_grad_norm(1.0) on the scaled gradients");
}
RunResult clip_before_unscale_fixed() {
  return clip_run(true, "the same run with scaler.unscale(opt) before clip_grad_norm(1.0)");
}

// ---------------------------------------------------------------------------
// 5. accumulation-unscale: gradients accumulated over micro-batches must stay
// scaled until the last one is in; unscaling in between divides the earlier
// micro-batches' share again and again.

constexpr int kMicroBatches = 4;
constexpr Eigen::Index kMicroBatch = 16;  // effective batch 64
constexpr int kAccumulationSteps = 100;
constexpr double kAccumulationLr = 0.05;

struct AccumulationRun {
  double refusals = 0, first_rel_error = 0, first_norm_ratio = 0, scale = 0;
  std::string message;
};

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
                "last one counts. The step-1 gradient was off by " + num(r.first_rel_error) +
                " relative, with " + num(r.first_norm_ratio) + " of the norm."
          : "One unscale() after the last micro-batch: the step-1 gradient matches the gradient of "
            "the 64 samples in one pass to " + num(r.first_rel_error) + " relative (rounding), and "
            "the loss ends at " + num(loss / base) + " times FP32's.";
  return out;
}

/// The forward and backward pass of the next micro-batch from S * loss / K:
/// adds its share of the effective batch's gradient, scaled by S, into .grad.
void micro_batch_backward(BlobsRun& run, GradScaler& scaler) {
  const Dataset b = run.batches.next();
  const Tensor& out = run.net.forward(b.x);
  (void)scaler.scale(cross_entropy_loss(out, b.labels) / kMicroBatches);
  run.net.backward(cross_entropy_backward(out, b.labels, scaler.get_scale() / kMicroBatches));
}

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
RunResult accumulation_unscale_fixed() {
  return accumulation_run(false, "the same accumulation, unscaled once after the last micro-batch");
}

// ---------------------------------------------------------------------------
// 6. fp16-weights-no-master: SGD with a small learning rate; most updates are
// below half an fp16 ulp of their weight and round away.

constexpr int kMasterSteps = 1500;
constexpr double kMasterLr = 1e-4;
constexpr Eigen::Index kMasterBatch = 16;

struct MasterRun {
  double initial_loss = 0, loss = 0, accuracy = 0, lost = 0;
};

/// Plain SGD training without loss scaling (cross-entropy gradients of the
/// blobs fit fp16 as they are), in any precision and weight mode.
MasterRun train_blobs_small_lr(DType p, MasterWeights mw) {
  BlobsRun run(p, kMasterLr, kMasterBatch, mw);
  MasterRun r;
  r.initial_loss = set_loss(run.net, blobs().train);
  for (int step = 0; step < kMasterSteps; ++step) {
    const RefreshStats st = plain_step(run.net, run.opt, run.batches);
    r.lost += static_cast<double>(st.lost) / static_cast<double>(st.elements) / kMasterSteps;
  }
  r.loss = set_loss(run.net, blobs().train);
  r.accuracy = set_accuracy(run.net, blobs().test);
  return r;
}

RunResult master_outcomes(const MasterRun& r, std::string setup) {
  static const MasterRun base = train_blobs_small_lr(DType::f32, MasterWeights::fp32);
  const double progress = (r.initial_loss - r.loss) / (base.initial_loss - base.loss);
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"steps", kMasterSteps, "SGD steps, momentum 0.9, lr " + num(kMasterLr) + ", batch 16"},
      {"lost_update_fraction", r.lost,
       "weights the optimizer moved but that rounded back to their old value, mean per step"},
      {"initial_loss", r.initial_loss, "training-set cross-entropy before the first step"},
      {"train_loss", r.loss, "the same after the last step"},
      {"fp32_train_loss", base.loss, "the FP32 baseline after the last step"},
      {"progress_vs_fp32", progress, "(initial - final loss) / the same for FP32"},
      {"test_accuracy", r.accuracy, "on 256 held-out samples"},
      {"fp32_test_accuracy", base.accuracy, "the FP32 baseline"},
      {"accuracy_gap", base.accuracy - r.accuracy, "fp32_test_accuracy - test_accuracy"},
  };
  out.explanation =
      r.lost > 0
          ? "On an average step " + pct(r.lost) + " of the weight updates were smaller than half the "
                "fp16 spacing at their weight and rounded away; the loss fell " + pct(progress) +
                " as far as FP32's, and the accuracy is " + num(base.accuracy - r.accuracy) + " lower."
          : "The FP32 masters keep every update, however small; the fp16 copies follow them, and "
            "the run matches FP32 (" + pct(progress) + " of its progress).";
  return out;
}

RunResult fp16_weights_no_master_broken() {
  MasterRun r;
  //! [fp16-weights-no-master-broken]
  // The weights exist only in fp16: after each step they are rounded, and
  // the rounded value is all that is kept.
  r = train_blobs_small_lr(DType::f16, MasterWeights::none);
  //! [fp16-weights-no-master-broken]
  return master_outcomes(r, "fp16 MLP on the blobs, fp16 weights only, SGD lr 1e-4");
}

RunResult fp16_weights_no_master_fixed() {
  MasterRun r;
  //! [fp16-weights-no-master-fixed]
  // FP32 master weights take the updates; the fp16 copy is refreshed from them.
  r = train_blobs_small_lr(DType::f16, MasterWeights::fp32);
  //! [fp16-weights-no-master-fixed]
  return master_outcomes(r, "the same run with FP32 master weights");
}

// ---------------------------------------------------------------------------
// 7. init-scale-skips: from 2^16 the scaler needs a few overflowing
// iterations to find a scale that fits; a schedule that counts iterations
// spends its first values on steps that never happened.

constexpr int kWarmupSteps = 8;
constexpr double kPeakLr = 1e-2;
constexpr int kScheduleIterations = 100;
constexpr Eigen::Index kScheduleBatch = 64;
constexpr double kLargeTargetScale = 1000.0;

/// The teacher regression with targets in the thousands (unnormalised
/// targets): its gradients at step 1 are large enough that S = 2^16 overflows.
const Dataset& large_targets() {
  static const Dataset d = [] {
    TinyTargetOptions o;
    o.target_scale = kLargeTargetScale;
    return make_tiny_target_regression(o);
  }();
  return d;
}

/// Linear warmup to the peak over kWarmupSteps scheduler steps, then
/// constant; `count` is how many steps the scheduler has taken (0-based).
double warmup_lr(int count) { return kPeakLr * std::min(1.0, (count + 1.0) / kWarmupSteps); }

struct ScheduleRun {
  double initial_skips = 0, skipped = 0, first_update = 0, first_lr = 0, warmup_updates = 0,
         scheduler_steps = 0, scale = 0, loss = 0;
};

RunResult schedule_outcomes(const ScheduleRun& r, std::string setup) {
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"iterations", kScheduleIterations, "iterations (AdamW, batch 64)"},
      {"initial_scale", GradScaler::Options{}.init_scale, "GradScaler's default init_scale, 2^16"},
      {"initial_skips", r.initial_skips, "iterations skipped in a row from the first"},
      {"skipped_steps", r.skipped, "all skipped iterations"},
      {"scale_at_first_update", r.scale, "the scale that first fitted the gradients"},
      {"first_update_iteration", r.first_update, "iteration of the first optimizer step"},
      {"warmup_steps", kWarmupSteps, "linear warmup to lr " + num(kPeakLr) + ", in scheduler steps"},
      {"lr_at_first_update", r.first_lr, "the learning rate the first real step used"},
      {"warmup_updates", r.warmup_updates, "optimizer steps that used one of the warmup's learning rates"},
      {"scheduler_steps", r.scheduler_steps, "scheduler.step() calls at the end"},
      {"relative_loss", r.loss, "final MSE / mean target^2 (1: predicts 0)"},
  };
  out.explanation =
      r.first_lr > warmup_lr(0)
          ? "The first " + num(r.initial_skips) + " iterations overflowed and were skipped while the "
                "scale fell from 2^16 to " + num(r.scale) + ", but the schedule counted them: the first "
                "real step ran at lr " + num(r.first_lr) + " (" + pct(r.first_lr / kPeakLr) +
                " of the peak), and only " + num(r.warmup_updates) + " of the " + num(kWarmupSteps) +
                " warmup values reached an optimizer step."
          : "The same " + num(r.initial_skips) + " skipped iterations, but the schedule only counts "
                "steps that happened: the first real step ran at lr " + num(r.first_lr) + " and all " +
                num(r.warmup_updates) + " warmup values were used.";
  return out;
}

/// One run; `count_skipped` is the broken schedule (advance every iteration).
ScheduleRun schedule_run(bool count_skipped) {
  MlpConfig c = mlp_config({8, 32, 32, 4}, DType::f16, 3);
  Mlp net(c);
  AdamWOptions o;
  o.lr = warmup_lr(0);
  o.weight_decay = 0.0;
  AdamW opt(net.parameters(), o);
  Batches batches(large_targets(), kScheduleBatch, kBatchSeed);
  GradScaler scaler;
  int scheduler_count = 0;  // the scheduler's own step counter
  ScheduleRun r;
  for (int it = 1; it <= kScheduleIterations; ++it) {
    scaled_backward(net, opt, batches, scaler);  // forward, S * loss, backward
    const float scale_used = scaler.get_scale();
    const int position = scheduler_count;  // the schedule value this iteration's step uses
    bool stepped = false;
    if (count_skipped) {
      //! [init-scale-skips-broken]
      stepped = scaler.step(opt);
      scaler.update();
      opt.set_lr(warmup_lr(++scheduler_count));  // scheduler.step(): every iteration
      //! [init-scale-skips-broken]
    } else {
      //! [init-scale-skips-fixed]
      stepped = scaler.step(opt);
      scaler.update();
      if (stepped) opt.set_lr(warmup_lr(++scheduler_count));  // only after a real step
      //! [init-scale-skips-fixed]
    }
    if (!stepped) {
      ++r.skipped;
      if (r.first_update == 0) ++r.initial_skips;
    } else {
      if (r.first_update == 0) {
        r.first_update = it;
        r.first_lr = warmup_lr(position);
        r.scale = scale_used;
      }
      r.warmup_updates += position < kWarmupSteps;
    }
    net.refresh_model_copies();
  }
  r.scheduler_steps = scheduler_count;
  r.loss = set_loss(net, large_targets()) / target_power(large_targets());
  return r;
}

RunResult init_scale_skips_broken() {
  return schedule_outcomes(schedule_run(true),
                           "fp16 MLP, regression with targets ~1000, GradScaler from 2^16, warmup "
                           "counted per iteration");
}
RunResult init_scale_skips_fixed() {
  return schedule_outcomes(schedule_run(false),
                           "the same run, warmup counted per optimizer step taken");
}

// ---------------------------------------------------------------------------
// 8. adam-eps-fp16: AdamW whose state and arithmetic are fp16. eps = 1e-8
// rounds to 0 there, and v = g^2 underflows for small gradients: 0/0 and
// m/0 in the update.

constexpr int kAdamSteps = 100;
constexpr Eigen::Index kAdamBatch = 64;

struct AdamRun {
  double eps_stored = 0, state_bytes = 0, v_zero = 0, bad_after_first = 0, bad = 0, loss = 0,
         accuracy = 0;
};

AdamRun adam_run(DType state) {
  Mlp net(mlp_config(kBlobsNet, DType::f16, kBlobsSeed));
  Batches batches(blobs().train, kAdamBatch, kBlobsSeed);
  AdamRun r;
  GradScaler scaler;
  AdamWOptions o;  // PyTorch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 1e-2
  o.state_dtype = state;
  AdamW opt(net.parameters(), o);
  r.eps_stored = round_value(static_cast<float>(o.eps), format_of(state));
  for (int step = 1; step <= kAdamSteps; ++step) {
    scaled_backward(net, opt, batches, scaler);
    scaler.step(opt);
    scaler.update();
    net.refresh_model_copies();
    if (step == 1) {
      double zeros = 0, n = 0;
      for (std::size_t i = 0; i < opt.params().size(); ++i) {
        const MatrixF v = opt.exp_avg_sq(i);
        zeros += static_cast<double>((v.array() == 0.0f).count());
        n += static_cast<double>(v.size());
      }
      r.v_zero = zeros / n;
      r.bad_after_first = nonfinite_weights(net);
    }
  }
  r.state_bytes = static_cast<double>(opt.state_bytes());
  r.bad = nonfinite_weights(net);
  r.loss = set_loss(net, blobs().train);
  r.accuracy = set_accuracy(net, blobs().test);
  return r;
}

/// The |g| at or below which v = (1 - beta2) * g * g, computed in fp16 as
/// fp16(fp16((1 - beta2) * g) * g), rounds to 0: where the product reaches
/// half the smallest subnormal.
double fp16_v_underflow_gradient() {
  const Format& f16 = format_named("fp16");
  const double w2 = round_value(static_cast<float>(1.0 - AdamWOptions{}.beta2), f16);
  return std::sqrt(limits_of(f16.spec).min_subnormal / 2 / w2);
}

RunResult adam_outcomes(const AdamRun& r, std::string setup) {
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"eps_stored", r.eps_stored, "eps = 1e-8 rounded to the state format"},
      {"state_bytes", r.state_bytes, "bytes of m and v"},
      {"zero_v_fraction", r.v_zero, "second moments v that are exactly 0 after step 1"},
      {"nonfinite_after_step1", r.bad_after_first, "master weights inf/NaN after step 1"},
      {"nonfinite_weights", r.bad, "master weights inf/NaN after the last step"},
      {"train_loss", r.loss, "cross-entropy on the training set at the end"},
      {"test_accuracy", r.accuracy, "on 256 held-out samples (chance 0.25)"},
  };
  out.explanation =
      r.eps_stored == 0
          ? "In fp16 everything of magnitude 2^-25 or less rounds to 0, eps = 1e-8 included; " +
                pct(r.v_zero) + " of the v values were 0 after step 1 (v = (1-beta2) g^2 underflows "
                "for |g| up to about " + num(fp16_v_underflow_gradient()) +
                "), so m / (sqrt(v) + eps) was m/0 = inf or 0/0 = NaN there: " +
                num(r.bad_after_first) + " weights were inf/NaN after one step."
          : "In FP32 eps = " + num(r.eps_stored) + " and v keeps even tiny gradients; the " +
                pct(r.v_zero) + " of v that are 0 belong to gradients that are exactly 0, and there "
                "m / (0 + eps) = 0. No weight became inf/NaN, for twice the state memory (" +
                num(r.state_bytes) + " bytes).";
  return out;
}

RunResult adam_eps_broken() {
  AdamRun r;
  //! [adam-eps-fp16-broken]
  r = adam_run(DType::f16);  // AdamW::Options::state_format = fp16: m, v, eps, arithmetic
  //! [adam-eps-fp16-broken]
  return adam_outcomes(r, "fp16 MLP on the blobs with GradScaler; AdamW state and arithmetic in fp16");
}

RunResult adam_eps_fixed() {
  AdamRun r;
  //! [adam-eps-fp16-fixed]
  r = adam_run(DType::f32);  // PyTorch's AdamW: FP32 state next to the FP32 masters
  //! [adam-eps-fp16-fixed]
  return adam_outcomes(r, "the same run with AdamW's state in FP32");
}

}  // namespace

void register_chapter02_pitfalls(Registry& registry) {
  registry.add(Pitfall{
      "no-loss-scaling", 2, "no loss scaling: small gradients flush to zero and training stalls",
      "Gradients of magnitude 2^-25 or less (half fp16's smallest subnormal) are stored as 0, so "
      "layers whose gradients are that small stop learning; multiplying the loss by S multiplies "
      "every gradient by S (chain rule) and lifts them into fp16's range, and dividing by S in FP32 "
      "before the step undoes it.",
      no_loss_scaling_broken, no_loss_scaling_fixed,
      {
          check("more than half of the activation gradients are stored as 0",
                [](const RunResult& r) { return r.get("zero_fraction") > 0.5; }),
          check("the first layer barely moves: under 10% of FP32's weight change",
                [](const RunResult& r) {
                  return r.get("fc1_weight_change") < 0.1 * r.get("fp32_fc1_weight_change");
                }),
          check("training stalls: the loss ends more than twice FP32's",
                [](const RunResult& r) { return r.get("loss_ratio") > 2.0; }),
      },
      {
          check("no more zero gradients than FP32 has (+1 percentage point)",
                [](const RunResult& r) {
                  return r.get("zero_fraction") <= r.get("fp32_zero_fraction") + 0.01;
                }),
          check("the loss is within 5% of FP32's",
                [](const RunResult& r) { return within(r.get("loss_ratio"), 1.0, 0.05); }),
          check("the first layer moves as in FP32 (within 10%)",
                [](const RunResult& r) {
                  return within(r.get("fc1_weight_change"), r.get("fp32_fc1_weight_change"), 0.1);
                }),
      }});

  registry.add(Pitfall{
      "static-scale-too-large", 2, "a static loss scale overflows once the gradients grow",
      "A constant scale chosen for the early gradients overflows fp16 (max 65504) when they grow; "
      "classic static scaling steps anyway, so inf reaches the weights and turns them to NaN, while "
      "the dynamic scaler skips that step and halves the scale.",
      static_scale_broken, static_scale_fixed,
      {
          check("the scale fitted at first: the first overflow comes after step 1",
                [](const RunResult& r) { return r.get("first_overflow_step") > 1; }),
          check("no step was skipped although some overflowed",
                [](const RunResult& r) {
                  return r.get("overflow_steps") > 0 && r.get("skipped_steps") == 0;
                }),
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
      }});

  registry.add(Pitfall{
      "update-forgotten", 2, "update() forgotten: the next step() is refused",
      "step() marks the optimizer as stepped until update() resets it; without update() the next "
      "iteration's step() throws, and the scale never adapts.",
      update_forgotten_broken, update_forgotten_fixed,
      {
          check("the scaler refused a call", [](const RunResult& r) { return r.get("misuse_errors") > 0; }),
          check("at iteration 2, the first step() after the missing update()",
                [](const RunResult& r) { return r.get("first_error_iteration") == 2; }),
          check("the message names update() and says where it belongs",
                [](const RunResult& r) {
                  return r.get("misuse_errors") > 0 &&
                         r.explanation.find("call update()") != std::string::npos &&
                         r.explanation.find("after step()") != std::string::npos;
                }),
          check("only the first iteration took an optimizer step",
                [](const RunResult& r) { return r.get("optimizer_steps") == 1; }),
      },
      {
          check("no call was refused", [](const RunResult& r) { return r.get("misuse_errors") == 0; }),
          check("every iteration completed with an optimizer step",
                [](const RunResult& r) {
                  return r.get("iterations_completed") == r.get("iterations") &&
                         r.get("optimizer_steps") == r.get("iterations");
                }),
          check("update() counted every clean step",
                [](const RunResult& r) { return r.get("growth_tracker") == r.get("iterations"); }),
      }});

  registry.add(Pitfall{
      "clip-before-unscale", 2, "gradient clipping before unscale: every step clipped to max_norm/S",
      "Before unscale() the gradients are S times too large, so clip_grad_norm measures S times the "
      "true norm and clips whenever the true norm exceeds max_norm/S; step() then divides by S, and "
      "the optimizer gets a gradient of norm max_norm/S. Unscale first, then clip.",
      clip_before_unscale_broken, clip_before_unscale_fixed,
      {
          check("the clip measured S times the true norm (within 1%)",
                [](const RunResult& r) { return within(r.get("seen_over_true"), r.get("loss_scale"), 0.01); }),
          check("it clipped every step",
                [](const RunResult& r) { return r.get("clipped_fraction") == 1.0; }),
          check("the optimizer got a gradient of norm at most max_norm/S (+0.1%)",
                [](const RunResult& r) {
                  return r.get("first_applied_norm") <= 1.001 * r.get("max_norm") / r.get("loss_scale");
                }),
          check("training crawls: the loss ends above 1.5 times FP32's",
                [](const RunResult& r) { return r.get("train_loss") > 1.5 * r.get("fp32_train_loss"); }),
      },
      {
          check("the clip measured the true norm (within 1%)",
                [](const RunResult& r) { return within(r.get("seen_over_true"), 1.0, 0.01); }),
          check("it clipped as often as FP32 (within 2 percentage points)",
                [](const RunResult& r) {
                  return std::fabs(r.get("clipped_fraction") - r.get("fp32_clipped_fraction")) <= 0.02;
                }),
          check("the loss is within 5% of FP32's",
                [](const RunResult& r) { return within(r.get("train_loss"), r.get("fp32_train_loss"), 0.05); }),
      }});

  registry.add(Pitfall{
      "accumulation-unscale", 2, "gradient accumulation: unscale once, after the last micro-batch",
      "Accumulated gradients must stay scaled by one constant S until the effective batch is "
      "complete; unscaling in between divides the earlier micro-batches' share of .grad again with "
      "every later unscale (PyTorch refuses a second unscale_ for that reason).",
      accumulation_unscale_broken, accumulation_unscale_fixed,
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
      }});

  registry.add(Pitfall{
      "fp16-weights-no-master", 2, "fp16 weights without FP32 master weights: small updates lost",
      "An update smaller than half the fp16 spacing at its weight rounds back to the old weight; "
      "with the weights only in fp16 it is lost for good, with an FP32 master it accumulates until "
      "it shows in the fp16 copy.",
      fp16_weights_no_master_broken, fp16_weights_no_master_fixed,
      {
          check("more than half of the updates were lost",
                [](const RunResult& r) { return r.get("lost_update_fraction") > 0.5; }),
          check("the loss fell less than half as far as FP32's",
                [](const RunResult& r) { return r.get("progress_vs_fp32") < 0.5; }),
          check("the accuracy trails FP32 by more than 0.1",
                [](const RunResult& r) { return r.get("accuracy_gap") > 0.1; }),
      },
      {
          check("no update was lost", [](const RunResult& r) { return r.get("lost_update_fraction") == 0; }),
          check("the loss is within 2% of FP32's",
                [](const RunResult& r) { return within(r.get("train_loss"), r.get("fp32_train_loss"), 0.02); }),
          check("the accuracy is within 0.02 of FP32's",
                [](const RunResult& r) { return std::fabs(r.get("accuracy_gap")) <= 0.02; }),
      }});

  registry.add(Pitfall{
      "init-scale-skips", 2, "init scale 2^16: the first iterations are skipped, the schedule is not",
      "Starting at 2^16, the scaler skips iterations and halves the scale until the gradients fit "
      "fp16; a learning-rate schedule stepped every iteration counts those skipped steps, so the "
      "first real update starts partway into the warmup.",
      init_scale_skips_broken, init_scale_skips_fixed,
      {
          check("at least 3 iterations in a row were skipped from the start",
                [](const RunResult& r) { return r.get("initial_skips") >= 3; }),
          check("the first real step used a learning rate past the warmup's first value",
                [](const RunResult& r) {
                  return r.get("lr_at_first_update") > 1.0001 * kPeakLr / r.get("warmup_steps");
                }),
          check("warmup values were spent on skipped iterations",
                [](const RunResult& r) { return r.get("warmup_updates") < r.get("warmup_steps"); }),
      },
      {
          check("the first real step used the warmup's first learning rate",
                [](const RunResult& r) {
                  return within(r.get("lr_at_first_update"), kPeakLr / r.get("warmup_steps"), 1e-6);
                }),
          check("every warmup value reached an optimizer step",
                [](const RunResult& r) { return r.get("warmup_updates") == r.get("warmup_steps"); }),
          check("the schedule counted only real steps",
                [](const RunResult& r) {
                  return r.get("scheduler_steps") == r.get("iterations") - r.get("skipped_steps");
                }),
      }});

  registry.add(Pitfall{
      "adam-eps-fp16", 2, "Adam's eps = 1e-8 is zero in fp16",
      "In fp16 eps = 1e-8 rounds to 0 (the smallest subnormal is 2^-24, about 6e-8) and v = (1-beta2) "
      "g^2 underflows to 0 for small gradients, so Adam's m / (sqrt(v) + eps) divides by zero: inf "
      "and NaN weights. Keep the optimizer state and its arithmetic in FP32.",
      adam_eps_broken, adam_eps_fixed,
      {
          check("eps is 0 in the state format", [](const RunResult& r) { return r.get("eps_stored") == 0; }),
          check("some second moments underflowed to 0",
                [](const RunResult& r) { return r.get("zero_v_fraction") > 0; }),
          check("one step made weights inf/NaN",
                [](const RunResult& r) { return r.get("nonfinite_after_step1") > 0; }),
          check("the loss is not finite", [](const RunResult& r) { return !std::isfinite(r.get("train_loss")); }),
      },
      {
          check("eps is the FP32 value of 1e-8",
                [](const RunResult& r) { return r.get("eps_stored") == static_cast<double>(1e-8f); }),
          check("no weight is inf/NaN, ever",
                [](const RunResult& r) {
                  return r.get("nonfinite_after_step1") == 0 && r.get("nonfinite_weights") == 0;
                }),
          check("it learns: test accuracy of at least 0.85",
                [](const RunResult& r) { return r.get("test_accuracy") >= 0.85; }),
      }});
}

}  // namespace mpt
