// Chapter 04 — the statistics of the seed sweep: paired differences, Student's t and the sign test.
// Depends on: the standard library only (<algorithm>, <cmath>, <cstddef>,
// <vector>).
//
// The sweep trains every precision from the same seeds; a seed draws the
// initial weights, the batches and the validation windows, and all
// precisions share them. Two precisions are compared seed by seed: the
// difference d_k = a_k − b_k at seed k removes what the seed does to both
// runs alike, which is most of the spread between seeds. What is left is
// summarised by
//   - the mean of d and its sample standard deviation s (n − 1 in the
//     denominator);
//   - Student's t = mean/(s/√n) with n − 1 degrees of freedom, its
//     two-sided p, and the 95% interval mean ± t₀.₉₇₅·s/√n. The test assumes
//     the d_k are independent draws from a normal distribution, which five
//     values cannot check;
//   - the sign test: how many d_k are positive, and the exact two-sided
//     binomial p under "positive and negative are equally likely" (ties,
//     d_k = 0, dropped). It assumes nothing of the distribution, and pays
//     for it: with n pairs its smallest p is 2/2^n, 0.0625 for n = 5, so five
//     seeds can never show a difference at the 5% level by signs alone.
// Student's t distribution for an integer number of degrees of freedom has a
// closed form (Abramowitz and Stegun, Handbook of Mathematical Functions,
// 26.7.3 and 26.7.4), so no special-function library is needed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace mpt::ch04 {

/// P(|T| <= t) for Student's t with df >= 1 degrees of freedom (t >= 0).
/// With θ = atan(t/√df) (Abramowitz and Stegun 26.7.3, 26.7.4):
///   df odd:  (2/π)·(θ + sin θ·(cos θ + (2/3)cos³θ + … + (2·4⋯(df−3))/(1·3⋯(df−2))·cos^(df−2) θ)),
///            the sum empty for df = 1;
///   df even: sin θ·(1 + (1/2)cos²θ + (1·3)/(2·4)cos⁴θ + … + (1·3⋯(df−3))/(2·4⋯(df−2))·cos^(df−2) θ).
inline double student_t_central(double t, int df) {
  const double pi = 3.14159265358979323846;
  if (std::isinf(t)) return 1;
  const double theta = std::atan(std::fabs(t) / std::sqrt(static_cast<double>(df)));
  const double c2 = std::cos(theta) * std::cos(theta);
  if (df % 2 == 1) {
    double term = std::cos(theta), sum = 0;
    for (int k = 1; 2 * k + 1 <= df; ++k) {  // powers cos^1 … cos^(df−2)
      sum += term;
      term *= c2 * (2.0 * k) / (2.0 * k + 1);
    }
    return (2 / pi) * (theta + std::sin(theta) * sum);
  }
  double term = 1, sum = 0;
  for (int k = 0; 2 * k + 2 <= df; ++k) {  // powers cos^0 … cos^(df−2)
    sum += term;
    term *= c2 * (2.0 * k + 1) / (2.0 * k + 2);
  }
  return std::sin(theta) * sum;
}

/// The two-sided p of Student's t: P(|T| >= |t|).
inline double student_t_two_sided_p(double t, int df) { return 1 - student_t_central(t, df); }

/// The t with P(|T| <= t) = level (0 < level < 1), by bisection: 2.776 for
/// level 0.95 and df 4.
inline double student_t_quantile(double level, int df) {
  double lo = 0, hi = 1;
  while (student_t_central(hi, df) < level) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = (lo + hi) / 2;
    (student_t_central(mid, df) < level ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

/// The exact two-sided p of the sign test: `positive` of `n` nonzero
/// differences are positive; under equal odds, the probability of a split
/// at least as uneven, 2·P(X <= min(positive, n − positive)) for X
/// binomial(n, 1/2), at most 1. 1 for n = 0.
inline double sign_test_p(int positive, int n) {
  if (n <= 0) return 1;
  const int low = std::min(positive, n - positive);
  double term = std::ldexp(1.0, -n), tail = 0;  // C(n, 0)/2^n
  for (int i = 0; i <= low; ++i) {
    tail += term;
    term = term * (n - i) / (i + 1);
  }
  return std::min(1.0, 2 * tail);
}

/// What the paired comparison of two runs over the same seeds found.
struct PairedDifference {
  int n = 0;           ///< pairs (seeds)
  double mean = 0;     ///< mean of d = a − b
  double sd = 0;       ///< sample standard deviation of d (n − 1)
  double t = 0;        ///< mean / (sd/√n); ±inf when sd = 0 and mean ≠ 0, 0 when both are 0
  int df = 0;          ///< n − 1
  double p_t = 1;      ///< the two-sided p of t
  double ci_low = 0;   ///< the 95% interval of the mean: mean − t₀.₉₇₅·sd/√n
  double ci_high = 0;  ///< mean + t₀.₉₇₅·sd/√n
  int positive = 0;    ///< pairs with d > 0
  int nonzero = 0;     ///< pairs with d ≠ 0
  double p_sign = 1;   ///< the sign test's exact two-sided p
};

/// d_k = a_k − b_k over the pairs (a and b of the same size, at least 2).
inline PairedDifference paired_difference(const std::vector<double>& a, const std::vector<double>& b) {
  PairedDifference r;
  r.n = static_cast<int>(a.size());
  r.df = r.n - 1;
  std::vector<double> d(a.size());
  for (std::size_t k = 0; k < a.size(); ++k) d[k] = a[k] - b[k];
  for (double x : d) r.mean += x / r.n;
  double ss = 0;
  for (double x : d) ss += (x - r.mean) * (x - r.mean);
  r.sd = std::sqrt(ss / r.df);
  const double se = r.sd / std::sqrt(static_cast<double>(r.n));
  r.t = se > 0 ? r.mean / se : (r.mean == 0 ? 0.0 : std::copysign(INFINITY, r.mean));
  r.p_t = student_t_two_sided_p(r.t, r.df);
  const double q = student_t_quantile(0.95, r.df);
  r.ci_low = r.mean - q * se;
  r.ci_high = r.mean + q * se;
  for (double x : d) {
    r.positive += x > 0;
    r.nonzero += x != 0;
  }
  r.p_sign = sign_test_p(r.positive, r.nonzero);
  return r;
}

}  // namespace mpt::ch04
