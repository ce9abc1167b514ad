// Chapter 01 — floating-point formats and their limits: the chapter's pitfalls.
// Depends on: mpt/format.hpp, mpt/rounding.hpp (all rounding goes through
// mpt::round_value), mpt/pitfall.hpp, and chapters.hpp (the declaration).
//
// Arithmetic follows what a GPU does: every operation is an
// fp32 operation, and a value is rounded to fp16/bf16 exactly where a GPU
// would store it in that format. The `//! [id-broken]` / `//! [id-fixed]`
// markers delimit the code the chapter text shows through Doxygen \snippet.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "chapters.hpp"
#include "mpt/formats/explain.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/formats/rounding.hpp"

namespace mpt {
namespace {

// ---------------------------------------------------------------------------
// Small tools shared by the runs.

const Format& fp16() { return format_named("fp16"); }
const Format& bf16() { return format_named("bf16"); }
const Format& fp32() { return format_named("fp32"); }

/// Unit roundoff u = 2^-p of a format: the largest relative error of one
/// round-to-nearest. Tolerances below are multiples of it, never typed in.
double unit_roundoff(const Format& f) { return limits_of(f.spec).unit_roundoff; }

/// The spacing of f's values around |x|: 2^(max(e, emin) - mantissa_bits)
/// where 2^e <= |x| < 2^(e+1). Below the normal range the spacing stays at
/// the subnormal quantum.
double ulp_in(const Format& f, double x) {
  const Limits l = limits_of(f.spec);
  int e = l.emin;
  if (x != 0.0) {
    int k = 0;
    std::frexp(std::fabs(x), &k);  // |x| = m * 2^k with m in [0.5, 1)
    e = k - 1 > l.emin ? k - 1 : l.emin;
  }
  return std::ldexp(1.0, e - f.spec.mantissa_bits);
}

/// A number for generated text: up to 8 significant digits, so exact binary
/// values (0.03125) print exactly and long ones stay readable.
std::string num(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.8g", v);
  return buf;
}
/// An fp32 value: the shortest decimal that reads back as the same float
/// (0.01f prints as 0.01, not as its 8-digit expansion).
std::string num(float v) { return shortest_decimal(v); }

/// Deterministic random numbers that are the same on every platform.
/// std::mt19937_64's output sequence is fixed by the C++ standard, but the
/// std:: distributions are not (libstdc++ and libc++ differ), so the two
/// distributions used here are written out.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : engine_(seed) {}
  /// Uniform in [0, 1): the top 53 bits of one draw, scaled by 2^-53.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1p-53; }
  /// Standard normal by Box–Muller (one of the pair; the other is dropped to
  /// keep each call independent of the previous one).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]: log(u1) is finite
    const double u2 = uniform();
    const double two_pi = 6.283185307179586476925286766559;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2);
  }
  /// +1 or -1 with equal probability.
  double sign() { return (engine_() >> 63) ? -1.0 : 1.0; }

 private:
  std::mt19937_64 engine_;
};

/// Standard normal cumulative distribution function.
double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

// ---------------------------------------------------------------------------
// 1. fp16-overflow: the sum of squares of fp16 activations (the L2 norm, or
// a variance) overflows although every activation fits comfortably.

/// Activations of a layer whose outputs have drifted to magnitudes in the
/// hundreds (a residual stream without normalisation does this as depth
/// grows): N(0, sigma^2), stored in fp16. Each value is far below fp16's
/// max; only the squares are not.
constexpr std::size_t kActivations = 4096;
constexpr double kActivationSigma = 100.0;

