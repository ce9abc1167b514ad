// Chapter 02 — loss scaling and FP32 master weights: the layers.
// Every backward formula is checked in FP64 against central finite
// differences (layer_math<double>, the same templates the float layers
// run); then the mixed-precision layers are checked to run exactly those
// formulas with the GPU's rounding points.
// Depends on: mpt/nn/layers/layer_math.hpp, linear.hpp, activations.hpp, losses.hpp,
// module.hpp, the core tier (Context, UniformPolicy, Rng).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/formats/rounding.hpp"
#include "mpt/nn/layers/activations.hpp"
#include "mpt/nn/layers/layer_math.hpp"
#include "mpt/nn/layers/linear.hpp"
#include "mpt/nn/layers/losses.hpp"

using namespace mpt;
using MatD = Mat<double>;

namespace {

MatD randn(Eigen::Index r, Eigen::Index c, std::uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  MatD m(r, c);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = scale * rng.normal();
  return m;
}

// Keeps every entry at least `gap` away from 0, so a ReLU's kink is never
// inside a finite-difference step.
MatD away_from_zero(MatD m, double gap) {
  for (Eigen::Index i = 0; i < m.size(); ++i) {
    double& v = m.data()[i];
    if (std::fabs(v) < gap) v = v < 0 ? -gap : gap;
  }
  return m;
}

// Central differences: (f(m + h·e_i) − f(m − h·e_i)) / 2h for every entry.
// Error model in FP64: truncation h²·|f'''|/6 ≈ 1e-13 for the O(1)
// derivatives here (h = 1e-6), rounding ≈ ε·|f|/h ≈ 1e-10; against
// gradients of size 1e-2..1 the relative error stays below ~1e-8, so 1e-6
// is a safe tolerance that still catches any wrong term (a missing
// transpose, a dropped factor 2 or 1/B is an O(1) relative error).
MatD numeric_grad(const std::function<double()>& f, MatD& m, double h = 1e-6) {
  MatD g(m.rows(), m.cols());
  for (Eigen::Index i = 0; i < m.size(); ++i) {
    const double keep = m.data()[i];
    m.data()[i] = keep + h;
    const double up = f();
    m.data()[i] = keep - h;
    const double down = f();
    m.data()[i] = keep;
    g.data()[i] = (up - down) / (2 * h);
  }
  return g;
}

double rel_err(const MatD& analytic, const MatD& numeric) {
  const double scale = std::max({analytic.norm(), numeric.norm(), 1e-30});
  return (analytic - numeric).norm() / scale;
}

constexpr double kTol = 1e-6;

bool same_bits(const MatrixF& a, const MatrixF& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  for (Eigen::Index i = 0; i < a.size(); ++i)
    if (!(a.data()[i] == b.data()[i] || (std::isnan(a.data()[i]) && std::isnan(b.data()[i])))) return false;
  return true;
}

MatrixF rounded(const MatrixF& x, DType p) { return Tensor::from_matrix(x, p).to_matrix(); }

/// A Linear with these FP32 values (b: one row), its model copies in `p`.
Linear linear_of(const MatrixF& w, const MatrixF& b, DType p) {
  Linear fc(Tensor::from_matrix(w, DType::f32), Tensor::from_matrix(b, DType::f32).reshaped({b.cols()}));
  fc.set_path("fc");
  fc.apply_policy(UniformPolicy(p));
  return fc;
}

/// A context asking UniformPolicy(p).
Context uniform(DType p) { return Context(uniform_policy(p)); }

}  // namespace

// --- FP64 finite-difference checks of layer_math ----------------------------------

