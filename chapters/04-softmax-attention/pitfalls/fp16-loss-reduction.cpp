// Chapter 04 — pitfall fp16-loss-reduction: per-token losses summed in fp16 overflow or stop adding
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/core/context.hpp, mpt/core/policy.hpp (uniform_policy),
// mpt/core/random.hpp (Rng), mpt/core/tensor.hpp, mpt/nn/layers/softmax.hpp (cross_entropy); <cmath>,
// <cstddef>, <cstdint>, <string>, <utility>, <vector>.
//
// A language model's loss is the mean over every token of a batch: 16384
// tokens here, a few million in a large run. With the per-token losses in
// fp16 that mean fails two ways. Early in training each token costs several
// nats, and 16384 of them sum past 65504: a sum accumulated in FP32 but
// stored in fp16 — torch.sum of a half tensor returns half, its CUDA kernel
// accumulating in float (acc_t, aten/src/ATen/native/cuda/ReduceSumProdKernel.cu)
// — is inf, and so is the mean. An fp16 running sum (a hand-written kernel's
// half accumulator) never gets that far: from 32768 on fp16's spacing is 32
// and a loss below 16 rounds away entirely, so the sum stops growing. Late
// in training the losses are small and it stalls much earlier (at 2048 the
// spacing is 2, and a loss below 1 no longer adds). The library's
// cross_entropy sums the FP32 losses in FP32 and divides there; the loss it
// returns is an FP32 tensor.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/nn/layers/softmax.hpp"

