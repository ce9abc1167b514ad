// Chapter 03 — exercises: grader tests for exercise 3.1 (the merge of two partial Welford statistics).
// Depends on: grader.hpp; mpt::welford_merge in double is the reference.
// Four test cases: hand-worked merges, empty operands (a detail, one point),
// halves of mean 1e4 ± 1 (where the order of operations decides), and
// reduction trees over seeded data against a two-pass sum in double.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex03;
using namespace mpt::ex03::grading;

// One merge compared with the reference; `why` says what the case is about.
void expect_merge(Mismatches& m, const Stats& a, const Stats& b, const std::string& why) {
  m.checked();
  const ExactStats want = reference_merge(a, b);
  const Stats got = merge_statistics(a, b);
  if (merge_close(got, want, a, b) || !m.wrong()) return;
  m.detail(why + ": merge(" + describe(a) + ", " + describe(b) + ") gave " + describe(got) + ", expected " +
           describe(want) + " (count exact, mean within 8 epsilons of the larger |mean|, m2 within 16 " +
           "epsilons of the exact m2)");
}

bool same_bits(const Stats& a, const Stats& b) {
  return a.count == b.count && bits_of(a.mean) == bits_of(b.mean) && bits_of(a.m2) == bits_of(b.m2);
}

// The reduction trees of the last test case: chunk statistics merged
// pairwise, level by level, over a power of two of slots, the unused ones
// empty (a block's tree: threads past the data hold {0, 0, 0}), or folded
// left to right (a grid-stride loop).
Stats tree_merge(std::vector<Stats> level) {
  std::size_t slots = 1;
  while (slots < level.size()) slots *= 2;
  level.resize(slots, Stats{});
  while (level.size() > 1) {
    std::vector<Stats> next;
    for (std::size_t i = 0; i + 1 < level.size(); i += 2)
      next.push_back(merge_statistics(level[i], level[i + 1]));
    level = next;
  }
  return level.front();
}

Stats fold_merge(const std::vector<Stats>& chunks) {
  Stats total;
  for (const Stats& c : chunks) total = merge_statistics(total, c);
  return total;
}

// The trees merge float chunk statistics, each the exact statistics of its
// chunk rounded once to float: a chunk mean near 1e5 is off by up to 2^-24 of
// it, which is what limits M2 when the mean is large next to the spread.
// Measured over these data: the solution's and mpt's own float merge within
// 2.3e-7 (mean, of max(|mean|, sd)) and 4.9e-5 (M2, relative); the merge
// through weighted sums of the means within 4.7e-7 and 2.2e-4. The naive
// Σx, Σx² merge misses M2 by 1 (100%) and more on the data of mean 1e4,
// -300 and 1e5.
constexpr double kTreeMeanTolerance = 4e-6;
constexpr double kTreeM2Tolerance = 1e-3;

}  // namespace