TEST_CASE("Linear backward matches finite differences (FP64)") {
  // x [B=5, in=4], W [out=3, in=4], b [1, 3]; loss = Σ R ⊙ y, so dy = R.
  MatD x = randn(5, 4, 1), w = randn(3, 4, 2), b = randn(1, 3, 3);
  const MatD r = randn(5, 3, 4);
  const auto loss = [&] { return layer_math::linear_forward<double>(x, w, b).cwiseProduct(r).sum(); };
  const auto g = layer_math::linear_backward<double>(x, w, r);
  CHECK(g.dx.rows() == 5);
  CHECK(g.dx.cols() == 4);
  CHECK(g.dw.rows() == 3);
  CHECK(g.dw.cols() == 4);
  CHECK(g.db.rows() == 1);
  CHECK(g.db.cols() == 3);
  CHECK(rel_err(g.dx, numeric_grad(loss, x)) < kTol);
  CHECK(rel_err(g.dw, numeric_grad(loss, w)) < kTol);
  CHECK(rel_err(g.db, numeric_grad(loss, b)) < kTol);
}

TEST_CASE("ReLU and GELU backward match finite differences (FP64)") {
  MatD x = away_from_zero(randn(6, 7, 5, 2.0), 0.05);
  const MatD r = randn(6, 7, 6);
  SUBCASE("relu") {
    const auto loss = [&] { return layer_math::relu_forward<double>(x).cwiseProduct(r).sum(); };
    const MatD y = layer_math::relu_forward<double>(x);
    CHECK(rel_err(layer_math::relu_backward<double>(y, r), numeric_grad(loss, x)) < kTol);
    // The saved input gives the same mask as the saved output.
    CHECK(layer_math::relu_backward<double>(x, r) == layer_math::relu_backward<double>(y, r));
  }
  for (GeluApproximation a : {GeluApproximation::none, GeluApproximation::tanh}) {
    CAPTURE(static_cast<int>(a));
    const auto loss = [&] { return layer_math::gelu_forward<double>(x, a).cwiseProduct(r).sum(); };
    CHECK(rel_err(layer_math::gelu_backward<double>(x, r, a), numeric_grad(loss, x)) < kTol);
  }
}

TEST_CASE("GELU values are PyTorch's") {
  // PyTorch's documented formulas (torch.nn.GELU: x·Φ(x), and approximate=
  // 'tanh'), evaluated independently with Python's math.erf / math.tanh in
  // double; the erf form is nn.GELU()'s default.
  CHECK(layer_math::gelu(1.0, GeluApproximation::none) == doctest::Approx(0.8413447460685429).epsilon(1e-15));
  CHECK(layer_math::gelu(-1.0, GeluApproximation::none) ==
        doctest::Approx(-0.15865525393145707).epsilon(1e-15));
  CHECK(layer_math::gelu(3.0, GeluApproximation::none) == doctest::Approx(2.99595030590511).epsilon(1e-15));
  CHECK(layer_math::gelu(1.0, GeluApproximation::tanh) == doctest::Approx(0.8411919906082768).epsilon(1e-15));
  CHECK(layer_math::gelu(-1.0, GeluApproximation::tanh) ==
        doctest::Approx(-0.15880800939172324).epsilon(1e-15));
}

TEST_CASE("softmax cross-entropy: value, gradient by finite differences, loss scaling") {
  // One row [1, 2, 3], label 2: log(e + e² + e³) − 3.
  MatD one(1, 3);
  one << 1, 2, 3;
  CHECK(layer_math::cross_entropy_forward<double>(one, {2}) ==
        doctest::Approx(std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0).epsilon(1e-15));
  // Max subtraction: logits of 1000 do not overflow.
  MatD huge(1, 2);
  huge << 1000, 1000;
  CHECK(layer_math::cross_entropy_forward<float>(huge.cast<float>(), {0}) == doctest::Approx(std::log(2.0)));

  MatD z = randn(6, 5, 7, 3.0);
  const std::vector<int> y{0, 4, 2, 2, 1, 3};
  const auto loss = [&] { return layer_math::cross_entropy_forward<double>(z, y); };
  const MatD d = layer_math::cross_entropy_backward<double>(z, y, 1.0);
  CHECK(rel_err(d, numeric_grad(loss, z)) < kTol);
  // Each row of softmax − onehot sums to zero.
  CHECK(d.rowwise().sum().cwiseAbs().maxCoeff() < 1e-15);
  // dloss = S multiplies the gradient: what GradScaler::scale does to backward.
  CHECK((layer_math::cross_entropy_backward<double>(z, y, 1024.0) - 1024.0 * d).norm() < 1e-12);
  CHECK_THROWS_WITH_AS(layer_math::cross_entropy_forward<double>(z, {0, 1, 2, 3, 4, 5}),
                       "cross_entropy: target 5 is out of bounds (classes 0..4)", std::invalid_argument);
  CHECK_THROWS_AS(layer_math::cross_entropy_forward<double>(z, {0, 1}), std::invalid_argument);
}

