// Chapter 04 — pitfall log-softmax-underflow: the log of a stored softmax is −inf where a probability flushed
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/core/context.hpp, mpt/core/dtype.hpp, mpt/core/policy.hpp
// (uniform_policy), mpt/core/tensor.hpp, mpt/formats/format.hpp
// (limits_of), mpt/nn/layers/softmax.hpp (softmax, log_softmax, nll_loss);
// <cmath>, <cstddef>, <cstdint>, <limits>, <string>, <utility>, <vector>.
//
// A confidently wrong prediction gives its target a probability of
// exp(−margin), the margin being how far the target's logit lies below the
// largest. Stored in fp16, a probability below 2^-25 (half the smallest
// subnormal, 2^-24) rounds to 0 — a margin above about 17.3 — and
// −log(0) = inf: the loss of the whole batch is inf. FP32 only moves the
// edge, to margins above about 103.9 (2^-150). Even before it flushes a
// probability in fp16's subnormal range (below 2^-14, margins above about
// 9.7) keeps few significant bits, and its log is off by up to tenths.
// log_softmax(z) = (z − max) − log Σ exp(z − max) never forms the
// probability: z − max is exact for nearby logits and the log is of a sum
// ≥ 1; nll_loss then reads −log_softmax at the target (F.cross_entropy is
// exactly this pair, aten/src/ATen/native/LossNLL.cpp).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/nn/layers/softmax.hpp"

