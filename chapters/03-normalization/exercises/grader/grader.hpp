// Chapter 03 — exercises: what every grader test file shares, instructors' hidden tests included.
// Depends on: doctest, grader_kit.hpp, ex03.hpp, mpt (welford.hpp,
// norm_math.hpp, batch_norm.hpp, policy.hpp, context.hpp, rounding.hpp).
// The exercise list, the reference answers (mpt is the oracle: its Welford
// merge and norm formulas in double, its BatchNorm with FP32 buffers), the
// error scales and the kit's helpers.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "ex03.hpp"
#include "grader_kit.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/formats/rounding.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/norm_math.hpp"
#include "mpt/nn/layers/welford.hpp"

namespace mpt::ex03::grading {

// ---- the exercises --------------------------------------------------------
// A test case belongs to an exercise through its doctest test suite,
// "exercise-" + id; each test case that passes scores its exercise's points
// per test case (the last number below): 2 for a behaviour to write, 3 for
// one of the diagnose exercise, and 1 for the test cases whose name ends
// "[1 point]", details next to the rest (empty operands, D = 1). The kit's
// grader main (grader_main.cpp) reads this list as exercise_kit::kChapter.

using exercise_kit::Exercise;
using exercise_kit::Kind;

inline constexpr Exercise kExercises[] = {
    {"3.1", "the merge of two partial Welford statistics", Kind::write, 2},
    {"3.2", "LayerNorm's backward, accumulated in FP32", Kind::write, 2},
    {"3.3", "a BatchNorm's running estimates on fp16 activations", Kind::diagnose, 2},
};

using exercise_kit::bits_of;
using exercise_kit::describe;
using exercise_kit::float_of;
using exercise_kit::Mismatches;

/// FP32's machine epsilon, 2^-23: the unit the tolerances are stated in.
inline constexpr double kFloatEpsilon = 0x1p-23;

/// A double to 6 significant digits, for errors and ratios.
inline std::string short_number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

// ---- the merge (exercise 3.1) ------------------------------------------------

/// The exact statistics, in double.
struct ExactStats {
  std::int64_t count = 0;
  double mean = 0.0;
  double m2 = 0.0;
};

/// "{count 3, mean 2 (0x40000000 = 0x1p+1), m2 2 (...)}"
inline std::string describe(const Stats& s) {
  return "{count " + std::to_string(s.count) + ", mean " + describe(s.mean) + ", m2 " + describe(s.m2) + "}";
}

/// "{count 3, mean 2, m2 2}" with 17 digits.
inline std::string describe(const ExactStats& s) {
  return "{count " + std::to_string(s.count) + ", mean " + describe(s.mean) + ", m2 " + describe(s.m2) + "}";
}

/// Exercise 3.1's answer: mpt's merge (Chan et al., welford.hpp) in double
/// on the float operands widened, i.e. the union's statistics to double's
/// precision.
inline ExactStats reference_merge(const Stats& a, const Stats& b) {
  const mpt::Welford<double> wa{a.count, a.mean, a.m2}, wb{b.count, b.mean, b.m2};
  const mpt::Welford<double> r = mpt::welford_merge(wa, wb);
  return {r.count, r.mean, r.m2};
}

/// Whether a float merge is within 3.1's tolerances of the exact one: count
/// exact, mean within 8 epsilons of the larger operand |mean|, M2 within 16
/// epsilons of the exact M2.
inline bool merge_close(const Stats& got, const ExactStats& want, const Stats& a, const Stats& b) {
  const double mean_scale =
      std::max(std::fabs(static_cast<double>(a.mean)), std::fabs(static_cast<double>(b.mean)));
  return got.count == want.count && std::fabs(got.mean - want.mean) <= 8 * kFloatEpsilon * mean_scale &&
         std::fabs(got.m2 - want.m2) <= 16 * kFloatEpsilon * want.m2;
}

/// The statistics of `values` in double by two passes (the mean, then the
/// squared deviations from it): what a merge tree must agree with.
inline ExactStats two_pass(const std::vector<float>& values) {
  ExactStats s;
  s.count = static_cast<std::int64_t>(values.size());
  if (values.empty()) return s;
  double sum = 0.0;
  for (float v : values) sum += v;
  s.mean = sum / static_cast<double>(values.size());
  for (float v : values) s.m2 += (v - s.mean) * (v - s.mean);
  return s;
}

/// A chunk's statistics as one thread of a reduction computes them: mpt's
/// Welford update in float, one value at a time.
inline Stats sequential_float(const float* values, std::size_t n) {
  mpt::Welford<float> w;
  for (std::size_t i = 0; i < n; ++i) mpt::welford_add(w, values[i]);
  return {w.count, w.mean, w.m2};
}

/// The statistics of `values`, exact in double and rounded once to float
/// (an operand whose only error is its storage).
inline Stats rounded_stats(const std::vector<double>& values) {
  double sum = 0.0;
  for (double v : values) sum += v;
  const double mean = values.empty() ? 0.0 : sum / static_cast<double>(values.size());
  double m2 = 0.0;
  for (double v : values) m2 += (v - mean) * (v - mean);
  return {static_cast<std::int64_t>(values.size()), static_cast<float>(mean), static_cast<float>(m2)};
}

// ---- LayerNorm's backward (exercise 3.2) ---------------------------------------

/// One [rows, D] problem and its answer in double, with the magnitude each
/// answer is made of (what a rounding error is relative to).
struct LayerNormCase {
  std::int64_t rows = 0, d = 0;
  float eps = 1e-5f;
  std::vector<float> x, dy, gamma;  // rows*d, rows*d, d
  // The reference (mpt's norm formulas in double on the widened inputs).
  std::vector<double> dx, dgamma, dbeta;
  // Error scales: for dx, rstd·(|g| + (Σ|g| + |x̂|·Σ|g·x̂|)/D) (the sizes of
  // the terms dx is formed from); for dgamma Σ|dy·x̂|; for dbeta Σ|dy|.
  std::vector<double> dx_scale, dgamma_scale, dbeta_scale;
};

/// Fills in the reference answer and the error scales of `c` (x, dy, gamma
/// set): mpt's statistics and backward (norm_math.hpp), in double.
inline void solve_reference(LayerNormCase& c) {
  const auto n = static_cast<std::size_t>(c.rows * c.d), d = static_cast<std::size_t>(c.d);
  const std::vector<double> x(c.x.begin(), c.x.end()), dy(c.dy.begin(), c.dy.end()),
      gamma(c.gamma.begin(), c.gamma.end());
  const mpt::norm_math::Layout l{1, c.rows, c.d};
  std::vector<mpt::Welford<double>> stats(static_cast<std::size_t>(c.rows));
  std::vector<double> mean(stats.size()), rstd(stats.size());
  mpt::norm_math::statistics(x.data(), l, stats.data());
  mpt::norm_math::mean_invstd(stats.data(), c.rows, static_cast<double>(c.eps), mean.data(), rstd.data());
  c.dx.assign(n, 0.0);
  c.dgamma.assign(d, 0.0);
  c.dbeta.assign(d, 0.0);
  mpt::norm_math::backward(x.data(), dy.data(), l, mean.data(), rstd.data(), gamma.data(),
                           mpt::norm_math::AffineAxis::inner, true, c.dx.data(), c.dgamma.data(),
                           c.dbeta.data());
  c.dx_scale.assign(n, 0.0);
  c.dgamma_scale.assign(d, 0.0);
  c.dbeta_scale.assign(d, 0.0);
  for (std::int64_t r = 0; r < c.rows; ++r) {
    const auto row = static_cast<std::size_t>(r) * d;
    double abs_g = 0.0, abs_g_xhat = 0.0;
    for (std::size_t i = 0; i < d; ++i) {
      const double xhat = (x[row + i] - mean[r]) * rstd[r];
      abs_g += std::fabs(gamma[i] * dy[row + i]);
      abs_g_xhat += std::fabs(gamma[i] * dy[row + i] * xhat);
      c.dgamma_scale[i] += std::fabs(dy[row + i] * xhat);
      c.dbeta_scale[i] += std::fabs(dy[row + i]);
    }
    for (std::size_t i = 0; i < d; ++i) {
      const double xhat = (x[row + i] - mean[r]) * rstd[r];
      c.dx_scale[row + i] =
          rstd[r] * (std::fabs(gamma[i] * dy[row + i]) + (abs_g + std::fabs(xhat) * abs_g_xhat) / c.d);
    }
  }
}

/// What the student's backward wrote, outputs poisoned with NaN first (so
/// that an output left unwritten, or added to, shows).
struct LayerNormAnswer {
  std::vector<float> dx, dgamma, dbeta;
};

inline LayerNormAnswer student_backward(const LayerNormCase& c) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  LayerNormAnswer a{std::vector<float>(c.x.size(), nan), std::vector<float>(c.gamma.size(), nan),
                    std::vector<float>(c.gamma.size(), nan)};
  layer_norm_backward(c.x.data(), c.dy.data(), c.gamma.data(), c.rows, c.d, c.eps, a.dx.data(),
                      a.dgamma.data(), a.dbeta.data());
  return a;
}

