// Chapter 02 — pitfall no-loss-scaling: no loss scaling: small gradients flush to zero and training stalls
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// ../training.hpp (the tiny-target run), mpt/amp/grad_scaler.hpp,
// mpt/nn/layers/losses.hpp (mse_loss, mse_backward), mpt/nn/models/mlp.hpp,
// mpt/optim/adamw.hpp; <string>, <utility>, <vector>.
//
// The small gradients of a regression with tiny targets flush to zero in
// fp16 (everything up to 2^-25, half the smallest subnormal, is stored as
// 0), and the hidden layers stop learning. Multiplying the loss by S
// multiplies every gradient by S (chain rule) and lifts them into fp16's
// range; a GradScaler divides by S in FP32 before the step.
#include <string>
#include <utility>
#include <vector>

#include "../training.hpp"
#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/adamw.hpp"

namespace mpt::ch02 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace no_loss_scaling {

// ---------------------------------------------------------------------------
// The constants and what a run measures.

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

/// The outcomes of both runs, next to the FP32 baseline (defined after the
/// runs).
RunResult underflow_outcomes(const UnderflowRun& r, std::string setup);

// ---------------------------------------------------------------------------
// The broken run.

/// A tiny-target run without loss scaling: in fp16 the broken run, in FP32
/// the baseline of both runs (FP32 holds these gradients).
UnderflowRun tiny_target_unscaled(DType p) {
  TinyTargetRun run(p);
  Mlp& net = run.net;
  AdamW& opt = run.opt;
  const MatrixF fc1 = net.parameters()[0]->master.f32();
  UnderflowRun r;
  ZeroFraction zeros;
  //! [no-loss-scaling-broken]
  // fp16 activations and gradients, FP32 master weights, no loss scaling:
  // the backward pass starts from dloss = 1.
  for (int step = 0; step < kUnderflowSteps; ++step) {
    const Dataset b = run.batches.next();
    const Tensor& out = net.forward(b.x);
    opt.zero_grad();
    net.backward(mse_backward(out, b.targets));  // gradients stored in fp16
    zeros.add(net);                              // count the exact zeros (ZeroFraction)
    opt.step();
    net.refresh_model_copies();
  }
  //! [no-loss-scaling-broken]
  r.zero_fraction = zeros.fraction();
  measure_end(r, net, fc1);
  return r;
}

RunResult no_loss_scaling_broken() {
  return underflow_outcomes(tiny_target_unscaled(DType::f16),
                            "fp16 MLP 8-32-32-4 on the tiny-target regression, no loss scaling");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult no_loss_scaling_fixed() {
  TinyTargetRun run(DType::f16);
  Mlp& net = run.net;
  AdamW& opt = run.opt;
  Batches& batches = run.batches;
  const MatrixF fc1 = net.parameters()[0]->master.f32();
  UnderflowRun r;
  ZeroFraction zeros;
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
    zeros.add(net);
    r.skipped += !scaler.step(opt);  // unscale in FP32, skip the step on inf/NaN
    scaler.update();
    net.refresh_model_copies();
  }
  //! [no-loss-scaling-fixed]
  r.zero_fraction = zeros.fraction();
  r.scale = scaler.get_scale();
  measure_end(r, net, fc1);
  return underflow_outcomes(r, "the same fp16 run with a GradScaler (dynamic loss scaling)");
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult underflow_outcomes(const UnderflowRun& r, std::string setup) {
  static const UnderflowRun base = tiny_target_unscaled(DType::f32);  // deterministic: train it once
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"steps", kUnderflowSteps, "optimizer steps attempted (AdamW, lr " + num(kUnderflowLr) + ")"},
      {"loss_scale", r.scale, "scale after the last step (1: none)"},
      {"skipped_steps", r.skipped, "steps the scaler skipped (inf/NaN gradients)"},
      {"zero_fraction", r.zero_fraction, std::string("zero fraction: ") + kZeroFractionDefinition},
      {"fp32_zero_fraction", base.zero_fraction, "the same in the FP32 baseline"},
      {"fc1_weight_change", r.fc1_change, "||W1_end - W1_start|| / ||W1_start||, first layer"},
      {"fp32_fc1_weight_change", base.fc1_change, "the same in the FP32 baseline"},
      {"relative_loss", r.relative_loss, "final MSE / mean target^2 (1: predicts 0)"},
      {"fp32_relative_loss", base.relative_loss, "the same in the FP32 baseline"},
      {"loss_ratio", r.relative_loss / base.relative_loss, "relative_loss / fp32_relative_loss"},
  };
  out.explanation =
      r.scale == 1.0
          ? pct(r.zero_fraction) +
                " of the dense activation gradients were stored as 0 (the zero fraction; FP32: " +
                pct(base.zero_fraction) +
                "): at or below 2^-25, half fp16's smallest subnormal, they flush. "
                "The first layer's weights moved " +
                num(r.fc1_change) + " relative (FP32: " + num(base.fc1_change) + "), and the loss ended " +
                num(r.relative_loss / base.relative_loss) + " times FP32's."
          : "Scaled by " + num(r.scale) + ", only " + pct(r.zero_fraction) +
                " of the dense activation gradients are 0 (the zero fraction; FP32: " +
                pct(base.zero_fraction) + "); " + num(r.skipped) +
                " steps were skipped, and the loss ends at " + num(r.relative_loss / base.relative_loss) +
                " times FP32's.";
  return out;
}

}  // namespace no_loss_scaling
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall no_loss_scaling_pitfall() {
  using namespace no_loss_scaling;
  return Pitfall{
      "no-loss-scaling",
      2,
      "no loss scaling: small gradients flush to zero and training stalls",
      "Gradients of magnitude 2^-25 or less (half fp16's smallest subnormal) are stored as 0, so "
      "layers whose gradients are that small stop learning; multiplying the loss by S multiplies "
      "every gradient by S (chain rule) and lifts them into fp16's range, and dividing by S in FP32 "
      "before the step undoes it.",
      no_loss_scaling_broken,
      no_loss_scaling_fixed,
      {
          check("the zero fraction is over one half: more than half of the dense activation gradients are "
                "stored as 0",
                [](const RunResult& r) { return r.get("zero_fraction") > 0.5; }),
          check("the first layer barely moves: under 10% of FP32's weight change",
                [](const RunResult& r) {
                  return r.get("fc1_weight_change") < 0.1 * r.get("fp32_fc1_weight_change");
                }),
          check("training stalls: the loss ends more than twice FP32's",
                [](const RunResult& r) { return r.get("loss_ratio") > 2.0; }),
      },
      {
          check("the zero fraction is at most FP32's (+1 percentage point)",
                [](const RunResult& r) {
                  return r.get("zero_fraction") <= r.get("fp32_zero_fraction") + 0.01;
                }),
          check("the loss is within 5% of FP32's",
                [](const RunResult& r) { return within(r.get("loss_ratio"), 1.0, 0.05); }),
          check("the first layer moves as in FP32 (within 10%)",
                [](const RunResult& r) {
                  return within(r.get("fc1_weight_change"), r.get("fp32_fc1_weight_change"), 0.1);
                }),
      },
      {}};
}

}  // namespace mpt::ch02
