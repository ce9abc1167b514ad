// Chapter 04 — numerically stable softmax, log-softmax and cross-entropy: the ops.
// softmax, log_softmax, cross_entropy and nll_loss against FP64 references
// written out in the test (every reduction, ignore_index, label smoothing),
// numbers worked out by hand as PyTorch gives them, the backward passes
// against FP64 central finite differences, the precision rules (FP32 loss,
// gradients in the logits' dtype, f16 compute refused), adversarial rows,
// the trace and the one-line errors.
// Depends on: mpt/nn/layers/softmax.hpp, softmax_math.hpp, the core tier (Context,
// policies, Trace, Rng).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "layer_test_support.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/nn/layers/softmax.hpp"
#include "mpt/nn/layers/softmax_math.hpp"

using namespace mpt;
using VecD = std::vector<double>;
using VecF = std::vector<float>;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

VecD randn(std::size_t n, std::uint64_t seed, double sd = 1.0) {
  Rng rng(seed);
  VecD v(n);
  for (double& x : v) x = sd * rng.normal();
  return v;
}

Tensor tensor(const VecD& v, Shape s, DType d = DType::f32) {
  const VecF f(v.begin(), v.end());
  return Tensor::from_f32(f.data(), std::move(s), d);
}

VecD values(const Tensor& t) {
  VecF f(static_cast<std::size_t>(t.numel()));
  t.to_f32(f.data());
  return VecD(f.begin(), f.end());
}

// The inputs as the library reads them: rounded into d, back to double.
VecD as_read(const VecD& v, DType d) { return values(tensor(v, {static_cast<std::int64_t>(v.size())}, d)); }

Context context(DType d = DType::f32) { return Context(uniform_policy(d)); }

// --- FP64 references, written out -------------------------------------------

VecD ref_log_softmax(const VecD& z, std::size_t k) {
  VecD out(z.size());
  for (std::size_t r = 0; r < z.size() / k; ++r) {
    double m = -kInf;
    for (std::size_t j = 0; j < k; ++j) m = std::max(m, z[r * k + j]);
    double s = 0;
    for (std::size_t j = 0; j < k; ++j) s += std::exp(z[r * k + j] - m);
    for (std::size_t j = 0; j < k; ++j) out[r * k + j] = z[r * k + j] - m - std::log(s);
  }
  return out;
}

VecD ref_softmax(const VecD& z, std::size_t k) {
  VecD out = ref_log_softmax(z, k);
  for (double& v : out) v = std::exp(v);
  return out;
}

// PyTorch's cross_entropy with class-index targets: per-row losses (0 for
// ignored rows) and the count of rows not ignored.
VecD ref_ce_rows(const VecD& z, std::size_t k, const std::vector<int>& t, int ignore, double eps) {
  const VecD lp = ref_log_softmax(z, k);
  VecD out(t.size(), 0.0);
  for (std::size_t r = 0; r < t.size(); ++r) {
    if (t[r] == ignore) continue;
    double smooth = 0;
    for (std::size_t j = 0; j < k; ++j) smooth -= lp[r * k + j];
    out[r] = (1 - eps) * -lp[r * k + static_cast<std::size_t>(t[r])] + eps / static_cast<double>(k) * smooth;
  }
  return out;
}

double reduce(const VecD& rows, const std::vector<int>& t, int ignore, Reduction red) {
  double s = 0;
  int n = 0;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    s += rows[r];
    n += t[r] != ignore;
  }
  return red == Reduction::sum ? s : s / n;
}

// Central differences (h = 1e-6, FP64).
VecD numeric_grad(const std::function<double(const VecD&)>& f, VecD v, double h = 1e-6) {
  VecD g(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double keep = v[i];
    v[i] = keep + h;
    const double up = f(v);
    v[i] = keep - h;
    const double down = f(v);
    v[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

void check_close(const VecD& got, const VecD& want, double rel, double abs_tol = 0) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(std::fabs(got[i] - want[i]) <= rel * std::fabs(want[i]) + abs_tol);
  }
}

Tensor scalar(double v) { return tensor({v}, {}); }

using mpt_test::HalfComputePolicy;

}  // namespace

