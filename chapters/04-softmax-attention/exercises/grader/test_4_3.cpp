// Chapter 04 — exercises: grader tests for exercise 4.3 (the fused backward of softmax cross-entropy).
// Depends on: grader.hpp; mpt's cross_entropy_backward_row in double is the
// reference.
// Five test cases: hand-worked rows without smoothing, label smoothing,
// ignore_index (a detail, one point), large logits and masked vocabulary
// entries, rows of a vocabulary's size with the gradients a mean and a loss
// scale send.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex04;
using namespace mpt::ex04::grading;

CrossEntropyRow row(std::vector<float> z, std::int64_t target, float smoothing = 0.0f, float g = 1.0f,
                    std::int64_t ignore_index = -100) {
  CrossEntropyRow r;
  r.z = std::move(z);
  r.target = target;
  r.smoothing = smoothing;
  r.g = g;
  r.ignore_index = ignore_index;
  return r;
}

}  // namespace

TEST_SUITE("exercise-4.3") {
  TEST_CASE("4.3 hand-worked rows without label smoothing: g·(softmax - onehot)") {
    Mismatches m;
    // {0, 0}, target 0: p = {1/2, 1/2}, dz = {-1/2, 1/2}.
    expect_backward(m, row({0.0f, 0.0f}, 0), kBackwardTolerance, "two equal logits");
    // {log 1, log 2, log 3}, target 2: p = {1/6, 2/6, 3/6}, dz = {1/6, 1/3, -1/2}.
    expect_backward(m, row({0.0f, std::log(2.0f), std::log(3.0f)}, 2), kBackwardTolerance,
                    "p = 1/6, 2/6, 3/6");
    expect_backward(m, row({1.0f, 2.0f, 3.0f, 4.0f}, 0, 0.0f, 0.25f), kBackwardTolerance,
                    "g = 1/4, the mean over 4 rows");
    // k = 1: p = 1 and dz = 0.
    expect_backward(m, row({5.0f}, 0), kBackwardTolerance, "a single class");
    expect_backward(m, row({-2.0f, 7.0f, 0.5f}, 1, 0.0f, -1.5f), kBackwardTolerance, "a negative g");
    expect_backward(m, row({10.0f, -10.0f, 0.0f}, 0, 0.0f, 1024.0f), kBackwardTolerance,
                    "a confident right answer, g = 1024 (a loss scale)");
    expect_backward(m, row({10.0f, -10.0f, 0.0f}, 1), kBackwardTolerance, "a confident wrong answer");
    expect_backward(m, row(normal_row(4301u, 100, 0.0, 2.0), 17), kBackwardTolerance, "100 logits N(0, 2)");
    expect_backward(m, row(normal_row(4302u, 1000, 1.0, 1.0), 999, 0.0f, 1.0f / 64), kBackwardTolerance,
                    "1000 logits N(1, 1), g = 1/64");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.3 label smoothing: every class receives eps/k, the target 1 - eps more [15 points]") {
    // The target distribution is (1 - eps)·onehot + eps/k.
    Mismatches m;
    // {0, 0}, target 0, eps 0.1: p - {0.95, 0.05} = {-0.45, 0.45}.
    expect_backward(m, row({0.0f, 0.0f}, 0, 0.1f), kBackwardTolerance, "two equal logits, eps 0.1");
    // {log 1, log 2, log 3}, target 2, eps 0.3: p - {0.1, 0.1, 0.8}.
    expect_backward(m, row({0.0f, std::log(2.0f), std::log(3.0f)}, 2, 0.3f), kBackwardTolerance,
                    "p = 1/6, 2/6, 3/6, eps 0.3");
    // eps = 1: the uniform distribution, whatever the target: p - 1/k.
    expect_backward(m, row({1.0f, 2.0f, 3.0f, 4.0f}, 3, 1.0f), kBackwardTolerance, "eps 1: p - 1/k");
    expect_backward(m, row({5.0f}, 0, 0.2f), kBackwardTolerance, "a single class, eps 0.2");
    expect_backward(m, row({10.0f, -10.0f, 0.0f, 2.0f}, 0, 0.1f, 0.5f), kBackwardTolerance,
                    "a confident right answer, eps 0.1");
    std::uint32_t seed = 4311u;
    for (float eps : {0.05f, 0.1f, 0.2f, 0.5f}) {
      for (std::size_t k : {10u, 257u, 4096u}) {
        std::mt19937 pick(seed);
        const auto target = static_cast<std::int64_t>(pick() % k);
        expect_backward(m, row(normal_row(seed++, k, 0.0, 3.0), target, eps, 1.0f / 32), kBackwardTolerance,
                        std::to_string(k) + " logits N(0, 3), eps " + short_number(eps));
      }
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.3 a row whose target is ignore_index gets a zero gradient [1 point]") {
    Mismatches m;
    expect_backward(m, row({1.0f, 2.0f, 3.0f}, -100), kBackwardTolerance, "target -100, PyTorch's default");
    expect_backward(m, row({1.0f, 2.0f, 3.0f}, -100, 0.1f, 1.0f), kBackwardTolerance,
                    "target -100 with label smoothing");
    // A padding token id as ignore_index: class 0 of a vocabulary.
    expect_backward(m, row(normal_row(4321u, 50, 0.0, 1.0), 0, 0.1f, 1.0f, 0), kBackwardTolerance,
                    "ignore_index 0 (a padding id), target 0");
    expect_backward(m, row(normal_row(4322u, 50, 0.0, 1.0), 3, 0.0f, 1.0f, 0), kBackwardTolerance,
                    "ignore_index 0, target 3: not ignored");
    expect_backward(m, row({60000.0f, -60000.0f}, 7, 0.0f, 1.0f, 7), kBackwardTolerance,
                    "ignore_index 7, outside the classes");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.3 large logits and masked vocabulary entries: the softmax with its maximum taken out") {
    // exp of these overflows (or every exp underflows) unless the maximum
    // is subtracted first; -inf entries (classes masked out) get p = 0.
    Mismatches m;
    expect_backward(m, row({60000.0f, 60000.0f}, 1), kBackwardTolerance, "logits of 60000");
    expect_backward(m, row({-60000.0f, -60001.0f, -59999.5f}, 0), kBackwardTolerance, "logits near -60000");
    expect_backward(m, row({1e30f, 0.0f, -1e30f}, 1), kBackwardTolerance, "1e30, 0, -1e30");
    expect_backward(m, row({88.8f, 88.0f, 80.0f}, 2, 0.0f, 0.5f), kBackwardTolerance,
                    "just above float's overflow of exp");
    expect_backward(m, row({-104.0f, -110.0f, -120.0f}, 0), kBackwardTolerance,
                    "every exp below float's smallest value");
    expect_backward(m, row({-kInf, 2.0f, -kInf, 3.0f}, 1), kBackwardTolerance, "masked classes (-inf)");
    std::vector<float> vocab = normal_row(4331u, 1000, 30000.0, 5.0);
    for (std::size_t j = 900; j < vocab.size(); ++j) vocab[j] = -kInf;
    expect_backward(m, row(vocab, 5, 0.0f, 1.0f / 256), kBackwardTolerance,
                    "1000 logits N(30000, 5), the last 100 masked");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("4.3 rows of a vocabulary's size, with the g of a mean and of a loss scale") {
    // Softmax sums of 8192 to 50257 terms: a float sum (or wider) is needed.
    Mismatches m;
    std::uint32_t seed = 4341u;
    struct Data {
      std::size_t k;
      double sd;
      float g;
      const char* what;
    };
    const Data rows[] = {{8192, 2.0, 1.0f / 512, "g = 1/512, a mean over 512 positions"},
                         {32000, 3.0, 65536.0f / 2048, "g = 65536/2048, a loss scale over a mean"},
                         {50257, 1.0, -0.75f, "g = -0.75"},
                         {50257, 4.0, 1.0f, "g = 1"}};
    for (const Data& d : rows) {
      std::mt19937 pick(seed);
      const auto target = static_cast<std::int64_t>(pick() % d.k);
      expect_backward(m, row(normal_row(seed++, d.k, 0.0, d.sd), target, 0.0f, d.g), kLongBackwardTolerance,
                      std::to_string(d.k) + " logits N(0, " + short_number(d.sd) + "), " + d.what);
    }
    CHECK_MESSAGE(m.none(), m.report());
  }
}  // TEST_SUITE