TEST_SUITE("exercise-3.1") {
  TEST_CASE("3.1 hand-worked merges: the union's count, mean and M2") {
    Mismatches m;
    // {1, 2, 3} and {4, 5}: {5 values, mean 3, M2 10}.
    expect_merge(m, {3, 2.0f, 2.0f}, {2, 4.5f, 0.5f}, "{1, 2, 3} and {4, 5}");
    expect_merge(m, {2, 4.5f, 0.5f}, {3, 2.0f, 2.0f}, "{4, 5} and {1, 2, 3}");
    // Two single values: {10} and {20}: mean 15, M2 50.
    expect_merge(m, {1, 10.0f, 0.0f}, {1, 20.0f, 0.0f}, "{10} and {20}");
    // 2, 4, 4, 4 | 5, 5, 7, 9: mean 5, M2 32 (variance 4).
    expect_merge(m, {4, 3.5f, 3.0f}, {4, 6.5f, 11.0f}, "{2, 4, 4, 4} and {5, 5, 7, 9}");
    // 1..9 and {100}: mean 14.5, M2 60 + 95² · 9/10 = 8182.5.
    expect_merge(m, {9, 5.0f, 60.0f}, {1, 100.0f, 0.0f}, "{1, ..., 9} and {100}");
    expect_merge(m, {1, 100.0f, 0.0f}, {9, 5.0f, 60.0f}, "{100} and {1, ..., 9}");
    // {-3, -1} and {1, 3}: mean 0, M2 20.
    expect_merge(m, {2, -2.0f, 2.0f}, {2, 2.0f, 2.0f}, "{-3, -1} and {1, 3}");
    // Counts that are not small, means and M2 that are not round.
    expect_merge(m, {1000, 0.25f, 83.3f}, {3000, -0.75f, 251.7f}, "1000 and 3000 values");
    expect_merge(m, {123457, 3.14159f, 1.0e5f}, {7, 2.71828f, 0.5f}, "123457 values and 7");
    expect_merge(m, {std::int64_t{1} << 33, -1.5e-3f, 4.0e6f}, {std::int64_t{1} << 31, 2.5e-3f, 1.0e6f},
                 "2^33 values and 2^31");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("3.1 an empty operand leaves the other exactly as it is; two empty ones are empty [1 point]") {
    Mismatches m;
    const Stats empty{};
    const Stats others[] = {{1, 0.1f, 0.0f},        {7, -2.5f, 1.25f},
                            {100, 1e4f, 3.0f},      {1, 3e19f, 0.0f},
                            {5, -1e30f, 1e35f},     {2, 1e-30f, 1e-45f},
                            {1 << 20, 7.0f, 1e38f}, {std::int64_t{1} << 40, -0.0f, 0.0f}};
    for (const Stats& s : others) {
      for (bool empty_first : {true, false}) {
        m.checked();
        const Stats got = empty_first ? merge_statistics(empty, s) : merge_statistics(s, empty);
        if (same_bits(got, s) || !m.wrong()) continue;
        m.detail(std::string("merge(") +
                 (empty_first ? "{0, 0, 0}, " + describe(s) : describe(s) + ", {0, 0, 0}") + ") gave " +
                 describe(got) + ", expected the non-empty operand bit for bit");
      }
    }
    m.checked();
    const Stats both = merge_statistics(empty, empty);
    if (!(both.count == 0 && both.mean == 0.0f && both.m2 == 0.0f) && m.wrong())
      m.detail("merge({0, 0, 0}, {0, 0, 0}) gave " + describe(both) + ", expected {0, 0, 0}");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE(
      "3.1 halves of mean 1e4 + 1 and 1e4 - 1: the difference of the means, taken first, keeps M2 [4 "
      "points]") {
    // Each half's spread is small next to the distance between the halves,
    // so nearly all of M2 is δ²·nₐ·n_b/n, and δ is the difference of two
    // floats near 1e4 (exact). Through Σx² every term is 1e8 times the size
    // of the spread's, and the float sums' rounding errors swamp the answer.
    Mismatches m;
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{2}, std::int64_t{10}, std::int64_t{1000},
                           std::int64_t{65536}, std::int64_t{1000000}, std::int64_t{1} << 30}) {
      const float m2 = n == 1 ? 0.0f : 0.25f * static_cast<float>(n);  // a spread of 0.5 in each half
      expect_merge(m, {n, 10001.0f, m2}, {n, 9999.0f, m2}, "halves of mean 1e4 + 1 and 1e4 - 1");
      expect_merge(m, {n, 9999.0f, m2}, {n, 10001.0f, m2}, "halves of mean 1e4 - 1 and 1e4 + 1");
      expect_merge(m, {n, 10000.9f, m2}, {3 * n + 1, 9999.17f, 3.0f * m2},
                   "a quarter near 1e4 + 0.9, the rest near 1e4 - 0.83");
      expect_merge(m, {n, -10001.0f, 0.0f}, {n, -9999.0f, 0.0f},
                   "two constant halves at -1e4 - 1 and -1e4 + 1");
    }
    // Halves built from data: 500 values each, spread 0.5, stored as float.
    std::mt19937 rng(31u);
    std::uniform_real_distribution<double> u(-0.5, 0.5);
    for (int t = 0; t < 20; ++t) {
      std::vector<double> lo, hi;
      for (int i = 0; i < 500; ++i) {
        hi.push_back(10001.0 + u(rng));
        lo.push_back(9999.0 + u(rng));
      }
      expect_merge(m, rounded_stats(hi), rounded_stats(lo), "500 values near 1e4 + 1 and 500 near 1e4 - 1");
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("3.1 reduction trees of merges agree with a two-pass sum in double [4 points]") {
    Mismatches m;
    struct Data {
      const char* what;
      double mean, sd;
      int n;
    };
    const Data sets[] = {
        {"4096 values of mean 0, sd 1", 0.0, 1.0, 4096},
        {"4096 values of mean 1e4, sd 1", 1e4, 1.0, 4096},
        {"3000 values of mean -300, sd 0.01", -300.0, 0.01, 3000},
        {"5000 values of mean 1e3, sd 1e3", 1e3, 1e3, 5000},
        {"777 values of mean 1e5, sd 3", 1e5, 3.0, 777},
        {"2 values of mean 5, sd 1", 5.0, 1.0, 2},
    };
    std::mt19937 rng(20250303u);
    for (const Data& d : sets) {
      std::normal_distribution<double> normal(d.mean, d.sd);
      std::vector<float> values;
      for (int i = 0; i < d.n; ++i) values.push_back(static_cast<float>(normal(rng)));
      const ExactStats want = two_pass(values);
      // Chunks of 0 to 64 values (empty ones included), each chunk's exact
      // statistics rounded once to float.
      std::vector<Stats> chunks;
      std::size_t at = 0;
      while (at < values.size()) {
        const std::size_t len = std::min<std::size_t>(rng() % 65, values.size() - at);
        chunks.push_back(rounded_stats(std::vector<double>(values.begin() + at, values.begin() + at + len)));
        at += len;
      }
      const double sd = std::sqrt(want.m2 / static_cast<double>(want.count));
      for (bool tree : {true, false}) {
        m.checked();
        const Stats got = tree ? tree_merge(chunks) : fold_merge(chunks);
        const double mean_error = std::fabs(got.mean - want.mean) / std::max(std::fabs(want.mean), sd);
        const double m2_error = std::fabs(got.m2 - want.m2) / want.m2;
        if (got.count == want.count && mean_error <= kTreeMeanTolerance && m2_error <= kTreeM2Tolerance)
          continue;
        if (m.wrong())
          m.detail(std::string(d.what) + ", " + std::to_string(chunks.size()) + " chunks merged " +
                   (tree ? "pairwise over a power of two of slots" : "left to right") + ": got " +
                   describe(got) + ", the two-pass statistics in double are " + describe(want) +
                   " (mean error " + short_number(mean_error) + " of max(|mean|, sd), allowed " +
                   short_number(kTreeMeanTolerance) + "; m2 error " + short_number(m2_error) +
                   " relative, allowed " + short_number(kTreeM2Tolerance) + ")");
      }
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

}  // TEST_SUITE
