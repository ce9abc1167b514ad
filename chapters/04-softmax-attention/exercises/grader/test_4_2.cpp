// Chapter 04 — exercises: grader tests for exercise 4.2 (the online (max, sum): add a logit, merge two
// states). Depends on: grader.hpp; mpt's max_sum_add, max_sum_merge and two-pass row_max_sum in double are
// the reference. Six test cases: hand-worked adds, hand-worked merges, empty operands (a detail, one point),
// masked logits (−inf), order independence (folds in four orders, trees), and block reductions of long rows
// of large logits against a two-pass computation in double.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex04;
using namespace mpt::ex04::grading;

// One add compared with the reference.
void expect_add(Mismatches& m, const OnlineSoftmax& s, float z, const std::string& why) {
  m.checked();
  const mpt::MaxSum<double> want = reference_add(s, z);
  const OnlineSoftmax got = online_add(s, z);
  if (state_close(got, want, kStepTolerance) || !m.wrong()) return;
  m.detail(why + ": online_add(" + describe(s) + ", " + describe(z) + ") gave " + describe(got) +
           ", expected " + describe(want) + " (max exact, sum within 8 epsilons relative)");
}

// One merge compared with the reference.
void expect_merge(Mismatches& m, const OnlineSoftmax& a, const OnlineSoftmax& b, const std::string& why) {
  m.checked();
  const mpt::MaxSum<double> want = reference_merge(a, b);
  const OnlineSoftmax got = online_merge(a, b);
  if (state_close(got, want, kStepTolerance) || !m.wrong()) return;
  m.detail(why + ": online_merge(" + describe(a) + ", " + describe(b) + ") gave " + describe(got) +
           ", expected " + describe(want) + " (max exact, sum within 8 epsilons relative)");
}

// A whole set's state compared with the two-pass state in double.
void expect_set(Mismatches& m, const OnlineSoftmax& got, const std::vector<float>& z,
                const std::string& why) {
  m.checked();
  const mpt::MaxSum<double> want = two_pass(z);
  if (state_close(got, want, kSetTolerance) || !m.wrong()) return;
  m.detail(why + " (" + describe_row(z) + "): got " + describe(got) + ", the two-pass state in double is " +
           describe(want) + " (sum error " + short_number(state_error(got, want)) + " relative, allowed " +
           short_number(kSetTolerance) + ")");
}

bool same_bits(const OnlineSoftmax& a, const OnlineSoftmax& b) {
  return bits_of(a.max) == bits_of(b.max) && bits_of(a.sum) == bits_of(b.sum);
}

// The state of a set, exact in double and rounded once to float: an
// operand whose only error is its storage.
OnlineSoftmax rounded_state(const std::vector<float>& z) {
  const mpt::MaxSum<double> s = two_pass(z);
  return {static_cast<float>(s.max), static_cast<float>(s.sum)};
}

// Chunks of 0 to `most` logits merged pairwise over a power of two of
// slots (empty padding), each chunk folded with online_add.
OnlineSoftmax chunk_tree(const std::vector<float>& z, std::mt19937& rng, std::size_t most) {
  std::vector<OnlineSoftmax> level;
  std::size_t at = 0;
  while (at < z.size()) {
    const std::size_t len = std::min<std::size_t>(rng() % (most + 1), z.size() - at);
    level.push_back(fold(std::vector<float>(z.begin() + static_cast<std::ptrdiff_t>(at),
                                            z.begin() + static_cast<std::ptrdiff_t>(at + len))));
    at += len;
  }
  std::size_t slots = 1;
  while (slots < level.size()) slots *= 2;
  level.resize(slots, OnlineSoftmax{});
  while (level.size() > 1) {
    std::vector<OnlineSoftmax> next;
    for (std::size_t i = 0; i + 1 < level.size(); i += 2)
      next.push_back(online_merge(level[i], level[i + 1]));
    level = next;
  }
  return level.front();
}

}  // namespace