std::vector<float> large_activations() {
  Rng rng(0x01f16a11ULL);
  std::vector<float> x(kActivations);
  for (float& v : x)
    v = round_value(static_cast<float>(kActivationSigma * rng.normal()), fp16());
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

/// Measurements shared by both sides of fp16-overflow. `compute` is the
/// format the squares and the norm are stored in.
RunResult overflow_outcomes(const std::vector<float>& x, const std::vector<float>& squares,
                            float norm, const Format& compute, std::string setup) {
  // The reference: the same fp16 inputs, squared and summed in fp64.
  double ref_sum = 0.0;
  for (float v : x) ref_sum += static_cast<double>(v) * v;
  const double ref_norm = std::sqrt(ref_sum);

  const double smallest_overflowing = smallest_overflowing_square(compute);
  double inputs_at_or_above = 0, squares_inf = 0;
  for (float v : x) inputs_at_or_above += std::fabs(v) >= smallest_overflowing;
  for (float s : squares) squares_inf += std::isinf(s);

  const double rel_error = std::isfinite(norm) ? std::fabs(norm - ref_norm) / ref_norm
                                               : std::numeric_limits<double>::infinity();
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"max_finite", limits_of(compute.spec).max, "largest finite value of the compute format"},
      {"rounded_65520", round_value(65520.0f, compute), "65520 rounded to the compute format"},
      {"smallest_overflowing_input", smallest_overflowing,
       "smallest fp16 x whose square overflows the compute format (inf: none)"},
      {"activations", static_cast<double>(x.size()),
       "fp16 activations, N(0, " + num(kActivationSigma) + "^2)"},
      {"inputs_overflowing_when_squared", inputs_at_or_above,
       "activations at or above that smallest overflowing input"},
      {"squares_inf", squares_inf, "squares that became inf"},
      {"norm", norm, "L2 norm as computed"},
      {"norm_fp64", ref_norm, "L2 norm of the same inputs in fp64"},
      {"norm_rel_error", rel_error, "|norm - norm_fp64| / norm_fp64"},
  };
  // Round-to-nearest keeps a value up to max + ulp(max)/2 (exclusive) finite.
  const double max = limits_of(compute.spec).max;
  const double overflow_from = max + ulp_in(compute, max) / 2;
  float largest_square = 0.0f;
  for (float s : squares) largest_square = s > largest_square ? s : largest_square;
  r.explanation =
      std::isfinite(norm)
          ? "In " + std::string(compute.name) + " the largest square, " + num(largest_square) +
                ", and the sum of squares, " + num(ref_sum) + ", are far below the max " +
                num(max) + "; the norm is off by " + num(rel_error) + " relative, fp32 rounding."
          : std::string(compute.name) + "'s max is " + num(max) + " and everything from " + num(overflow_from) +
                " up rounds to inf, so any activation with |x| >= " + num(smallest_overflowing) +
                " has an inf square (" + num(smallest_overflowing) + "^2 = " +
                num(smallest_overflowing * smallest_overflowing) + "); " + num(squares_inf) +
                " of " + num(static_cast<double>(x.size())) +
                " squares did, so the sum and the norm are inf.";
  return r;
}

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
  return overflow_outcomes(x, squares, norm, fp16(),
                           std::to_string(kActivations) +
                               " fp16 activations; squares stored in fp16, summed in fp32, "
                               "norm stored in fp16");
}

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
  return overflow_outcomes(x, squares, norm, fp32(),
                           "the same fp16 activations; squares, sum and norm in fp32");
}

// ---------------------------------------------------------------------------
// 2. fp16-lost-update: a weight stored in fp16 ignores every update smaller
// than half its ulp.

constexpr int kUpdateSteps = 10000;
// lr * grad is 1e-4 in fp32: the size of a late-training SGD step on one
// weight (lr 1e-4, gradient -1 so the weight grows towards 2).
constexpr float kLearningRate = 1e-4f;
constexpr float kGradient = -1.0f;