/// The worst error of `got` against `want` in units of `scale`, and where
/// it is (NaN or inf give +inf; a zero scale asks for the exact value).
inline double worst_error(const std::vector<float>& got, const std::vector<double>& want,
                          const std::vector<double>& scale, std::size_t& where) {
  double worst = 0.0;
  where = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    double e = 0.0;
    if (!std::isfinite(err)) e = std::numeric_limits<double>::infinity();
    else if (scale[i] > 0) e = err / scale[i];
    else if (err > 0) e = std::numeric_limits<double>::infinity();
    if (e > worst) {
      worst = e;
      where = i;
    }
  }
  return worst;
}

/// Grades one problem: every output within `tolerance` of the reference, in
/// units of its scale. Adds one line to `m` for a wrong answer.
inline void expect_backward(Mismatches& m, LayerNormCase c, double tolerance, const std::string& what) {
  m.checked();
  solve_reference(c);
  const LayerNormAnswer got = student_backward(c);
  std::size_t at_dx = 0, at_dg = 0, at_db = 0;
  const double e_dx = worst_error(got.dx, c.dx, c.dx_scale, at_dx);
  const double e_dg = worst_error(got.dgamma, c.dgamma, c.dgamma_scale, at_dg);
  const double e_db = worst_error(got.dbeta, c.dbeta, c.dbeta_scale, at_db);
  if (e_dx <= tolerance && e_dg <= tolerance && e_db <= tolerance) return;
  if (!m.wrong()) return;
  const std::string size = " (rows " + std::to_string(c.rows) + ", D " + std::to_string(c.d) + ")";
  std::string line = what + size + ":";
  auto part = [&](const char* name, double e, std::size_t at, const std::vector<float>& g,
                  const std::vector<double>& w) {
    if (e <= tolerance) return;
    line += std::string(" ") + name + "[" + std::to_string(at) + "] = " + describe(g[at]) + ", expected " +
            describe(w[at]) + " (error " + short_number(e) + " of its scale, allowed " +
            short_number(tolerance) + ");";
  };
  part("dx", e_dx, at_dx, got.dx, c.dx);
  part("dgamma", e_dg, at_dg, got.dgamma, c.dgamma);
  part("dbeta", e_db, at_db, got.dbeta, c.dbeta);
  m.detail(line);
}