TEST_CASE("MSE: value and gradient by finite differences") {
  MatD p = randn(4, 3, 8), t = randn(4, 3, 9);
  const auto loss = [&] { return layer_math::mse_forward<double>(p, t); };
  CHECK(loss() == doctest::Approx((p - t).array().square().mean()).epsilon(1e-15));
  CHECK(rel_err(layer_math::mse_backward<double>(p, t, 1.0), numeric_grad(loss, p)) < kTol);
  CHECK_THROWS_AS(layer_math::mse_forward<double>(p, randn(3, 3, 1)), std::invalid_argument);
}

TEST_CASE("a Linear-GELU-Linear-ReLU-Linear-CE chain: backward composes (FP64)") {
  MatD x = randn(8, 5, 10), w1 = randn(6, 5, 11, 0.5), b1 = randn(1, 6, 12, 0.1);
  MatD w2 = randn(7, 6, 13, 0.5), b2 = randn(1, 7, 14, 0.1), w3 = randn(3, 7, 15, 0.5),
       b3 = randn(1, 3, 16, 0.1);
  const std::vector<int> y{0, 1, 2, 0, 1, 2, 2, 1};
  const auto gelu = GeluApproximation::none;
  struct Fwd {
    MatD z1, a1, z2, a2, z3;
  };
  const auto forward = [&] {
    Fwd f;
    f.z1 = layer_math::linear_forward<double>(x, w1, b1);
    f.a1 = layer_math::gelu_forward<double>(f.z1, gelu);
    f.z2 = layer_math::linear_forward<double>(f.a1, w2, b2);
    f.a2 = layer_math::relu_forward<double>(f.z2);
    f.z3 = layer_math::linear_forward<double>(f.a2, w3, b3);
    return f;
  };
  const auto loss = [&] { return layer_math::cross_entropy_forward<double>(forward().z3, y); };
  const Fwd f = forward();
  // This draw keeps every ReLU input away from its kink.
  REQUIRE(f.z2.cwiseAbs().minCoeff() > 1e-4);
  const MatD dz3 = layer_math::cross_entropy_backward<double>(f.z3, y, 1.0);
  const auto g3 = layer_math::linear_backward<double>(f.a2, w3, dz3);
  const MatD dz2 = layer_math::relu_backward<double>(f.a2, g3.dx);
  const auto g2 = layer_math::linear_backward<double>(f.a1, w2, dz2);
  const MatD dz1 = layer_math::gelu_backward<double>(f.z1, g2.dx, gelu);
  const auto g1 = layer_math::linear_backward<double>(x, w1, dz1);
  CHECK(rel_err(g1.dw, numeric_grad(loss, w1)) < kTol);
  CHECK(rel_err(g1.db, numeric_grad(loss, b1)) < kTol);
  CHECK(rel_err(g2.dw, numeric_grad(loss, w2)) < kTol);
  CHECK(rel_err(g3.db, numeric_grad(loss, b3)) < kTol);
  CHECK(rel_err(g1.dx, numeric_grad(loss, x)) < kTol);
}

// --- the mixed-precision layers run those formulas, rounded where a GPU rounds ------