TEST_CASE("softmax and log_softmax over the last dimension, any rank, against FP64") {
  const VecD z = randn(24, 1, 3.0);
  for (const Shape& s : {Shape{24}, Shape{4, 6}, Shape{2, 3, 4}}) {
    CAPTURE(shape_string(s));
    const auto k = static_cast<std::size_t>(s.back());
    Context ctx = context();
    const Tensor y = softmax(tensor(z, s), ctx);
    const Tensor ly = log_softmax(tensor(z, s), ctx);
    CHECK(y.shape() == s);
    CHECK(y.dtype() == DType::f32);
    const VecD zr = as_read(z, DType::f32);
    check_close(values(y), ref_softmax(zr, k), 1e-6, 1e-30);
    check_close(values(ly), ref_log_softmax(zr, k), 1e-6, 1e-6);
  }
  // Hand-worked: log_softmax([1, 2, 3]) = [1, 2, 3] − 3 − log(e^-2 + e^-1 + 1).
  Context ctx = context();
  const VecD ly = values(log_softmax(tensor({1, 2, 3}, {3}), ctx));
  check_close(ly, {-2.4076059644443806, -1.4076059644443806, -0.40760596444438046}, 1e-7);
}

TEST_CASE("cross_entropy in every reduction, with ignore_index and label smoothing, against FP64") {
  const std::size_t n = 5, k = 7;
  const VecD z = randn(n * k, 2, 4.0);
  const VecD zr = as_read(z, DType::f32);
  const std::vector<int> t = {3, -100, 0, 6, 2};
  for (double eps : {0.0, 0.1, 1.0}) {
    for (Reduction red : {Reduction::none, Reduction::mean, Reduction::sum}) {
      CAPTURE(eps);
      CAPTURE(reduction_name(red));
      CrossEntropyOptions o;
      o.label_smoothing = static_cast<float>(eps);
      o.reduction = red;
      Context ctx = context();
      const Tensor loss = cross_entropy(tensor(z, {5, 7}), t, o, ctx);
      CHECK(loss.dtype() == DType::f32);
      const VecD rows = ref_ce_rows(zr, k, t, -100, static_cast<double>(o.label_smoothing));
      if (red == Reduction::none) {
        CHECK(loss.shape() == Shape{5});
        check_close(values(loss), rows, 1e-6, 1e-7);
        CHECK(values(loss)[1] == 0.0);
      } else {
        CHECK(loss.shape() == Shape{});
        check_close(values(loss), {reduce(rows, t, -100, red)}, 1e-6);
      }
    }
  }
  // The mean divides by the 4 rows not ignored, not by 5.
  Context ctx = context();
  const double mean = values(cross_entropy(tensor(z, {5, 7}), t, {}, ctx))[0];
  const VecD rows = ref_ce_rows(zr, k, t, -100, 0);
  CHECK(mean == doctest::Approx((rows[0] + rows[2] + rows[3] + rows[4]) / 4).epsilon(1e-6));
  // An ignore_index inside [0, K) ignores that class; every row ignored: NaN mean, 0 sum.
  CrossEntropyOptions o;
  o.ignore_index = 3;
  CHECK(values(cross_entropy(tensor(z, {5, 7}), {3, 3, 3, 3, 3}, o, ctx))[0] !=
        values(cross_entropy(tensor(z, {5, 7}), {3, 3, 3, 3, 3}, o, ctx))[0]);
  o.reduction = Reduction::sum;
  CHECK(values(cross_entropy(tensor(z, {5, 7}), {3, 3, 3, 3, 3}, o, ctx))[0] == 0.0);
  o.reduction = Reduction::none;
  for (double v : values(cross_entropy(tensor(z, {5, 7}), {3, 3, 3, 3, 3}, o, ctx))) CHECK(v == 0.0);
}

