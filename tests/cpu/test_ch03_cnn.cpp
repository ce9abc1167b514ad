// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the digits CNN
// (mpt::Cnn) and the Model it is built on.
// Its layers in order with their paths, where each value lives under the
// three ways of keeping norms in FP32 (none, by path, by op), training on a
// synthetic 8×8 set, train/eval reaching the BatchNorms, and the Model's
// errors.
// Depends on: mpt/nn/models/cnn.hpp, mpt/nn/layers/batch_norm.hpp, mpt/nn/layers/conv.hpp,
// mpt/nn/data/data.hpp, mpt/nn/layers/losses.hpp, mpt/optim/sgd.hpp.
#include <doctest/doctest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/nn/data/data.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/conv.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/cnn.hpp"
#include "mpt/optim/sgd.hpp"

using namespace mpt;

namespace {

Dataset images(Eigen::Index n = 256) {
  BlobsOptions o;
  o.samples = n;
  o.features = 64;
  o.classes = 10;
  o.spread = 1.5;
  o.seed = 3;
  return make_blobs(o);
}

BatchNorm& bn(Cnn& net, const char* path) { return dynamic_cast<BatchNorm&>(*net.find(path)); }

}  // namespace

TEST_CASE("the CNN's layers, in order, with their paths and shapes") {
  Cnn net(CnnConfig{});
  const std::vector<std::string> want = {"unflatten", "conv1", "bn1",   "relu1",   "pool1", "conv2",
                                         "bn2",       "relu2", "pool2", "flatten", "fc"};
  REQUIRE(net.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(net.child_name(i) == want[i]);
  const Dataset d = images(4);
  const Tensor& y = net.forward(d.x);
  CHECK(y.shape() == Shape{4, 10});
  // With BatchNorm the convolutions have no bias (β replaces it); without, they do.
  CHECK(dynamic_cast<Conv2d&>(*net.find("conv1")).parameters().size() == 1);
  CnnConfig plain;
  plain.batch_norm = false;
  Cnn without(plain);
  CHECK(without.size() == want.size() - 2);
  CHECK(without.find("bn1") == nullptr);
  CHECK(dynamic_cast<Conv2d&>(*without.find("conv1")).parameters().size() == 2);
  CnnConfig none;
  none.channels1 = 0;
  CHECK_THROWS_WITH_AS(Cnn{none}, "Cnn: channels1, channels2 and classes must be >= 1, got 0, 16, 10",
                       std::invalid_argument);
}

TEST_CASE("where the BatchNorms' values live: model.half(), norms kept by path, norms kept by op") {
  const Dataset d = images(8);
  SUBCASE("uniform f16: the running statistics and the affine copies are f16, as model.half() makes them") {
    CnnConfig c;
    c.dtype = DType::f16;
    Cnn net(c);
    BatchNorm& b = bn(net, "bn1");
    CHECK(b.running_mean.dtype() == DType::f16);
    CHECK(b.running_var.bytes() == 2u * 8u);
    CHECK(b.weight.model_dtype() == DType::f16);
    CHECK(net.forward(d.x).dtype() == DType::f16);
  }
  SUBCASE(
      "kept in f32 by path (apex's keep_batchnorm_fp32, a module.float() loop) or by op: the same layers "
      "f32") {
    for (const bool by_path : {true, false}) {
      CnnConfig c;
      c.policy = by_path
                     ? std::make_shared<KeepF32Policy>(uniform_policy(DType::f16),
                                                       std::vector<std::string>{"bn1", "bn2"})
                     : std::make_shared<KeepF32Policy>(uniform_policy(DType::f16), std::vector<std::string>{},
                                                       std::vector<std::string>{"batch_norm"});
      Cnn net(c);
      for (const char* p : {"bn1", "bn2"}) {
        CHECK(bn(net, p).running_mean.dtype() == DType::f32);
        CHECK(bn(net, p).weight.model_dtype() == DType::f32);
      }
      CHECK(dynamic_cast<Conv2d&>(*net.find("conv2")).weight.model_dtype() == DType::f16);
      CHECK(net.forward(d.x).dtype() == DType::f16);
    }
  }
}

TEST_CASE("the CNN trains on an 8x8 set in f32 and in f16, and eval() reaches its BatchNorms") {
  const Dataset d = images(256);
  for (const DType dt : {DType::f32, DType::f16}) {
    CAPTURE(dtype_name(dt));
    CnnConfig c;
    c.dtype = dt;
    c.seed = 5;
    Cnn net(c);
    SGD::Options so;
    so.lr = 0.1;
    so.momentum = 0.9;
    SGD opt(net.parameters(), so);
    const double before = accuracy(net.forward(d.x), d.labels);
    for (int step = 0; step < 30; ++step) {
      const Tensor& out = net.forward(d.x);
      opt.zero_grad();
      net.backward(cross_entropy_backward(out, d.labels));
      opt.step();
      net.refresh_model_copies();
    }
    const double after = accuracy(net.forward(d.x), d.labels);
    CHECK(before < 0.3);
    CHECK(after > 0.9);
    CHECK(bn(net, "bn2").num_batches_tracked == 32);
    net.eval();
    CHECK_FALSE(bn(net, "bn1").training());
    CHECK_FALSE(bn(net, "bn2").training());
    // Eval uses the running estimates, which after 32 batches of momentum 0.1
    // are close to the batch statistics: the accuracy holds.
    CHECK(accuracy(net.forward(d.x), d.labels) > 0.85);
    CHECK(bn(net, "bn2").num_batches_tracked == 32);
  }
}

TEST_CASE("a Model names itself in its errors") {
  Cnn net(CnnConfig{});
  CHECK_THROWS_WITH_AS(net.backward(Tensor(DType::f32, {2, 10})), "Cnn::backward: call forward() first",
                       std::logic_error);
  CHECK_THROWS_WITH_AS(net.forward(MatrixF::Zero(2, 63)),
                       "Cnn::forward: x has 63 columns, the network takes 64", std::invalid_argument);
  (void)net.forward(MatrixF::Zero(2, 64));
  CHECK_THROWS_WITH_AS(net.backward(Tensor(DType::f32, {2, 9})),
                       "Cnn::backward: the gradient is 2x9 but the output is 2x10", std::invalid_argument);
}
