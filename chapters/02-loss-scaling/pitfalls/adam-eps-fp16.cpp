// Chapter 02 — pitfall adam-eps-fp16: Adam's eps = 1e-8 is zero in fp16
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// ../training.hpp (Batches, mlp_config, scaled_backward, blobs()),
// mpt/amp/grad_scaler.hpp, mpt/core/dtype.hpp (format_of),
// mpt/formats/format.hpp (format_named, limits_of),
// mpt/formats/rounding.hpp (round_value), mpt/nn/models/mlp.hpp,
// mpt/optim/adamw.hpp; <cmath>, <cstddef>, <string>, <utility>.
//
// AdamW whose state and arithmetic are fp16: eps = 1e-8 rounds to 0 there,
// and v = (1 - beta2) g^2 underflows for small gradients, so the update
// m / (sqrt(v) + eps) is 0/0 or m/0: NaN and inf weights. PyTorch keeps the
// state, and its arithmetic, in FP32.
#include <cmath>
#include <cstddef>
#include <string>
#include <utility>

#include "../training.hpp"
#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/formats/rounding.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/adamw.hpp"

namespace mpt::ch02 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace adam_eps_fp16 {

// ---------------------------------------------------------------------------
// The constants, what a run measures, and the training of both runs.

constexpr int kAdamSteps = 100;
constexpr Eigen::Index kAdamBatch = 64;

struct AdamRun {
  double eps_stored = 0, state_bytes = 0, v_zero = 0, grad_zero = 0, bad_after_first = 0, bad = 0, loss = 0,
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
      // v after step 1 against the gradient it was made from (step() left
      // the unscaled gradients in .grad): v = (1 - beta2) g^2 is 0 where g
      // is, and wherever else it underflowed.
      double zeros = 0, grad_zeros = 0, n = 0;
      for (std::size_t i = 0; i < opt.params().size(); ++i) {
        const MatrixF v = opt.exp_avg_sq(i);
        zeros += static_cast<double>((v.array() == 0.0f).count());
        grad_zeros += static_cast<double>((opt.params()[i]->grad.f32().array() == 0.0f).count());
        n += static_cast<double>(v.size());
      }
      r.v_zero = zeros / n;
      r.grad_zero = grad_zeros / n;
      r.bad_after_first = nonfinite_weights(net);
    }
  }
  r.state_bytes = static_cast<double>(opt.state_bytes());
  r.bad = nonfinite_weights(net);
  r.loss = set_loss(net, blobs().train);
  r.accuracy = set_accuracy(net, blobs().test);
  return r;
}

/// The outcomes of both runs (defined after the runs).
RunResult adam_outcomes(const AdamRun& r, std::string setup);

// ---------------------------------------------------------------------------
// The broken run.

RunResult adam_eps_broken() {
  AdamRun r;
  //! [adam-eps-fp16-broken]
  r = adam_run(DType::f16);  // AdamW::Options::state_dtype = f16: m, v, eps, arithmetic
  //! [adam-eps-fp16-broken]
  return adam_outcomes(r, "fp16 MLP on the blobs with GradScaler; AdamW state and arithmetic in fp16");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult adam_eps_fixed() {
  AdamRun r;
  //! [adam-eps-fp16-fixed]
  r = adam_run(DType::f32);  // PyTorch's AdamW: FP32 state next to the FP32 masters
  //! [adam-eps-fp16-fixed]
  return adam_outcomes(r, "the same run with AdamW's state in FP32");
}

// ---------------------------------------------------------------------------
// The outcomes.

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
      {"zero_grad_fraction", r.grad_zero,
       "gradients that were exactly 0 at step 1 (v is 0 there in any format)"},
      {"nonfinite_after_step1", r.bad_after_first, "master weights inf/NaN after step 1"},
      {"nonfinite_weights", r.bad, "master weights inf/NaN after the last step"},
      {"train_loss", r.loss, "cross-entropy on the training set at the end"},
      {"test_accuracy", r.accuracy, "on 256 held-out samples (chance 0.25)"},
  };
  out.explanation =
      r.eps_stored == 0
          ? "In fp16 everything of magnitude 2^-25 or less rounds to 0, eps = 1e-8 included; " +
                pct(r.v_zero) +
                " of the v values were 0 after step 1 (v = (1-beta2) g^2 underflows "
                "for |g| up to about " +
                num(fp16_v_underflow_gradient()) +
                "), so m / (sqrt(v) + eps) was m/0 = inf or 0/0 = NaN there: " + num(r.bad_after_first) +
                " weights were inf/NaN after one step."
          : "In FP32 eps = " + num(r.eps_stored) + " and v keeps even tiny gradients; the " + pct(r.v_zero) +
                " of v that are 0 belong to gradients that are exactly 0, and there "
                "m / (0 + eps) = 0. " +
                num(r.bad) + " weights are inf/NaN after the last step, for twice the state memory (" +
                num(r.state_bytes) + " bytes).";
  return out;
}

}  // namespace adam_eps_fp16
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall adam_eps_fp16_pitfall() {
  using namespace adam_eps_fp16;
  return Pitfall{
      "adam-eps-fp16",
      2,
      "Adam's eps = 1e-8 is zero in fp16",
      "In fp16 eps = 1e-8 rounds to 0 (the smallest subnormal is 2^-24, about 6e-8) and v = (1-beta2) "
      "g^2 underflows to 0 for small gradients, so Adam's m / (sqrt(v) + eps) divides by zero: inf "
      "and NaN weights. Keep the optimizer state and its arithmetic in FP32.",
      adam_eps_broken,
      adam_eps_fixed,
      {
          check("second moments underflowed: more of v is 0 after step 1 than the gradient was",
                [](const RunResult& r) { return r.get("zero_v_fraction") > r.get("zero_grad_fraction"); }),
          check("one step made weights inf/NaN",
                [](const RunResult& r) { return r.get("nonfinite_after_step1") > 0; }),
          check("the loss is not finite",
                [](const RunResult& r) { return !std::isfinite(r.get("train_loss")); }),
      },
      {
          check("no second moment underflowed: v is 0 only where the gradient was 0",
                [](const RunResult& r) { return r.get("zero_v_fraction") == r.get("zero_grad_fraction"); }),
          check("no weight is inf/NaN, ever",
                [](const RunResult& r) {
                  return r.get("nonfinite_after_step1") == 0 && r.get("nonfinite_weights") == 0;
                }),
          check("it learns: test accuracy of at least 0.85",
                [](const RunResult& r) { return r.get("test_accuracy") >= 0.85; }),
      },
      {}};
}

}  // namespace mpt::ch02