RunResult lost_update_outcomes(double final_weight, double final_fp16_copy, double changed,
                               const Format& storage, std::string setup) {
  const float update = -kLearningRate * kGradient;  // the fp32 step size both runs apply
  const double expected = 1.0 + kUpdateSteps * static_cast<double>(update);
  const double half_ulp_of_one = limits_of(storage.spec).epsilon / 2;
  const double rel_error = std::fabs(final_weight - expected) / expected;
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"steps", static_cast<double>(kUpdateSteps), "optimizer steps"},
      {"update", update, "lr * |grad| added each step (fp32)"},
      {"half_ulp_of_one", half_ulp_of_one,
       "half the spacing at 1.0 in the weight's storage format (epsilon/2)"},
      {"steps_that_changed_weight", changed, "steps after which the stored weight differed"},
      {"final_weight", final_weight, "the stored weight after the last step"},
      {"final_fp16_copy", final_fp16_copy, "the fp16 weight the next forward pass would use"},
      {"expected_weight", expected, "1 + steps * update, in fp64"},
      {"rel_error", rel_error, "|final_weight - expected| / expected"},
  };
  r.explanation =
      static_cast<double>(update) <= half_ulp_of_one
          ? "In " + std::string(storage.name) + " the neighbours of 1.0 are " +
                num(half_ulp_of_one * 2) + " apart; an update of " + num(update) +
                " is below half of that (" + num(half_ulp_of_one) +
                "), so 1.0 + update rounds back to 1.0 on every step."
          : "The update " + num(update) + " is far above half the " +
                std::string(storage.name) + " spacing at 1.0 (" + num(half_ulp_of_one) +
                "), so every step lands; what remains, " + num(rel_error) +
                " relative, is fp32 rounding accumulated over the steps.";
  return r;
}

RunResult fp16_lost_update_broken() {
  double changed = 0;
  //! [fp16-lost-update-broken]
  // The weight lives in fp16 and the optimizer writes it back in fp16.
  float w = round_value(1.0f, fp16());
  for (int step = 0; step < kUpdateSteps; ++step) {
    const float updated = w - kLearningRate * kGradient;  // fp32 arithmetic
    const float stored = round_value(updated, fp16());    // stored in fp16
    changed += stored != w;
    w = stored;
  }
  //! [fp16-lost-update-broken]
  return lost_update_outcomes(w, w, changed, fp16(),
                              "weight 1.0 stored in fp16; " + std::to_string(kUpdateSteps) +
                                  " steps of w -= lr*grad (fp32 math, result rounded to fp16)");
}

RunResult fp16_lost_update_fixed() {
  double changed = 0;
  float w16 = 0.0f;
  //! [fp16-lost-update-fixed]
  // The optimizer updates an fp32 master copy; the fp16 weight is only a
  // copy of it, refreshed after every step for the next forward pass.
  float master = 1.0f;
  for (int step = 0; step < kUpdateSteps; ++step) {
    const float updated = master - kLearningRate * kGradient;  // fp32, stays fp32
    changed += updated != master;
    master = updated;
    w16 = round_value(master, fp16());
  }
  //! [fp16-lost-update-fixed]
  return lost_update_outcomes(master, w16, changed, fp32(),
                              "fp32 master weight 1.0; " + std::to_string(kUpdateSteps) +
                                  " steps of master -= lr*grad; fp16 copy taken after each step");
}

// ---------------------------------------------------------------------------
// 3. fp16-sum-stagnation: an fp16 accumulator stops growing once half its
// spacing exceeds the addend.

constexpr int kSumSteps = 10000;
constexpr float kSumValue = 0.01f;  // before rounding: what the tensor was meant to hold

