// Chapter 06 — pitfall bce-on-fp16-probabilities: binary_cross_entropy on fp16 sigmoid outputs
// Depends on: common.hpp (check, num, this entry's declaration),
// mpt/core/autocast.hpp (AutocastPolicy: the ban), mpt/core/dtype.hpp
// (format_of), mpt/formats/rounding.hpp (round_value); <algorithm>, <cmath>,
// <stdexcept>, <string>, <vector>.
//
// torch.autocast bans binary_cross_entropy on CUDA (autocast_mode.cpp,
// binary_cross_entropy_banned): its input is a probability from a sigmoid,
// and in fp16 every sigmoid(z) above 1 − 2^-12 rounds to exactly 1 (fp16's
// spacing below 1 is 2^-11). A confident wrong prediction (z = 12 for a
// target 0) then has log(1 − p) = log 0; PyTorch's binary_cross_entropy
// clamps each log at −100 (aten/src/ATen/native/Loss.cpp), so its loss is
// 100 instead of about 12. Its gradient is lost too: the sigmoid's
// derivative p(1 − p) is 0 in fp16, and BCE's derivative
// (p − t) / max(p(1 − p), 1e-12) = 10^12 overflows fp16 to inf, so the chain
// rule multiplies inf by 0 and gives NaN (with fp16 between the two ops, as
// here): the examples the model gets most wrong teach it nothing, and a
// dynamic scaler skips every step that contains one. binary_cross_entropy_with_logits takes the logits and
// computes log-sigmoid in FP32 without ever forming p: the loss is right and the gradient is sigmoid(z) − t,
// whatever z is. The broken run is what the ban prevents (a model converted to fp16, outside autocast);
// autocast itself refuses the op with PyTorch's advice, as this library's AutocastPolicy does.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/core/autocast.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/formats/rounding.hpp"

