// Chapter 04 — exercises: what every grader test file shares, instructors' hidden tests included.
// Depends on: doctest, grader_kit.hpp, ex04.hpp, mpt (softmax_math.hpp,
// attention_math.hpp, dtype.hpp, format_spec.hpp).
// The exercise list, the reference answers (mpt is the oracle: its two-pass
// (max, sum), online add and merge, cross-entropy backward row and the
// softmax of an attention row, all in double), the error scales and the
// kit's helpers.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ex04.hpp"
#include "grader_kit.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/formats/format_spec.hpp"
#include "mpt/nn/layers/attention_math.hpp"
#include "mpt/nn/layers/softmax_math.hpp"

namespace mpt::ex04::grading {

// ---- the exercises --------------------------------------------------------
// A test case belongs to an exercise through its doctest test suite,
// "exercise-" + id; each test case that passes scores its exercise's points
// per test case (the last number below): 2 for a behaviour to write, 3 for
// one of the diagnose exercise, and 1 for the test cases whose name ends
// "[1 point]", details next to the rest (+inf and NaN, a single logit,
// empty operands, ignore_index). The kit's grader main (grader_main.cpp)
// reads this list as exercise_kit::kChapter.

using exercise_kit::Exercise;
using exercise_kit::Kind;

inline constexpr Exercise kExercises[] = {
    {"4.1", "a stable log-sum-exp of a row of floats", Kind::write, 2},
    {"4.2", "the online (max, sum) of a softmax: add a logit, merge two states", Kind::write, 2},
    {"4.3", "the fused backward of softmax cross-entropy with label smoothing", Kind::write, 2},
    {"4.4", "an attention row's masked softmax on fp16 scores", Kind::diagnose, 3},
};

using exercise_kit::bits_of;
using exercise_kit::describe;
using exercise_kit::float_of;
using exercise_kit::Mismatches;

/// FP32's machine epsilon, 2^-23: the unit the tolerances are stated in.
inline constexpr double kFloatEpsilon = 0x1p-23;
/// +inf in float, for writing rows.
inline constexpr float kInf = std::numeric_limits<float>::infinity();
/// A quiet NaN in float, for writing rows.
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

/// A double to 6 significant digits, for errors and ratios.
inline std::string short_number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

/// "{1, 2.5, -inf}", or "{1, 2, ... (4096 logits)}" for a long row.
inline std::string describe_row(const std::vector<float>& z) {
  std::string s = "{";
  const std::size_t shown = std::min<std::size_t>(z.size(), 6);
  for (std::size_t j = 0; j < shown; ++j) s += (j ? ", " : "") + short_number(z[j]);
  if (shown < z.size()) s += ", ... (" + std::to_string(z.size()) + " logits)";
  return s + "}";
}

/// Seeded logits: mean + sd·N(0, 1), stored as float.
inline std::vector<float> normal_row(std::uint32_t seed, std::size_t n, double mean, double sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(mean, sd);
  std::vector<float> z(n);
  for (float& v : z) v = static_cast<float>(normal(rng));
  return z;
}

// ---- log-sum-exp (exercise 4.1) -------------------------------------------------

/// Exercise 4.1's answer on finite rows (−inf allowed): mpt's two-pass (max,
/// sum) in double over the floats widened, then max + log(sum). The special
/// values (+inf, NaN) are graded against torch.logsumexp's rules written out
/// in the test file, not against this.
inline double reference_lse(const std::vector<float>& z) {
  const mpt::MaxSum<double> s = mpt::row_max_sum<double>(
      [&z](std::int64_t j) { return static_cast<double>(z[static_cast<std::size_t>(j)]); },
      static_cast<std::int64_t>(z.size()));
  return mpt::log_sum_exp(s);
}

/// 4.1's tolerance for rows of up to 4096 logits, in float epsilons of
/// 1 + |answer|: the float result is max + log(sum), each step rounded once,
/// and a float sum of a few thousand terms >= 1 is off by a few epsilons.
/// Measured over every row the tests grade: the solution (a sum in double)
/// 0.3 epsilons, a float sum left to right 1.7; an fp16 accumulator misses
/// by 1.8e4 epsilons, bf16 by 1.4e5.
inline constexpr double kLseTolerance = 8 * kFloatEpsilon;
/// 4.1's tolerance for the rows of 2^16 to 2^20 logits (of 1 + |answer|):
/// a float sum's rounding errors grow with the row. Measured: a sum in
/// double 2.1e-8, a float sum left to right 2.0e-6; an fp16 accumulator
/// misses by 0.5, bf16 by 0.67.
inline constexpr double kLongLseTolerance = 2e-5;

/// Grades one row of 4.1 against the reference within `tolerance` of
/// 1 + |answer|; adds one line to `m` for a wrong answer.
inline void expect_lse(Mismatches& m, const std::vector<float>& z, double tolerance, const std::string& why) {
  m.checked();
  const double want = reference_lse(z);
  const float got = stable_log_sum_exp(z.data(), static_cast<std::int64_t>(z.size()));
  const double error = std::fabs(static_cast<double>(got) - want) / (1.0 + std::fabs(want));
  if (error <= tolerance || !m.wrong()) return;  // NaN fails the comparison
  m.detail(why + ": log-sum-exp of " + describe_row(z) + " gave " + describe(got) + ", expected " +
           describe(want) + " (error " + short_number(error) + " of 1 + |answer|, allowed " +
           short_number(tolerance) + ")");
}

/// Grades one row of 4.1 whose answer is a float known exactly (an
/// infinity, NaN, a single logit): the same value, NaN for NaN.
inline void expect_lse_exactly(Mismatches& m, const std::vector<float>& z, float want,
                               const std::string& why) {
  m.checked();
  const float got = stable_log_sum_exp(z.data(), static_cast<std::int64_t>(z.size()));
  const bool same = std::isnan(want) ? std::isnan(got) : bits_of(got) == bits_of(want) || got == want;
  if (same || !m.wrong()) return;
  m.detail(why + ": log-sum-exp of " + describe_row(z) + " gave " + describe(got) + ", expected exactly " +
           describe(want));
}

// ---- the online (max, sum) (exercise 4.2) ---------------------------------------

/// "{max 2 (0x40000000 = 0x1p+1), sum 1.5 (...)}"
inline std::string describe(const OnlineSoftmax& s) {
  return "{max " + describe(s.max) + ", sum " + describe(s.sum) + "}";
}

/// "{max 2, sum 1.5}" with 17 digits.
inline std::string describe(const mpt::MaxSum<double>& s) {
  return "{max " + describe(s.max) + ", sum " + describe(s.sum) + "}";
}

/// A float state widened to mpt's, exactly.
inline mpt::MaxSum<double> widened(const OnlineSoftmax& s) {
  mpt::MaxSum<double> w;
  w.max = s.max;
  w.sum = s.sum;
  return w;
}

/// 4.2's answer to one add: mpt's max_sum_add in double on the float operands.
inline mpt::MaxSum<double> reference_add(const OnlineSoftmax& s, float z) {
  mpt::MaxSum<double> w = widened(s);
  mpt::max_sum_add(w, static_cast<double>(z));
  return w;
}

/// 4.2's answer to one merge: mpt's max_sum_merge in double.
inline mpt::MaxSum<double> reference_merge(const OnlineSoftmax& a, const OnlineSoftmax& b) {
  return mpt::max_sum_merge(widened(a), widened(b));
}

/// The (max, sum) of a whole set in double by two passes (the maximum, then
/// Σ exp(z − max)): what every fold and tree must agree with.
inline mpt::MaxSum<double> two_pass(const std::vector<float>& z) {
  return mpt::row_max_sum<double>(
      [&z](std::int64_t j) { return static_cast<double>(z[static_cast<std::size_t>(j)]); },
      static_cast<std::int64_t>(z.size()));
}

/// 4.2's tolerance for one add or merge, relative to the sum: an exp, a
/// multiplication and an addition of terms >= 0, each rounded once (2.5
/// epsilons at most; measured for the solution: 0.31 for adds, 0.32 for
/// merges).
inline constexpr double kStepTolerance = 8 * kFloatEpsilon;
/// 4.2's tolerance for whole sets (folds and trees over up to 8192 logits),
/// relative to the sum. Measured for the solution over every set graded:
/// 7.3e-6 for folds (a float sum of thousands of terms), 5.7e-7 for the
/// ascending folds (a rescale at every step), 2.8e-7 for trees. Forgetting a
/// rescale misses by a factor, not by epsilons.
inline constexpr double kSetTolerance = 1e-4;

/// Whether a float state matches the reference: the same max (a max is one
/// of the inputs, exactly), the sum within `tolerance` relative; the empty
/// state exactly {−inf, 0}.
inline bool state_close(const OnlineSoftmax& got, const mpt::MaxSum<double>& want, double tolerance) {
  if (want.sum == 0.0) return got.max == -kInf && got.sum == 0.0f;
  if (static_cast<double>(got.max) != want.max) return false;
  return std::fabs(static_cast<double>(got.sum) - want.sum) <= tolerance * want.sum;
}

/// The relative error of a state's sum ("max differs" as +inf).
inline double state_error(const OnlineSoftmax& got, const mpt::MaxSum<double>& want) {
  if (static_cast<double>(got.max) != want.max) return std::numeric_limits<double>::infinity();
  const double e = std::fabs(static_cast<double>(got.sum) - want.sum) / want.sum;
  return std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
}

/// The logits folded left to right with online_add, from the empty state.
inline OnlineSoftmax fold(const std::vector<float>& z) {
  OnlineSoftmax s;
  for (float v : z) s = online_add(s, v);
  return s;
}

/// A GPU block's reduction: `lanes` threads, thread t folding the logits t,
/// t + lanes, t + 2·lanes, ... with online_add, then the lanes' states
/// merged as a shuffle tree does (lane i with lane i + half, half = lanes/2,
/// lanes/4, ..., 1). `lanes` a power of two; lanes past the data stay empty.
inline OnlineSoftmax block_reduce(const std::vector<float>& z, std::size_t lanes) {
  std::vector<OnlineSoftmax> lane(lanes);
  for (std::size_t j = 0; j < z.size(); ++j) lane[j % lanes] = online_add(lane[j % lanes], z[j]);
  for (std::size_t half = lanes / 2; half >= 1; half /= 2)
    for (std::size_t i = 0; i < half; ++i) lane[i] = online_merge(lane[i], lane[i + half]);
  return lane[0];
}

// ---- the cross-entropy backward (exercise 4.3) ------------------------------------

/// One row of 4.3: the logits, the target, the options and g.
struct CrossEntropyRow {
  std::vector<float> z;              ///< the k logits
  std::int64_t target = 0;           ///< the class y, or ignore_index
  std::int64_t ignore_index = -100;  ///< the target of a row that adds nothing
  float smoothing = 0.0f;            ///< label smoothing ε
  float g = 1.0f;                    ///< the gradient arriving at the row's loss
};

/// "k 3, target 1, ignore_index -100, label_smoothing 0.1, g 1, logits {…}"
inline std::string describe(const CrossEntropyRow& r) {
  return "k " + std::to_string(r.z.size()) + ", target " + std::to_string(r.target) + ", ignore_index " +
         std::to_string(r.ignore_index) + ", label_smoothing " + short_number(r.smoothing) + ", g " +
         short_number(r.g) + ", logits " + describe_row(r.z);
}

/// 4.3's answer: mpt's fused cross-entropy backward row in double on the
/// widened logits, g·((1 − ε)·(p − onehot) + ε·(p − 1/k)), 0 for an ignored
/// row; and each entry's error scale |g|·(p_j + ε/k + (1 − ε)·[j = y]).
inline void reference_backward(const CrossEntropyRow& r, std::vector<double>& dz,
                               std::vector<double>& scale) {
  const auto k = static_cast<std::int64_t>(r.z.size());
  const auto logit = [&r](std::int64_t j) { return static_cast<double>(r.z[static_cast<std::size_t>(j)]); };
  dz.assign(r.z.size(), 0.0);
  scale.assign(r.z.size(), 0.0);
  mpt::cross_entropy_backward_row<double>(
      logit, k, r.target, r.ignore_index, r.smoothing, r.g,
      [&dz](std::int64_t j, double v) { dz[static_cast<std::size_t>(j)] = v; });
  if (r.target == r.ignore_index) return;
  const mpt::MaxSum<double> s = mpt::row_max_sum<double>(logit, k);
  const double eps = r.smoothing;
  for (std::int64_t j = 0; j < k; ++j)
    scale[static_cast<std::size_t>(j)] =
        std::fabs(static_cast<double>(r.g)) *
        (mpt::softmax_of(s, logit(j)) + eps / static_cast<double>(k) + (j == r.target ? 1.0 - eps : 0.0));
}

/// 4.3's tolerance, in units of each entry's scale (for rows of up to 4096
/// logits). Measured over every row graded: the solution (a sum in double)
/// 5.4e-7, a float variant (a float sum left to right, p as exp·(1/sum),
/// g·p − g·(ε/k + (1 − ε)[j = y])) 3.8e-6; an fp16 sum misses by 7.7e-3
/// (5.8e-2 with label smoothing). Forgetting ε/k misses by up to 1,
/// forgetting the 1 − ε by about ε.
inline constexpr double kBackwardTolerance = 1e-4;
/// 4.3's tolerance for rows of a vocabulary's size (8192 to 50257 logits),
/// whose float sums lose more: measured 1.9e-6 for the solution, 9.3e-5 for
/// the float variant; an fp16 sum misses by 1.9, bf16 by 10.
inline constexpr double kLongBackwardTolerance = 1e-3;

/// Grades one row of 4.3 (dz poisoned with NaN first, so that an entry left
/// unwritten shows); adds one line to `m` for a wrong answer.
inline void expect_backward(Mismatches& m, const CrossEntropyRow& r, double tolerance,
                            const std::string& why) {
  m.checked();
  std::vector<double> want, scale;
  reference_backward(r, want, scale);
  std::vector<float> got(r.z.size(), kNaN);
  softmax_cross_entropy_backward(r.z.data(), static_cast<std::int64_t>(r.z.size()), r.target, r.ignore_index,
                                 r.smoothing, r.g, got.data());
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t j = 0; j < got.size(); ++j) {
    const double err = std::fabs(static_cast<double>(got[j]) - want[j]);
    double e = 0.0;
    if (!std::isfinite(err)) e = std::numeric_limits<double>::infinity();
    else if (scale[j] > 0) e = err / scale[j];
    else if (err > 0) e = std::numeric_limits<double>::infinity();  // a zero scale asks for exactly 0
    if (e > worst) {
      worst = e;
      at = j;
    }
  }
  if (worst <= tolerance || !m.wrong()) return;
  m.detail(why + " (" + describe(r) + "): dz[" + std::to_string(at) + "] = " + describe(got[at]) +
           ", expected " + describe(want[at]) + " (error " + short_number(worst) +
           " of |g|·(p + eps/k + (1 - eps)·[j = target]), allowed " + short_number(tolerance) + ")");
}

