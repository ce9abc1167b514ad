// Chapter 01 — pitfall fp16-vs-bf16: fp16 against bf16: precision or range
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/formats/format.hpp (format_named, limits_of), mpt/formats/rounding.hpp
// (round_array); <cmath>, <cstddef>, <string>, <utility>, <vector>.
//
// The same tensor in both 16-bit formats. fp16 has 3 more significand bits,
// bf16 has fp32's exponent range: on a tensor with large values bf16 avoids
// the overflow, at the price of a larger rounding error.
#include <cmath>
#include <cstddef>
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
namespace fp16_vs_bf16 {

// ---------------------------------------------------------------------------
// The constants and the input.

/// The bf16 format (only this pitfall stores in it).
const Format& bf16() { return format_named("bf16"); }

/// A tensor with both needs: mostly values just above 1 (normalisation
/// gains, probabilities times a count, ... — where the digits after the
/// point matter) and some large values spread log-uniformly over three
/// decades starting at 1000 (unnormalised sums, logits before a softmax).
constexpr int kNearOne = 1024;  // values in [1, 1 + kNearOneWidth)
constexpr double kNearOneWidth = 0.125;
constexpr int kLarge = 256;  // |values| in [10^kLargeFrom, 10^(kLargeFrom + kLargeDecades))
constexpr double kLargeFrom = 3.0;
constexpr double kLargeDecades = 3.0;

std::vector<float> mixed_range_tensor() {
  Rng rng(0x01f16b16ULL);
  std::vector<float> x;
  for (int i = 0; i < kNearOne; ++i) x.push_back(static_cast<float>(1.0 + kNearOneWidth * rng.uniform()));
  for (int i = 0; i < kLarge; ++i)
    x.push_back(static_cast<float>(rng.sign() * std::pow(10.0, kLargeFrom + kLargeDecades * rng.uniform())));
  return x;
}

/// Measurements shared by both sides (defined after the runs).
RunResult range_precision_outcomes(const std::vector<float>& x, const std::vector<float>& y, const Format& f,
                                   std::string setup);

// ---------------------------------------------------------------------------
// The broken run.

RunResult fp16_vs_bf16_broken() {
  const std::vector<float> x = mixed_range_tensor();
  std::vector<float> y(x.size());
  //! [fp16-vs-bf16-broken]
  // Store the tensor in fp16: 11 significant bits, 5 exponent bits.
  round_array(x.data(), y.data(), x.size(), fp16());
  //! [fp16-vs-bf16-broken]
  return range_precision_outcomes(x, y, fp16(), "the mixed tensor stored in fp16");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult fp16_vs_bf16_fixed() {
  const std::vector<float> x = mixed_range_tensor();
  std::vector<float> y(x.size());
  //! [fp16-vs-bf16-fixed]
  // Store it in bf16: fp32's 8 exponent bits, only 8 significant bits.
  round_array(x.data(), y.data(), x.size(), bf16());
  //! [fp16-vs-bf16-fixed]
  return range_precision_outcomes(x, y, bf16(), "the same tensor stored in bf16");
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult range_precision_outcomes(const std::vector<float>& x, const std::vector<float>& y, const Format& f,
                                   std::string setup) {
  double overflows = 0, max_rel = 0, near_one_rel = 0, near_one = 0, largest = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    largest = std::fabs(xi) > largest ? std::fabs(xi) : largest;
    if (!std::isfinite(y[i])) {
      ++overflows;
      continue;
    }
    const double rel = std::fabs(y[i] - xi) / std::fabs(xi);
    max_rel = rel > max_rel ? rel : max_rel;
    if (std::fabs(xi) < 1 + kNearOneWidth) {
      near_one_rel += rel;
      ++near_one;
    }
  }
  const double u = unit_roundoff(f);
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"values", static_cast<double>(x.size()),
       std::to_string(kNearOne) + " values in [1, " + num(1 + kNearOneWidth) + "), " +
           std::to_string(kLarge) + " with |x| in [" + num(std::pow(10.0, kLargeFrom)) + ", " +
           num(std::pow(10.0, kLargeFrom + kLargeDecades)) + ")"},
      {"largest_input", largest, "largest |x| in the tensor"},
      {"format_max", limits_of(f.spec).max, "largest finite value of the format"},
      {"overflows", overflows, "values that became inf"},
      {"max_rel_error", max_rel, "largest relative rounding error among values that stayed finite"},
      {"mean_rel_error_near_one", near_one_rel / near_one, "mean relative error of the values near 1"},
      {"unit_roundoff", u, "the format's bound on that error, 2^-p"},
  };
  r.explanation = std::string(f.name) + " holds values up to " + num(limits_of(f.spec).max) +
                  " and rounds with relative error at most " + num(u) + ": " + num(overflows) + " of " +
                  num(static_cast<double>(x.size())) + " values overflowed, the rest are off by at most " +
                  num(max_rel) + ".";
  return r;
}

}  // namespace fp16_vs_bf16
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall fp16_vs_bf16_pitfall() {
  using namespace fp16_vs_bf16;
  const Limits l16 = limits_of(fp16().spec), lbf16 = limits_of(bf16().spec);
  return Pitfall{
      "fp16-vs-bf16",
      1,
      "fp16 against bf16: precision or range",
      "fp16 spends its bits on precision (" + std::to_string(l16.precision) + " significant bits, max " +
          num(l16.max) + ") and bf16 on range (fp32's exponent, " + std::to_string(lbf16.precision) +
          " significant bits): on a tensor with large values bf16 avoids the overflow, at the "
          "price of a larger rounding error (unit roundoff " +
          p2(lbf16.unit_roundoff) + " against " + p2(l16.unit_roundoff) + ").",
      fp16_vs_bf16_broken,
      fp16_vs_bf16_fixed,
      {
          check("some values overflow to inf", [](const RunResult& r) { return r.get("overflows") > 0; }),
          check("the values that fit are rounded within fp16's unit roundoff (fp16's strength)",
                [](const RunResult& r) { return r.get("max_rel_error") <= unit_roundoff(fp16()); }),
      },
      {
          check("no value overflows", [](const RunResult& r) { return r.get("overflows") == 0; }),
          check("the price: the worst relative error exceeds fp16's unit roundoff",
                [](const RunResult& r) { return r.get("max_rel_error") > unit_roundoff(fp16()); }),
      },
      {
          // Both formats round correctly; they differ in where they spend
          // their bits.
          check("every value that stayed finite is rounded within its format's unit roundoff",
                [](const RunResult& r) { return r.get("max_rel_error") <= r.get("unit_roundoff"); }),
      }};
}

}  // namespace mpt::ch01