TEST_CASE("numbers worked out by hand, as F.cross_entropy and F.nll_loss give them") {
  Context ctx = context();
  // logits [1, 2, 3], target 0: lse = 3 + log(1 + e^-1 + e^-2) = 3.4076059644443806.
  CHECK(values(cross_entropy(tensor({1, 2, 3}, {1, 3}), {0}, {}, ctx))[0] ==
        doctest::Approx(2.4076059644443806).epsilon(1e-7));
  // label_smoothing 0.1: 0.9·2.40760596 + 0.1·(3.40760596 − mean(1, 2, 3) = 2).
  CrossEntropyOptions o;
  o.label_smoothing = 0.1f;
  CHECK(values(cross_entropy(tensor({1, 2, 3}, {1, 3}), {0}, o, ctx))[0] ==
        doctest::Approx(0.9 * 2.4076059644443806 + 0.1 * 1.4076059644443806).epsilon(1e-7));
  // Two rows [0, 0] → log 2 each; sum 2 log 2.
  o = {};
  o.reduction = Reduction::sum;
  CHECK(values(cross_entropy(tensor({0, 0, 0, 0}, {2, 2}), {0, 1}, o, ctx))[0] ==
        doctest::Approx(2 * std::log(2.0)).epsilon(1e-7));
  // nll_loss of log-probabilities: −x[i, t_i], mean over the rows not ignored.
  const Tensor lp = tensor({-0.5, -1.5, -2.0, -0.25}, {2, 2});
  CHECK(values(nll_loss(lp, {1, 0}, {}, ctx))[0] == doctest::Approx((1.5 + 2.0) / 2));
  CHECK(values(nll_loss(lp, {1, -100}, {}, ctx))[0] == doctest::Approx(1.5));
  CHECK(std::isnan(values(nll_loss(lp, {-100, -100}, {}, ctx))[0]));
  NllLossOptions no;
  no.reduction = Reduction::none;
  check_close(values(nll_loss(lp, {1, -100}, no, ctx)), {1.5, 0.0}, 0);
  // nll_loss(log_softmax(z)) is cross_entropy(z).
  const VecD z = randn(12, 5, 2.0);
  const Tensor ls = log_softmax(tensor(z, {3, 4}), ctx);
  CHECK(values(nll_loss(ls, {0, 3, 1}, {}, ctx))[0] ==
        doctest::Approx(values(cross_entropy(tensor(z, {3, 4}), {0, 3, 1}, {}, ctx))[0]).epsilon(1e-6));
}

TEST_CASE("the double row backward matches FP64 central finite differences") {
  const std::size_t k = 6;
  const VecD z0 = randn(k, 7, 2.0);
  for (double eps : {0.0, 0.3}) {
    CAPTURE(eps);
    const auto f = [&](const VecD& z) {
      return cross_entropy_row<double>([&](std::int64_t j) { return z[static_cast<std::size_t>(j)]; }, 6, 2,
                                       eps);
    };
    VecD d(k);
    cross_entropy_backward_row<double>([&](std::int64_t j) { return z0[static_cast<std::size_t>(j)]; }, 6, 2,
                                       -100, eps, 1.0,
                                       [&](std::int64_t j, double v) { d[static_cast<std::size_t>(j)] = v; });
    check_close(d, numeric_grad(f, z0), 1e-6, 1e-9);
  }
  // softmax and log_softmax: the gradient of Σ dy·f(z).
  const VecD dy = randn(k, 8);
  for (bool log : {false, true}) {
    CAPTURE(log);
    const auto fwd = [&](const VecD& z) {
      VecD y(k);
      const auto value = [&](std::int64_t j) { return z[static_cast<std::size_t>(j)]; };
      const auto store = [&](std::int64_t j, double v) { y[static_cast<std::size_t>(j)] = v; };
      if (log) log_softmax_row<double>(value, 6, store);
      else softmax_row<double>(value, 6, store);
      return y;
    };
    const VecD y = fwd(z0);
    VecD dx(k);
    const auto yv = [&](std::int64_t j) { return y[static_cast<std::size_t>(j)]; };
    const auto gv = [&](std::int64_t j) { return dy[static_cast<std::size_t>(j)]; };
    const auto store = [&](std::int64_t j, double v) { dx[static_cast<std::size_t>(j)] = v; };
    if (log) log_softmax_backward_row<double>(yv, gv, 6, store);
    else softmax_backward_row<double>(yv, gv, 6, store);
    const auto dot = [&](const VecD& z) {
      const VecD out = fwd(z);
      double s = 0;
      for (std::size_t j = 0; j < k; ++j) s += dy[j] * out[j];
      return s;
    };
    check_close(dx, numeric_grad(dot, z0), 1e-6, 1e-9);
  }
}