namespace mpt::ch04 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace fp16_loss_reduction {

// ---------------------------------------------------------------------------
// The two batches both runs take, and what a run measures.

constexpr std::int64_t kTokens = 16384;
constexpr std::int64_t kVocab = 32;

/// One batch of fp16 logits [16384, 32] with a target per token.
struct Batch {
  std::vector<float> logits;  ///< row-major, fp16 values
  std::vector<int> targets;   ///< one class id per token
};

/// N(0, std²) logits; the target's logit raised by `boost` (how well the
/// model has learnt).
Batch make_batch(double std, float boost, std::uint64_t seed) {
  Batch b{normal_values(kTokens * kVocab, 0, std, seed), std::vector<int>(kTokens)};
  Rng rng(seed + 1);
  for (std::int64_t i = 0; i < kTokens; ++i) {
    const int t = static_cast<int>(rng.below(kVocab));
    b.targets[static_cast<std::size_t>(i)] = t;
    b.logits[static_cast<std::size_t>(i * kVocab + t)] += boost;
  }
  b.logits = rounded_to_fp16(std::move(b.logits));
  return b;
}

/// Early in training: wide random logits, a loss of several nats per token.
const Batch& early_batch() {
  static const Batch b = make_batch(3, 0, 404);
  return b;
}
/// Late in training: the target's logit well ahead, small losses.
const Batch& late_batch() {
  static const Batch b = make_batch(1, 5.5f, 405);
  return b;
}

/// The mean FP64 cross-entropy of a batch (log-sum-exp in double).
double fp64_mean_loss(const Batch& b) {
  const std::vector<double> lp = fp64_log_softmax(b.logits, kTokens, kVocab);
  double s = 0;
  for (std::int64_t i = 0; i < kTokens; ++i)
    s -= lp[static_cast<std::size_t>(i * kVocab + b.targets[static_cast<std::size_t>(i)])];
  return s / kTokens;
}

/// What a run's reduction of one batch gave.
struct Reduced {
  double stored_sum = 0;    ///< Σ loss, accumulated in FP32 and stored in the run's dtype for sums
  double mean = 0;          ///< stored_sum / tokens
  double running_mean = 0;  ///< the mean from a running sum in the run's accumulator, left to right
};

/// A batch's reduction as one run does it.
using ReduceFn = Reduced (*)(const Batch&);

/// The outcomes of both runs (defined after the runs); `why` is the run's explanation.
RunResult reduction_outcomes(ReduceFn f, std::string setup, std::string why);

// ---------------------------------------------------------------------------
// The broken run.

/// The library's per-token losses of a batch (FP32, reduction none), kept
/// in fp16 as a half-precision loss tensor holds them.
std::vector<float> fp16_token_losses(const Batch& b) {
  Context ctx(uniform_policy(DType::f16));
  const Tensor z = Tensor::from_f32(b.logits.data(), {kTokens, kVocab}, DType::f16);
  CrossEntropyOptions o;
  o.reduction = Reduction::none;
  return rounded_to_fp16(values_of(cross_entropy(z, b.targets, o, ctx)));
}

/// What an fp16 running sum did, for the explanation.
struct RunningSum {
  float sum = 0;             ///< the final fp16 sum
  std::int64_t dropped = 0;  ///< tokens whose loss left the sum unchanged
};
RunningSum fp16_running_sum(const std::vector<float>& loss) {
  RunningSum r;
  for (const float l : loss) {
    //! [fp16-loss-reduction-broken]
    const float next = h(r.sum + l);  // an fp16 accumulator: from 32768 on its spacing is 32
    //! [fp16-loss-reduction-broken]
    r.dropped += next == r.sum && l != 0;
    r.sum = next;
  }
  return r;
}

/// The two fp16 reductions: sum() of the half losses (FP32 accumulation,
/// the result stored in fp16, as torch.sum of a half tensor) divided by the
/// token count, and a hand-written fp16 running sum.
Reduced fp16_reduce(const Batch& b) {
  const std::vector<float> loss = fp16_token_losses(b);
  float acc = 0;  // FP32
  for (const float l : loss) acc += l;
  Reduced r;
  r.stored_sum = h(acc);  // past 65504: inf
  r.mean = h(static_cast<float>(r.stored_sum / kTokens));
  r.running_mean = h(fp16_running_sum(loss).sum / static_cast<float>(kTokens));
  return r;
}

RunResult reduction_broken() {
  const Reduced e = fp16_reduce(early_batch());
  const RunningSum er = fp16_running_sum(fp16_token_losses(early_batch()));
  const RunningSum lr = fp16_running_sum(fp16_token_losses(late_batch()));
  const double e64 = fp64_mean_loss(early_batch()) * kTokens, l64 = fp64_mean_loss(late_batch()) * kTokens;
  const std::string why = "Summed in FP32 and stored in fp16, the early batch's " + num(e64) + " is " +
                          num(e.stored_sum) + " (past " + num(fp16_max()) +
                          "), and so is its mean. An fp16 running sum never gets that far: it ends at " +
                          num(er.sum) + ", where fp16's spacing is " + num(fp16_ulp(er.sum)) +
                          " and a loss below half of it no "
                          "longer adds (" +
                          std::to_string(er.dropped) +
                          " tokens lost). The late batch's running sum ends at " + num(lr.sum) +
                          " instead of " + num(l64) + " (spacing " + num(fp16_ulp(lr.sum)) + "; " +
                          std::to_string(lr.dropped) + " tokens lost).";
  return reduction_outcomes(fp16_reduce,
                            "16384 tokens of 32-way fp16 logits, early (N(0, 9)) and late (target +5.5) in "
                            "training; the library's per-token losses in fp16, summed into fp16 (FP32 "
                            "accumulation) and in an fp16 running sum",
                            why);
}

// ---------------------------------------------------------------------------
// The fixed run.

/// The library's cross_entropy: reduction sum and mean, both FP32 running
/// sums (the mean divides in FP32 too), FP32 results.
Reduced library_reduce(const Batch& b) {
  Context ctx(uniform_policy(DType::f16));
  const Tensor z = Tensor::from_f32(b.logits.data(), {kTokens, kVocab}, DType::f16);
  CrossEntropyOptions sum;
  sum.reduction = Reduction::sum;
  Reduced r;
  r.stored_sum = cross_entropy(z, b.targets, sum, ctx).value(0);
  //! [fp16-loss-reduction-fixed]
  const Tensor loss = cross_entropy(z, b.targets, CrossEntropyOptions{}, ctx);  // mean: FP32 sum, FP32 loss
  //! [fp16-loss-reduction-fixed]
  r.mean = loss.value(0);
  r.running_mean = r.mean;  // the library's mean is an FP32 running sum, divided
  return r;
}

RunResult reduction_fixed() {
  const Reduced e = library_reduce(early_batch());
  const std::string why = "The library sums the FP32 losses in FP32: the early batch's sum " +
                          num(e.stored_sum) + " is far inside FP32's range, and FP32's spacing there is " +
                          num(std::ldexp(1.0, static_cast<int>(std::floor(std::log2(e.stored_sum))) - 23)) +
                          ", so every token adds; the loss it returns is an FP32 number.";
  return reduction_outcomes(library_reduce,
                            "the same batches through the library's cross_entropy (reductions sum and mean: "
                            "FP32 sums and division, FP32 results)",
                            why);
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult reduction_outcomes(ReduceFn f, std::string setup, std::string why) {
  const double early64 = fp64_mean_loss(early_batch()), late64 = fp64_mean_loss(late_batch());
  const Reduced early = f(early_batch()), late = f(late_batch());
  const auto rel = [](double v, double want) { return std::fabs(v - want) / want; };
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"tokens", static_cast<double>(kTokens), "tokens per batch"},
      {"early_sum_fp64", early64 * kTokens, "the early batch's summed loss, FP64"},
      {"early_sum", early.stored_sum, "the early batch's sum, as the run stores it"},
      {"early_mean", early.mean, "the early batch's mean loss, from that sum"},
      {"early_mean_fp64", early64, "the same in FP64"},
      {"early_rel_error", rel(early.mean, early64), "its relative error"},
      {"early_running_rel_error", rel(early.running_mean, early64),
       "the relative error of the mean from the run's running sum"},
      {"late_sum_fp64", late64 * kTokens, "the late batch's summed loss, FP64"},
      {"late_running_mean", late.running_mean, "the late batch's mean loss from the run's running sum"},
      {"late_mean_fp64", late64, "the same in FP64"},
      {"late_running_rel_error", rel(late.running_mean, late64), "its relative error"},
  };
  out.explanation = std::move(why);
  return out;
}

}  // namespace fp16_loss_reduction
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall fp16_loss_reduction_pitfall() {
  using namespace fp16_loss_reduction;
  return Pitfall{
      "fp16-loss-reduction",
      4,
      "a batch's loss summed in fp16: past 65504 it is inf, and once it is large small losses stop adding",
      "Per-token losses of several nats over 16384 tokens sum past fp16's largest value, 65504: a sum "
      "stored in fp16 is inf, and so is the mean. An fp16 running sum fails sooner: a loss stops adding "
      "once the sum's fp16 spacing is more than twice its size, and the mean comes out far too small. Sum "
      "and divide in FP32 and keep the "
      "loss an FP32 number, as the library's cross_entropy does.",
      reduction_broken,
      reduction_fixed,
      {
          check("the early batch's sum, stored in fp16, is inf, and so is its mean",
                [](const RunResult& r) {
                  return std::isinf(r.get("early_sum")) && std::isinf(r.get("early_mean"));
                }),
          check("the early batch's running-sum mean is more than 10% off",
                [](const RunResult& r) { return r.get("early_running_rel_error") > 0.1; }),
          check(
              "the late batch's running-sum mean is more than 10% too small",
              [](const RunResult& r) { return r.get("late_running_mean") < 0.9 * r.get("late_mean_fp64"); }),
      },
      {
          check("the early batch's mean within 1e-5 of FP64's, relatively",
                [](const RunResult& r) { return r.get("early_rel_error") < 1e-5; }),
          check("both running-sum means within 1e-5 of FP64's, relatively",
                [](const RunResult& r) {
                  return r.get("early_running_rel_error") < 1e-5 && r.get("late_running_rel_error") < 1e-5;
                }),
      },
      {}};
}

}  // namespace mpt::ch04