RunResult stagnation_outcomes(float addend, double sum, double stalled, double first_stall,
                              const Format& accumulator, std::string setup) {
  const double expected = kSumSteps * static_cast<double>(addend);
  const double ulp = ulp_in(accumulator, sum);
  const double rel_error = std::fabs(sum - expected) / expected;
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"addend", addend, "fp16(" + num(kSumValue) + "): the value actually added"},
      {"steps", static_cast<double>(kSumSteps), "number of additions"},
      {"final_sum", sum, "the accumulator at the end (where it stalled, if it did)"},
      {"expected_sum", expected, "steps * addend, in fp64"},
      {"rel_error", rel_error, "|final_sum - expected_sum| / expected_sum"},
      {"stalled_adds", stalled, "additions that left the accumulator unchanged"},
      {"first_stalled_step", first_stall, "first such addition, counting from 1 (0: none)"},
      {"ulp_at_final", ulp, "spacing of the accumulator format at final_sum"},
      {"half_ulp_at_final", ulp / 2, "half that spacing: smaller addends round away"},
  };
  r.explanation =
      stalled > 0
          ? "From step " + num(first_stall) + " on, the sum stays at " + num(sum) + ": there the " +
                std::string(accumulator.name) + " spacing is " + num(ulp) + ", half of it (" +
                num(ulp / 2) + ") is more than the addend " + num(addend) +
                ", so sum + addend rounds back to sum."
          : "The " + std::string(accumulator.name) + " spacing at " + num(sum) + " is " + num(ulp) +
                ", far below the addend " + num(addend) +
                ", so every addition counts (relative error vs fp64: " + num(rel_error) + ").";
  return r;
}

RunResult fp16_sum_stagnation_broken() {
  // The values come from an fp16 tensor, so the addend is fp16(0.01).
  const float addend = round_value(kSumValue, fp16());
  double stalled = 0, first_stall = 0;
  //! [fp16-sum-stagnation-broken]
  // An fp16 accumulator: each add is an fp32 add of two fp16 values whose
  // result is rounded back to fp16.
  float sum = 0.0f;
  for (int i = 0; i < kSumSteps; ++i) {
    const float next = round_value(sum + addend, fp16());
    if (next == sum && stalled++ == 0) first_stall = i + 1;
    sum = next;
  }
  //! [fp16-sum-stagnation-broken]
  return stagnation_outcomes(addend, sum, stalled, first_stall, fp16(),
                             "sum fp16(" + num(kSumValue) + ") " + std::to_string(kSumSteps) +
                                 " times in an fp16 accumulator (rounded after every add)");
}

RunResult fp16_sum_stagnation_fixed() {
  const float addend = round_value(kSumValue, fp16());
  double stalled = 0, first_stall = 0;
  //! [fp16-sum-stagnation-fixed]
  // Same fp16 inputs, fp32 accumulator (what tensor cores and GPU
  // reductions use): the sum is never rounded to fp16 along the way.
  float sum = 0.0f;
  for (int i = 0; i < kSumSteps; ++i) {
    const float next = sum + addend;
    if (next == sum && stalled++ == 0) first_stall = i + 1;
    sum = next;
  }
  //! [fp16-sum-stagnation-fixed]
  return stagnation_outcomes(addend, sum, stalled, first_stall, fp32(),
                             "sum the same fp16(" + num(kSumValue) + ") " +
                                 std::to_string(kSumSteps) + " times in an fp32 accumulator");
}

// ---------------------------------------------------------------------------
// 4. fp16-gradient-underflow: small gradients flush to zero in fp16; a loss
// scale moves them into range (chapter 2 makes the scale dynamic).

// Gradient magnitudes are log-normal: 10^N(mu, sigma^2) with random signs.
// Histograms of activation gradients on a log axis are bell-shaped and
// spread over many decades, with much of their mass below fp16's normal
// range (Micikevicius et al., "Mixed Precision Training", ICLR 2018, Fig. 3,
// which motivates loss scaling with exactly this picture). mu = -6.5 and
// sigma = 1.2 decades put the bell across fp16's subnormal floor 2^-24
// (about 10^-7.2), the situation that paper describes.
constexpr double kGradLog10Mean = -6.5;
constexpr double kGradLog10Sigma = 1.2;
constexpr std::size_t kGradients = std::size_t{1} << 16;

std::vector<float> lognormal_gradients() {
  Rng rng(0x01f16d0eULL);
  std::vector<float> g(kGradients);
  for (float& v : g)
    v = static_cast<float>(rng.sign() *
                           std::pow(10.0, kGradLog10Mean + kGradLog10Sigma * rng.normal()));
  return g;
}

