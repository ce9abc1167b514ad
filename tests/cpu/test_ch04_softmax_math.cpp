// Chapter 04 — numerically stable softmax and cross-entropy: the row math.
// MaxSum's add and merge against FP64 sums written out in the test, order
// independence up to rounding, the rules for the empty set, −inf, +inf and
// NaN; the two-pass row_max_sum, and the row functions in double against
// formulas evaluated here in long double.
// Depends on: mpt/nn/layers/softmax_math.hpp, mpt/core/random.hpp (Rng).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "mpt/core/random.hpp"
#include "mpt/nn/layers/softmax_math.hpp"

using namespace mpt;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr float kInfF = std::numeric_limits<float>::infinity();

std::vector<double> randn(std::size_t n, std::uint64_t seed, double sd) {
  Rng rng(seed);
  std::vector<double> v(n);
  for (double& x : v) x = sd * rng.normal();
  return v;
}

// log Σ exp(z) in long double with the max taken out: the reference.
long double ref_lse(const std::vector<double>& z) {
  const long double m = *std::max_element(z.begin(), z.end());
  long double s = 0;
  for (double v : z) s += std::exp(static_cast<long double>(v) - m);
  return m + std::log(s);
}

template <class T>
MaxSum<T> fold(const std::vector<T>& z) {
  MaxSum<T> s;
  for (T v : z) max_sum_add(s, v);
  return s;
}

}  // namespace

TEST_CASE("max_sum_add: the running (max, sum) against the FP64 sum written out") {
  // Hand-worked: {1, 3, 2}: max 3, sum e^-2 + 1 + e^-1.
  const MaxSum<double> s = fold<double>({1.0, 3.0, 2.0});
  CHECK(s.max == 3.0);
  CHECK(s.sum == doctest::Approx(std::exp(-2.0) + 1.0 + std::exp(-1.0)).epsilon(1e-15));
  // Random rows, in double and in float, against long double.
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    const std::vector<double> z = randn(257, seed, 8.0);
    const MaxSum<double> d = fold(z);
    CHECK(d.max == *std::max_element(z.begin(), z.end()));
    CHECK(static_cast<double>(log_sum_exp(d)) ==
          doctest::Approx(static_cast<double>(ref_lse(z))).epsilon(1e-14));
    const std::vector<float> zf(z.begin(), z.end());
    const MaxSum<float> f = fold(zf);
    const std::vector<double> zr(zf.begin(), zf.end());  // the float row, exactly
    CHECK(static_cast<double>(log_sum_exp(f)) ==
          doctest::Approx(static_cast<double>(ref_lse(zr))).epsilon(1e-6));
  }
}

TEST_CASE("max_sum_add: a rising row rescales the sum and loses nothing to overflow") {
  // 0, 100, 200, …: without the rescale exp(z) overflows; with it sum -> 1/(1 − e^-100) ≈ 1.
  std::vector<float> z;
  for (int i = 0; i < 10; ++i) z.push_back(100.0f * static_cast<float>(i));
  const MaxSum<float> s = fold(z);
  CHECK(s.max == 900.0f);
  CHECK(s.sum == 1.0f);
  CHECK(log_sum_exp(s) == 900.0f);
  // Two equal maxima: sum 2, whatever order.
  CHECK(fold<double>({5.0, -1.0, 5.0}).sum == doctest::Approx(2.0 + std::exp(-6.0)).epsilon(1e-15));
}

TEST_CASE("max_sum_merge: any split of a row gives the same (max, sum) up to rounding") {
  const std::vector<double> z = randn(100, 11, 5.0);
  const MaxSum<double> whole = fold(z);
  for (std::size_t cut :
       {std::size_t{0}, std::size_t{1}, std::size_t{37}, std::size_t{99}, std::size_t{100}}) {
    const MaxSum<double> a =
        fold(std::vector<double>(z.begin(), z.begin() + static_cast<std::ptrdiff_t>(cut)));
    const MaxSum<double> b = fold(std::vector<double>(z.begin() + static_cast<std::ptrdiff_t>(cut), z.end()));
    for (const MaxSum<double>& m : {max_sum_merge(a, b), max_sum_merge(b, a)}) {
      CAPTURE(cut);
      CHECK(m.max == whole.max);
      CHECK(m.sum == doctest::Approx(whole.sum).epsilon(1e-13));
    }
  }
  // A tree of 8 leaves, as a warp reduction combines them, against the fold.
  std::vector<MaxSum<double>> leaves;
  for (std::size_t k = 0; k < 8; ++k) {
    MaxSum<double> s;
    for (std::size_t i = k; i < z.size(); i += 8) max_sum_add(s, z[i]);
    leaves.push_back(s);
  }
  for (std::size_t width = 1; width < 8; width *= 2)
    for (std::size_t k = 0; k + width < 8; k += 2 * width)
      leaves[k] = max_sum_merge(leaves[k], leaves[k + width]);
  CHECK(leaves[0].max == whole.max);
  CHECK(leaves[0].sum == doctest::Approx(whole.sum).epsilon(1e-13));
  // Reversed and sorted orders of the same row.
  std::vector<double> r(z.rbegin(), z.rend()), sorted = z;
  std::sort(sorted.begin(), sorted.end());
  CHECK(fold(r).sum == doctest::Approx(whole.sum).epsilon(1e-13));
  CHECK(fold(sorted).sum == doctest::Approx(whole.sum).epsilon(1e-13));
}

