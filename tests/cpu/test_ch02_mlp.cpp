// Chapter 02 — loss scaling and FP32 master weights: the MLP.
// Its wiring against the FP64 layer math, activation memory measured from
// allocations, training on the synthetic sets in fp32/fp16/bf16, the
// stall without loss scaling, and the lost updates without master weights.
// Loss scaling is done by hand here (seed backward with S, divide the FP32
// grads by S) so this suite does not depend on the GradScaler.
// Depends on: mpt/mlp.hpp, mpt/optim.hpp, mpt/data.hpp, mpt/layers.hpp.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "mpt/nn/data/data.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/adamw.hpp"
#include "mpt/optim/sgd.hpp"

using namespace mpt;

namespace {

MlpConfig config(std::vector<int> sizes, DType p, Activation a = Activation::relu, std::uint64_t seed = 7) {
  MlpConfig c;
  c.sizes = std::move(sizes);
  c.dtype = p;
  c.activation = a;
  c.seed = seed;
  return c;
}

// Batches of `batch` from a fresh seeded permutation each epoch.
class Batcher {
 public:
  Batcher(const Dataset& d, Eigen::Index batch, std::uint64_t seed) : d_(d), batch_(batch), seed_(seed) {}
  Dataset next() {
    if (pos_ + batch_ > d_.size() || order_.empty()) {
      order_ = shuffled_indices(d_.size(), seed_ + epoch_++);
      pos_ = 0;
    }
    std::vector<Eigen::Index> idx(order_.begin() + pos_, order_.begin() + pos_ + batch_);
    pos_ += batch_;
    return d_.rows(idx);
  }

 private:
  const Dataset& d_;
  Eigen::Index batch_, pos_ = 0;
  std::uint64_t seed_, epoch_ = 0;
  std::vector<Eigen::Index> order_;
};

struct Trained {
  double initial_loss = 0;      // loss on the whole training set before the first step
  double train_loss = 0;        // loss on the whole training set at the end
  double test_accuracy = 0;     // classification only
  double flushed_fraction = 0;  // zeros among dlogits and d(activation output), averaged over steps
  double lost_fraction = 0;     // RefreshStats::lost / elements, averaged over steps
};

// The zeros counted are those of the dense gradients (dlogits and the
// gradients w.r.t. each activation's output); the ReLU-masked ones would
// count zeros that are zero in every precision.
double zero_fraction(const std::vector<Tensor>& grads) {
  double zeros = 0, n = 0;
  for (std::size_t k = 0; k < grads.size(); k += (k == 0 ? 1 : 2)) {
    const MatrixF g = grads[k].to_matrix();
    zeros += static_cast<double>((g.array() == 0.0f).count());
    n += static_cast<double>(g.size());
  }
  return zeros / n;
}

enum class Opt { sgd, adamw };

Trained train(Mlp& net, const Dataset& train_set, const Dataset* test_set, Opt which, double lr, int steps,
              Eigen::Index batch, float loss_scale = 1.0f) {
  std::unique_ptr<Optimizer> opt;
  if (which == Opt::sgd) {
    SgdOptions o;
    o.lr = lr;
    o.momentum = 0.9;
    opt = std::make_unique<SGD>(net.parameters(), o);
  } else {
    AdamWOptions o;
    o.lr = lr;
    o.weight_decay = 0.0;
    opt = std::make_unique<AdamW>(net.parameters(), o);
  }
  Batcher batches(train_set, batch, 1234);
  Trained r;
  const auto full_loss = [&] {
    const Tensor& all = net.forward(train_set.x);
    return train_set.is_classification() ? cross_entropy_loss(all, train_set.labels)
                                         : mse_loss(all, train_set.targets);
  };
  r.initial_loss = full_loss();
  for (int s = 0; s < steps; ++s) {
    const Dataset b = batches.next();
    const Tensor& out = net.forward(b.x);
    const Tensor dout = b.is_classification() ? cross_entropy_backward(out, b.labels, loss_scale)
                                              : mse_backward(out, b.targets, loss_scale);
    opt->zero_grad();
    net.backward(dout);
    if (loss_scale != 1.0f)
      for (Parameter* p : net.parameters()) p->grad.f32() /= loss_scale;  // unscale in FP32
    r.flushed_fraction += zero_fraction(net.activation_gradients()) / steps;
    opt->step();
    const RefreshStats st = net.refresh_model_copies();
    r.lost_fraction += static_cast<double>(st.lost) / static_cast<double>(st.elements) / steps;
  }
  r.train_loss = full_loss();
  if (test_set) r.test_accuracy = accuracy(net.forward(test_set->x), test_set->labels);
  return r;
}

}  // namespace