RunResult underflow_outcomes(const std::vector<float>& g, const std::vector<float>& stored,
                             const std::vector<float>& recovered, float scale, std::string setup) {
  const Limits l16 = limits_of(fp16().spec);
  double flushed = 0, subnormal = 0, sum_rel = 0, ref_sq = 0, got_sq = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double a = std::fabs(static_cast<double>(stored[i]));
    flushed += a == 0.0 && g[i] != 0.0f;
    subnormal += a > 0.0 && a < l16.min_normal;
    sum_rel += std::fabs(static_cast<double>(recovered[i]) - g[i]) / std::fabs(g[i]);
    ref_sq += static_cast<double>(g[i]) * g[i];
    got_sq += static_cast<double>(recovered[i]) * recovered[i];
  }
  const double n = static_cast<double>(g.size());
  // Round-to-nearest sends |x| <= min_subnormal / 2 to zero (the tie goes to
  // the even neighbour, 0). Divided by the scale: the gradient magnitude at
  // or below which a gradient is lost.
  const double threshold = l16.min_subnormal / 2 / scale;
  const double predicted =
      normal_cdf((std::log10(threshold) - kGradLog10Mean) / kGradLog10Sigma);
  const double ref_norm = std::sqrt(ref_sq);
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"gradients", n,
       "gradient values, |g| = 10^N(" + num(kGradLog10Mean) + ", " + num(kGradLog10Sigma) +
           "^2), random signs"},
      {"loss_scale", scale, "factor applied before the fp16 cast (1: none)"},
      {"flush_threshold", threshold, "|g| at or below this becomes 0 in fp16"},
      {"predicted_flushed_fraction", predicted, "P(|g| < threshold) under the log-normal model"},
      {"flushed_fraction", flushed / n, "nonzero gradients that became exactly 0"},
      {"subnormal_fraction", subnormal / n,
       "gradients stored as fp16 subnormals (fewer significant bits)"},
      {"mean_rel_error", sum_rel / n, "mean over elements of |g~ - g| / |g| (vs fp64)"},
      // Reported, not checked: the norm is dominated by the largest
      // gradients, so it barely notices the small ones vanishing.
      {"norm_rel_error", std::fabs(std::sqrt(got_sq) - ref_norm) / ref_norm,
       "relative error of the gradient's L2 norm (vs fp64)"},
  };
  r.explanation =
      "fp16's smallest subnormal is " + num(l16.min_subnormal) + "; with a loss scale of " +
      num(scale) + " every gradient with |g| <= " + num(threshold) + " rounds to zero (" +
      num(flushed / n) + " of them; the log-normal model predicts " + num(predicted) + "), and " +
      num(subnormal / n) + " land below the smallest normal " + num(l16.min_normal) +
      " with fewer significant bits.";
  return r;
}

RunResult fp16_gradient_underflow_broken() {
  const std::vector<float> g = lognormal_gradients();  // fp32 gradients
  std::vector<float> stored(g.size()), recovered(g.size());
  //! [fp16-gradient-underflow-broken]
  // The backward pass stores its gradients in fp16: a plain cast.
  round_array(g.data(), stored.data(), g.size(), fp16());
  for (std::size_t i = 0; i < g.size(); ++i) recovered[i] = stored[i];
  //! [fp16-gradient-underflow-broken]
  return underflow_outcomes(g, stored, recovered, 1.0f,
                            std::to_string(kGradients) + " fp32 gradients cast to fp16, no scaling");
}

