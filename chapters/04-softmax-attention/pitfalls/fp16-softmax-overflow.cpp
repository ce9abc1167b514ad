// Chapter 04 — pitfall fp16-softmax-overflow: exp(z) in fp16 without the max subtraction
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/core/context.hpp, mpt/core/policy.hpp (uniform_policy),
// mpt/core/tensor.hpp, mpt/nn/layers/softmax.hpp (softmax); <algorithm>, <cmath>,
// <cstddef>, <cstdint>, <limits>, <string>, <utility>, <vector>.
//
// softmax(z) = exp(z) / Σ exp(z) is exact mathematics and a poor program.
// fp16's largest value is 65504, so exp(z) is inf for every z above
// ln(65504) ≈ 11.09 — a logit any confident classifier produces. A row
// holding one such logit divides inf by inf there (NaN) and finite values by
// inf elsewhere (0); a row whose exponentials each fit but whose sum passes
// 65504 is all zeros. Subtracting the row's maximum first makes every
// exponent ≤ 0 and the largest term exactly 1, so nothing overflows; the
// library's softmax does that, in FP32, and rounds once into fp16
// (aten/src/ATen/native/cpu/SoftmaxKernel.cpp computes the max first too).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/nn/layers/softmax.hpp"

namespace mpt::ch04 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace fp16_softmax_overflow {

// ---------------------------------------------------------------------------
// The logits both runs take, and what a run measures.

constexpr std::int64_t kRows = 8;
constexpr std::int64_t kClasses = 32;
constexpr std::int64_t kOrdinaryRows = 4;  // rows 0..3: logits of size 2, nothing overflows

/// [8, 32] fp16 logits, seeded: rows 0–3 ordinary (N(0, 2²)); rows 4 and 5
/// confident (one logit raised to 12.5 and 16, past ln 65504); rows 6 and 7
/// with four logits near 10.5, each exp below 65504, their sum above it.
const std::vector<float>& logits() {
  static const std::vector<float> z = [] {
    std::vector<float> v = normal_values(kRows * kClasses, 0, 2, 401);
    const auto at = [](std::int64_t i, std::int64_t j) { return static_cast<std::size_t>(i * kClasses + j); };
    v[at(4, 7)] = 12.5f;
    v[at(5, 19)] = 16.0f;
    for (std::int64_t i = 6; i < 8; ++i)
      for (std::int64_t j = 0; j < 4; ++j) v[at(i, 3 + 5 * j)] = 10.25f + 0.125f * static_cast<float>(j);
    return rounded_to_fp16(std::move(v));
  }();
  return z;
}

/// A softmax over `rows` rows of `width` values.
using SoftmaxFn = std::vector<float> (*)(const std::vector<float>&, std::int64_t, std::int64_t);

/// The largest fp16 logit z ≥ 1 for which the row [z, 0] has a finite
/// softmax under f: every fp16 value from 1 to 65504 is tried, one row each.
double largest_finite_logit(SoftmaxFn f) {
  std::vector<float> rows;
  for (double z = 1; z <= fp16_max(); z += fp16_ulp(z)) {
    rows.push_back(static_cast<float>(z));
    rows.push_back(0.0f);
  }
  const auto n = static_cast<std::int64_t>(rows.size() / 2);
  const std::vector<float> p = f(rows, n, 2);
  double best = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto at = static_cast<std::size_t>(2 * i);
    if (std::isfinite(p[at]) && std::isfinite(p[at + 1]))
      best = std::max(best, static_cast<double>(rows[at]));
  }
  return best;
}

/// The outcomes of both runs (defined after the runs); `why` is the run's explanation.
RunResult overflow_outcomes(SoftmaxFn f, std::string setup, std::string why);

// ---------------------------------------------------------------------------
// The broken run.

/// exp, sum and division in fp16, without the max subtraction: the softmax
/// of the formula, as a hand-written half-precision kernel computes it. It
/// exists only as this pitfall.
std::vector<float> naive_fp16_softmax(const std::vector<float>& z, std::int64_t rows, std::int64_t width) {
  std::vector<float> p(z.size()), e(static_cast<std::size_t>(width));
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* row = z.data() + i * width;
    //! [fp16-softmax-overflow-broken]
    float sum = 0;  // an fp16 accumulator
    for (std::int64_t j = 0; j < width; ++j) {
      e[static_cast<std::size_t>(j)] = h(std::exp(row[j]));  // inf for z > ln 65504 ≈ 11.09
      sum = h(sum + e[static_cast<std::size_t>(j)]);         // inf once it passes 65504
    }
    for (std::int64_t j = 0; j < width; ++j)
      p[static_cast<std::size_t>(i * width + j)] = h(e[static_cast<std::size_t>(j)] / sum);  // inf/inf = NaN
    //! [fp16-softmax-overflow-broken]
  }
  return p;
}

RunResult overflow_broken() {
  const double ln_max = std::log(fp16_max());
  const double largest = largest_finite_logit(naive_fp16_softmax);
  const std::string why =
      "fp16's largest value is " + num(fp16_max()) + " and ln " + num(fp16_max()) + " = " + num(ln_max) +
      ": the largest fp16 logit whose exp is finite in fp16 is " + num(largest) + " (the next one, " +
      num(largest + fp16_ulp(largest)) + ", has exp " + num(std::exp(largest + fp16_ulp(largest))) +
      ", stored as inf). A row holding a larger logit divides inf by inf (NaN) there and finite values by "
      "inf (0) elsewhere; four logits near 10.5 have exponentials of about " +
      num(std::exp(10.5)) + " each, whose fp16 sum is inf, and every probability of their row is 0.";
  return overflow_outcomes(naive_fp16_softmax,
                           "8 rows of 32 fp16 logits (4 ordinary, 2 with one logit of 12.5 or 16, 2 with "
                           "four logits near 10.5); exp, sum and division in fp16, no max subtracted",
                           why);
}