TEST_CASE("Mlp: parameters, PyTorch initialisation, determinism, errors") {
  Mlp net(config({8, 16, 3}, DType::f16));
  const std::vector<Parameter*> ps = net.parameters();
  REQUIRE(ps.size() == 4);
  CHECK(net.num_layers() == 2);
  CHECK(ps[0]->name == "fc1.weight");
  CHECK(ps[1]->name == "fc1.bias");
  CHECK(ps[3]->name == "fc2.bias");
  CHECK(ps[0]->master.shape() == Shape{16, 8});
  CHECK(ps[1]->master.shape() == Shape{16});  // torch.nn.Linear's bias: [out]
  CHECK(ps[0]->model_dtype() == DType::f16);
  CHECK(ps[0]->weights().shape() == Shape{16, 8});
  CHECK(ps[0]->master.f32().cwiseAbs().maxCoeff() <= 1 / std::sqrt(8.0));  // U(±1/√in)
  CHECK(ps[2]->master.f32().cwiseAbs().maxCoeff() <= 1 / std::sqrt(16.0));
  CHECK(ps[0]->master.f32().cwiseAbs().maxCoeff() > 0.8 / std::sqrt(8.0));  // and spread over it
  Mlp same(config({8, 16, 3}, DType::f16)), other(config({8, 16, 3}, DType::f16, Activation::relu, 8));
  CHECK(same.parameters()[0]->master.f32() == ps[0]->master.f32());
  CHECK(other.parameters()[0]->master.f32() != ps[0]->master.f32());
  MlpConfig zi = config({8, 16, 3}, DType::f32);
  zi.zero_init_output = true;
  Mlp zero_head(zi);
  CHECK(zero_head.parameters()[2]->master.f32().isZero(0));
  CHECK(zero_head.parameters()[3]->master.f32().isZero(0));
  CHECK_FALSE(zero_head.parameters()[0]->master.f32().isZero(0));

  CHECK_THROWS_AS(Mlp(config({8}, DType::f32)), std::invalid_argument);
  CHECK_THROWS_AS(Mlp(config({8, 0, 2}, DType::f32)), std::invalid_argument);
  CHECK_THROWS_WITH_AS(net.backward(Tensor(DType::f16, {2, 3})), "Mlp::backward: call forward() first",
                       std::logic_error);
  CHECK_THROWS_AS(net.forward(MatrixF::Zero(2, 7)), std::invalid_argument);
  net.forward(MatrixF::Zero(2, 8));
  CHECK_THROWS_AS(net.backward(Tensor(DType::f16, {2, 4})), std::invalid_argument);
}

TEST_CASE("Mlp: activation bytes are the allocated buffers; fp16 and bf16 are half of fp32") {
  const MatrixF x = MatrixF::Ones(64, 8);
  // ReLU keeps x, the two hidden outputs and the logits:
  // 64·(8 + 32 + 32 + 4) = 4864 elements.
  std::size_t relu_bytes[3], gelu_bytes[3];
  const DType ps[3] = {DType::f32, DType::f16, DType::bf16};
  for (int i = 0; i < 3; ++i) {
    Mlp relu(config({8, 32, 32, 4}, ps[i]));
    CHECK(relu.activation_bytes() == 0);  // nothing kept before a forward
    relu.forward(x);
    relu_bytes[i] = relu.activation_bytes();
    // GELU also keeps its two inputs (the pre-activations): + 64·64 elements.
    Mlp gelu(config({8, 32, 32, 4}, ps[i], Activation::gelu));
    gelu.forward(x);
    gelu_bytes[i] = gelu.activation_bytes();
  }
  CHECK(relu_bytes[0] == 4864 * 4);
  CHECK(relu_bytes[1] == 4864 * 2);
  CHECK(relu_bytes[2] == 4864 * 2);
  CHECK(gelu_bytes[0] == (4864 + 4096) * 4);
  CHECK(gelu_bytes[1] * 2 == gelu_bytes[0]);
  MESSAGE("activation bytes, MLP 8-32-32-4, batch 64: ReLU fp32 "
          << relu_bytes[0] << ", fp16 " << relu_bytes[1] << ", bf16 " << relu_bytes[2] << "; GELU fp32 "
          << gelu_bytes[0] << ", fp16 " << gelu_bytes[1]);
}