RunResult fp16_gradient_underflow_fixed() {
  const std::vector<float> g = lognormal_gradients();
  std::vector<float> stored(g.size()), recovered(g.size());
  //! [fp16-gradient-underflow-fixed]
  // Multiply by a power of two before the cast (in training: scale the loss,
  // and the chain rule scales every gradient), divide after, in fp32. Powers
  // of two change only the exponent, so scaling and unscaling are exact.
  // The scale is the largest power of two that keeps max|g| * scale within
  // fp16's max — the most room that does not overflow.
  float max_abs = 0.0f;
  for (float v : g) max_abs = std::fabs(v) > max_abs ? std::fabs(v) : max_abs;
  const double fp16_max = limits_of(fp16().spec).max;
  float scale = std::ldexp(1.0f, std::ilogb(fp16_max / max_abs));
  while (static_cast<double>(max_abs) * scale > fp16_max) scale /= 2;
  for (std::size_t i = 0; i < g.size(); ++i) stored[i] = round_value(g[i] * scale, fp16());
  for (std::size_t i = 0; i < g.size(); ++i) recovered[i] = stored[i] / scale;  // fp32 unscale
  //! [fp16-gradient-underflow-fixed]
  return underflow_outcomes(g, stored, recovered, scale,
                            "the same gradients times a power-of-two loss scale, cast to fp16, "
                            "unscaled in fp32");
}

// ---------------------------------------------------------------------------
// 5. fp16-vs-bf16: the same tensor in both 16-bit formats. fp16 has 3 more
// significand bits, bf16 has fp32's exponent range.

/// A tensor with both needs: mostly values just above 1 (normalisation
/// gains, probabilities times a count, ... — where the digits after the
/// point matter) and some large values spread log-uniformly over three
/// decades starting at 1000 (unnormalised sums, logits before a softmax).
constexpr int kNearOne = 1024;          // values in [1, 1 + kNearOneWidth)
constexpr double kNearOneWidth = 0.125;
constexpr int kLarge = 256;             // |values| in [10^kLargeFrom, 10^(kLargeFrom + kLargeDecades))
constexpr double kLargeFrom = 3.0;
constexpr double kLargeDecades = 3.0;

std::vector<float> mixed_range_tensor() {
  Rng rng(0x01f16b16ULL);
  std::vector<float> x;
  for (int i = 0; i < kNearOne; ++i)
    x.push_back(static_cast<float>(1.0 + kNearOneWidth * rng.uniform()));
  for (int i = 0; i < kLarge; ++i)
    x.push_back(static_cast<float>(rng.sign() *
                                   std::pow(10.0, kLargeFrom + kLargeDecades * rng.uniform())));
  return x;
}

RunResult range_precision_outcomes(const std::vector<float>& x, const std::vector<float>& y,
                                   const Format& f, std::string setup) {
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
                  " and rounds with relative error at most " + num(u) + ": " + num(overflows) +
                  " of " + num(static_cast<double>(x.size())) +
                  " values overflowed, the rest are off by at most " + num(max_rel) + ".";
  return r;
}

RunResult fp16_vs_bf16_broken() {
  const std::vector<float> x = mixed_range_tensor();
  std::vector<float> y(x.size());
  //! [fp16-vs-bf16-broken]
  // Store the tensor in fp16: 11 significant bits, 5 exponent bits.
  round_array(x.data(), y.data(), x.size(), fp16());
  //! [fp16-vs-bf16-broken]
  return range_precision_outcomes(x, y, fp16(), "the mixed tensor stored in fp16");
}

RunResult fp16_vs_bf16_fixed() {
  const std::vector<float> x = mixed_range_tensor();
  std::vector<float> y(x.size());
  //! [fp16-vs-bf16-fixed]
  // Store it in bf16: fp32's 8 exponent bits, only 8 significant bits.
  round_array(x.data(), y.data(), x.size(), bf16());
  //! [fp16-vs-bf16-fixed]
  return range_precision_outcomes(x, y, bf16(), "the same tensor stored in bf16");
}

// Check helpers: each reads outcomes by name, so a renamed outcome makes
// the check fail loudly instead of silently passing.
Check check(std::string claim, std::function<bool(const RunResult&)> holds) {
  return Check{std::move(claim), std::move(holds)};
}

}  // namespace