TEST_CASE("the float ops' backward matches finite differences of the FP64 references") {
  const std::size_t n = 4, k = 5;
  const VecD z = as_read(randn(n * k, 9, 2.0), DType::f32);
  const std::vector<int> t = {1, -100, 4, 0};
  for (double eps : {0.0, 0.2}) {
    for (Reduction red : {Reduction::none, Reduction::mean, Reduction::sum}) {
      CAPTURE(eps);
      CAPTURE(reduction_name(red));
      CrossEntropyOptions o;
      o.label_smoothing = static_cast<float>(eps);
      o.reduction = red;
      const double e = o.label_smoothing;
      // dloss: 3 for mean/sum (a loss scale), one per row for none.
      const VecD dl = red == Reduction::none ? VecD{0.5, 2.0, -1.0, 3.0} : VecD{3.0};
      const auto f = [&](const VecD& v) {
        const VecD rows = ref_ce_rows(v, k, t, -100, e);
        if (red != Reduction::none) return dl[0] * reduce(rows, t, -100, red);
        double s = 0;
        for (std::size_t r = 0; r < n; ++r) s += dl[r] * rows[r];
        return s;
      };
      Context ctx = context();
      const Tensor dloss = red == Reduction::none ? tensor(dl, {4}) : scalar(dl[0]);
      const Tensor dz = cross_entropy_backward(tensor(z, {4, 5}), t, o, dloss, ctx);
      CHECK(dz.shape() == Shape{4, 5});
      check_close(values(dz), numeric_grad(f, z), 1e-5, 1e-6);
      for (std::size_t j = 0; j < k; ++j) CHECK(values(dz)[k + j] == 0.0);  // the ignored row
    }
  }
  // softmax_backward and log_softmax_backward from their outputs, [2, 3, 4].
  const VecD x = as_read(randn(24, 10, 2.0), DType::f32), dy = as_read(randn(24, 11), DType::f32);
  for (bool log : {false, true}) {
    CAPTURE(log);
    Context ctx = context();
    const Tensor y = log ? log_softmax(tensor(x, {2, 3, 4}), ctx) : softmax(tensor(x, {2, 3, 4}), ctx);
    const Tensor dx = log ? log_softmax_backward(y, tensor(dy, {2, 3, 4}), DType::f32, ctx)
                          : softmax_backward(y, tensor(dy, {2, 3, 4}), DType::f32, ctx);
    const auto f = [&](const VecD& v) {
      const VecD out = log ? ref_log_softmax(v, 4) : ref_softmax(v, 4);
      double s = 0;
      for (std::size_t i = 0; i < out.size(); ++i) s += dy[i] * out[i];
      return s;
    };
    check_close(values(dx), numeric_grad(f, x), 1e-5, 1e-6);
  }
  // nll_loss: −dloss/count at the targets.
  Context ctx = context();
  const VecD d =
      values(nll_loss_backward(tensor({-1, -2, -3, -4, -5, -6}, {3, 2}), {1, -100, 0}, {}, scalar(4), ctx));
  check_close(d, {0, -2, 0, 0, -2, 0}, 0);
}

