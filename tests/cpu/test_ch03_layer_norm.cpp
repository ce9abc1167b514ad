// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the LayerNorm layer.
// The FP64 backward (norm_math<double> on the LayerNorm layout) against
// central finite differences; PyTorch's semantics against numbers worked out
// in the test; the precision rules; the float layer against the double
// formulas; the trace; the errors.
// Depends on: mpt/nn/layers/layer_norm.hpp, norm_math.hpp, welford.hpp, the core
// tier (Context, policies, Trace, Rng), Chapter 1's format descriptors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layer_test_support.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/nn/layers/layer_norm.hpp"
#include "mpt/nn/layers/norm_math.hpp"
#include "mpt/nn/layers/welford.hpp"

using namespace mpt;
using VecD = std::vector<double>;
using VecF = std::vector<float>;
using norm_math::AffineAxis;
using norm_math::Layout;

namespace {

VecD randn(std::size_t n, std::uint64_t seed, double mean = 0.0, double sd = 1.0) {
  Rng rng(seed);
  VecD v(n);
  for (double& x : v) x = mean + sd * rng.normal();
  return v;
}

// Central differences (h = 1e-6, FP64): truncation ~1e-12, rounding ~1e-10
// against O(1) gradients, so 1e-6 relative is safe and any wrong term fails.
using mpt_test::numeric_grad;

double norm2(const VecD& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

double rel_err(const VecD& a, const VecD& b) {
  VecD d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return norm2(d) / std::max({norm2(a), norm2(b), 1e-30});
}

constexpr double kTol = 1e-6;

struct Ref {
  VecD mean, rstd, y;
};

// LayerNorm in double: rows of d values, the layout {1, rows, d}.
Ref ref_forward(const VecD& x, std::int64_t d, double eps, const VecD* w, const VecD* b) {
  const Layout l{1, static_cast<std::int64_t>(x.size()) / d, d};
  const auto rows = static_cast<std::size_t>(l.channels);
  Ref r{VecD(rows), VecD(rows), VecD(x.size())};
  std::vector<norm_math::Statistics> st(rows);
  norm_math::statistics(x.data(), l, st.data());
  norm_math::mean_invstd(st.data(), l.channels, eps, r.mean.data(), r.rstd.data());
  norm_math::forward(x.data(), l, r.mean.data(), r.rstd.data(), w ? w->data() : nullptr,
                     b ? b->data() : nullptr, AffineAxis::inner, r.y.data());
  return r;
}

Tensor tensor(const VecD& v, Shape s, DType d) {
  const VecF f(v.begin(), v.end());
  return Tensor::from_f32(f.data(), std::move(s), d);
}

VecD values(const Tensor& t) {
  VecF f(static_cast<std::size_t>(t.numel()));
  t.to_f32(f.data());
  return VecD(f.begin(), f.end());
}

double ulp_of(double v, DType d) {
  const FormatSpec& s = format_of(d).spec;
  const int e = v == 0 ? s.emin() : std::max(std::ilogb(v), s.emin());
  return std::ldexp(1.0, e - s.mantissa_bits);
}

// As in the BatchNorm suite: FP32 arithmetic within kUlps f32 ulps of
// `scale`, then one rounding into d. The worst error/bound (<= 1 passes).
constexpr double kUlps = 8;
double worst_ratio(const VecD& got, const VecD& ref, const VecD& scale, DType d) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = 0.5 * ulp_of(ref[i], d) + kUlps * 0x1p-24 * scale[i];
    worst = std::max(worst, std::fabs(got[i] - ref[i]) / bound);
  }
  return worst;
}

bool fits(const VecD& v, DType d) {
  for (double x : v) {
    const auto f = static_cast<float>(x);
    if (Tensor::from_f32(&f, {1}, d).value(0) != f) return false;
  }
  return true;
}

Context context(DType d) { return Context(uniform_policy(d)); }

// A LayerNorm "ln" over `shape` with these FP32 γ, β, then the policy's dtypes.
LayerNorm make_ln(const Shape& shape, const VecD& w, const VecD& b, const Policy& policy) {
  LayerNorm ln(shape);
  ln.set_path("ln");
  ln.weight = Parameter("ln.weight", tensor(w, shape, DType::f32));
  ln.bias = Parameter("ln.bias", tensor(b, shape, DType::f32));
  ln.apply_policy(policy);
  return ln;
}

using mpt_test::HalfComputePolicy;

}  // namespace

