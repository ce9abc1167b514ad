// Chapter 04 — tests of the seed sweep's statistics: Student's t, the sign
// test and the paired comparison that Chapter 4's table of seeds prints.
// Depends on: chapters/04-softmax-attention/seed_statistics.hpp, doctest.
//
// The values are those of printed tables (Student's t quantiles to five
// digits, as any statistics textbook lists them) and of small cases worked
// out by hand.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "../../chapters/04-softmax-attention/seed_statistics.hpp"

using namespace mpt::ch04;

TEST_CASE("Student's t: the closed forms against tabulated quantiles") {
  // t₀.₉₇₅ for 1 to 5 and 10 degrees of freedom.
  const double table[][2] = {{1, 12.706}, {2, 4.303}, {3, 3.182}, {4, 2.776}, {5, 2.571}, {10, 2.228}};
  for (const auto& row : table) {
    const int df = static_cast<int>(row[0]);
    CAPTURE(df);
    CHECK(student_t_quantile(0.95, df) == doctest::Approx(row[1]).epsilon(2e-4));
    CHECK(student_t_two_sided_p(row[1], df) == doctest::Approx(0.05).epsilon(2e-3));
  }
  // df = 2: P(|T| <= t) = t/√(2 + t²) exactly.
  CHECK(student_t_central(1.5, 2) == doctest::Approx(1.5 / std::sqrt(2 + 2.25)).epsilon(1e-12));
  // df = 1 is Cauchy: P(|T| <= 1) = 1/2.
  CHECK(student_t_central(1.0, 1) == doctest::Approx(0.5).epsilon(1e-12));
  CHECK(student_t_two_sided_p(0.0, 4) == 1.0);
  CHECK(student_t_two_sided_p(INFINITY, 4) == 0.0);
}

TEST_CASE("the sign test's exact two-sided p") {
  CHECK(sign_test_p(5, 5) == 2.0 / 32);  // all five the same way: the smallest p for 5 pairs
  CHECK(sign_test_p(0, 5) == 2.0 / 32);
  CHECK(sign_test_p(4, 5) == 2.0 * 6 / 32);  // 2·(C(5,0) + C(5,1))/2^5
  CHECK(sign_test_p(3, 5) == 1.0);           // 2·16/32, capped at 1
  CHECK(sign_test_p(6, 6) == 2.0 / 64);      // six pairs can reach 5%
  CHECK(sign_test_p(0, 0) == 1.0);
}

TEST_CASE("paired differences: mean, spread, interval, t and signs") {
  // d = 0.1, 0.2, 0.3, 0.4, 0.5: mean 0.3, sd √0.025, t = 0.3/(√0.025/√5).
  const std::vector<double> a = {1.1, 1.2, 1.3, 1.4, 1.5}, b = {1, 1, 1, 1, 1};
  const PairedDifference d = paired_difference(a, b);
  CHECK(d.n == 5);
  CHECK(d.df == 4);
  CHECK(d.mean == doctest::Approx(0.3));
  CHECK(d.sd == doctest::Approx(std::sqrt(0.025)));
  CHECK(d.t == doctest::Approx(0.3 / (std::sqrt(0.025) / std::sqrt(5.0))));
  CHECK(d.ci_low == doctest::Approx(0.3 - 2.7764451 * std::sqrt(0.025 / 5)).epsilon(1e-6));
  CHECK(d.ci_high == doctest::Approx(0.3 + 2.7764451 * std::sqrt(0.025 / 5)).epsilon(1e-6));
  CHECK(d.p_t < 0.05);
  CHECK(d.positive == 5);
  CHECK(d.p_sign == 2.0 / 32);
  // The seed's own effect cancels: adding the same number to both runs at a
  // seed changes nothing.
  std::vector<double> a2 = a, b2 = b;
  const double seed_effect[] = {0.3, -0.2, 0.5, 0.0, -0.4};
  for (int k = 0; k < 5; ++k) {
    a2[k] += seed_effect[k];
    b2[k] += seed_effect[k];
  }
  CHECK(paired_difference(a2, b2).t == doctest::Approx(d.t).epsilon(1e-9));
  // A tie is left out of the sign test.
  const PairedDifference tied = paired_difference({1, 2, 3}, {1, 1, 1});
  CHECK(tied.nonzero == 2);
  CHECK(tied.p_sign == 2.0 / 4);
}