// ---------------------------------------------------------------------------
// The fixed run.

/// The library's softmax: fp16 in, max subtracted, FP32 exp and sum, one
/// rounding into fp16.
std::vector<float> library_softmax(const std::vector<float>& z, std::int64_t rows, std::int64_t width) {
  Context ctx(uniform_policy(DType::f16));
  const Tensor x = Tensor::from_f32(z.data(), {rows, width}, DType::f16);
  //! [fp16-softmax-overflow-fixed]
  const Tensor p = softmax(x, ctx);  // exp(z − max) / Σ exp(z − max) in FP32, stored in fp16
  //! [fp16-softmax-overflow-fixed]
  return values_of(p);
}

RunResult overflow_fixed() {
  const double largest = largest_finite_logit(library_softmax);
  const std::string why =
      "With the maximum subtracted every exponent is ≤ 0 and the largest term is exactly 1: "
      "every fp16 logit up to " +
      num(largest) +
      " gives a finite softmax, and each probability is the FP32 value rounded once "
      "into fp16.";
  return overflow_outcomes(library_softmax,
                           "the same logits through the library's softmax (max subtracted, FP32 exp and "
                           "sum, output rounded into fp16)",
                           why);
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult overflow_outcomes(SoftmaxFn f, std::string setup, std::string why) {
  const std::vector<float>& z = logits();
  const std::vector<float> p = f(z, kRows, kClasses);
  const std::vector<double> ref = fp64_softmax(z, kRows, kClasses);
  const Errors all = compare(p, ref);
  const auto ordinary = static_cast<std::size_t>(kOrdinaryRows * kClasses);
  const Errors first =
      compare(std::vector<float>(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(ordinary)),
              std::vector<double>(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(ordinary)));
  double above = 0, nan_rows = 0, zero_rows = 0;
  for (const float v : z) above += std::exp(static_cast<double>(v)) > fp16_max();
  for (std::int64_t i = 0; i < kRows; ++i) {
    bool any_nan = false, all_zero = true;
    for (std::int64_t j = 0; j < kClasses; ++j) {
      const float v = p[static_cast<std::size_t>(i * kClasses + j)];
      any_nan = any_nan || std::isnan(v);
      all_zero = all_zero && v == 0;
    }
    nan_rows += any_nan;
    zero_rows += all_zero;
  }
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"logits_past_ln_max", above, "logits whose exp (FP64) is above fp16's largest value"},
      {"largest_finite_logit", largest_finite_logit(f),
       "the largest fp16 logit z whose row [z, 0] has a finite softmax"},
      {"largest_fp16", fp16_max(), "the largest fp16 value tried"},
      {"nan_probabilities", all.nan, "probabilities that are NaN"},
      {"nan_rows", nan_rows, "rows with a NaN probability"},
      {"all_zero_rows", zero_rows, "rows whose probabilities are all 0"},
      {"max_error", all.max_error, "the largest |p − p_fp64| (inf when some p is not finite)"},
      {"worst_error_ulps", all.worst_ulps, "the largest error in fp16 ulps at p_fp64"},
      {"ordinary_rows_worst_ulps", first.worst_ulps, "the same on the 4 ordinary rows"},
  };
  out.explanation = std::move(why);
  return out;
}

}  // namespace fp16_softmax_overflow
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall fp16_softmax_overflow_pitfall() {
  using namespace fp16_softmax_overflow;
  return Pitfall{
      "fp16-softmax-overflow",
      4,
      "softmax in fp16 without the max subtraction: exp(z) is inf above z ≈ 11.09, and inf/inf is NaN",
      "fp16's largest value is 65504, so exp(z) overflows to inf for every logit above ln 65504 ≈ 11.09: "
      "its row divides inf by inf (NaN) and everything else by inf (0), and a row whose exponentials sum "
      "past 65504 is all zeros. Subtract the row's maximum before the exp and sum in FP32, as the "
      "library's softmax (and PyTorch's) does.",
      overflow_broken,
      overflow_fixed,
      {
          check("NaN probabilities (inf/inf)",
                [](const RunResult& r) { return r.get("nan_probabilities") > 0; }),
          check("rows of all-zero probabilities (the sum is inf)",
                [](const RunResult& r) { return r.get("all_zero_rows") > 0; }),
          check("a logit below 12 is already too large",
                [](const RunResult& r) { return r.get("largest_finite_logit") < 12; }),
      },
      {
          check("every fp16 logit gives a finite softmax",
                [](const RunResult& r) { return r.get("largest_finite_logit") == r.get("largest_fp16"); }),
          check("every probability within one fp16 ulp of FP64's",
                [](const RunResult& r) { return r.get("worst_error_ulps") <= 1; }),
          check("no row is NaN or all zeros",
                [](const RunResult& r) { return r.get("nan_rows") == 0 && r.get("all_zero_rows") == 0; }),
      },
      {
          check("on the ordinary rows both softmaxes are within 4 fp16 ulps of FP64's",
                [](const RunResult& r) { return r.get("ordinary_rows_worst_ulps") <= 4; }),
      }};
}

}  // namespace mpt::ch04