TEST_CASE("LayerNorm backward matches finite differences (FP64), 2-D and 3-D, affine or not") {
  // [4, 6] over {6}; [2, 3, 4] over {4} and over {3, 4}.
  struct Case {
    std::size_t numel;
    std::int64_t d;
  };
  for (const Case& k : {Case{24, 6}, Case{24, 4}, Case{24, 12}}) {
    for (bool affine : {true, false}) {
      CAPTURE(k.d);
      CAPTURE(affine);
      const auto d = static_cast<std::size_t>(k.d);
      VecD x = randn(k.numel, 1, -0.3, 2.0), w = randn(d, 2, 1.0, 0.5), b = randn(d, 3);
      const VecD r = randn(k.numel, 4);
      const double eps = 1e-3;
      const auto loss = [&] {
        const Ref f = ref_forward(x, k.d, eps, affine ? &w : nullptr, affine ? &b : nullptr);
        double s = 0;
        for (std::size_t i = 0; i < r.size(); ++i) s += r[i] * f.y[i];
        return s;
      };
      const Ref f = ref_forward(x, k.d, eps, affine ? &w : nullptr, affine ? &b : nullptr);
      const Layout l{1, static_cast<std::int64_t>(k.numel) / k.d, k.d};
      VecD dx(k.numel), dw(d), db(d);
      norm_math::backward(x.data(), r.data(), l, f.mean.data(), f.rstd.data(), affine ? w.data() : nullptr,
                          AffineAxis::inner, true, dx.data(), dw.data(), db.data());
      CHECK(rel_err(dx, numeric_grad(loss, x)) < kTol);
      if (affine) {
        CHECK(rel_err(dw, numeric_grad(loss, w)) < kTol);
        CHECK(rel_err(db, numeric_grad(loss, b)) < kTol);
      }
    }
  }
}

TEST_CASE("LayerNorm by hand: every row its own mean and biased variance, eps inside the root") {
  LayerNorm ln({4});
  CHECK(values(ln.weight.master) == VecD{1, 1, 1, 1});
  CHECK(values(ln.bias.master) == VecD{0, 0, 0, 0});
  ln.weight = Parameter("weight", tensor({1, 2, 0.5, -1}, {4}, DType::f32));
  ln.bias = Parameter("bias", tensor({0, 1, 0, 0.25}, {4}, DType::f32));
  Context ctx = context(DType::f32);
  // Row 0 {1, 2, 3, 4}: mean 2.5, biased variance 1.25. Row 1 {10, 10, 10, 14}: mean 11, variance 3.
  const Tensor y = ln.forward(tensor({1, 2, 3, 4, 10, 10, 10, 14}, {2, 4}, DType::f32), ctx);
  CHECK(ln.mean().shape() == Shape{2});
  CHECK(ln.mean().value(0) == doctest::Approx(2.5).epsilon(1e-7));
  CHECK(ln.mean().value(1) == doctest::Approx(11).epsilon(1e-7));
  const double s0 = 1 / std::sqrt(1.25 + 1e-5), s1 = 1 / std::sqrt(3 + 1e-5);
  CHECK(ln.rstd().value(0) == doctest::Approx(s0).epsilon(1e-6));
  CHECK(ln.rstd().value(1) == doctest::Approx(s1).epsilon(1e-6));
  // γ and β are per element of the row.
  CHECK(y.value(0) == doctest::Approx(-1.5 * s0 * 1 + 0).epsilon(1e-6));
  CHECK(y.value(1) == doctest::Approx(-0.5 * s0 * 2 + 1).epsilon(1e-6));
  CHECK(y.value(3) == doctest::Approx(1.5 * s0 * -1 + 0.25).epsilon(1e-6));
  CHECK(y.value(7) == doctest::Approx(3 * s1 * -1 + 0.25).epsilon(1e-6));
  // dβ = Σ_rows dy, dγ = Σ_rows dy·x̂.
  ln.backward(tensor({1, 1, 1, 1, 1, 1, 1, 1}, {2, 4}, DType::f32), ctx);
  CHECK(values(ln.bias.grad) == VecD{2, 2, 2, 2});
  CHECK(ln.weight.grad.value(3) == doctest::Approx(1.5 * s0 + 3 * s1).epsilon(1e-6));

  // eps = 0.5 on {0, 2}: ±1/√(1 + 0.5).
  LayerNorm::Options o;
  o.eps = 0.5;
  o.elementwise_affine = false;
  LayerNorm plain({2}, o);
  CHECK(plain.parameters().empty());
  const Tensor z = plain.forward(tensor({0, 2}, {1, 2}, DType::f32), ctx);
  CHECK(z.value(0) == doctest::Approx(-1 / std::sqrt(1.5)).epsilon(1e-7));
  CHECK(z.value(1) == doctest::Approx(1 / std::sqrt(1.5)).epsilon(1e-7));
  // x of exactly normalized_shape is one row; eval changes nothing.
  plain.eval();
  const Tensor z1 = plain.forward(tensor({0, 2}, {2}, DType::f32), ctx);
  CHECK(z1.shape() == Shape{2});
  CHECK(z1.value(1) == z.value(1));
  CHECK(plain.mean().shape() == Shape{1});
}

