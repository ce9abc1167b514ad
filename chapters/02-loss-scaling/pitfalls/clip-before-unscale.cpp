// Chapter 02 — pitfall clip-before-unscale: clipping before unscale clips to max_norm/S.
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// ../training.hpp (plain_step, scaled_backward, digits()),
// mpt/amp/grad_scaler.hpp, mpt/nn/models/mlp.hpp, mpt/optim/sgd.hpp; <algorithm>,
// <cmath>, <string>, <utility>, <vector>.
//
// Before unscale() the gradients are S times too large, so clip_grad_norm
// measures S times the true norm and clips (almost) every step; step() then
// divides by S, and the optimizer gets a gradient of norm max_norm / S.
// Unscale first, then clip. The runs train on the real handwritten digits
// (digits(): the file must have been fetched, tools/fetch_digits.sh).
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "../training.hpp"
#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch02 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace clip_before_unscale {

// ---------------------------------------------------------------------------
// The constants, what a run measures, and the clip.

constexpr float kMaxNorm = 1.0f;
constexpr int kClipSteps = kDigitsSteps;  // the digits run of training.hpp (the paper figure trains it too)
constexpr Eigen::Index kClipBatch = kDigitsBatch;
constexpr double kClipLr = kDigitsLr;

struct ClipRun {
  double first_seen = 0, first_applied = 0, clipped = 0, scale = 0;
};

/// L2 norm over every gradient, summed in double.
double grad_norm(const std::vector<Parameter*>& params) {
  double sq = 0;
  for (const Parameter* p : params) sq += p->grad.f32().cast<double>().squaredNorm();
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

/// The outcomes of both runs, next to the FP32 baseline (defined after the
/// runs).
RunResult clip_outcomes(const ClipRun& r, DigitsRun& run, std::string setup);

// ---------------------------------------------------------------------------
// The broken run (the loop of both runs).

/// The loop of both runs; `unscale_first` is the fix.
RunResult clip_run(bool unscale_first, std::string setup) {
  DigitsRun run(DType::f16, kClipLr, kClipBatch);
  Mlp& net = run.net;
  SGD& opt = run.opt;
  ClipRun r;
  GradScaler scaler;
  for (int step = 1; step <= kClipSteps; ++step) {
    scaled_backward(net, opt, run.batches, scaler);  // forward, S * loss, backward
    float seen = 0;                                  // the norm clip_grad_norm measured
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
  return clip_run(false,
                  "fp16 MLP 64-32-32-10 on the handwritten digits, GradScaler, clip_grad_norm(1.0) on the "
                  "scaled gradients");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult clip_before_unscale_fixed() {
  return clip_run(true, "the same run with scaler.unscale(opt) before clip_grad_norm(1.0)");
}

// ---------------------------------------------------------------------------
// The outcomes.

/// The FP32 baseline clips correctly (nothing to unscale).
struct ClipBaseline {
  double first_norm = 0, loss = 0, accuracy = 0, clipped = 0;
};
ClipBaseline clip_fp32() {
  DigitsRun run(DType::f32, kClipLr, kClipBatch);
  ClipBaseline r;
  for (int step = 1; step <= kClipSteps; ++step)
    plain_step(run.net, run.opt, run.batches, [&] {
      const float norm = clip_grad_norm(run.net.parameters(), kMaxNorm);
      if (step == 1) r.first_norm = norm;
      r.clipped += norm > kMaxNorm;
    });
  r.loss = set_loss(run.net, digits().train);
  r.accuracy = set_accuracy(run.net, digits().test);
  return r;
}

RunResult clip_outcomes(const ClipRun& r, DigitsRun& run, std::string setup) {
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
      {"train_loss", set_loss(run.net, digits().train), "cross-entropy on the training set at the end"},
      {"fp32_train_loss", base.loss, "the same in the FP32 baseline"},
      {"test_accuracy", set_accuracy(run.net, digits().test),
       "on the " + std::to_string(digits().test.size()) + " held-out digits (10 classes: chance is 0.1)"},
      {"fp32_test_accuracy", base.accuracy, "the same in the FP32 baseline"},
  };
  out.explanation =
      ratio > 2
          ? "Clipping saw the norm of S*g, " + num(ratio) + " times the true norm, so it clipped " +
                pct(r.clipped / kClipSteps) + " of the steps down to norm " + num(kMaxNorm) +
                "; step() then divided by S, leaving the optimizer a gradient of norm " +
                num(r.first_applied) +
                ": the threshold on the true gradient was max_norm / S = " + num(kMaxNorm / ratio) +
                ", and training crawled."
          : "After unscale() the clip sees the true norm (" + num(r.first_seen) +
                " at step 1, FP32: " + num(base.first_norm) + ") and clips " + pct(r.clipped / kClipSteps) +
                " of the steps; the FP32 run clips " + pct(base.clipped / kClipSteps) + ".";
  return out;
}

}  // namespace clip_before_unscale
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall clip_before_unscale_pitfall() {
  using namespace clip_before_unscale;
  return Pitfall{
      "clip-before-unscale",
      2,
      "gradient clipping before unscale: every step clipped to max_norm/S",
      "Before unscale() the gradients are S times too large, so clip_grad_norm measures S times the "
      "true norm and clips whenever the true norm exceeds max_norm/S; step() then divides by S, and "
      "the optimizer gets a gradient of norm max_norm/S. Unscale first, then clip.",
      clip_before_unscale_broken,
      clip_before_unscale_fixed,
      {
          check(
              "the clip measured S times the true norm (within 1%)",
              [](const RunResult& r) { return within(r.get("seen_over_true"), r.get("loss_scale"), 0.01); }),
          check("it clipped every step", [](const RunResult& r) { return r.get("clipped_fraction") == 1.0; }),
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
          check(
              "the loss is within 5% of FP32's",
              [](const RunResult& r) { return within(r.get("train_loss"), r.get("fp32_train_loss"), 0.05); }),
      },
      {}};
}

}  // namespace mpt::ch02