TEST_CASE("parameters: FP32 master, rounded model copy in its dtype, FP32 grad") {
  const MatrixF init = randn(3, 4, 20).cast<float>() * 0.1f;
  const Parameter p16 = make_parameter("w", init, DType::f16);
  CHECK(p16.master.f32() == init);
  CHECK(p16.master.dtype() == DType::f32);
  CHECK(p16.grad.f32().isZero(0));
  CHECK(p16.grad.shape() == Shape{3, 4});
  CHECK(p16.model_dtype() == DType::f16);
  CHECK(p16.weights().dtype() == DType::f16);
  CHECK(p16.model_bytes() == 24);  // 12 elements, 2 bytes each: really allocated
  CHECK(same_bits(p16.weights().to_matrix(), rounded(init, DType::f16)));
  const Parameter p32 = make_parameter("w", init, DType::f32);
  CHECK(p32.model_dtype() == DType::f32);
  CHECK(p32.model_bytes() == 0);
  CHECK(p32.weights().shares_storage_with(p32.master));  // f32: forward reads the master
  Parameter pb = make_parameter("w", init, DType::bf16);
  pb.master.f32().array() += 1.0f;
  refresh_model_copy(pb);
  CHECK(same_bits(pb.weights().to_matrix(), rounded(pb.master.f32(), DType::bf16)));
  CHECK_THROWS_WITH_AS(Parameter("w", Tensor(DType::f16, {2})),
                       "Parameter w: the master must be f32, got f16", std::invalid_argument);
}

TEST_CASE("Linear: fp32 is layer_math<float>, bit for bit; gradients accumulate") {
  const MatrixF x = randn(6, 5, 30).cast<float>(), w = randn(4, 5, 31).cast<float>(),
                b = randn(1, 4, 32).cast<float>(), dy = randn(6, 4, 33).cast<float>();
  Linear fc = linear_of(w, b, DType::f32);
  Context ctx = uniform(DType::f32);
  const Tensor xt = Tensor::from_matrix(x, DType::f32);
  CHECK(same_bits(fc.forward(xt, ctx).to_matrix(), layer_math::linear_forward<float>(x, w, b)));
  const auto g = layer_math::linear_backward<float>(x, w, dy);
  const Tensor dx = fc.backward(Tensor::from_matrix(dy, DType::f32), ctx);
  CHECK(same_bits(dx.to_matrix(), g.dx));
  CHECK(same_bits(fc.weight.grad.f32(), g.dw));
  CHECK(same_bits(fc.bias.grad.f32(), g.db));
  CHECK(fc.bias.grad.shape() == Shape{4});
  // Gradients accumulate, as PyTorch's .grad does, until zero_grad.
  fc.set_input_grad(false);
  const Tensor none = fc.backward(Tensor::from_matrix(dy, DType::f32), ctx);
  CHECK(same_bits(fc.weight.grad.f32(), MatrixF(2.0f * g.dw)));
  // Without input gradients (the first layer) dx is an empty tensor.
  CHECK(none.numel() == 0);
  CHECK(ctx.casts().casts == 0);  // an all-f32 pass casts nothing
  CHECK(fc.weight.name == "fc.weight");
}