TEST_CASE("LayerNorm over two trailing dims normalizes each [3, 4] block") {
  LayerNorm ln({3, 4});
  CHECK(ln.weight.master.shape() == Shape{3, 4});
  Context ctx = context(DType::f32);
  VecD x(24);
  for (std::size_t i = 0; i < 24; ++i) x[i] = static_cast<double>(i);  // block 0: 0..11, block 1: 12..23
  ln.forward(tensor(x, {2, 3, 4}, DType::f32), ctx);
  // Mean 5.5 and 17.5; the biased variance of 12 consecutive integers is (12² − 1)/12.
  CHECK(ln.mean().value(0) == doctest::Approx(5.5).epsilon(1e-7));
  CHECK(ln.mean().value(1) == doctest::Approx(17.5).epsilon(1e-7));
  CHECK(ln.rstd().value(1) == doctest::Approx(1 / std::sqrt(143.0 / 12 + 1e-5)).epsilon(1e-6));
}

TEST_CASE("LayerNorm precision: f16 storage, f32 statistics, KeepF32Policy, f16 compute refused") {
  const auto f16 = uniform_policy(DType::f16);
  {
    LayerNorm ln = make_ln({8}, VecD(8, 1.0), VecD(8, 0.0), *f16);
    Context ctx(f16);
    const Tensor x = tensor(randn(40, 5, 3.0), {5, 8}, DType::f16);
    const Tensor y = ln.forward(x, ctx);
    CHECK(y.dtype() == DType::f16);
    CHECK(ln.weight.weights().dtype() == DType::f16);
    CHECK(ln.weight.model_bytes() == 16);
    CHECK(ln.mean().dtype() == DType::f32);
    CHECK(ln.rstd().dtype() == DType::f32);
    CHECK(ctx.casts().casts == 0);
    CHECK(ln.saved().front()->shares_storage_with(x));
    CHECK(distinct_bytes(ln.saved()) == 2 * 40 + 4 * 5 + 4 * 5);
    const Tensor dx = ln.backward(tensor(randn(40, 6), {5, 8}, DType::f16), ctx);
    CHECK(dx.dtype() == DType::f16);
    CHECK(fits(values(ln.weight.grad), DType::f16));
  }
  const auto by_op = std::make_shared<KeepF32Policy>(f16, std::vector<std::string>{},
                                                     std::vector<std::string>{"layer_norm"});
  const auto by_path = std::make_shared<KeepF32Policy>(f16, std::vector<std::string>{"ln"});
  for (const auto& policy : {std::shared_ptr<const Policy>(by_op), std::shared_ptr<const Policy>(by_path)}) {
    CAPTURE(policy->describe());
    LayerNorm ln = make_ln({8}, VecD(8, 1.0), VecD(8, 0.0), *policy);
    Context ctx(policy);
    const Tensor y = ln.forward(tensor(randn(40, 7), {5, 8}, DType::f16), ctx);
    CHECK(y.dtype() == DType::f32);
    CHECK(ln.weight.model_dtype() == DType::f32);
    CHECK(ctx.casts().casts == 1);
    CHECK(ln.backward(tensor(randn(40, 8), {5, 8}, DType::f32), ctx).dtype() == DType::f16);
  }
  LayerNorm ln({2});
  Context half(std::make_shared<HalfComputePolicy>());
  CHECK_THROWS_WITH_AS(
      ln.forward(Tensor(DType::f16, {3, 2}), half),
      "layer_norm: the policy asks for f16 compute; layer_norm computes its statistics in f32; "
      "FP16 statistics are Chapter 3's pitfalls, not a policy choice",
      std::invalid_argument);
}