namespace mpt::ch06 {
namespace {
namespace bce_on_fp16_probabilities {

// Logits (whole numbers, exact in fp16) and targets: three confident
// mistakes (z = 9 and 12 for targets 0, z = −10 for a target 1), the rest right.
const std::vector<float> kLogits = {12, 9, -10, 3, -3, 0.5f, 6, -6};
const std::vector<float> kTargets = {0, 0, 1, 1, 0, 1, 1, 0};

float f16(float v) { return round_value(v, format_of(DType::f16)); }

struct Losses {
  std::vector<double> loss, grad;  // per example: the loss and d loss / d z
};

// FP64 references: softplus form of the logits loss, and sigmoid(z) − t.
Losses reference() {
  Losses r;
  for (std::size_t i = 0; i < kLogits.size(); ++i) {
    const double z = kLogits[i], t = kTargets[i];
    r.loss.push_back(std::max(z, 0.0) - z * t + std::log1p(std::exp(-std::fabs(z))));
    r.grad.push_back(1 / (1 + std::exp(-z)) - t);
  }
  return r;
}

Losses broken_losses() {
  Losses r;
  for (std::size_t i = 0; i < kLogits.size(); ++i) {
    //! [bce-on-fp16-probabilities-broken]
    // sigmoid in fp16, then binary_cross_entropy on the probability
    const float p = f16(1 / (1 + std::exp(-kLogits[i])));
    const float t = kTargets[i];
    const float log_p = std::max(std::log(p), -100.0f), log_1mp = std::max(std::log(1 - p), -100.0f);
    const float loss = -(t * log_p + (1 - t) * log_1mp);
    // backward: BCE's (p − t) / max(p(1 − p), 1e-12), times the fp16 sigmoid's p(1 − p)
    const float dp = (p - t) / std::max(p * (1 - p), 1e-12f);
    const float dz = f16(f16(dp) * f16(p * (1 - p)));
    //! [bce-on-fp16-probabilities-broken]
    r.loss.push_back(loss);
    r.grad.push_back(dz);
  }
  return r;
}

Losses fixed_losses() {
  Losses r;
  for (std::size_t i = 0; i < kLogits.size(); ++i) {
    //! [bce-on-fp16-probabilities-fixed]
    // binary_cross_entropy_with_logits: log-sigmoid from the logit, in FP32
    const float z = kLogits[i], t = kTargets[i];
    const float loss = std::max(z, 0.0f) - z * t + std::log1p(std::exp(-std::fabs(z)));
    const float dz = 1 / (1 + std::exp(-z)) - t;
    //! [bce-on-fp16-probabilities-fixed]
    r.loss.push_back(loss);
    r.grad.push_back(dz);
  }
  return r;
}

RunResult outcomes(const Losses& got, std::string setup) {
  const Losses ref = reference();
  double worst_loss = 0, worst_grad = 0, dead = 0, mistakes = 0;
  for (std::size_t i = 0; i < got.loss.size(); ++i) {
    worst_loss = std::max(worst_loss, std::fabs(got.loss[i] - ref.loss[i]));
    const double e = std::fabs(got.grad[i] - ref.grad[i]);
    worst_grad = std::isfinite(e) ? std::max(worst_grad, e) : INFINITY;
    const bool mistake = std::fabs(ref.grad[i]) > 0.9;  // confident and wrong
    mistakes += mistake;
    dead += mistake && (got.grad[i] == 0 || !std::isfinite(got.grad[i]));
  }
  double refused = 0;
  try {
    (void)AutocastPolicy(AutocastDevice::cuda, DType::f16)
        .decide({"binary_cross_entropy", "loss", {DType::f16}});
  } catch (const std::invalid_argument& e) {
    refused = std::string(e.what()).find("binary_cross_entropy_with_logits") != std::string::npos ? 1 : 0;
  }
  const OpPrecision logits_loss = AutocastPolicy(AutocastDevice::cuda, DType::f16)
                                      .decide({"binary_cross_entropy_with_logits", "loss", {DType::f16}});
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"examples", static_cast<double>(got.loss.size()), "logits and targets"},
      {"confident_mistakes", mistakes, "examples whose FP64 gradient |sigmoid(z) − t| exceeds 0.9"},
      {"loss_max_error", worst_loss, "the largest |loss − FP64 loss| of one example"},
      {"grad_max_error", worst_grad, "the largest |d loss/dz − FP64's|"},
      {"dead_gradients", dead, "confident mistakes whose gradient is 0 or not finite"},
      {"autocast_refuses_bce", refused,
       "1 when autocast (CUDA, f16) refuses binary_cross_entropy with the advice"},
      {"logits_loss_computes_f32", logits_loss.compute == DType::f32 ? 1.0 : 0.0,
       "1 when autocast runs binary_cross_entropy_with_logits in FP32"},
  };
  r.explanation = "The largest loss error is " + num(worst_loss) + " and " + num(dead) + " of " +
                  num(mistakes) + " confident mistakes get no usable gradient (0 or NaN).";
  return r;
}

RunResult broken_run() {
  return outcomes(broken_losses(),
                  "8 logits from -10 to 12, three of them confident mistakes; sigmoid stored in fp16, then "
                  "binary_cross_entropy (log clamped at -100, as PyTorch's)");
}

RunResult fixed_run() {
  return outcomes(fixed_losses(), "the same logits into binary_cross_entropy_with_logits, in FP32");
}

}  // namespace bce_on_fp16_probabilities
}  // namespace

Pitfall bce_on_fp16_probabilities_pitfall() {
  using namespace bce_on_fp16_probabilities;
  return Pitfall{
      "bce-on-fp16-probabilities",
      6,
      "binary_cross_entropy on fp16 probabilities: sigmoid rounds to 1, the loss clamps at 100, the gradient "
      "is NaN",
      "In fp16, sigmoid(z) rounds to exactly 1 above 1 - 2^-12, so log(1 - p) is log 0 (clamped to -100) and "
      "p(1 - p) is 0 while 1/(p(1 - p)) overflows: the most confident mistakes get a wrong loss and a NaN "
      "gradient. Autocast bans the op; use "
      "binary_cross_entropy_with_logits, which never forms p.",
      broken_run,
      fixed_run,
      {
          check("a loss off by more than 50 (the clamp at -100)",
                [](const RunResult& r) { return r.get("loss_max_error") > 50; }),
          check("confident mistakes get no usable gradient (0 or NaN)",
                [](const RunResult& r) { return r.get("dead_gradients") > 0; }),
      },
      {
          check("every loss within 1e-5 of FP64's",
                [](const RunResult& r) { return r.get("loss_max_error") < 1e-5; }),
          check("every gradient within 1e-6 of FP64's",
                [](const RunResult& r) { return r.get("grad_max_error") < 1e-6; }),
      },
      {}};
}

}  // namespace mpt::ch06