TEST_CASE("Linear in fp16/bf16: widen exactly, FP32 math, one rounding per output") {
  const MatrixF x = randn(6, 5, 40).cast<float>(), w = randn(4, 5, 41).cast<float>(),
                b = randn(1, 4, 42).cast<float>(), dy = randn(6, 4, 43).cast<float>();
  for (DType p : {DType::f16, DType::bf16}) {
    CAPTURE(std::string(dtype_name(p)));
    Linear fc = linear_of(w, b, p);
    Context ctx = uniform(p);
    const Tensor xt = Tensor::from_matrix(x, p), dyt = Tensor::from_matrix(dy, p);
    const MatrixF xs = xt.to_matrix(), ws = fc.weight.weights().to_matrix(),
                  bs = fc.bias.weights().to_matrix(), dys = dyt.to_matrix();
    const Tensor y = fc.forward(xt, ctx);
    CHECK(y.dtype() == p);
    CHECK(same_bits(y.to_matrix(), rounded(layer_math::linear_forward<float>(xs, ws, bs), p)));
    const Tensor dx = fc.backward(dyt, ctx);
    const auto g = layer_math::linear_backward<float>(xs, ws, dys);
    CHECK(dx.dtype() == p);
    CHECK(same_bits(dx.to_matrix(), rounded(g.dx, p)));
    // The weight gradient is the low-precision one, widened into FP32.
    CHECK(fc.weight.grad.dtype() == DType::f32);
    CHECK(same_bits(fc.weight.grad.f32(), rounded(g.dw, p)));
    CHECK(same_bits(fc.bias.grad.f32(), rounded(g.db, p)));
    CHECK(ctx.casts().casts == 0);  // every operand already in p
    // An f32 input is cast at the op's boundary, counted once, and its
    // gradient leaves in f32 again (the cast's backward), counted too.
    Context mixed = uniform(p);
    const Tensor y32 = fc.forward(Tensor::from_matrix(x, DType::f32), mixed);
    CHECK(same_bits(y32.to_matrix(), y.to_matrix()));
    CHECK(mixed.casts().casts == 1);
    CHECK(mixed.casts().bytes == 30 * bytes_per_element(p));
    const Tensor dx32 = fc.backward(dyt, mixed);
    CHECK(dx32.dtype() == DType::f32);
    CHECK(same_bits(dx32.to_matrix(), dx.to_matrix()));
    CHECK(mixed.casts().casts == 2);
  }
}

TEST_CASE("fp16 weight gradients below 2^-25 are zero; in fp32 they are not") {
  // dy = 2^-20 (an fp16 subnormal), x = 2^-10: dW = Σ_B dy·x = 4·2^-30 = 2^-28,
  // below half of fp16's smallest subnormal 2^-24 — it rounds to 0.
  const MatrixF x = MatrixF::Constant(4, 3, 0x1.0p-10f), dy = MatrixF::Constant(4, 2, 0x1.0p-20f);
  for (DType p : {DType::f32, DType::f16}) {
    Linear fc = linear_of(MatrixF::Ones(2, 3), MatrixF::Zero(1, 2), p);
    Context ctx = uniform(p);
    const Tensor dyt = Tensor::from_matrix(dy, p);
    CHECK(dyt.value(0) == 0x1.0p-20f);  // dy itself survives
    fc.forward(Tensor::from_matrix(x, p), ctx);
    fc.backward(dyt, ctx);
    if (p == DType::f16) CHECK(fc.weight.grad.f32().isZero(0));
    else CHECK(fc.weight.grad.value(0) == 0x1.0p-28f);
    CHECK(fc.bias.grad.value(0) == 0x1.0p-18f);  // Σ dy = 2^-18 is representable in both
  }
}

TEST_CASE("Linear: mixed operands are the policy's business; wrong shapes are errors") {
  // The weights are bf16 copies, the input f16: the policy says bf16, so the
  // input is cast at the boundary instead of refused.
  Linear fc = linear_of(MatrixF::Ones(2, 3), MatrixF::Zero(1, 2), DType::bf16);
  Context ctx = uniform(DType::bf16);
  const Tensor y = fc.forward(Tensor(DType::f16, {4, 3}), ctx);
  CHECK(y.dtype() == DType::bf16);
  CHECK(ctx.casts().casts == 1);
  CHECK_THROWS_WITH_AS(fc.forward(Tensor(DType::bf16, {4, 5}), ctx),
                       "fc.weight: x is 4x5 but the layer takes [B, 3]", std::invalid_argument);
  Linear fresh = linear_of(MatrixF::Ones(2, 3), MatrixF::Zero(1, 2), DType::f32);
  CHECK_THROWS_WITH_AS(fresh.backward(Tensor(DType::f32, {4, 2}), ctx),
                       "Linear fc::backward: call forward() first", std::logic_error);
  fresh.forward(Tensor(DType::f32, {4, 3}), ctx);
  CHECK_THROWS_WITH_AS(fresh.backward(Tensor(DType::f32, {4, 3}), ctx), "dy is 4x3, expected 4x2",
                       std::invalid_argument);
}

