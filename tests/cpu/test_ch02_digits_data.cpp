// Chapter 02 — loss scaling and FP32 master weights: the real digits set.
// The file comes from Debian's python3-sklearn package via
// tools/fetch_digits.sh, which ./mpt.sh test runs before CTest; a missing
// file is therefore a failure here, reported with the command that fetches
// it. Also trains the chapter's MLP on it in fp32, fp16 and bf16.
// Depends on: mpt/data.hpp, mpt/mlp.hpp, mpt/optim.hpp, mpt/layers.hpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mpt/nn/data/data.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/adamw.hpp"
#include "mpt/optim/sgd.hpp"

using namespace mpt;

namespace {

// Loads once; a missing or broken file fails every case with the loader's message.
const Dataset& digits() {
  static const Dataset d = [] {
    try {
      return load_digits();
    } catch (const std::exception& e) {
      FAIL("cannot load the digits set: " << std::string(e.what()));
      return Dataset{};
    }
  }();
  return d;
}

constexpr int kEpochs = 40;

struct Result {
  double test_accuracy = 0;
  double final_loss = 0;
};

Result train_digits(DType p, const Split& s) {
  MlpConfig c;
  c.sizes = {64, 64, 10};
  c.dtype = p;
  c.seed = 1;
  Mlp net(c);
  AdamW opt(net.parameters());  // PyTorch defaults: lr 1e-3, weight decay 1e-2
  const Eigen::Index batch = 64;
  int step = 0;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    const std::vector<Eigen::Index> order = shuffled_indices(s.train.size(), 100 + epoch);
    for (Eigen::Index at = 0; at + batch <= s.train.size(); at += batch, ++step) {
      const Dataset b =
          s.train.rows(std::vector<Eigen::Index>(order.begin() + at, order.begin() + at + batch));
      const Tensor& logits = net.forward(b.x);
      const Tensor dlogits = cross_entropy_backward(logits, b.labels);
      opt.zero_grad();
      net.backward(dlogits);
      opt.step();
      net.refresh_model_copies();
    }
  }
  Result r;
  r.final_loss = cross_entropy_loss(net.forward(s.train.x), s.train.labels);
  r.test_accuracy = accuracy(net.forward(s.test.x), s.test.labels);
  return r;
}

}  // namespace

TEST_CASE("digits.csv.gz: 1797 images of 8x8 pixels, labels 0..9") {
  const Dataset& d = digits();
  REQUIRE(d.size() == 1797);
  CHECK(d.x.cols() == 64);
  CHECK(d.num_classes == 10);
  // Class counts of the UCI optical digits test set that scikit-learn ships.
  const std::vector<int> counts{178, 182, 177, 183, 181, 182, 181, 179, 174, 180};
  for (int k = 0; k < 10; ++k) {
    CAPTURE(k);
    CHECK(std::count(d.labels.begin(), d.labels.end(), k) == counts[static_cast<std::size_t>(k)]);
  }
  // Pixels are counts 0..16 divided by 16: in [0, 1] and exact multiples of 1/16.
  CHECK(d.x.minCoeff() == 0.0f);
  CHECK(d.x.maxCoeff() == 1.0f);
  CHECK(((d.x.array() * 16.0f).round() == d.x.array() * 16.0f).all());
  // The first image is a 0: its first row of pixels is 0 0 5 13 9 1 0 0.
  CHECK(d.labels[0] == 0);
  const float first_row[8] = {0, 0, 5, 13, 9, 1, 0, 0};
  for (int j = 0; j < 8; ++j) CHECK(d.x(0, j) * 16.0f == first_row[j]);
}

TEST_CASE("digits: a deterministic 80/20 split") {
  const Dataset& d = digits();
  REQUIRE(d.size() == 1797);
  const Split a = train_test_split(d, 0.2, 42), b = train_test_split(d, 0.2, 42);
  CHECK(a.test.size() == 359);
  CHECK(a.train.size() == 1438);
  CHECK(a.test.x == b.test.x);
  CHECK(a.train.labels == b.train.labels);
}

TEST_CASE("digits: the MLP learns it in fp32, and fp16/bf16 with FP32 masters match") {
  const Dataset& d = digits();
  REQUIRE(d.size() == 1797);
  const Split s = train_test_split(d, 0.2, 42);
  const Result f32 = train_digits(DType::f32, s);
  const Result f16 = train_digits(DType::f16, s);
  const Result b16 = train_digits(DType::bf16, s);
  MESSAGE("digits, MLP 64-64-10, AdamW defaults, "
          << kEpochs << " epochs: test accuracy fp32 " << f32.test_accuracy << ", fp16 " << f16.test_accuracy
          << ", bf16 " << b16.test_accuracy << "; train loss " << f32.final_loss << " / " << f16.final_loss
          << " / " << b16.final_loss);
  CHECK(f32.test_accuracy >= 0.95);
  // One test image is 1/359 ≈ 0.3%: allow a few to flip either way.
  CHECK(std::fabs(f16.test_accuracy - f32.test_accuracy) <= 0.015);
  CHECK(std::fabs(b16.test_accuracy - f32.test_accuracy) <= 0.02);
  CHECK(f16.final_loss == doctest::Approx(f32.final_loss).epsilon(0.05));
}
