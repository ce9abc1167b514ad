// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: Welford's update
// and Chan's merge against a double two-pass reference, and why the norms
// use them (the one-pass E[x²] − E[x]² in float cancels).
// Depends on: mpt/nn/layers/welford.hpp, the core tier's Rng.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "mpt/core/random.hpp"
#include "mpt/nn/layers/welford.hpp"

using namespace mpt;

namespace {

// The textbook two-pass reference in double: the mean, then Σ (x − mean)².
struct TwoPass {
  double mean = 0, m2 = 0;
};

template <class T>
TwoPass two_pass(const std::vector<T>& v, std::size_t begin, std::size_t end) {
  TwoPass r;
  if (begin == end) return r;
  double sum = 0;
  for (std::size_t i = begin; i < end; ++i) sum += static_cast<double>(v[i]);
  r.mean = sum / static_cast<double>(end - begin);
  for (std::size_t i = begin; i < end; ++i) {
    const double d = static_cast<double>(v[i]) - r.mean;
    r.m2 += d * d;
  }
  return r;
}

template <class T>
TwoPass two_pass(const std::vector<T>& v) {
  return two_pass(v, 0, v.size());
}

template <class T>
Welford<T> one_at_a_time(const std::vector<T>& v, std::size_t begin, std::size_t end) {
  Welford<T> s;
  for (std::size_t i = begin; i < end; ++i) welford_add(s, v[i]);
  return s;
}

std::vector<double> normals(std::size_t n, double mean, double sd, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<double> v(n);
  for (double& x : v) x = mean + sd * rng.normal();
  return v;
}

double rel(double a, double b) { return std::fabs(a - b) / std::fabs(b); }

}  // namespace

TEST_CASE("welford by hand: {1, 2, 3, 4}") {
  const std::vector<double> v{1, 2, 3, 4};
  const Welford<double> s = one_at_a_time(v, 0, v.size());
  CHECK(s.count == 4);
  CHECK(s.mean == 2.5);
  CHECK(s.m2 == 5.0);  // 2.25 + 0.25 + 0.25 + 2.25
  CHECK(welford_variance_biased(s) == 1.25);
  CHECK(welford_variance_unbiased(s) == doctest::Approx(5.0 / 3.0).epsilon(1e-15));
  // The empty set: {0, 0, 0}, biased variance 0.
  const Welford<double> none;
  CHECK(none.count == 0);
  CHECK(welford_variance_biased(none) == 0.0);
  // One value: M2 = 0, so the unbiased variance is 0/0, as in PyTorch.
  const Welford<double> one = one_at_a_time(v, 1, 2);
  CHECK(one.mean == 2.0);
  CHECK(one.m2 == 0.0);
  CHECK(std::isnan(welford_variance_unbiased(one)));
}

TEST_CASE("welford one at a time agrees with the double two-pass reference") {
  const std::vector<double> v = normals(1000, 3.0, 2.0, 1);
  const TwoPass ref = two_pass(v);
  const Welford<double> d = one_at_a_time(v, 0, v.size());
  CHECK(d.count == 1000);
  CHECK(rel(d.mean, ref.mean) < 1e-13);
  CHECK(rel(d.m2, ref.m2) < 1e-13);
  // In float, on the same values rounded to float: a few ulps of the result.
  std::vector<float> f(v.begin(), v.end());
  const TwoPass reff = two_pass(f);
  const Welford<float> s = one_at_a_time(f, 0, f.size());
  CHECK(rel(s.mean, reff.mean) < 1e-5);
  CHECK(rel(s.m2, reff.m2) < 1e-5);
}