TEST_CASE("activations and losses: FP32 math on widened values, stored in the tensor's dtype") {
  const MatrixF z = randn(5, 6, 50, 2.0).cast<float>(), dy = randn(5, 6, 51).cast<float>();
  for (DType p : {DType::f32, DType::f16, DType::bf16}) {
    CAPTURE(std::string(dtype_name(p)));
    Context ctx = uniform(p);
    const Tensor zt = Tensor::from_matrix(z, p), dyt = Tensor::from_matrix(dy, p);
    const MatrixF zs = zt.to_matrix(), dys = dyt.to_matrix();
    ReLU relu;
    const Tensor a = relu.forward(zt, ctx);
    CHECK(same_bits(a.to_matrix(), layer_math::relu_forward<float>(zs)));  // exact: no rounding needed
    CHECK(same_bits(relu.backward(dyt, ctx).to_matrix(), layer_math::relu_backward<float>(zs, dys)));
    CHECK(relu.saved().front()->shares_storage_with(a));  // it keeps its output, no copy
    for (GeluApproximation k : {GeluApproximation::none, GeluApproximation::tanh}) {
      GELU gelu(k);
      CHECK(same_bits(gelu.forward(zt, ctx).to_matrix(), rounded(layer_math::gelu_forward<float>(zs, k), p)));
      CHECK(same_bits(gelu.backward(dyt, ctx).to_matrix(),
                      rounded(layer_math::gelu_backward<float>(zs, dys, k), p)));
    }
    const std::vector<int> y{0, 5, 2, 3, 1};
    CHECK(cross_entropy_loss(zt, y) == layer_math::cross_entropy_forward<float>(zs, y));
    CHECK(cross_entropy_loss(zt, y, ctx) == cross_entropy_loss(zt, y));  // the policy's path: the same number
    const Tensor d = cross_entropy_backward(zt, y, 256.0f);
    CHECK(d.dtype() == p);
    CHECK(same_bits(d.to_matrix(), rounded(layer_math::cross_entropy_backward<float>(zs, y, 256.0f), p)));
    CHECK(same_bits(cross_entropy_backward(zt, y, 256.0f, ctx).to_matrix(), d.to_matrix()));
    const MatrixF target = MatrixF::Constant(5, 6, 0.25f);
    CHECK(mse_loss(zt, target) == layer_math::mse_forward<float>(zs, target));
    CHECK(same_bits(mse_backward(zt, target, 2.0f).to_matrix(),
                    rounded(layer_math::mse_backward<float>(zs, target, 2.0f), p)));
    CHECK(ctx.casts().casts == 0);
  }
}

TEST_CASE("cross-entropy gradients flush to zero in fp16 unless the loss is scaled") {
  // A confident, correct prediction: softmax − onehot is ~1e-9 off the label.
  MatrixF z(1, 3);
  z << 20.0f, 0.0f, 0.0f;
  const Tensor z16 = Tensor::from_matrix(z, DType::f16);
  const MatrixF plain = cross_entropy_backward(z16, {0}).to_matrix();
  CHECK(plain(0, 1) == 0.0f);  // e^-20 ≈ 2.1e-9 < 2^-25: lost
  const MatrixF scaled = cross_entropy_backward(z16, {0}, 65536.0f).to_matrix();
  CHECK(scaled(0, 1) > 0.0f);  // 2^16·2.1e-9 ≈ 1.4e-4: kept
  CHECK(scaled(0, 1) / 65536.0f ==
        doctest::Approx(std::exp(-20.0) / (1 + 2 * std::exp(-20.0))).epsilon(1e-3));
}