namespace mpt::ch04 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace log_softmax_underflow {

// ---------------------------------------------------------------------------
// The two batches both runs take, and what a run measures.

constexpr std::int64_t kRows = 8;
constexpr std::int64_t kClasses = 16;

/// One batch: logits [8, 16] and each row's target.
struct Batch {
  std::vector<float> logits;  ///< row-major, as the run's model stores them
  std::vector<int> targets;   ///< class ids
  DType dtype;                ///< the logits' and the softmax's storage dtype
};

/// Rows of N(0, 1) logits whose largest logit is `margins[i]` above the
/// target's: the model is confidently wrong by that much.
Batch make_batch(const std::vector<float>& margins, DType dtype, std::uint64_t seed) {
  Batch b{normal_values(kRows * kClasses, 0, 1, seed), std::vector<int>(kRows), dtype};
  for (std::int64_t i = 0; i < kRows; ++i) {
    const auto row = static_cast<std::size_t>(i * kClasses);
    const int target = static_cast<int>((3 * i + 1) % kClasses);
    const int wrong = static_cast<int>((3 * i + 5) % kClasses);
    b.targets[static_cast<std::size_t>(i)] = target;
    b.logits[row + static_cast<std::size_t>(target)] = 0.0f;
    b.logits[row + static_cast<std::size_t>(wrong)] = margins[static_cast<std::size_t>(i)];
  }
  if (dtype == DType::f16) b.logits = rounded_to_fp16(std::move(b.logits));
  return b;
}

/// fp16 logits, margins from ordinary to confidently wrong.
const Batch& fp16_batch() {
  static const Batch b = make_batch({2, 6, 10, 13, 16, 19, 22, 25}, DType::f16, 402);
  return b;
}
/// FP32 logits with margins past FP32's range of exp (a very confident model).
const Batch& fp32_batch() {
  static const Batch b = make_batch({20, 40, 60, 80, 95, 100, 110, 120}, DType::f32, 403);
  return b;
}

/// The per-row losses a run computed from one batch.
using LossFn = std::vector<double> (*)(const Batch&);

/// What a run measured on one batch.
struct BatchLoss {
  double mean = 0;          ///< the batch's mean loss
  double fp64_mean = 0;     ///< the same in FP64
  double rel_error = 0;     ///< |mean − fp64_mean| / fp64_mean (inf when mean is inf)
  double inf_rows = 0;      ///< rows whose loss is inf
  double worst_finite = 0;  ///< the largest |loss_i − fp64_i| over the rows with a finite loss
};
BatchLoss measure(const Batch& b, LossFn f) {
  const std::vector<double> rows = f(b);
  const std::vector<double> ref = fp64_log_softmax(b.logits, kRows, kClasses);
  BatchLoss r;
  for (std::int64_t i = 0; i < kRows; ++i) {
    const double want = -ref[static_cast<std::size_t>(i * kClasses + b.targets[static_cast<std::size_t>(i)])];
    const double got = rows[static_cast<std::size_t>(i)];
    r.fp64_mean += want / kRows;
    r.mean += got / kRows;
    if (std::isinf(got)) r.inf_rows += 1;
    else r.worst_finite = std::max(r.worst_finite, std::fabs(got - want));
  }
  r.rel_error = std::fabs(r.mean - r.fp64_mean) / r.fp64_mean;
  return r;
}

/// The outcomes of both runs (defined after the runs); `why` is the run's explanation.
RunResult underflow_outcomes(LossFn f, std::string setup, std::string why);

// ---------------------------------------------------------------------------
// The broken run.

/// −log(softmax(z)[target]) per row: the library's softmax, stored in the
/// batch's dtype, then the log in FP32 of the stored probability.
std::vector<double> log_of_softmax_losses(const Batch& b) {
  Context ctx(uniform_policy(b.dtype));
  const Tensor z = Tensor::from_f32(b.logits.data(), {kRows, kClasses}, b.dtype);
  //! [log-softmax-underflow-broken]
  const std::vector<float> p = values_of(softmax(z, ctx));  // stored: below 2^-25 in fp16 it is 0
  std::vector<double> loss(kRows);
  for (std::int64_t i = 0; i < kRows; ++i)  // −log(0) = inf
    loss[static_cast<std::size_t>(i)] = -std::log(p[static_cast<std::size_t>(i * kClasses + b.targets[i])]);
  //! [log-softmax-underflow-broken]
  return loss;
}

RunResult underflow_broken() {
  const Limits f16 = limits_of(format_of(DType::f16).spec), f32 = limits_of(format_of(DType::f32).spec);
  const BatchLoss a = measure(fp16_batch(), log_of_softmax_losses);
  const std::string why = "A probability below half of fp16's smallest subnormal, " +
                          num(f16.min_subnormal / 2) + ", is stored as 0: a target more than −ln(" +
                          num(f16.min_subnormal / 2) + ") = " + num(-std::log(f16.min_subnormal / 2)) +
                          " below the largest logit gets −log 0 = inf, here " + num(a.inf_rows) + " of " +
                          std::to_string(kRows) + " rows, and the mean is inf. Below " + num(f16.min_normal) +
                          " (a margin of " + num(-std::log(f16.min_normal)) +
                          ") the probability is a subnormal with few bits: the worst finite row is off by " +
                          num(a.worst_finite) + ". FP32 flushes below " + num(f32.min_subnormal / 2) +
                          ", a margin of " + num(-std::log(static_cast<double>(f32.min_subnormal) / 2)) + ".";
  return underflow_outcomes(log_of_softmax_losses,
                            "8 rows of 16 logits, the target 2 to 25 below the largest (fp16) and 20 to 120 "
                            "(FP32); the library's softmax stored in that dtype, then −log of the target's",
                            why);
}

// ---------------------------------------------------------------------------
// The fixed run.

/// log_softmax (stored in the batch's dtype), then nll_loss with no
/// reduction (FP32 losses).
std::vector<double> log_softmax_losses(const Batch& b) {
  Context ctx(uniform_policy(b.dtype));
  const Tensor z = Tensor::from_f32(b.logits.data(), {kRows, kClasses}, b.dtype);
  NllLossOptions o;
  o.reduction = Reduction::none;
  //! [log-softmax-underflow-fixed]
  const Tensor loss = nll_loss(log_softmax(z, ctx), b.targets, o, ctx);  // (z − max) − log Σ exp(z − max)
  //! [log-softmax-underflow-fixed]
  const std::vector<float> l = values_of(loss);
  return {l.begin(), l.end()};
}

RunResult underflow_fixed() {
  const BatchLoss a = measure(fp16_batch(), log_softmax_losses);
  const std::string why =
      "log_softmax forms no probability: it subtracts the maximum and the log of a sum ≥ 1, and its fp16 "
      "output rounds each log-probability once. The worst row is off by " +
      num(a.worst_finite) + ", the mean loss by a relative " + num(a.rel_error) + ".";
  return underflow_outcomes(log_softmax_losses,
                            "the same batches through the library's log_softmax (stored in that dtype) and "
                            "nll_loss",
                            why);
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult underflow_outcomes(LossFn f, std::string setup, std::string why) {
  const BatchLoss a = measure(fp16_batch(), f), b = measure(fp32_batch(), f);
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"loss_fp16", a.mean, "the mean loss of the fp16 batch"},
      {"loss_fp16_fp64", a.fp64_mean, "the same in FP64"},
      {"loss_fp16_rel_error", a.rel_error, "its relative error"},
      {"inf_rows_fp16", a.inf_rows, "rows of the fp16 batch whose loss is inf"},
      {"worst_finite_row_error_fp16", a.worst_finite, "the largest error of a finite row loss, fp16 batch"},
      {"loss_fp32", b.mean, "the mean loss of the FP32 batch"},
      {"loss_fp32_fp64", b.fp64_mean, "the same in FP64"},
      {"loss_fp32_rel_error", b.rel_error, "its relative error"},
      {"inf_rows_fp32", b.inf_rows, "rows of the FP32 batch whose loss is inf"},
  };
  out.explanation = std::move(why);
  return out;
}

}  // namespace log_softmax_underflow
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall log_softmax_underflow_pitfall() {
  using namespace log_softmax_underflow;
  return Pitfall{
      "log-softmax-underflow",
      4,
      "log(softmax(z)): a probability stored as 0 has log −inf, and the loss is inf",
      "A probability below 2^-25 is stored in fp16 as 0 (a target about 17.3 below the largest logit; in "
      "FP32 about 104 below), and −log 0 = inf makes the batch's loss inf; above that edge, subnormal "
      "probabilities keep few bits. Compute log_softmax as (z − max) − log Σ exp(z − max), never the log of "
      "a stored softmax, and take nll_loss of it (or cross_entropy, which is both).",
      underflow_broken,
      underflow_fixed,
      {
          check("the fp16 batch's loss is inf",
                [](const RunResult& r) { return std::isinf(r.get("loss_fp16")); }),
          check("the FP32 batch's loss is inf too",
                [](const RunResult& r) { return std::isinf(r.get("loss_fp32")); }),
          check("a finite fp16 row loss is off by more than 0.05",
                [](const RunResult& r) { return r.get("worst_finite_row_error_fp16") > 0.05; }),
      },
      {
          check("the fp16 batch's loss within 1e-3 of FP64's, relatively",
                [](const RunResult& r) { return r.get("loss_fp16_rel_error") < 1e-3; }),
          check("the FP32 batch's loss within 1e-6 of FP64's, relatively",
                [](const RunResult& r) { return r.get("loss_fp32_rel_error") < 1e-6; }),
          check(
              "no row's loss is inf",
              [](const RunResult& r) { return r.get("inf_rows_fp16") == 0 && r.get("inf_rows_fp32") == 0; }),
      },
      {}};
}

}  // namespace mpt::ch04