TEST_CASE("max_sum_merge with the empty set returns the other side exactly") {
  const MaxSum<float> empty;
  CHECK(empty.max == -kInfF);
  CHECK(empty.sum == 0.0f);
  const MaxSum<float> s = fold<float>({0.1f, 3.7f, -2.0f});
  for (const MaxSum<float>& m : {max_sum_merge(s, empty), max_sum_merge(empty, s)}) {
    CHECK(m.max == s.max);
    CHECK(m.sum == s.sum);  // bit for bit: no exp(−inf − m) rescale of the other side
  }
  const MaxSum<float> both = max_sum_merge(empty, empty);
  CHECK(both.max == -kInfF);
  CHECK(both.sum == 0.0f);
  CHECK(log_sum_exp(both) == -kInfF);
}

TEST_CASE("MaxSum: −inf is a masked position, +inf and NaN make the sum NaN") {
  // −inf adds nothing: the same (max, sum) as without it, exactly.
  const MaxSum<double> plain = fold<double>({1.0, 2.0});
  const MaxSum<double> masked = fold<double>({-kInf, 1.0, -kInf, 2.0});
  CHECK(masked.max == plain.max);
  CHECK(masked.sum == plain.sum);
  // A row of −inf only is the empty set.
  const MaxSum<double> all = fold<double>({-kInf, -kInf});
  CHECK(all.max == -kInf);
  CHECK(all.sum == 0.0);
  CHECK(log_sum_exp(all) == -kInf);
  // +inf: exp(inf − inf) is NaN, as the two-pass sum and PyTorch's softmax.
  for (const std::vector<double>& z :
       {std::vector<double>{kInf}, {1.0, kInf}, {kInf, 1.0}, {kInf, kInf}, {-kInf, kInf, 0.0}}) {
    const MaxSum<double> s = fold(z);
    CHECK(s.max == kInf);
    CHECK(std::isnan(s.sum));
    CHECK(std::isnan(log_sum_exp(s)));
    CHECK(std::isnan(row_max_sum<double>([&](std::int64_t j) { return z[static_cast<std::size_t>(j)]; },
                                         static_cast<std::int64_t>(z.size()))
                         .sum));
  }
  // NaN anywhere: both NaN, and merging keeps it, on either side.
  const MaxSum<double> n = fold<double>({1.0, std::nan(""), 2.0});
  CHECK(std::isnan(n.max));
  CHECK(std::isnan(n.sum));
  CHECK(std::isnan(log_sum_exp(n)));
  for (const MaxSum<double>& m : {max_sum_merge(n, plain), max_sum_merge(plain, n)}) {
    CHECK(std::isnan(m.max));
    CHECK(std::isnan(m.sum));
  }
}

TEST_CASE("row_max_sum: max first, then Σ exp(z − max) left to right") {
  const std::vector<float> z = {0.5f, -3.0f, 2.25f, 2.0f, -0.125f};
  const auto value = [&](std::int64_t j) { return z[static_cast<std::size_t>(j)]; };
  const MaxSum<float> s = row_max_sum<float>(value, 5);
  // The same float operations written out: bit for bit.
  float sum = 0.0f;
  for (float v : z) sum += expf(v - 2.25f);
  CHECK(s.max == 2.25f);
  CHECK(s.sum == sum);
  // And close to the online fold (which rounds its rescales too).
  CHECK(s.sum == doctest::Approx(fold(z).sum).epsilon(1e-6));
  // Empty, masked, NaN.
  CHECK(row_max_sum<float>(value, 0).sum == 0.0f);
  const std::vector<float> m = {-kInfF, -kInfF};
  const MaxSum<float> e =
      row_max_sum<float>([&](std::int64_t j) { return m[static_cast<std::size_t>(j)]; }, 2);
  CHECK(e.max == -kInfF);
  CHECK(e.sum == 0.0f);
  const std::vector<float> q = {1.0f, std::nanf(""), kInfF};
  const MaxSum<float> nq =
      row_max_sum<float>([&](std::int64_t j) { return q[static_cast<std::size_t>(j)]; }, 3);
  CHECK(std::isnan(nq.max));
  CHECK(std::isnan(nq.sum));
}

