// Chapter 01 — pitfall fp16-overflow: fp16 overflow: squares of large activations
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/formats/format.hpp (limits_of, decode), mpt/formats/rounding.hpp
// (round_value); <algorithm>, <cmath>, <cstdint>, <limits>, <string>, <utility>, <vector>.
//
// The sum of squares of fp16 activations (the L2 norm, or a variance)
// overflows although every activation fits comfortably: fp16's max is 65504,
// so the square of any |x| >= 256 is inf. Computing the squares, their sum
// and the norm in fp32 (the inputs still fp16) keeps them finite.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/formats/rounding.hpp"

namespace mpt::ch01 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace fp16_overflow {

// ---------------------------------------------------------------------------
// The constants and the inputs.

/// Activations of a layer whose outputs have drifted to magnitudes in the
/// hundreds (a residual stream without normalisation does this as depth
/// grows): N(0, sigma^2), stored in fp16. Each value is far below fp16's
/// max; only the squares are not.
constexpr std::size_t kActivations = 4096;
constexpr double kActivationSigma = 100.0;

std::vector<float> large_activations() {
  Rng rng(0x01f16a11ULL);
  std::vector<float> x(kActivations);
  for (float& v : x) v = round_value(static_cast<float>(kActivationSigma * rng.normal()), fp16());
  return x;
}

/// The smallest fp16 value whose square (an fp32 product, stored in
/// `compute`) is not finite; inf when there is none. Scans every positive
/// finite fp16 value in increasing order.
double smallest_overflowing_square(const Format& compute) {
  const float fp16_max = static_cast<float>(limits_of(fp16().spec).max);
  for (std::uint32_t code = 1;; ++code) {
    const float v = decode(code, fp16().spec);
    if (v > fp16_max) return std::numeric_limits<double>::infinity();
    if (!std::isfinite(round_value(v * v, compute))) return v;
  }
}

/// Measurements shared by both sides of fp16-overflow (defined after the
/// runs). `compute` is the format the squares, their sum and the norm are
/// stored in.
RunResult overflow_outcomes(const std::vector<float>& x, const std::vector<float>& squares,
                            float sum_of_squares, float norm, const Format& compute, std::string setup);

// ---------------------------------------------------------------------------
// The broken run.

RunResult fp16_overflow_broken() {
  const std::vector<float> x = large_activations();
  //! [fp16-overflow-broken]
  // x*x is an elementwise op: computed in fp32, stored in the tensor's
  // format, fp16. The reduction accumulates in fp32, as GPU reductions do,
  // and writes its result back in fp16.
  std::vector<float> squares(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) squares[i] = round_value(x[i] * x[i], fp16());
  float sum = 0.0f;
  for (float s : squares) sum += s;
  const float sum16 = round_value(sum, fp16());
  const float norm = round_value(std::sqrt(sum16), fp16());
  //! [fp16-overflow-broken]
  return overflow_outcomes(x, squares, sum16, norm, fp16(),
                           std::to_string(kActivations) +
                               " fp16 activations; squares stored in fp16, summed in fp32, "
                               "norm stored in fp16");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult fp16_overflow_fixed() {
  const std::vector<float> x = large_activations();
  //! [fp16-overflow-fixed]
  // The same fp16 activations, but the squares, their sum and the norm stay
  // in fp32 (PyTorch's autocast runs pow, sum and norm in float32 for this
  // reason). The inputs are still fp16: only the computation moved.
  std::vector<float> squares(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) squares[i] = x[i] * x[i];
  float sum = 0.0f;
  for (float s : squares) sum += s;
  const float norm = std::sqrt(sum);
  //! [fp16-overflow-fixed]
  return overflow_outcomes(x, squares, sum, norm, fp32(),
                           "the same fp16 activations; squares, sum and norm in fp32");
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult overflow_outcomes(const std::vector<float>& x, const std::vector<float>& squares,
                            float sum_of_squares, float norm, const Format& compute, std::string setup) {
  // The reference: the same fp16 inputs, squared and summed in fp64.
  double ref_sum = 0.0;
  for (float v : x) ref_sum += static_cast<double>(v) * v;
  const double ref_norm = std::sqrt(ref_sum);

  const double smallest_overflowing = smallest_overflowing_square(compute);
  double inputs_at_or_above = 0, squares_inf = 0, largest_input = 0;
  for (float v : x) {
    inputs_at_or_above += std::fabs(v) >= smallest_overflowing;
    largest_input = std::max(largest_input, static_cast<double>(std::fabs(v)));
  }
  for (float s : squares) squares_inf += std::isinf(s);

  const double rel_error =
      std::isfinite(norm) ? std::fabs(norm - ref_norm) / ref_norm : std::numeric_limits<double>::infinity();
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"activations", static_cast<double>(x.size()),
       "fp16 activations, N(0, " + num(kActivationSigma) + "^2)"},
      {"largest_activation", largest_input, "largest |x| among them"},
      {"smallest_overflowing_input", smallest_overflowing,
       "smallest fp16 x whose square overflows the compute format (inf: none)"},
      {"inputs_overflowing_when_squared", inputs_at_or_above,
       "activations at or above that smallest overflowing input"},
      {"squares_inf", squares_inf, "squares that became inf"},
      {"sum_of_squares", sum_of_squares, "the sum of the squares as computed"},
      {"norm", norm, "L2 norm as computed"},
      {"norm_fp64", ref_norm, "L2 norm of the same inputs in fp64"},
      {"norm_rel_error", rel_error, "|norm - norm_fp64| / norm_fp64"},
  };
  // Round-to-nearest keeps a value up to max + ulp(max)/2 (exclusive) finite.
  const double max = limits_of(compute.spec).max;
  const double overflow_from = max + ulp_in(compute, max) / 2;
  float largest_square = 0.0f;
  for (float s : squares) largest_square = s > largest_square ? s : largest_square;
  r.explanation = std::isfinite(norm)
                      ? "In " + std::string(compute.name) + " the largest square, " + num(largest_square) +
                            ", and the sum of squares, " + num(ref_sum) + ", are far below the max " +
                            num(max) + "; the norm is off by " + num(rel_error) + " relative, fp32 rounding."
                      : std::string(compute.name) + "'s max is " + num(max) + " and everything from " +
                            num(overflow_from) +
                            " up rounds to inf, so any activation with |x| >= " + num(smallest_overflowing) +
                            " has an inf square (" + num(smallest_overflowing) +
                            "^2 = " + num(smallest_overflowing * smallest_overflowing) + "); " +
                            num(squares_inf) + " of " + num(static_cast<double>(x.size())) +
                            " squares did, so the sum and the norm are inf.";
  return r;
}

}  // namespace fp16_overflow
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall fp16_overflow_pitfall() {
  using namespace fp16_overflow;
  const double inf = std::numeric_limits<double>::infinity();
  // The mechanism quotes the format's limits; they are computed, like
  // everything the CLI prints.
  const Limits l16 = limits_of(fp16().spec);
  return Pitfall{
      "fp16-overflow",
      1,
      "fp16 overflow: squares of large activations",
      "fp16's largest finite value is " + num(l16.max) + " and everything from " +
          num(l16.max + ulp_in(fp16(), l16.max) / 2) +
          " up rounds to inf, so squaring any fp16 value of magnitude " +
          num(smallest_overflowing_square(fp16())) +
          " or more overflows, and a norm or variance computed in fp16 becomes inf.",
      fp16_overflow_broken,
      fp16_overflow_fixed,
      {
          check("squares overflowed to inf: some did, exactly those of the activations at or above "
                "the smallest overflowing input",
                [](const RunResult& r) {
                  return r.get("squares_inf") > 0 &&
                         r.get("squares_inf") == r.get("inputs_overflowing_when_squared");
                }),
          check("the sum of squares is inf",
                [inf](const RunResult& r) { return r.get("sum_of_squares") == inf; }),
          check("the norm is inf", [inf](const RunResult& r) { return r.get("norm") == inf; }),
      },
      {
          check("no square overflows", [](const RunResult& r) { return r.get("squares_inf") == 0; }),
          check("the norm matches fp64 within n*u(fp32), the bound for an fp32 sum of n terms",
                [](const RunResult& r) {
                  return std::isfinite(r.get("norm")) &&
                         r.get("norm_rel_error") <= r.get("activations") * unit_roundoff(fp32());
                }),
      },
      {
          // What both runs start from: the same activations, each of them a
          // finite fp16 value; only their squares can overflow.
          check("every activation fits fp16: the largest |x| is below fp16's max",
                [](const RunResult& r) { return r.get("largest_activation") < limits_of(fp16().spec).max; }),
      }};
}

}  // namespace mpt::ch01
