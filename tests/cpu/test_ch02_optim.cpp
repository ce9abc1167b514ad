// Chapter 02 — loss scaling and FP32 master weights: SGD and AdamW.
// Each optimizer runs a few steps on a tiny parameter with known gradients;
// the expected values are computed here in double from the update rules
// as PyTorch documents them (torch.optim.SGD / torch.optim.AdamW), written
// independently of the library's FP32 code.
// Depends on: mpt/optim.hpp, mpt/layers.hpp (make_parameter).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "mpt/nn/layers/losses.hpp"
#include "mpt/optim/adamw.hpp"
#include "mpt/optim/sgd.hpp"

using namespace mpt;

namespace {

using Vec = std::vector<double>;

// Three steps' gradients for a 2x2 parameter (row-major), mixed signs and
// magnitudes, one tiny entry where Adam's eps matters.
const std::vector<Vec> kGrads = {
    {0.5, -1.25, 3e-9, 2.0}, {0.25, -0.5, -1e-9, 1.5}, {-0.75, 0.125, 2e-9, -3.0}};
const Vec kInit = {1.0, -2.0, 0.5, 3.0};

Parameter param_2x2() {
  MatrixF init(2, 2);
  for (int i = 0; i < 4; ++i) init.data()[i] = static_cast<float>(kInit[static_cast<std::size_t>(i)]);
  return make_parameter("p", init, DType::f32);
}

void set_grad(Parameter& p, const Vec& g) {
  for (int i = 0; i < 4; ++i) p.grad.f32_data()[i] = static_cast<float>(g[static_cast<std::size_t>(i)]);
}

// The grads as the FP32 parameter holds them (what the double reference must use).
double f32(double v) { return static_cast<double>(static_cast<float>(v)); }

// FP32 arithmetic over ~10 roundings of relative size 2^-24 per step, three
// steps: 2e-6 relative (plus a tiny absolute floor) leaves ample margin, and
// any wrong term (coupled decay, missing bias correction, eps inside the
// square root) is off by far more.
void check_close(const MatrixF& got, const Vec& want) {
  for (int i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(static_cast<double>(got.data()[i]) ==
          doctest::Approx(want[static_cast<std::size_t>(i)]).epsilon(2e-6).scale(1e-3));
  }
}

// torch.optim.SGD's documented algorithm, in double.
Vec sgd_reference(const SgdOptions& o, int steps) {
  Vec p = kInit, b(4, 0.0);
  for (int t = 0; t < steps; ++t)
    for (int i = 0; i < 4; ++i) {
      double g = f32(kGrads[static_cast<std::size_t>(t)][static_cast<std::size_t>(i)]);
      if (o.weight_decay != 0) g += o.weight_decay * p[static_cast<std::size_t>(i)];
      if (o.momentum != 0) {
        double& bi = b[static_cast<std::size_t>(i)];
        bi = t == 0 ? g : o.momentum * bi + (1 - o.dampening) * g;
        g = o.nesterov ? g + o.momentum * bi : bi;
      }
      p[static_cast<std::size_t>(i)] -= o.lr * g;
    }
  return p;
}

// torch.optim.AdamW's documented algorithm, in double:
//   θ ← θ − γλθ;  m ← β1 m + (1−β1) g;  v ← β2 v + (1−β2) g²;
//   m̂ = m/(1−β1^t);  v̂ = v/(1−β2^t);  θ ← θ − γ m̂/(√v̂ + ε)
Vec adamw_reference(const AdamWOptions& o, int steps, const std::vector<Vec>& grads = kGrads) {
  Vec p = kInit, m(4, 0.0), v(4, 0.0);
  for (int t = 1; t <= steps; ++t)
    for (std::size_t i = 0; i < 4; ++i) {
      const double g = f32(grads[static_cast<std::size_t>(t - 1)][i]);
      p[i] -= o.lr * o.weight_decay * p[i];
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      const double mhat = m[i] / (1 - std::pow(o.beta1, t));
      const double vhat = v[i] / (1 - std::pow(o.beta2, t));
      p[i] -= o.lr * mhat / (std::sqrt(vhat) + o.eps);
    }
  return p;
}

}  // namespace

TEST_CASE("defaults are PyTorch's") {
  const SGD::Options s;
  CHECK(s.lr == 1e-3);
  CHECK(s.momentum == 0.0);
  CHECK(s.dampening == 0.0);
  CHECK(s.weight_decay == 0.0);
  CHECK_FALSE(s.nesterov);
  const AdamW::Options a;
  CHECK(a.lr == 1e-3);
  CHECK(a.beta1 == 0.9);
  CHECK(a.beta2 == 0.999);
  CHECK(a.eps == 1e-8);
  CHECK(a.weight_decay == 1e-2);
  CHECK(a.state_dtype == DType::f32);
}