TEST_CASE("the float LayerNorm is the double formulas on its widened inputs, rounded where it rounds") {
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    for (const Shape& ns : {Shape{16}, Shape{3, 5}}) {
      CAPTURE(std::string(dtype_name(dt)));
      CAPTURE(shape_string(ns));
      const std::int64_t d = numel(ns);
      const auto du = static_cast<std::size_t>(d);
      Shape xs{2, 3};
      xs.insert(xs.end(), ns.begin(), ns.end());
      const auto n = static_cast<std::size_t>(numel(xs)), rows = n / du;
      LayerNorm ln = make_ln(ns, randn(du, 50, 1.0, 0.3), randn(du, 51, 0.0, 0.5), UniformPolicy(dt));
      Context ctx = context(dt);
      const Tensor xt = tensor(randn(n, 52, 1.5, 1.2), xs, dt), dyt = tensor(randn(n, 53), xs, dt);
      const VecD x = values(xt), dy = values(dyt), w = values(ln.weight.weights()),
                 b = values(ln.bias.weights());
      const Tensor y = ln.forward(xt, ctx);
      const Ref f = ref_forward(x, d, 1e-5, &w, &b);
      // The error model's magnitudes, per row r and element e (see the BatchNorm suite).
      VecD a(rows, 0.0), sy(n), sdx(n), sum_g(rows, 0.0), sum_gx(rows, 0.0), sdw(du, 0.0), sdb(du, 0.0);
      for (std::size_t e = 0; e < n; ++e) a[e / du] = std::max(a[e / du], std::fabs(x[e]) * f.rstd[e / du]);
      for (std::size_t e = 0; e < n; ++e) {
        const std::size_t r = e / du, i = e % du;
        const double xhat = std::fabs((x[e] - f.mean[r]) * f.rstd[r]);
        sy[e] = std::fabs(w[i]) * (a[r] + xhat) + std::fabs(b[i]);
        sum_g[r] += std::fabs(w[i] * dy[e]);
        sum_gx[r] += std::fabs(w[i] * dy[e]) * xhat;
        sdw[i] += std::fabs(dy[e]) * (xhat + a[r]);
        sdb[i] += std::fabs(dy[e]);
      }
      VecD smean(rows), srstd(rows);
      for (std::size_t r = 0; r < rows; ++r) {
        smean[r] = a[r] / f.rstd[r];
        srstd[r] = f.rstd[r] * (1 + a[r]);
      }
      CHECK(y.dtype() == dt);
      CHECK(worst_ratio(values(y), f.y, sy, dt) <= 1.0);
      CHECK(worst_ratio(values(ln.mean()), f.mean, smean, DType::f32) <= 1.0);
      CHECK(worst_ratio(values(ln.rstd()), f.rstd, srstd, DType::f32) <= 1.0);

      const Tensor dx = ln.backward(dyt, ctx);
      VecD dx_ref(n), dw_ref(du), db_ref(du);
      const Layout l{1, static_cast<std::int64_t>(rows), d};
      norm_math::backward(x.data(), dy.data(), l, f.mean.data(), f.rstd.data(), w.data(), AffineAxis::inner,
                          true, dx_ref.data(), dw_ref.data(), db_ref.data());
      for (std::size_t e = 0; e < n; ++e) {
        const std::size_t r = e / du, i = e % du;
        const double xhat = std::fabs((x[e] - f.mean[r]) * f.rstd[r]);
        sdx[e] = f.rstd[r] *
                 (std::fabs(w[i] * dy[e]) + (sum_g[r] + xhat * sum_gx[r]) / static_cast<double>(d)) *
                 (1 + a[r]);
      }
      CHECK(dx.dtype() == dt);
      CHECK(worst_ratio(values(dx), dx_ref, sdx, dt) <= 1.0);
      CHECK(worst_ratio(values(ln.weight.grad), dw_ref, sdw, dt) <= 1.0);
      CHECK(worst_ratio(values(ln.bias.grad), db_ref, sdb, dt) <= 1.0);
      CHECK(fits(values(ln.weight.grad), dt));
      CHECK(fits(values(ln.bias.grad), dt));
    }
  }
}