TEST_CASE("f16 and bf16 logits: the loss is FP32, the gradient is in the logits' dtype") {
  const VecD z = randn(12, 12, 3.0);
  for (DType dt : {DType::f16, DType::bf16}) {
    CAPTURE(dtype_name(dt));
    Context ctx = context(dt);
    const Tensor logits = tensor(z, {3, 4}, dt);
    const Tensor loss = cross_entropy(logits, {0, 1, 2}, {}, ctx);
    CHECK(loss.dtype() == DType::f32);
    // The FP32 loss of the logits as stored: within FP32 rounding of FP64.
    const VecD rows = ref_ce_rows(values(logits), 4, {0, 1, 2}, -100, 0);
    CHECK(values(loss)[0] == doctest::Approx((rows[0] + rows[1] + rows[2]) / 3).epsilon(1e-6));
    const Tensor dz = cross_entropy_backward(logits, {0, 1, 2}, {}, scalar(1), ctx);
    CHECK(dz.dtype() == dt);
    const Tensor y = softmax(logits, ctx);
    CHECK(y.dtype() == dt);
    CHECK(softmax_backward(y, y, dt, ctx).dtype() == dt);
    CHECK(nll_loss(log_softmax(logits, ctx), {0, 1, 2}, {}, ctx).dtype() == DType::f32);
    CHECK(ctx.casts().casts == 0);  // the uniform policy reads everything as it arrives
  }
  // Keeping cross_entropy in f32 casts f16 logits up, and the gradient back down.
  auto keep = std::make_shared<KeepF32Policy>(uniform_policy(DType::f16), std::vector<std::string>{},
                                              std::vector<std::string>{"cross_entropy"});
  Context ctx(keep);
  const Tensor dz = cross_entropy_backward(tensor(z, {3, 4}, DType::f16), {0, 1, 2}, {}, scalar(1), ctx);
  CHECK(dz.dtype() == DType::f16);
  CHECK(ctx.casts().casts == 2);
  // A policy asking for f16 compute is refused.
  Context half(std::make_shared<HalfComputePolicy>());
  CHECK_THROWS_WITH_AS(
      softmax(tensor(z, {3, 4}, DType::f16), half),
      "softmax: the policy asks for f16 compute; softmax computes its max, sum of exponentials "
      "and log in f32 (autocast's FP32 list); low-precision exponentials are Chapter 4's "
      "pitfalls, not a policy choice",
      std::invalid_argument);
  CHECK_THROWS_AS(cross_entropy(tensor(z, {3, 4}, DType::f16), {0, 1, 2}, {}, half), std::invalid_argument);
  CHECK_THROWS_AS(nll_loss(tensor(z, {3, 4}, DType::f16), {0, 1, 2}, {}, half), std::invalid_argument);
}