TEST_SUITE("exercise-4.2") {
  TEST_CASE("4.2 hand-worked adds: a larger logit rescales the sum, a smaller one adds to it") {
    Mismatches m;
    const OnlineSoftmax empty{};
    // The first logit: {z, 1}, whatever z is.
    expect_add(m, empty, 0.0f, "the first logit, 0");
    expect_add(m, empty, 3.5f, "the first logit, 3.5");
    expect_add(m, empty, -60000.0f, "the first logit, -60000");
    // {0, 1} + 0: {0, 2}. {0, 2} + 1: {1, 2/e + 1}. {1, 1.7358} + -1: + e^-2.
    expect_add(m, {0.0f, 1.0f}, 0.0f, "an equal logit");
    expect_add(m, {0.0f, 2.0f}, 1.0f, "a larger logit: the sum rescaled by e^-1");
    expect_add(m, {1.0f, 1.7357589f}, -1.0f, "a smaller logit: e^-2 added");
    expect_add(m, {5.0f, 3.0f}, 5.0f + std::log(2.0f), "a larger logit by log 2: 3/2 + 1");
    expect_add(m, {-2.0f, 7.5f}, 30.0f, "a much larger logit: the old sum nearly vanishes");
    expect_add(m, {30.0f, 1.25f}, -2.0f, "a much smaller logit: almost nothing added");
    expect_add(m, {60000.0f, 1.0f}, 60001.0f, "large logits, one apart");
    expect_add(m, {-1e30f, 4.0f}, 1e30f, "from -1e30 to 1e30");
    expect_add(m, {10.0f, 1000.0f}, 9.0f, "a large sum");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.2 hand-worked merges: the smaller maximum's sum rescaled to the larger one") {
    Mismatches m;
    // {0, 0} and {1}: {0, 2} and {1, 1}: {1, 2/e + 1}.
    expect_merge(m, {0.0f, 2.0f}, {1.0f, 1.0f}, "{0, 0} and {1}");
    expect_merge(m, {1.0f, 1.0f}, {0.0f, 2.0f}, "{1} and {0, 0}");
    expect_merge(m, {3.0f, 1.5f}, {3.0f, 2.25f}, "equal maxima: the sums add");
    expect_merge(m, {-4.0f, 17.0f}, {2.5f, 1.0001f}, "maxima 6.5 apart");
    expect_merge(m, {2.5f, 1.0001f}, {-4.0f, 17.0f}, "maxima 6.5 apart, the larger first");
    expect_merge(m, {60000.0f, 3.0f}, {59990.0f, 40.0f}, "maxima near 60000, 10 apart");
    expect_merge(m, {1e30f, 2.0f}, {-1e30f, 5.0f}, "maxima 1e30 and -1e30");
    expect_merge(m, {7.0f, 1.0f}, {7.0f + std::log(3.0f), 1.0f}, "maxima log 3 apart");
    expect_merge(m, {-100.0f, 250.0f}, {-99.0f, 3.0f}, "negative maxima");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.2 an empty operand leaves the other exactly as it is; two empty ones are empty [1 point]") {
    Mismatches m;
    const OnlineSoftmax empty{};
    const OnlineSoftmax others[] = {{0.0f, 1.0f},   {3.5f, 2.0f},        {-60000.0f, 1.0f}, {1e30f, 7.0f},
                                    {-1e30f, 1.5f}, {0.1f, 1.00000012f}, {12.0f, 3.0e38f},  {-3e38f, 1.0f}};
    for (const OnlineSoftmax& s : others) {
      for (bool empty_first : {true, false}) {
        m.checked();
        const OnlineSoftmax got = empty_first ? online_merge(empty, s) : online_merge(s, empty);
        if (same_bits(got, s) || !m.wrong()) continue;
        m.detail(std::string("online_merge(") +
                 (empty_first ? "{-inf, 0}, " + describe(s) : describe(s) + ", {-inf, 0}") + ") gave " +
                 describe(got) + ", expected the non-empty operand bit for bit");
      }
    }
    m.checked();
    const OnlineSoftmax both = online_merge(empty, empty);
    if (!(both.max == -kInf && both.sum == 0.0f) && m.wrong())
      m.detail("online_merge({-inf, 0}, {-inf, 0}) gave " + describe(both) + ", expected {-inf, 0}");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.2 masked logits (-inf) change nothing, from the first logit on") {
    // A padded or causal attention row starts and ends with masked
    // positions: exp(-inf - (-inf)) is NaN, and one NaN ruins the row.
    Mismatches m;
    const OnlineSoftmax empty{};
    m.checked();
    const OnlineSoftmax first = online_add(empty, -kInf);
    if (!(first.max == -kInf && first.sum == 0.0f) && m.wrong())
      m.detail("online_add({-inf, 0}, -inf) gave " + describe(first) + ", expected {-inf, 0} (still empty)");
    for (const OnlineSoftmax& s :
         {OnlineSoftmax{0.0f, 1.0f}, OnlineSoftmax{-60000.0f, 2.5f}, OnlineSoftmax{1e30f, 3.0f}}) {
      m.checked();
      const OnlineSoftmax got = online_add(s, -kInf);
      if (!same_bits(got, s) && m.wrong())
        m.detail("online_add(" + describe(s) + ", -inf) gave " + describe(got) + ", expected " + describe(s) +
                 " bit for bit");
    }
    expect_set(m, fold({-kInf, -kInf, -kInf}), {-kInf, -kInf, -kInf}, "a fully masked row folded");
    expect_set(m, fold({-kInf, -kInf, 2.0f, -kInf, 3.0f}), {-kInf, -kInf, 2.0f, -kInf, 3.0f},
               "masked positions first, between and after");
    std::vector<float> left = normal_row(4201u, 200, 0.0, 3.0);
    for (std::size_t j = 0; j < 150; ++j) left[j] = -kInf;
    expect_set(m, fold(left), left, "200 logits, the first 150 masked (left padding), folded");
    expect_set(m, block_reduce(left, 32), left, "the same row reduced by 32 lanes");
    std::vector<float> causal = normal_row(4202u, 64, 1.0, 2.0);
    for (std::size_t j = 5; j < causal.size(); ++j) causal[j] = -kInf;
    expect_set(m, block_reduce(causal, 32), causal,
               "a causal row (5 of 64 keys visible) reduced by 32 lanes");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.2 the order does not matter: folds in four orders and trees of merges agree") {
    // Ascending order makes every logit a new maximum (a rescale at every
    // step), descending order none; trees merge chunks of every size.
    Mismatches m;
    std::mt19937 rng(4210u);
    struct Data {
      const char* what;
      double mean, sd;
      std::size_t n;
    };
    const Data sets[] = {{"1000 logits N(0, 1)", 0.0, 1.0, 1000},
                         {"4096 logits N(0, 4)", 0.0, 4.0, 4096},
                         {"3000 logits N(-20, 10)", -20.0, 10.0, 3000},
                         {"777 logits N(100, 0.5)", 100.0, 0.5, 777},
                         {"2 logits", 0.0, 1.0, 2}};
    std::uint32_t seed = 4211u;
    for (const Data& d : sets) {
      std::vector<float> z = normal_row(seed++, d.n, d.mean, d.sd);
      const std::string what = d.what;
      expect_set(m, fold(z), z, what + ", folded as drawn");
      std::vector<float> up = z;
      std::sort(up.begin(), up.end());
      expect_set(m, fold(up), z, what + ", folded in ascending order");
      std::vector<float> down(up.rbegin(), up.rend());
      expect_set(m, fold(down), z, what + ", folded in descending order");
      std::shuffle(up.begin(), up.end(), rng);
      expect_set(m, fold(up), z, what + ", folded shuffled");
      expect_set(m, chunk_tree(z, rng, 64), z, what + ", chunks of 0 to 64 merged pairwise");
      expect_set(m, chunk_tree(up, rng, 7), z, what + ", shuffled, chunks of 0 to 7 merged pairwise");
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.2 block reductions of long rows of large logits agree with two passes in double") {
    // Rows of logits near 60000 or 1e4 (exp of them overflows even in
    // double), as 32 lanes of a warp, 256 threads of a block or 1024 would
    // reduce them: each lane folds a strided share, then a shuffle tree.
    Mismatches m;
    std::uint32_t seed = 4220u;
    struct Data {
      const char* what;
      double mean, sd;
      std::size_t n;
    };
    const Data rows[] = {{"8192 logits N(60000, 5)", 60000.0, 5.0, 8192},
                         {"5000 logits N(-60000, 20)", -60000.0, 20.0, 5000},
                         {"8192 logits N(1e4, 100)", 1e4, 100.0, 8192},
                         {"1000 logits N(0, 30)", 0.0, 30.0, 1000},
                         {"100 logits N(0, 1)", 0.0, 1.0, 100}};
    for (const Data& d : rows) {
      const std::vector<float> z = normal_row(seed++, d.n, d.mean, d.sd);
      for (std::size_t lanes : {32u, 256u, 1024u})
        expect_set(m, block_reduce(z, lanes), z,
                   std::string(d.what) + ", " + std::to_string(lanes) + " lanes");
    }
    // Two halves of a long vocabulary row, each reduced apart (a split
    // kernel), stored as float and merged.
    const std::vector<float> vocab = normal_row(seed++, 50257, 0.0, 3.0);
    const std::vector<float> lo(vocab.begin(), vocab.begin() + 25000), hi(vocab.begin() + 25000, vocab.end());
    expect_set(m, online_merge(rounded_state(lo), rounded_state(hi)), vocab,
               "a row of 50257 logits, two halves' states merged");
    CHECK_MESSAGE(m.none(), m.report());
  }
}  // TEST_SUITE