TEST_CASE("Mlp (fp32): gradients match the FP64 layer math") {
  // Same weights, same input, the same chain written with layer_math<double>:
  // any mis-wiring (wrong saved tensor, wrong layer order) is an O(1) error.
  for (Activation act : {Activation::relu, Activation::gelu, Activation::gelu_tanh}) {
    CAPTURE(static_cast<int>(act));
    Mlp net(config({5, 7, 6, 3}, DType::f32, act, 3));
    Rng rng(4);
    MatrixF x(9, 5);
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(rng.normal());
    const std::vector<int> y{0, 1, 2, 0, 1, 2, 0, 1, 2};
    const Tensor& logits = net.forward(x);
    const float loss = cross_entropy_loss(logits, y);
    net.backward(cross_entropy_backward(logits, y));
    const auto P = net.parameters();
    const auto d = [](const Tensor& t) { return t.to_matrix().cast<double>().eval(); };
    const GeluApproximation ga =
        act == Activation::gelu_tanh ? GeluApproximation::tanh : GeluApproximation::none;
    const auto fwd_act = [&](const Mat<double>& z) {
      return act == Activation::relu ? layer_math::relu_forward<double>(z)
                                     : layer_math::gelu_forward<double>(z, ga);
    };
    const Mat<double> x0 = x.cast<double>();
    const Mat<double> z1 = layer_math::linear_forward<double>(x0, d(P[0]->master), d(P[1]->master));
    const Mat<double> a1 = fwd_act(z1);
    const Mat<double> z2 = layer_math::linear_forward<double>(a1, d(P[2]->master), d(P[3]->master));
    const Mat<double> a2 = fwd_act(z2);
    const Mat<double> z3 = layer_math::linear_forward<double>(a2, d(P[4]->master), d(P[5]->master));
    CHECK(loss == doctest::Approx(layer_math::cross_entropy_forward<double>(z3, y)).epsilon(1e-5));
    const auto back_act = [&](const Mat<double>& z, const Mat<double>& a, const Mat<double>& da) {
      return act == Activation::relu ? layer_math::relu_backward<double>(a, da)
                                     : layer_math::gelu_backward<double>(z, da, ga);
    };
    const auto g3 = layer_math::linear_backward<double>(
        a2, d(P[4]->master), layer_math::cross_entropy_backward<double>(z3, y, 1.0));
    const auto g2 = layer_math::linear_backward<double>(a1, d(P[2]->master), back_act(z2, a2, g3.dx));
    const auto g1 = layer_math::linear_backward<double>(x0, d(P[0]->master), back_act(z1, a1, g2.dx));
    const std::vector<Mat<double>> want{g1.dw, g1.db, g2.dw, g2.db, g3.dw, g3.db};
    for (std::size_t k = 0; k < 6; ++k) {
      CAPTURE(P[k]->name);
      CHECK((d(P[k]->grad) - want[k]).norm() <= 1e-5 * want[k].norm() + 1e-9);
    }
    // The stored gradients: dlogits, then (d act-output, d pre-activation) per hidden layer.
    CHECK(net.activation_gradients().size() == 5);
  }
}

TEST_CASE("blobs: fp32 learns; fp16 and bf16 with FP32 master weights match it") {
  BlobsOptions bo;
  bo.samples = 1024;
  const Split s = train_test_split(make_blobs(bo), 0.25, 5);
  Trained r[3];
  const DType ps[3] = {DType::f32, DType::f16, DType::bf16};
  for (int i = 0; i < 3; ++i) {
    Mlp net(config({8, 32, 32, 4}, ps[i], Activation::gelu));
    r[i] = train(net, s.train, &s.test, Opt::adamw, 3e-3, 300, 64);
  }
  MESSAGE("blobs test accuracy: fp32 " << r[0].test_accuracy << ", fp16 " << r[1].test_accuracy << ", bf16 "
                                       << r[2].test_accuracy << "; train loss fp32 " << r[0].train_loss
                                       << ", fp16 " << r[1].train_loss << ", bf16 " << r[2].train_loss);
  CHECK(r[0].test_accuracy >= 0.9);
  // Cross-entropy gradients here are O(1/batch): nothing to flush, so fp16
  // tracks fp32 without loss scaling; bf16 rounds more coarsely (8 bits).
  CHECK(std::fabs(r[1].test_accuracy - r[0].test_accuracy) <= 0.02);
  CHECK(std::fabs(r[2].test_accuracy - r[0].test_accuracy) <= 0.03);
  CHECK(r[1].train_loss == doctest::Approx(r[0].train_loss).epsilon(0.05));
  CHECK(r[2].train_loss == doctest::Approx(r[0].train_loss).epsilon(0.10));
  CHECK(r[1].lost_fraction == 0.0);  // master weights keep every update
}