TEST_CASE("the float LayerNorm runs norm_math<float> exactly, rounding only where it stores") {
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    CAPTURE(std::string(dtype_name(dt)));
    LayerNorm ln = make_ln({6}, randn(6, 60, 1.0, 0.3), randn(6, 61), UniformPolicy(dt));
    Context ctx = context(dt);
    const Tensor xt = tensor(randn(30, 62, 0.4, 2.0), {5, 6}, dt), dyt = tensor(randn(30, 63), {5, 6}, dt);
    VecF x(30), dy(30), w(6), b(6);
    xt.to_f32(x.data());
    dyt.to_f32(dy.data());
    ln.weight.weights().to_f32(w.data());
    ln.bias.weights().to_f32(b.data());
    const Layout l{1, 5, 6};
    std::vector<norm_math::Statistics> st(5);
    VecF mean(5), rstd(5), y(30), dx(30), dw(6), db(6);
    norm_math::statistics(x.data(), l, st.data());
    norm_math::mean_invstd(st.data(), 5, 1e-5f, mean.data(), rstd.data());
    norm_math::forward(x.data(), l, mean.data(), rstd.data(), w.data(), b.data(), AffineAxis::inner,
                       y.data());
    norm_math::backward(x.data(), dy.data(), l, mean.data(), rstd.data(), w.data(), AffineAxis::inner, true,
                        dx.data(), dw.data(), db.data());
    const auto rounded = [dt](const VecF& v) {
      return values(Tensor::from_f32(v.data(), {static_cast<std::int64_t>(v.size())}, dt));
    };
    CHECK(values(ln.forward(xt, ctx)) == rounded(y));
    CHECK(values(ln.rstd()) == VecD(rstd.begin(), rstd.end()));
    CHECK(values(ln.backward(dyt, ctx)) == rounded(dx));
    CHECK(values(ln.weight.grad) == rounded(dw));
    CHECK(values(ln.bias.grad) == rounded(db));
  }
}

TEST_CASE("LayerNorm trace entries") {
  const auto bf16 = uniform_policy(DType::bf16);
  LayerNorm ln = make_ln({4}, VecD(4, 1.0), VecD(4, 0.0), *bf16);
  Context ctx(bf16);
  Trace trace;
  ctx.set_trace(&trace);
  ln.forward(tensor(randn(12, 70), {3, 4}, DType::bf16), ctx);
  ln.set_input_grad(false);
  ln.backward(tensor(randn(12, 71), {3, 4}, DType::bf16), ctx);
  const auto& es = trace.entries();
  REQUIRE(es.size() == 2);
  const TraceEntry& fw = es[0];
  CHECK(fw.op == "layer_norm");
  CHECK(fw.path == "ln");
  CHECK(fw.compute == DType::f32);
  REQUIRE(fw.inputs.size() == 3);
  CHECK(fw.inputs[0].dtype == DType::bf16);
  CHECK(fw.inputs[2].name == "bias");
  REQUIRE(fw.outputs.size() == 3);
  CHECK(fw.outputs[0].name == "y");
  CHECK(fw.outputs[0].dtype == DType::bf16);
  CHECK(fw.outputs[1].name == "mean");
  CHECK(fw.outputs[1].dtype == DType::f32);
  CHECK(fw.outputs[2].name == "rstd");
  CHECK(fw.outputs[2].bytes == 12);
  const TraceEntry& bw = es[1];
  CHECK(bw.phase == Phase::backward);
  // No input gradient asked for: only the parameters' gradients are written.
  REQUIRE(bw.outputs.size() == 2);
  CHECK(bw.outputs[0].name == "weight.grad");
  CHECK(bw.outputs[0].dtype == DType::bf16);
  CHECK(bw.outputs[1].name == "bias.grad");
}

TEST_CASE("LayerNorm: wrong shapes and options are one-line errors") {
  CHECK_THROWS_WITH_AS(
      LayerNorm(Shape{}),
      "LayerNorm: normalized_shape must have at least one dimension, every size >= 1; got scalar",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      LayerNorm(Shape{3, 0}),
      "LayerNorm: normalized_shape must have at least one dimension, every size >= 1; got 3x0",
      std::invalid_argument);
  LayerNorm::Options o;
  o.eps = std::nan("");
  CHECK_THROWS_WITH_AS(LayerNorm(Shape{3}, o), "LayerNorm: eps must be finite and >= 0, got nan",
                       std::invalid_argument);
  LayerNorm ln({3, 4});
  ln.set_path("ln");
  Context ctx = context(DType::f32);
  CHECK_THROWS_WITH_AS(ln.forward(Tensor(DType::f32, {2, 4, 3}), ctx),
                       "LayerNorm ln: x is 2x4x3 but its last 2 dims must be normalized_shape 3x4",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ln.forward(Tensor(DType::f32, {4}), ctx),
                       "LayerNorm ln: x is 4 but its last 2 dims must be normalized_shape 3x4",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ln.forward(Tensor(DType::f32, {0, 3, 4}), ctx),
                       "LayerNorm ln: x is 0x3x4; every size must be >= 1", std::invalid_argument);
  ln.forward(Tensor(DType::f32, {2, 3, 4}), ctx);
  CHECK_THROWS_WITH_AS(ln.backward(Tensor(DType::f32, {6, 4}), ctx),
                       "LayerNorm ln: dy is 6x4, expected 2x3x4", std::invalid_argument);
}