TEST_CASE("adversarial rows: ±60000 in f16, equal logits, one huge, −inf, NaN") {
  Context ctx = context(DType::f16);
  // ±60000 in f16: exp(60000) would overflow every format; the max subtraction leaves 0 and −120000.
  const Tensor big = tensor({60000, -60000, 0, 60000}, {2, 2}, DType::f16);
  CrossEntropyOptions none;
  none.reduction = Reduction::none;
  const VecD l = values(cross_entropy(big, {1, 0}, none, ctx));
  check_close(l, {120000, 60000}, 1e-6);
  const VecD p = values(softmax(big, ctx));
  check_close(p, {1, 0, 0, 1}, 0);
  const VecD g = values(cross_entropy_backward(big, {1, 0}, none, tensor({1, 1}, {2}), ctx));
  check_close(g, {1, -1, -1, 1}, 0);
  // All equal: loss log K, softmax 1/K, gradient 1/K − onehot (/N for the mean).
  Context f32 = context();
  const Tensor eq = tensor({7, 7, 7, 7}, {1, 4});
  CHECK(values(cross_entropy(eq, {2}, {}, f32))[0] == doctest::Approx(std::log(4.0)).epsilon(1e-7));
  check_close(values(softmax(eq, f32)), {0.25, 0.25, 0.25, 0.25}, 0);
  check_close(values(cross_entropy_backward(eq, {2}, {}, scalar(1), f32)), {0.25, 0.25, -0.75, 0.25}, 0);
  // One huge logit: softmax one-hot, a loss of 0 at it and of the gap elsewhere.
  const Tensor huge = tensor({1e30, 0, -5}, {1, 3});
  check_close(values(softmax(huge, f32)), {1, 0, 0}, 0);
  CHECK(values(cross_entropy(huge, {0}, {}, f32))[0] == 0.0);
  CHECK(values(cross_entropy(huge, {1}, {}, f32))[0] == doctest::Approx(1e30).epsilon(1e-6));
  // −inf entries are masked: probability 0, finite loss, zero gradient there;
  // with smoothing the loss is +inf (ε/K·(−log 0)), as PyTorch's.
  const Tensor masked = tensor({-kInf, 1, 2, -kInf}, {1, 4});
  const VecD pm = values(softmax(masked, f32));
  CHECK(pm[0] == 0.0);
  CHECK(pm[3] == 0.0);
  CHECK(pm[2] == doctest::Approx(1 / (1 + std::exp(-1.0))).epsilon(1e-6));
  CHECK(values(log_softmax(masked, f32))[0] == -kInf);
  CHECK(values(cross_entropy(masked, {2}, {}, f32))[0] ==
        doctest::Approx(std::log(1 + std::exp(-1.0))).epsilon(1e-6));
  const VecD gm = values(cross_entropy_backward(masked, {2}, {}, scalar(1), f32));
  CHECK(gm[0] == 0.0);
  CHECK(gm[3] == 0.0);
  CrossEntropyOptions smooth;
  smooth.label_smoothing = 0.1f;
  CHECK(values(cross_entropy(masked, {2}, smooth, f32))[0] == kInf);
  // A row of −inf only: NaN (0/0), as PyTorch's softmax.
  for (double v : values(softmax(tensor({-kInf, -kInf}, {1, 2}), f32))) CHECK(std::isnan(v));
  // NaN in one row: that row's outputs are NaN, the other row's are not.
  const Tensor withnan = tensor({1, std::nan(""), 2, 0.5, 1.5, -1}, {2, 3});
  const VecD pn = values(softmax(withnan, f32));
  for (std::size_t j = 0; j < 3; ++j) {
    CHECK(std::isnan(pn[j]));
    CHECK(std::isfinite(pn[3 + j]));
  }
  const VecD ln = values(cross_entropy(withnan, {0, 1}, none, f32));
  CHECK(std::isnan(ln[0]));
  CHECK(std::isfinite(ln[1]));
  const VecD gn = values(cross_entropy_backward(withnan, {0, 1}, none, tensor({1, 1}, {2}), f32));
  for (std::size_t j = 0; j < 3; ++j) {
    CHECK(std::isnan(gn[j]));
    CHECK(std::isfinite(gn[3 + j]));
  }
  // +inf in a row makes it NaN (exp(inf − inf)), as PyTorch's softmax.
  for (double v : values(softmax(tensor({kInf, 1}, {1, 2}), f32))) CHECK(std::isnan(v));
}