TEST_CASE("row functions in double against the formulas in long double") {
  const std::vector<double> z = randn(7, 3, 4.0);
  const auto value = [&](std::int64_t j) { return z[static_cast<std::size_t>(j)]; };
  const long double lse = ref_lse(z);
  std::vector<double> p(7), lp(7);
  softmax_row<double>(value, 7, [&](std::int64_t j, double v) { p[static_cast<std::size_t>(j)] = v; });
  log_softmax_row<double>(value, 7, [&](std::int64_t j, double v) { lp[static_cast<std::size_t>(j)] = v; });
  for (std::size_t j = 0; j < 7; ++j) {
    CHECK(p[j] == doctest::Approx(static_cast<double>(std::exp(z[j] - lse))).epsilon(1e-14));
    CHECK(lp[j] == doctest::Approx(static_cast<double>(z[j] - lse)).epsilon(1e-14));
  }
  // Cross-entropy with smoothing ε: (1 − ε)(lse − z_y) + ε(lse − mean z).
  const long double mean = std::accumulate(z.begin(), z.end(), 0.0L) / 7;
  for (double eps : {0.0, 0.1, 1.0}) {
    CAPTURE(eps);
    const double want = static_cast<double>((1 - eps) * (lse - z[2]) + eps * (lse - mean));
    CHECK(cross_entropy_row<double>(value, 7, 2, eps) == doctest::Approx(want).epsilon(1e-14));
  }
  // The fused backward: g((1 − ε)(p − onehot) + ε(p − 1/K)); an ignored row is 0.
  std::vector<double> d(7);
  cross_entropy_backward_row<double>(value, 7, 4, -100, 0.2, 3.0,
                                     [&](std::int64_t j, double v) { d[static_cast<std::size_t>(j)] = v; });
  for (std::size_t j = 0; j < 7; ++j) {
    const long double pj = std::exp(z[j] - lse);
    CHECK(d[j] == doctest::Approx(static_cast<double>(3 * (0.8L * (pj - (j == 4)) + 0.2L * (pj - 1.0L / 7))))
                      .epsilon(1e-13));
  }
  cross_entropy_backward_row<double>(value, 7, 4, 4, 0.2, 3.0,
                                     [&](std::int64_t j, double v) { d[static_cast<std::size_t>(j)] = v; });
  for (double v : d) CHECK(v == 0.0);
  // Reductions: mean over the counted rows, 0/0 = NaN; sum.
  CHECK(reduce_loss(LossTotal<double>{6.0, 4}, Reduction::mean) == 1.5);
  CHECK(reduce_loss(LossTotal<double>{6.0, 4}, Reduction::sum) == 6.0);
  CHECK(std::isnan(reduce_loss(LossTotal<double>{0.0, 0}, Reduction::mean)));
  CHECK(row_gradient(6.0, 4, Reduction::mean) == 1.5);
  CHECK(row_gradient(6.0, 4, Reduction::sum) == 6.0);
}

TEST_CASE("the max subtraction: float rows of large logits stay finite") {
  // exp(100) overflows float; the row functions never form it.
  const std::vector<float> z = {100.0f, 99.0f, 98.0f};
  const auto value = [&](std::int64_t j) { return z[static_cast<std::size_t>(j)]; };
  std::vector<float> p(3);
  softmax_row<float>(value, 3, [&](std::int64_t j, float v) { p[static_cast<std::size_t>(j)] = v; });
  const double s = 1 + std::exp(-1.0) + std::exp(-2.0);
  CHECK(p[0] == doctest::Approx(1 / s).epsilon(1e-6));
  CHECK(p[2] == doctest::Approx(std::exp(-2.0) / s).epsilon(1e-6));
  CHECK(cross_entropy_row<float>(value, 3, 2, 0.0f) == doctest::Approx(2 + std::log(s)).epsilon(1e-6));
}

TEST_CASE("cross_entropy_of: a large max never meets log(sum) (the CPU rows and the CUDA kernels)") {
  // Logits at 30000 with the target tied at the maximum: the loss is
  // log 2 + a little. In float, m + log(sum) would be rounded to FP32's
  // spacing at 30000 (2^-9) before z_y is taken off; log(sum) − (z_y − m)
  // keeps the few-ulp accuracy of log(sum) itself.
  const std::vector<float> z = {30000.0f, 30000.0f, 29984.0f, 29968.0f};
  const auto value = [&](std::int64_t j) { return z[static_cast<std::size_t>(j)]; };
  const long double want = std::log(2.0L + std::exp(-16.0L) + std::exp(-32.0L));
  const MaxSum<float> s = row_max_sum<float>(value, 4);
  for (float eps : {0.0f, 0.1f}) {
    const float shifted = (0.0f + 0.0f) + (-16.0f) + (-32.0f);
    const long double smooth = want + 48.0L / 4.0L;
    const long double exact = (1 - static_cast<long double>(eps)) * want + eps * smooth;
    const float got = cross_entropy_of(s, z[0], shifted, 4, eps);
    CHECK(std::fabs(static_cast<long double>(got) - exact) <= 8 * 0x1p-24L * std::fabs(exact));
    CHECK(got == cross_entropy_row<float>(value, 4, 0, eps));  // the row function is this formula
  }
  // The form it replaces, for contrast: off by far more than 8 ulps of the loss.
  const float lse_form = (s.max + std::log(s.sum)) - z[0];
  CHECK(std::fabs(static_cast<long double>(lse_form) - want) > 64 * 0x1p-24L * want);
}