TEST_CASE("SGD: three steps match the documented update rule") {
  struct Case {
    const char* name;
    SgdOptions o;
  };
  const std::vector<Case> cases = {
      {"plain", {0.1, 0.0, 0.0, 0.0, false}},
      {"momentum", {0.1, 0.9, 0.0, 0.0, false}},
      {"momentum + dampening (none on step 1)", {0.1, 0.9, 0.5, 0.0, false}},
      {"nesterov", {0.05, 0.8, 0.0, 0.0, true}},
      {"weight decay (coupled, L2)", {0.1, 0.9, 0.0, 0.01, false}},
  };
  for (const Case& c : cases) {
    CAPTURE(std::string(c.name));
    Parameter p = param_2x2();
    SGD opt({&p}, c.o);
    for (int t = 0; t < 3; ++t) {
      set_grad(p, kGrads[static_cast<std::size_t>(t)]);
      opt.step();
    }
    check_close(p.master.f32(), sgd_reference(c.o, 3));
    CHECK(opt.state_bytes() == (c.o.momentum != 0 ? 16u : 0u));
  }
}

TEST_CASE("AdamW: three steps on a 2x2 parameter match the documented update rule") {
  for (double wd : {0.0, 1e-2, 0.5}) {
    CAPTURE(wd);
    AdamWOptions o;
    o.lr = 0.1;  // large enough that every term of the update shows
    o.weight_decay = wd;
    Parameter p = param_2x2();
    AdamW opt({&p}, o);
    for (int t = 0; t < 3; ++t) {
      set_grad(p, kGrads[static_cast<std::size_t>(t)]);
      opt.step();
    }
    CHECK(opt.step_count() == 3);
    check_close(p.master.f32(), adamw_reference(o, 3));
  }
}

TEST_CASE("AdamW: the first step moves each weight by about lr, whatever the gradient's size") {
  // m̂ = g and v̂ = g² on step 1, so the update is lr·g/(|g| + eps) ≈ ±lr —
  // except where |g| is comparable to eps (the 3e-9 entry).
  AdamWOptions o;
  o.weight_decay = 0;
  Parameter p = param_2x2();
  AdamW opt({&p}, o);
  set_grad(p, kGrads[0]);
  opt.step();
  CHECK(p.master.f32()(0, 0) == doctest::Approx(1.0 - 1e-3).epsilon(1e-6));
  CHECK(p.master.f32()(0, 1) == doctest::Approx(-2.0 + 1e-3).epsilon(1e-6));
  CHECK(p.master.f32()(1, 0) == doctest::Approx(0.5 - 1e-3 * 3e-9 / (3e-9 + 1e-8)).epsilon(1e-6));
}

TEST_CASE("AdamW: weight decay is decoupled — it does not go through m and v") {
  // Zero gradients: m and v stay 0, the Adam term is exactly 0, and only
  // the decay acts: θ_t = θ_0·(1 − lr·λ)^t. (Adam with L2 would instead
  // feed λθ into m and v and move each weight by about lr per step.)
  AdamWOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.5;
  Parameter p = param_2x2();
  AdamW opt({&p}, o);
  for (int t = 0; t < 4; ++t) opt.step();  // grads are zero
  for (int i = 0; i < 4; ++i)
    CHECK(p.master.f32_data()[i] ==
          doctest::Approx(kInit[static_cast<std::size_t>(i)] * std::pow(0.95, 4)).epsilon(1e-6));
  CHECK(opt.exp_avg(0).isZero(0));
  CHECK(opt.exp_avg_sq(0).isZero(0));
}

TEST_CASE("optimizers update the FP32 master, and zero_grad clears the grads") {
  MatrixF init(1, 2);
  init << 1.0f, 2.0f;
  Parameter p = make_parameter("p", init, DType::f16);
  p.grad.f32() << 1e-4f, 0.0f;
  SGD opt({&p}, {1e-3, 0, 0, 0, false});
  opt.step();
  // 1 − 1e-7 is not an fp16 value (fp16's spacing at 1 is 2^-10): the master
  // keeps the update, the model copy does not see it until refreshed and
  // even then rounds back to 1.
  CHECK(p.master.f32()(0, 0) == 1.0f - 1e-7f);
  CHECK(p.weights().value(0) == 1.0f);
  opt.zero_grad();
  CHECK(p.grad.f32().isZero(0));
}