TEST_CASE("ReLU keeps NaN and passes dy through a NaN output, as PyTorch's relu and threshold_backward do") {
  // PyTorch: relu(x) = clamp_min(x, 0) propagates NaN; its backward is
  // threshold_backward(dy, y, 0) = (y <= 0 ? 0 : dy), so a NaN output passes
  // dy through. A library that mapped NaN to 0 would hide a diverged run.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  MatrixF x(1, 7), dy(1, 7);
  x << nan, -nan, inf, -inf, 0.0f, -0.0f, 2.5f;
  dy << 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, nan;
  for (DType p : {DType::f32, DType::f16, DType::bf16}) {
    CAPTURE(std::string(dtype_name(p)));
    Context ctx = uniform(p);
    ReLU relu;
    const MatrixF y = relu.forward(Tensor::from_matrix(x, p), ctx).to_matrix();
    CHECK(std::isnan(y(0, 0)));
    CHECK(std::isnan(y(0, 1)));
    CHECK(y(0, 2) == inf);
    CHECK(y(0, 3) == 0.0f);
    CHECK(y(0, 4) == 0.0f);
    CHECK((y(0, 5) == 0.0f && !std::signbit(y(0, 5))));  // -0 <= 0: a plain +0, as max(x, 0) gives
    CHECK(y(0, 6) == 2.5f);
    const MatrixF dx = relu.backward(Tensor::from_matrix(dy, p), ctx).to_matrix();
    CHECK(dx(0, 0) == 3.0f);  // NaN output: dy passes
    CHECK(dx(0, 1) == 4.0f);
    CHECK(dx(0, 2) == 5.0f);
    CHECK(dx(0, 3) == 0.0f);
    CHECK(dx(0, 4) == 0.0f);
    CHECK(dx(0, 5) == 0.0f);
    CHECK(std::isnan(dx(0, 6)));  // a NaN gradient where y > 0 stays NaN
  }
}

TEST_CASE(
    "ReLU on f16/bf16 codes gives the bits of widening, the formulas and rounding back, for every code") {
  // The layer's f16/bf16 path works on the codes (each kept or +0); the
  // reference is the generic path: layer_math on the widened values,
  // rounded into the dtype.
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t c = 0; c < 65536; ++c) all[c] = static_cast<std::uint16_t>(c);
  const auto codes_of = [](const Tensor& t) {
    const auto* p = static_cast<const std::uint16_t*>(t.raw());
    return std::vector<std::uint16_t>(p, p + t.numel());
  };
  for (DType p : {DType::f16, DType::bf16}) {
    CAPTURE(std::string(dtype_name(p)));
    const Tensor x = Tensor::from_codes(
        {256, 256}, p, [&](void* c) { std::memcpy(c, all.data(), all.size() * sizeof(std::uint16_t)); });
    Context ctx = uniform(p);
    ReLU relu;
    const Tensor y = relu.forward(x, ctx);
    CHECK(codes_of(y) == codes_of(Tensor::from_matrix(layer_math::relu_forward<float>(x.to_matrix()), p)));
    // Backward: every code as the saved output against gradients that
    // include NaNs, infinities, zeros of both signs and subnormals.
    std::vector<std::uint16_t> g(65536);
    for (std::uint32_t c = 0; c < 65536; ++c) g[c] = static_cast<std::uint16_t>((c * 40503u + 7u) & 0xffffu);
    const Tensor dy = Tensor::from_codes(
        {256, 256}, p, [&](void* c) { std::memcpy(c, g.data(), g.size() * sizeof(std::uint16_t)); });
    const Tensor dx = relu.backward(dy, ctx);
    CHECK(codes_of(dx) ==
          codes_of(Tensor::from_matrix(layer_math::relu_backward<float>(y.to_matrix(), dy.to_matrix()), p)));
  }
}

TEST_CASE("accuracy: argmax against labels") {
  MatrixF z(3, 2);
  z << 1, 2, 3, 0, 5, 5;
  CHECK(accuracy(Tensor::from_matrix(z, DType::f16), {1, 0, 0}) == 1.0);
  CHECK(accuracy(Tensor::from_matrix(z, DType::f32), {0, 0, 1}) == doctest::Approx(1.0 / 3));
}