/// A problem with x = offset + spread·N(0, 1), dy = dy_mean + N(0, 1),
/// gamma = 1 + 0.5·N(0, 1) (seeded).
inline LayerNormCase random_case(std::uint32_t seed, std::int64_t rows, std::int64_t d, double offset,
                                 double spread, double dy_mean = 0.0, float eps = 1e-5f) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  LayerNormCase c;
  c.rows = rows;
  c.d = d;
  c.eps = eps;
  for (std::int64_t i = 0; i < rows * d; ++i) {
    c.x.push_back(static_cast<float>(offset + spread * normal(rng)));
    c.dy.push_back(static_cast<float>(dy_mean + normal(rng)));
  }
  for (std::int64_t i = 0; i < d; ++i) c.gamma.push_back(static_cast<float>(1.0 + 0.5 * normal(rng)));
  return c;
}

// ---- the BatchNorm forward (exercise 3.3) -----------------------------------------

/// The precision exercise 3.3 specifies: activations read and stored in
/// their own dtype, FP32 compute, and FP32 parameters and running estimates
/// (apex's keep_batchnorm_fp32; what torch.autocast leaves a BatchNorm).
class Fp32BuffersPolicy final : public mpt::Policy {
 public:
  explicit Fp32BuffersPolicy(mpt::DType activations) : activations_(activations) {}
  std::string describe() const override {
    return "activations " + std::string(mpt::dtype_name(activations_)) + ", FP32 parameters and buffers";
  }