TEST_CASE("welford merge: every split, empty sets on either side, equals the whole") {
  const std::vector<double> v = normals(37, -1.5, 0.7, 2);
  const TwoPass ref = two_pass(v);
  for (std::size_t k = 0; k <= v.size(); ++k) {
    CAPTURE(k);
    const Welford<double> a = one_at_a_time(v, 0, k), b = one_at_a_time(v, k, v.size());
    // Each part agrees with its own two-pass statistics ...
    const TwoPass ra = two_pass(v, 0, k), rb = two_pass(v, k, v.size());
    CHECK(a.mean == doctest::Approx(ra.mean).epsilon(1e-13));
    CHECK(b.m2 == doctest::Approx(rb.m2).epsilon(1e-13));
    // ... and so does their merge, in either order, with the whole set's.
    for (const Welford<double>& m : {welford_merge(a, b), welford_merge(b, a)}) {
      CHECK(m.count == 37);
      CHECK(rel(m.mean, ref.mean) < 1e-13);
      CHECK(rel(m.m2, ref.m2) < 1e-13);
    }
  }
  // Merging with the empty set returns the other operand exactly.
  const Welford<double> all = one_at_a_time(v, 0, v.size()), none;
  for (const Welford<double>& m : {welford_merge(all, none), welford_merge(none, all)}) {
    CHECK(m.count == all.count);
    CHECK(m.mean == all.mean);
    CHECK(m.m2 == all.m2);
  }
  const Welford<double> empty = welford_merge(none, none);
  CHECK(empty.count == 0);
  CHECK(empty.mean == 0.0);
  CHECK(empty.m2 == 0.0);
}

TEST_CASE("welford merge of many uneven parts: a tree reduction") {
  // Parts of 1, 2, 3, ... values, merged pairwise as a GPU block would.
  const std::vector<double> v = normals(300, 10.0, 3.0, 3);
  std::vector<Welford<double>> parts;
  for (std::size_t begin = 0, len = 1; begin < v.size(); begin += len, ++len)
    parts.push_back(one_at_a_time(v, begin, std::min(v.size(), begin + len)));
  parts.emplace_back();  // an empty pad, as a reduction over a power of two would have
  while (parts.size() > 1) {
    std::vector<Welford<double>> next;
    for (std::size_t i = 0; i < parts.size(); i += 2)
      next.push_back(i + 1 < parts.size() ? welford_merge(parts[i], parts[i + 1]) : parts[i]);
    parts = next;
  }
  const TwoPass ref = two_pass(v);
  CHECK(parts[0].count == 300);
  CHECK(rel(parts[0].mean, ref.mean) < 1e-13);
  CHECK(rel(parts[0].m2, ref.m2) < 1e-12);
}

TEST_CASE("mean 1000, std 1: float Welford is accurate, float E[x^2] - E[x]^2 is not") {
  // 4096 float values around 1000 with spread 1: the variance is ~1, while
  // x² is ~10⁶, where a float's spacing is 2⁻⁴ and the running Σx² reaches
  // 4·10⁹ (spacing 256). The one-pass formula subtracts two numbers near
  // 10⁶ whose rounding errors are as large as their difference.
  const std::vector<double> d = normals(4096, 1000.0, 1.0, 4);
  const std::vector<float> x(d.begin(), d.end());
  const TwoPass ref = two_pass(x);  // double, on the float values themselves
  const double var_ref = ref.m2 / 4096.0;
  REQUIRE(var_ref > 0.8);
  REQUIRE(var_ref < 1.2);

  const Welford<float> w = one_at_a_time(x, 0, x.size());
  const double welford_err = rel(welford_variance_biased(w), var_ref);

  float sum = 0.0f, sum_sq = 0.0f;
  for (float v : x) {
    sum += v;
    sum_sq += v * v;
  }
  const float mean = sum / 4096.0f;
  const float naive_var = sum_sq / 4096.0f - mean * mean;
  const double naive_err = rel(naive_var, var_ref);

  MESSAGE("relative error of the variance: float Welford ", welford_err, ", float E[x^2]-E[x]^2 ", naive_err);
  CHECK(welford_err < 1e-4);
  CHECK(naive_err > 0.5);
  // And in double the one-pass formula is fine here: the trouble is the float.
  double dsum = 0, dsq = 0;
  for (float v : x) {
    dsum += v;
    dsq += static_cast<double>(v) * v;
  }
  CHECK(rel(dsq / 4096.0 - (dsum / 4096.0) * (dsum / 4096.0), var_ref) < 1e-6);
}