TEST_CASE("trace entries of softmax and cross_entropy") {
  Context ctx = context(DType::f16);
  Trace trace;
  ctx.set_trace(&trace);
  const Tensor z = tensor(randn(6, 4), {2, 3}, DType::f16);
  const Tensor y = softmax(z, ctx, "attn.softmax");
  (void)softmax_backward(y, y, DType::f16, ctx, "attn.softmax");
  CrossEntropyOptions none;
  none.reduction = Reduction::none;
  (void)cross_entropy(z, {0, 2}, none, ctx, "loss");
  (void)cross_entropy_backward(z, {0, 2}, {}, scalar(1), ctx, "loss");
  const auto& es = trace.entries();
  REQUIRE(es.size() == 4);
  CHECK(es[0].phase == Phase::forward);
  CHECK(es[0].path == "attn.softmax");
  CHECK(es[0].op == "softmax");
  CHECK(es[0].compute == DType::f32);
  REQUIRE(es[0].inputs.size() == 1);
  CHECK(es[0].inputs[0].dtype == DType::f16);
  REQUIRE(es[0].outputs.size() == 1);
  CHECK(es[0].outputs[0].name == "y");
  CHECK(es[0].outputs[0].dtype == DType::f16);
  CHECK(es[0].outputs[0].bytes == 12);
  CHECK(es[1].phase == Phase::backward);
  CHECK(es[1].outputs[0].name == "dx");
  CHECK(es[2].op == "cross_entropy");
  CHECK(es[2].outputs[0].name == "loss");
  CHECK(es[2].outputs[0].dtype == DType::f32);
  CHECK(es[2].outputs[0].shape == Shape{2});
  CHECK(es[2].outputs[0].bytes == 8);
  CHECK(es[3].phase == Phase::backward);
  CHECK(es[3].outputs[0].name == "dx");
  CHECK(es[3].outputs[0].dtype == DType::f16);
}

TEST_CASE("bad input: one line naming what was wrong and what would be valid") {
  Context ctx = context();
  const Tensor z = tensor(randn(6, 1), {2, 3});
  CHECK_THROWS_WITH_AS(
      softmax(Tensor(DType::f32, {}), ctx),
      "softmax: x is a scalar; give a tensor of at least one dimension (the last is reduced over)",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(cross_entropy(tensor(randn(6, 1), {6}), {0}, {}, ctx),
                       "cross_entropy: logits are 6; give logits [N, K], 2 dimensions",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(cross_entropy(z, {0}, {}, ctx),
                       "cross_entropy: 1 targets for 2 rows of logits 2x3; give one class id per row",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      cross_entropy(z, {0, 3}, {}, ctx),
      "cross_entropy: target 3 (row 1) is out of bounds; give a class in 0..2 or ignore_index -100",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      cross_entropy(z, {-1, 0}, {}, ctx),
      "cross_entropy: target -1 (row 0) is out of bounds; give a class in 0..2 or ignore_index -100",
      std::invalid_argument);
  CrossEntropyOptions o;
  o.label_smoothing = 1.5f;
  CHECK_THROWS_WITH_AS(cross_entropy(z, {0, 1}, o, ctx),
                       "cross_entropy: label_smoothing must be in [0, 1], got 1.5", std::invalid_argument);
  o.label_smoothing = -0.1f;
  CHECK_THROWS_AS(cross_entropy_backward(z, {0, 1}, o, scalar(1), ctx), std::invalid_argument);
  o.label_smoothing = std::nanf("");
  CHECK_THROWS_AS(cross_entropy(z, {0, 1}, o, ctx), std::invalid_argument);
  o = {};
  o.reduction = Reduction::none;
  CHECK_THROWS_WITH_AS(cross_entropy_backward(z, {0, 1}, o, scalar(1), ctx),
                       "cross_entropy: dloss is scalar for reduction none; give the loss's shape, 2",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(softmax_backward(z, tensor(randn(3, 1), {3}), DType::f32, ctx),
                       "softmax: dy is 3 but the output y is 2x3; give dy of y's shape",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      nll_loss(z, {0, 5}, {}, ctx),
      "nll_loss: target 5 (row 1) is out of bounds; give a class in 0..2 or ignore_index -100",
      std::invalid_argument);
}