 protected:
  mpt::OpPrecision decide_op(const mpt::OpInfo&, const mpt::OpQuery&) const override {
    return {activations_, mpt::DType::f32, activations_};
  }
  mpt::DType parameter_dtype_of(const mpt::OpInfo&, std::string_view) const override {
    return mpt::DType::f32;
  }

 private:
  mpt::DType activations_;
};

/// A BatchNorm layer and the student's state side by side: the same
/// parameters, the same running estimates to start from.
struct BatchNormPair {
  std::shared_ptr<Fp32BuffersPolicy> policy;
  mpt::BatchNorm reference;
  std::vector<float> gamma, beta;
  RunningStats student;
  float eps, momentum;

  BatchNormPair(mpt::DType activations, const std::vector<float>& weight, const std::vector<float>& bias,
                const std::vector<float>& running_mean, const std::vector<float>& running_var, float eps_,
                float momentum_)
      : policy(std::make_shared<Fp32BuffersPolicy>(activations)),
        reference(static_cast<int>(weight.size()), options(eps_, momentum_)),
        gamma(weight),
        beta(bias),
        student{running_mean, running_var, 0},
        eps(eps_),
        momentum(momentum_) {
    const auto c = static_cast<std::int64_t>(weight.size());
    reference.set_path("bn");
    reference.weight =
        mpt::Parameter("bn.weight", mpt::Tensor::from_f32(weight.data(), {c}, mpt::DType::f32));
    reference.bias = mpt::Parameter("bn.bias", mpt::Tensor::from_f32(bias.data(), {c}, mpt::DType::f32));
    reference.running_mean = mpt::Tensor::from_f32(running_mean.data(), {c}, mpt::DType::f32);
    reference.running_var = mpt::Tensor::from_f32(running_var.data(), {c}, mpt::DType::f32);
    reference.apply_policy(*policy);
    reference.train();
  }

  static mpt::BatchNorm::Options options(float eps_, float momentum_) {
    mpt::BatchNorm::Options o;
    o.eps = eps_;
    o.momentum = momentum_;
    return o;
  }

  /// One training forward of the reference; returns y widened.
  std::vector<float> reference_step(const mpt::Tensor& x) {
    mpt::Context ctx(policy);
    const mpt::Tensor y = reference.forward(x, ctx);
    std::vector<float> v(static_cast<std::size_t>(y.numel()));
    y.to_f32(v.data());
    return v;
  }

  /// One call of the student's forward; returns y widened (and its dtype and
  /// shape in `y`).
  std::vector<float> student_step(const mpt::Tensor& x, mpt::Tensor& y) {
    y = batch_norm_train_forward(x, gamma, beta, eps, momentum, student);
    std::vector<float> v(static_cast<std::size_t>(y.numel()));
    y.to_f32(v.data());
    return v;
  }

  std::vector<float> reference_mean() const { return widened(reference.running_mean); }
  std::vector<float> reference_var() const { return widened(reference.running_var); }

  static std::vector<float> widened(const mpt::Tensor& t) {
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    t.to_f32(v.data());
    return v;
  }
};

/// The running estimates' tolerance. Both sides update in FP32 from FP32
/// statistics that differ in the order of their sums (mpt merges Welford
/// runs; the given body sums two passes). A running mean is compared in
/// units of |mean| + σ, σ the feature's standard deviation (a batch mean's
/// rounding error is relative to the values summed, not to their mean), a
/// running variance relative to itself. Measured for the fixed body over
/// everything the tests grade: 2.1e-7 and 2.5e-7 at most. Rounding into
/// fp16 is off by up to 2^-11 = 4.9e-4 of the value, and then it stalls.
inline constexpr double kRunningTolerance = 1e-5;

/// |got − want| / scale (+inf for NaN or inf unless both are the same inf).
inline double running_error(float got, float want, double scale) {
  if (!std::isfinite(want)) return got == want ? 0.0 : std::numeric_limits<double>::infinity();
  const double e = std::fabs(static_cast<double>(got) - want) / scale;
  return std::isfinite(e) ? e : std::numeric_limits<double>::infinity();
}