void register_chapter01_pitfalls(Registry& registry) {
  const double inf = std::numeric_limits<double>::infinity();
  // The mechanisms quote the formats' limits; they are computed, like
  // everything the CLI prints.
  const Limits l16 = limits_of(fp16().spec), lbf16 = limits_of(bf16().spec);
  const auto p2 = [](double x) { return power_of_two_or_decimal(x); };

  registry.add(Pitfall{
      "fp16-overflow", 1, "fp16 overflow: squares of large activations",
      "fp16's largest finite value is " + num(l16.max) + " and everything from " +
          num(l16.max + ulp_in(fp16(), l16.max) / 2) +
          " up rounds to inf, so squaring any fp16 value of magnitude " +
          num(smallest_overflowing_square(fp16())) +
          " or more overflows, and a norm or variance computed in fp16 becomes inf.",
      fp16_overflow_broken, fp16_overflow_fixed,
      {
          check("the compute format's largest finite value is 65504",
                [](const RunResult& r) { return r.get("max_finite") == 65504.0; }),
          check("65520 rounds to inf",
                [inf](const RunResult& r) { return r.get("rounded_65520") == inf; }),
          check("squaring overflows from |x| = 256 on",
                [](const RunResult& r) { return r.get("smallest_overflowing_input") == 256.0; }),
          check("every activation with |x| >= 256 has an inf square, and there are some",
                [](const RunResult& r) {
                  return r.get("squares_inf") > 0 &&
                         r.get("squares_inf") == r.get("inputs_overflowing_when_squared");
                }),
          check("the norm is inf", [inf](const RunResult& r) { return r.get("norm") == inf; }),
      },
      {
          check("no square overflows", [](const RunResult& r) { return r.get("squares_inf") == 0; }),
          check("65520 stays finite",
                [](const RunResult& r) { return std::isfinite(r.get("rounded_65520")); }),
          check("the norm matches fp64 within n*u(fp32), the bound for an fp32 sum of n terms",
                [](const RunResult& r) {
                  return std::isfinite(r.get("norm")) &&
                         r.get("norm_rel_error") <= r.get("activations") * unit_roundoff(fp32());
                }),
      }});

  registry.add(Pitfall{
      "fp16-lost-update", 1, "lost updates: an fp16 weight ignores small steps",
      "A weight of 1.0 stored in fp16 has neighbours " + p2(l16.epsilon) +
          " apart, so an update smaller than half of that (" + p2(l16.epsilon / 2) +
          ") rounds away on every step and the weight never moves; an fp32 master copy keeps "
          "every update.",
      fp16_lost_update_broken, fp16_lost_update_fixed,
      {
          check("the update is at most half the spacing at 1.0",
                [](const RunResult& r) { return r.get("update") <= r.get("half_ulp_of_one"); }),
          check("no step changed the weight",
                [](const RunResult& r) { return r.get("steps_that_changed_weight") == 0; }),
          check("the weight is still exactly 1.0",
                [](const RunResult& r) { return r.get("final_weight") == 1.0; }),
      },
      {
          check("every step changed the weight",
                [](const RunResult& r) {
                  return r.get("steps_that_changed_weight") == r.get("steps");
                }),
          check("the final weight matches 1 + steps*update within steps*u(fp32)",
                [](const RunResult& r) {
                  return r.get("rel_error") <= r.get("steps") * unit_roundoff(fp32());
                }),
          check("the fp16 copy the model uses moved too",
                [](const RunResult& r) { return r.get("final_fp16_copy") > 1.0; }),
      }});

  registry.add(Pitfall{
      "fp16-sum-stagnation", 1, "stagnating sum: an fp16 accumulator stops growing",
      "An fp16 accumulator rounds after every add; once half the fp16 spacing at the running "
      "sum exceeds the addend, sum + addend rounds back to sum and the sum stalls for good.",
      fp16_sum_stagnation_broken, fp16_sum_stagnation_fixed,
      {
          check("the sum stalls below half the expected value",
                [](const RunResult& r) {
                  return r.get("final_sum") < 0.5 * r.get("expected_sum");
                }),
          check("additions stopped changing the sum, and never resumed",
                [](const RunResult& r) {
                  return r.get("stalled_adds") > 0 &&
                         r.get("stalled_adds") == r.get("steps") - r.get("first_stalled_step") + 1;
                }),
          check("at the stall, half an ulp is at least the addend",
                [](const RunResult& r) {
                  return r.get("half_ulp_at_final") >= r.get("addend");
                }),
      },
      {
          check("no addition was lost",
                [](const RunResult& r) { return r.get("stalled_adds") == 0; }),
          check("the sum matches steps*addend within steps*u(fp32)",
                [](const RunResult& r) {
                  return r.get("rel_error") <= r.get("steps") * unit_roundoff(fp32());
                }),
      }});

  registry.add(Pitfall{
      "fp16-gradient-underflow", 1, "gradient underflow: small gradients flush to zero",
      "fp16's smallest subnormal is " + p2(l16.min_subnormal) + ", so gradients of magnitude " +
          p2(l16.min_subnormal / 2) + " or less round to zero and those below " +
          p2(l16.min_normal) +
          " keep fewer significant bits; multiplying by a power-of-two loss scale before the "
          "cast and dividing after (in fp32) moves them into range.",
      fp16_gradient_underflow_broken, fp16_gradient_underflow_fixed,
      {
          check("more than 5% of the gradients become exactly zero",
                [](const RunResult& r) { return r.get("flushed_fraction") > 0.05; }),
          check("the flushed fraction is what the log-normal model predicts (within 4 standard "
                "errors)",
                [](const RunResult& r) {
                  const double p = r.get("predicted_flushed_fraction");
                  const double se = std::sqrt(p * (1 - p) / r.get("gradients"));
                  return std::fabs(r.get("flushed_fraction") - p) <= 4 * se;
                }),
          check("most gradients that survive are subnormal (fewer significant bits)",
                [](const RunResult& r) { return r.get("subnormal_fraction") > 0.5; }),
          check("underflow, not rounding, dominates: the mean relative error per gradient is "
                "over 100 times fp16's unit roundoff",
                [](const RunResult& r) {
                  return r.get("mean_rel_error") > 100 * unit_roundoff(fp16());
                }),
      },
      {
          check("fewer than 0.1% of the gradients become zero",
                [](const RunResult& r) { return r.get("flushed_fraction") < 0.001; }),
          check("the mean relative error per gradient is within fp16's unit roundoff",
                [](const RunResult& r) {
                  return r.get("mean_rel_error") <= unit_roundoff(fp16());
                }),
      }});

  registry.add(Pitfall{
      "fp16-vs-bf16", 1, "fp16 against bf16: precision or range",
      "fp16 spends its bits on precision (" + std::to_string(l16.precision) +
          " significant bits, max " + num(l16.max) + ") and bf16 on range (fp32's exponent, " +
          std::to_string(lbf16.precision) +
          " significant bits): on a tensor with large values bf16 avoids the overflow, at the "
          "price of a larger rounding error (unit roundoff " + p2(lbf16.unit_roundoff) +
          " against " + p2(l16.unit_roundoff) + ").",
      fp16_vs_bf16_broken, fp16_vs_bf16_fixed,
      {
          check("some values overflow to inf",
                [](const RunResult& r) { return r.get("overflows") > 0; }),
          check("the values that fit are rounded within fp16's unit roundoff (fp16's strength)",
                [](const RunResult& r) {
                  return r.get("max_rel_error") <= unit_roundoff(fp16());
                }),
      },
      {
          check("no value overflows", [](const RunResult& r) { return r.get("overflows") == 0; }),
          check("the price: the worst relative error exceeds fp16's unit roundoff",
                [](const RunResult& r) { return r.get("max_rel_error") > unit_roundoff(fp16()); }),
          check("and stays within the format's own unit roundoff",
                [](const RunResult& r) { return r.get("max_rel_error") <= r.get("unit_roundoff"); }),
      }});
}

}  // namespace mpt