// ---- the attention row (exercise 4.4) ------------------------------------------

/// 4.4's answer: the softmax of mpt's attention row in double, t_j =
/// s_j·scale for a kept position and −inf otherwise (attention_math::score),
/// p = row_softmax(t), zeros for a row with no position kept.
inline std::vector<double> reference_probabilities(const std::vector<float>& s, const std::vector<bool>& keep,
                                                   float scale) {
  const int n = static_cast<int>(s.size());
  std::vector<double> t(s.size()), p(s.size());
  for (std::size_t j = 0; j < s.size(); ++j)
    t[j] = mpt::attention_math::score<double>(s[j], scale, keep[j], 0.0);
  mpt::attention_math::row_softmax(t.data(), n, p.data());
  return p;
}

/// One unit of the dtype's spacing at x >= 0 (the subnormal spacing at and
/// near 0).
inline double spacing_at(double x, mpt::DType dtype) {
  const mpt::FormatSpec& f = mpt::format_of(dtype).spec;
  const int e = x > 0 ? std::max(std::ilogb(x), f.emin()) : f.emin();
  return std::ldexp(1.0, e - f.mantissa_bits);
}

/// 4.4's tolerance for a kept position, in units of the dtype's spacing at
/// the reference plus 64 float epsilons of it: the FP32 probability, a few
/// epsilons from the exact one, is rounded once, and may round to either
/// neighbour. Measured for the fixed body: 0.5 units at most. A masked
/// position must be exactly 0.
inline double probability_error(float got, double want, mpt::DType dtype) {
  const double e =
      std::fabs(static_cast<double>(got) - want) / (spacing_at(want, dtype) + 64 * kFloatEpsilon * want);
  return std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
}