TEST_CASE("tiny targets: fp16 without loss scaling flushes gradients and stalls; scaled fp16 tracks fp32") {
  const Dataset d = make_tiny_target_regression();
  const double target_power = d.targets.cast<double>().array().square().mean();
  struct Run {
    const char* name;
    DType p;
    float scale;
    Trained r;
  };
  std::vector<Run> runs = {{"fp32", DType::f32, 1.0f, {}},
                           {"fp16, no scaling", DType::f16, 1.0f, {}},
                           {"fp16, loss scale 2^16", DType::f16, 65536.0f, {}},
                           {"bf16, no scaling", DType::bf16, 1.0f, {}}};
  for (Run& run : runs) {
    MlpConfig c = config({8, 32, 32, 4}, run.p, Activation::relu, 3);
    c.zero_init_output = true;
    Mlp net(c);
    run.r = train(net, d, nullptr, Opt::adamw, 3e-4, 200, 256, run.scale);
    run.r.train_loss /= target_power;  // relative: 1 = predicting zero
    MESSAGE(std::string(run.name) << ": relative loss " << run.r.train_loss << ", gradients flushed to zero "
                                  << run.r.flushed_fraction);
  }
  const Trained &f32 = runs[0].r, &f16 = runs[1].r, &scaled = runs[2].r, &b16 = runs[3].r;
  CHECK(f32.train_loss < 0.2);
  CHECK(f16.flushed_fraction > 0.5);             // most activation gradients are below 2^-24
  CHECK(f16.train_loss > 2.5 * f32.train_loss);  // and training stalls
  CHECK(scaled.flushed_fraction < f32.flushed_fraction + 0.01);
  CHECK(scaled.train_loss == doctest::Approx(f32.train_loss).epsilon(0.05));
  CHECK(b16.train_loss == doctest::Approx(f32.train_loss).epsilon(0.05));  // bf16 has FP32's range
}

TEST_CASE("fp16 weights without FP32 master weights lose small updates") {
  // SGD (momentum 0.9) with a small learning rate: most updates are below
  // half an fp16 ulp of their weight, so rounding them into fp16 weights
  // undoes them; the FP32 master adds them up.
  BlobsOptions bo;
  bo.samples = 1024;
  const Split s = train_test_split(make_blobs(bo), 0.25, 5);
  Trained r[3];
  const MasterWeights modes[3] = {MasterWeights::fp32, MasterWeights::fp32, MasterWeights::none};
  const DType ps[3] = {DType::f32, DType::f16, DType::f16};
  for (int i = 0; i < 3; ++i) {
    MlpConfig c = config({8, 32, 32, 4}, ps[i]);
    c.master_weights = modes[i];
    Mlp net(c);
    r[i] = train(net, s.train, &s.test, Opt::sgd, 1e-4, 1500, 64);
  }
  MESSAGE("small-lr SGD on blobs: train loss fp32 "
          << r[0].train_loss << ", fp16+master " << r[1].train_loss << ", fp16 no master " << r[2].train_loss
          << "; updates lost without master " << r[2].lost_fraction << "; test accuracy "
          << r[0].test_accuracy << " / " << r[1].test_accuracy << " / " << r[2].test_accuracy);
  CHECK(r[1].lost_fraction == 0.0);
  CHECK(r[2].lost_fraction > 0.5);
  CHECK(r[1].train_loss == doctest::Approx(r[0].train_loss).epsilon(0.02));
  // What the master keeps and the fp16-only run loses shows in the loss
  // (all three start from the same weights) and in the accuracy.
  CHECK(r[2].initial_loss - r[2].train_loss < 0.5 * (r[0].initial_loss - r[0].train_loss));
  CHECK(r[0].test_accuracy - r[2].test_accuracy > 0.1);
}

TEST_CASE("refresh_model_copies: what forward reads after a step") {
  Mlp net(config({2, 3, 2}, DType::f16));
  Parameter& w = *net.parameters()[0];
  const float w0 = w.master.f32()(0, 0);
  w.master.f32()(0, 0) = w0 + 1e-6f;  // far below fp16's ulp at ~0.5: not visible yet
  w.master.f32()(0, 1) += 0.25f;      // visible
  RefreshStats st = net.refresh_model_copies();
  CHECK(st.elements == 6 + 3 + 6 + 2);
  CHECK(st.changed == 1);
  CHECK(st.lost == 0);
  CHECK(w.master.f32()(0, 0) == w0 + 1e-6f);  // the master keeps it

  MlpConfig c = config({2, 3, 2}, DType::f16);
  c.master_weights = MasterWeights::none;
  Mlp pure(c);
  Parameter& v = *pure.parameters()[0];
  CHECK(v.master.f32() == v.weights().to_matrix());  // the weights are the fp16 values from the start
  const float v0 = v.master.f32()(0, 0);
  v.master.f32()(0, 0) = v0 + 1e-6f;
  v.master.f32()(0, 1) += 0.25f;
  st = pure.refresh_model_copies();
  CHECK(st.changed == 1);
  CHECK(st.lost == 1);
  CHECK(v.master.f32()(0, 0) == v0);  // rounded away for good
}
