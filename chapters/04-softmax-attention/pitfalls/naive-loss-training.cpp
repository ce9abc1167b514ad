// Chapter 04 — pitfall naive-loss-training: an fp16 softmax without the max
// subtracted turns a language model's loss NaN, and the scaler skips every step.
// Depends on: common.hpp (this entry's declaration), ../training.hpp
// (train_lm, LmConfig, the corpus), mpt/registry/pitfall.hpp, mpt/core/policy.hpp
// (uniform_policy), mpt/core/dtype.hpp and mpt/formats/format.hpp (fp16's largest value);
// <algorithm>, <cmath>, <cstdio>, <limits>, <string>.
//
// A softmax written out in fp16 — exp of every logit rounded to fp16, summed
// in fp16 — overflows as soon as one logit passes ln(65504) ≈ 11.09: exp
// gives inf, the sum is inf, that probability is inf/inf = NaN and the
// others 0/inf = 0, so the loss is NaN (or inf, −log 0). Its gradient is NaN
// too, GradScaler skips the step and halves the scale — and because the
// step was skipped the weights, and so the logits, stay where they were:
// every later batch overflows again. Loss scaling cannot help: the overflow
// is in the forward pass, where no scale acts.
//
// The setting. The tiny Transformer (D = 32, one block, two heads) on
// batches of 8 × 32 characters, fp16 everywhere, GradScaler with PyTorch's
// defaults, AdamW at lr 0.2 without weight decay. Adam's first updates move
// every weight by about lr whatever its gradient, and the tied output layer
// (logits = h·Eᵀ, h the unit-variance output of ln_f) turns that into logits
// above 11 within the first few steps — an aggressive but not absurd
// learning rate for so small a model, and the same thing happens later at
// smaller rates as a model grows confident (its logits grow). The library's
// cross_entropy subtracts each row's maximum and works in FP32, so the same
// logits give a finite loss, the steps go through and the model learns.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "../training.hpp"
#include "common.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/registry/pitfall.hpp"