/// An attention row: the raw scores as the GEMM stored them (values that
/// the dtype holds), the mask, the scale.
struct AttentionRow {
  std::vector<float> scores;           ///< the raw products, values of `dtype`
  std::vector<bool> keep;              ///< which keys take part
  float scale = 1.0f;                  ///< the softmax scale, 1/√d
  mpt::DType dtype = mpt::DType::f16;  ///< what the scores and probabilities are stored in
};

/// "f16, 80 keys (72 kept), scale 0.111803"
inline std::string describe(const AttentionRow& r) {
  const auto kept = std::count(r.keep.begin(), r.keep.end(), true);
  return std::string(mpt::dtype_name(r.dtype)) + ", " + std::to_string(r.scores.size()) + " keys (" +
         std::to_string(kept) + " kept), scale " + short_number(r.scale);
}

/// Seeded raw scores: sd·N(0, 1), rounded into dtype as a GEMM's output is,
/// all kept.
inline AttentionRow attention_row(std::uint32_t seed, std::size_t n, double sd, float scale,
                                  mpt::DType dtype) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, sd);
  std::vector<float> raw(n);
  for (float& v : raw) v = static_cast<float>(normal(rng));
  AttentionRow r;
  const mpt::Tensor stored = mpt::Tensor::from_f32(raw.data(), {static_cast<std::int64_t>(n)}, dtype);
  r.scores.resize(n);
  stored.to_f32(r.scores.data());
  r.keep.assign(n, true);
  r.scale = scale;
  r.dtype = dtype;
  return r;
}