TEST_CASE("invalid hyperparameters get PyTorch's errors") {
  Parameter p = param_2x2();
  CHECK_THROWS_WITH_AS(SGD({&p}, {-1.0, 0, 0, 0, false}), "Invalid learning rate: -1", std::invalid_argument);
  CHECK_THROWS_WITH_AS(SGD({&p}, {0.1, -0.5, 0, 0, false}), "Invalid momentum value: -0.5",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(SGD({&p}, {0.1, 0, 0, -1, false}), "Invalid weight_decay value: -1",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(SGD({&p}, {0.1, 0.0, 0, 0, true}),
                       "Nesterov momentum requires a momentum and zero dampening", std::invalid_argument);
  CHECK_THROWS_WITH_AS(SGD({&p}, {0.1, 0.9, 0.1, 0, true}),
                       "Nesterov momentum requires a momentum and zero dampening", std::invalid_argument);
  AdamWOptions o;
  o.eps = -1e-8;
  CHECK_THROWS_WITH_AS(AdamW({&p}, o), "Invalid epsilon value: -1e-08", std::invalid_argument);
  o = {};
  o.beta1 = 1.0;
  CHECK_THROWS_WITH_AS(AdamW({&p}, o), "Invalid beta parameter at index 0: 1", std::invalid_argument);
  o = {};
  o.beta2 = -0.1;
  CHECK_THROWS_WITH_AS(AdamW({&p}, o), "Invalid beta parameter at index 1: -0.1", std::invalid_argument);
  o = {};
  o.weight_decay = -0.1;
  CHECK_THROWS_WITH_AS(AdamW({&p}, o), "Invalid weight_decay value: -0.1", std::invalid_argument);
  AdamW ok({&p});
  CHECK_THROWS_AS(ok.set_lr(-1), std::invalid_argument);
  ok.set_lr(0.5);
  CHECK(ok.lr() == 0.5);
  // A gradient of the wrong shape is named.
  p.grad = Tensor(DType::f32, {1, 1});
  CHECK_THROWS_WITH_AS(ok.step(),
                       doctest::Contains("parameter p: grad is 1x1 f32 but the weights are 2x2 f32"),
                       std::invalid_argument);
}

TEST_CASE("pitfall: AdamW arithmetic in fp16 — eps = 1e-8 is zero there") {
  // eps rounds to 0 in fp16 (half of the smallest subnormal 2^-24 is ~3e-8),
  // and for a gradient of 1e-5 the term (1 − β2)·g² ≈ 1e-13 underflows, so
  // v = 0 and the update m/(√v + eps) = m/0 is infinite.
  MatrixF init = MatrixF::Constant(2, 2, 0.5f);
  Parameter p16 = make_parameter("p", init, DType::f32), p32 = p16;
  p16.grad.f32().setConstant(1e-5f);
  p32.grad.f32().setConstant(1e-5f);
  AdamWOptions o;
  o.state_dtype = DType::f16;
  AdamW bad({&p16}, o);
  AdamW good({&p32});  // PyTorch: state and eps in FP32
  bad.step();
  good.step();
  CHECK(p16.master.f32().array().isInf().all());
  CHECK(bad.exp_avg_sq(0).isZero(0));
  CHECK(p32.master.f32().allFinite());
  CHECK(p32.master.f32()(0, 0) == doctest::Approx(0.5 * (1 - 1e-5) - 1e-3).epsilon(1e-6));
  // Half the state memory: 2 tensors x 4 elements x 2 bytes.
  CHECK(bad.state_bytes() == 16);
  CHECK(good.state_bytes() == 32);

  // With gradients well inside fp16's range the fp16 arithmetic is merely
  // coarse: the same trajectory within a few fp16 ulps of the update.
  Parameter q16 = param_2x2(), q32 = param_2x2();
  AdamWOptions oq;
  oq.lr = 0.1;
  AdamWOptions oq16 = oq;
  oq16.state_dtype = DType::f16;
  AdamW a16({&q16}, oq16), a32({&q32}, oq);
  const std::vector<Vec> moderate = {{0.5, -1.25, 0.75, 2.0}, {0.25, -0.5, -1.0, 1.5}};
  for (const Vec& g : moderate) {
    set_grad(q16, g);
    set_grad(q32, g);
    a16.step();
    a32.step();
  }
  CHECK((q16.master.f32() - q32.master.f32()).cwiseAbs().maxCoeff() <
        0.2 * 1e-2);  // updates are ~0.1; fp16 ε ≈ 1e-3
}