namespace mpt::ch04 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace naive_loss_training {

constexpr int kSteps = 120;

LmConfig pitfall_config(LossKind loss) {
  LmConfig c;
  c.model.d_model = 32;
  c.model.num_heads = 2;
  c.model.num_layers = 1;
  c.model.context = 32;
  c.batch = 8;
  c.steps = kSteps;
  c.adam.lr = 0.2;
  c.adam.weight_decay = 0;
  c.eval_every = kSteps;
  c.eval_batches = 2;
  c.seed = 1;
  c.loss = loss;  // naive_fp16: exp(z) in fp16, no max subtracted; stable: the library's
  return c;
}

RunResult measured(const LmRun& run, int vocab, const std::string& setup) {
  double top = -std::numeric_limits<double>::infinity();
  for (const LmStep& s : run.steps)
    if (std::isfinite(s.max_logit)) top = std::max(top, static_cast<double>(s.max_logit));
  RunResult r;
  r.setup = setup;
  r.outcomes = {
      {"first_nonfinite_loss_step", static_cast<double>(run.first_nonfinite_loss),
       "the first step whose training loss was inf or NaN (0: none)"},
      {"nonfinite_losses", static_cast<double>(run.nonfinite_losses),
       "steps whose training loss was inf or NaN"},
      {"skipped_steps", static_cast<double>(run.skipped), "optimizer steps the GradScaler skipped"},
      {"steps", static_cast<double>(run.steps.size()), "steps run"},
      {"final_scale", static_cast<double>(run.steps.back().scale), "the loss scale of the last step"},
      {"largest_logit", top, "the largest finite logit of any training batch"},
      {"initial_valid_loss", run.valid.front().loss, "validation loss (FP32 cross-entropy) before training"},
      {"final_valid_loss", run.final_valid(), "validation loss (FP32 cross-entropy) after the last step"},
      {"log_vocab", std::log(static_cast<double>(vocab)),
       "log V: the loss of a uniform guess over the vocabulary"},
  };
  const bool failed = run.first_nonfinite_loss > 0;
  char limit[64];
  std::snprintf(limit, sizeof limit, "ln(%g) = %.2f", fp16_max(), std::log(fp16_max()));
  r.explanation =
      failed
          ? "A logit passed " + std::string(limit) + " by step " + std::to_string(run.first_nonfinite_loss) +
                ": its fp16 exp is inf, the row's softmax NaN, and so the loss and every gradient; the "
                "scaler skipped " +
                std::to_string(run.skipped) + " of " + std::to_string(run.steps.size()) +
                " steps, so the weights stayed where the overflow began."
          : "The largest logit reached " + num(top) + ", past " + std::string(limit) +
                ", but the loss subtracts each row's maximum before the exp and sums in FP32: no loss was "
                "inf "
                "or NaN, and the scaler skipped " +
                std::to_string(run.skipped) + " of " + std::to_string(run.steps.size()) + " steps.";
  return r;
}

//! [naive-loss-training-broken]
RunResult naive_broken() {
  const LmRun run = train_lm(licence_corpus(), pitfall_config(LossKind::naive_fp16),
                             uniform_policy(DType::f16), ScalerMode::dynamic);
  return measured(run, licence_corpus().vocab_size(),
                  "tiny Transformer, fp16 + GradScaler, loss = -log of a softmax computed in fp16 "
                  "(exp of the raw logits, fp16 sum)");
}
//! [naive-loss-training-broken]

//! [naive-loss-training-fixed]
RunResult naive_fixed() {
  const LmRun run = train_lm(licence_corpus(), pitfall_config(LossKind::stable), uniform_policy(DType::f16),
                             ScalerMode::dynamic);
  return measured(run, licence_corpus().vocab_size(),
                  "the same run with the library's cross_entropy: max subtracted, exp and sum in FP32");
}
//! [naive-loss-training-fixed]

}  // namespace naive_loss_training
}  // namespace

Pitfall naive_loss_training_pitfall() {
  using namespace naive_loss_training;
  return Pitfall{
      "naive-loss-training",
      4,
      "a language model trained with an fp16 softmax without the max: the loss turns NaN and training stops",
      "exp(z) in fp16 is inf once a logit passes ln(65504) = 11.09, so a softmax written out in fp16 (no max "
      "subtracted, fp16 sum) gives NaN probabilities, a NaN loss and NaN gradients; GradScaler skips the "
      "step, "
      "the weights do not move and every later batch overflows again. Subtract the row maximum and compute "
      "the loss in FP32 (F.cross_entropy does both).",
      naive_broken,
      naive_fixed,
      {
          check("a training loss is inf or NaN",
                [](const RunResult& r) { return r.get("first_nonfinite_loss_step") > 0; }),
          check("the scaler skips more than half of the steps",
                [](const RunResult& r) { return r.get("skipped_steps") > r.get("steps") / 2; }),
      },
      {
          check("every training loss is finite",
                [](const RunResult& r) { return r.get("nonfinite_losses") == 0; }),
          check("the validation loss falls by more than 0.5 nats",
                [](const RunResult& r) {
                  return r.get("final_valid_loss") < r.get("initial_valid_loss") - 0.5;
                }),
          check("the loss scale ends at 1 or above",
                [](const RunResult& r) { return r.get("final_scale") >= 1; }),
      },
      {
          check("the model starts untrained: validation loss within 0.1 of log V (a uniform guess)",
                [](const RunResult& r) {
                  return std::fabs(r.get("initial_valid_loss") - r.get("log_vocab")) < 0.1;
                }),
          check("both runs see a logit above ln(65504) = 11.09",
                [](const RunResult& r) { return r.get("largest_logit") > std::log(fp16_max()); }),
      }};
}

}  // namespace mpt::ch04