/// What is wrong with the student's probabilities of one row ("" when
/// nothing): the dtype and shape, then the worst position.
inline std::string attention_problem(const AttentionRow& r) {
  const auto n = static_cast<std::int64_t>(r.scores.size());
  const mpt::Tensor s = mpt::Tensor::from_f32(r.scores.data(), {n}, r.dtype);
  const mpt::Tensor p = attention_row_probabilities(s, r.keep, r.scale);
  if (p.dtype() != r.dtype || p.shape() != mpt::Shape{n})
    return "the probabilities are a " + std::string(mpt::dtype_name(p.dtype())) + " tensor of " +
           std::to_string(p.numel()) + " elements, expected " + std::string(mpt::dtype_name(r.dtype)) + " [" +
           std::to_string(n) + "]";
  std::vector<float> got(static_cast<std::size_t>(n));
  p.to_f32(got.data());
  const std::vector<double> want = reference_probabilities(r.scores, r.keep, r.scale);
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t j = 0; j < got.size(); ++j) {
    const double e = r.keep[j] ? probability_error(got[j], want[j], r.dtype)
                               : (got[j] == 0.0f ? 0.0 : std::numeric_limits<double>::infinity());
    if (e > worst) {
      worst = e;
      at = j;
    }
  }
  if (worst <= 1.0) return "";
  double total = 0.0;
  for (float v : got) total += v;
  return "p[" + std::to_string(at) + "] = " + describe(got[at]) + ", expected " + describe(want[at]) +
         (r.keep[at] ? " (score " + short_number(r.scores[at] * r.scale) + " after scaling; off by " +
                           short_number(worst) + " units of the dtype's spacing, allowed 1)"
                     : " (a masked position: exactly 0)") +
         "; the row's probabilities sum to " + short_number(total);
}

}  // namespace mpt::ex04::grading

namespace mpt::exercise_kit {
/// What the kit's grader main grades: Chapter 4 and its exercises.
inline constexpr Chapter kChapter{4, mpt::ex04::grading::kExercises,
                                  sizeof mpt::ex04::grading::kExercises / sizeof(Exercise)};
}  // namespace mpt::exercise_kit