/// What is wrong with one running estimate ("" when nothing), told at its
/// worst channel: `sigma` holds the features' standard deviations for the
/// mean's scale; empty means a variance, compared relative to itself.
inline std::string running_difference(const char* name, const std::vector<float>& got,
                                      const std::vector<float>& want, const std::vector<double>& sigma) {
  if (got.size() != want.size())
    return std::string(name) + " has " + std::to_string(got.size()) + " entries, expected " +
           std::to_string(want.size());
  const bool mean = !sigma.empty();
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t c = 0; c < got.size(); ++c) {
    const double scale = mean ? std::fabs(static_cast<double>(want[c])) + sigma[c] : std::fabs(want[c]);
    const double e = running_error(got[c], want[c], scale);
    if (e > worst) {
      worst = e;
      at = c;
    }
  }
  if (worst <= kRunningTolerance) return "";
  return std::string(name) + "[" + std::to_string(at) + "] = " + describe(got[at]) + ", expected " +
         describe(want[at]) + " (error " + short_number(worst) + (mean ? " of |mean| + sd" : " relative") +
         ", allowed " + short_number(kRunningTolerance) + ")";
}

/// An activation tensor of `shape` in `dtype`: channel c's values are
/// means[c] + stds[c]·N(0, 1), rounded into dtype (seeded).
inline mpt::Tensor activations(std::uint32_t seed, const mpt::Shape& shape, mpt::DType dtype,
                               const std::vector<double>& means, const std::vector<double>& stds) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  const std::int64_t n = shape[0], c = shape[1];
  std::int64_t inner = 1;
  for (std::size_t k = 2; k < shape.size(); ++k) inner *= shape[k];
  std::vector<float> v(static_cast<std::size_t>(n * c * inner));
  for (std::int64_t a = 0; a < n; ++a)
    for (std::int64_t ch = 0; ch < c; ++ch)
      for (std::int64_t i = 0; i < inner; ++i)
        v[static_cast<std::size_t>((a * c + ch) * inner + i)] = static_cast<float>(
            means[static_cast<std::size_t>(ch)] + stds[static_cast<std::size_t>(ch)] * normal(rng));
  return mpt::Tensor::from_f32(v.data(), shape, dtype);
}

/// How far the student's y is from the reference's, as a share of what the
/// two may differ by: one unit of the dtype's spacing at the reference (the
/// same FP32 value may round the other way) plus 64 float epsilons of the
/// magnitudes y is made of, (|x| + |mean|)·invstd·|γ| + |β| (the statistics
/// are summed in another order). <= 1 passes; NaN and inf give +inf.
inline double worst_output_error(const std::vector<float>& got, const std::vector<float>& want,
                                 const BatchNormPair& p, const mpt::Tensor& x) {
  const mpt::FormatSpec& s = mpt::format_of(x.dtype()).spec;
  const std::vector<float> xv = BatchNormPair::widened(x), mean = BatchNormPair::widened(p.reference.mean()),
                           invstd = BatchNormPair::widened(p.reference.invstd());
  const std::int64_t channels = x.size(1), inner = x.numel() / (x.size(0) * channels);
  double worst = 0.0;
  for (std::size_t e = 0; e < got.size(); ++e) {
    const auto c = static_cast<std::size_t>((static_cast<std::int64_t>(e) / inner) % channels);
    const double w = want[e];
    const int ex = w == 0 ? s.emin() : std::max(std::ilogb(w), s.emin());
    const double unit = std::ldexp(1.0, ex - s.mantissa_bits);
    const double made_of = (std::fabs(static_cast<double>(xv[e])) + std::fabs(static_cast<double>(mean[c]))) *
                               invstd[c] * std::fabs(static_cast<double>(p.gamma[c])) +
                           std::fabs(static_cast<double>(p.beta[c]));
    const double err = std::fabs(static_cast<double>(got[e]) - w) / (unit + 64 * kFloatEpsilon * made_of);
    worst = std::max(worst, std::isfinite(err) ? err : std::numeric_limits<double>::infinity());
  }
  return worst;
}

}  // namespace mpt::ex03::grading

namespace mpt::exercise_kit {
/// What the kit's grader main grades: Chapter 3 and its exercises.
inline constexpr Chapter kChapter{3, mpt::ex03::grading::kExercises,
                                  sizeof mpt::ex03::grading::kExercises / sizeof(Exercise)};
}  // namespace mpt::exercise_kit
