// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the BatchNorm layer.
// The FP64 backward (norm_math<double>) against central finite differences;
// PyTorch's semantics, each against numbers worked out in the test; the
// precision rules (FP32 statistics, running estimates and parameter copies in
// the policy's parameter dtype); the float layer against the double
// formulas; the running-update guard; the trace; train/eval through a
// Sequential; the errors.
// Depends on: mpt/nn/layers/batch_norm.hpp, norm_math.hpp, welford.hpp, module.hpp,
// the core tier (Context, policies, Trace, Rng), Chapter 1's format descriptors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
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
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/norm_math.hpp"
#include "mpt/nn/layers/welford.hpp"
#include "mpt/nn/module.hpp"

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

// Central differences of f with respect to every entry of v. In FP64 with
// h = 1e-6 the truncation error is ~h²·|f'''| ≈ 1e-12 and the rounding error
// ~ε·|f|/h ≈ 1e-10 for the O(1) losses here: 1e-6 relative leaves a wide
// margin and still catches any wrong term (a dropped sum, a wrong M, a
// missing invstd are O(1) relative errors).
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

double dot(const VecD& a, const VecD& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// The double formulas: statistics of x (or the given fixed ones), y.
struct Ref {
  VecD mean, invstd, unbiased, y;
};

Ref ref_forward(const VecD& x, const Layout& l, double eps, const VecD* w, const VecD* b, AffineAxis axis,
                const VecD* fixed_mean = nullptr, const VecD* fixed_var = nullptr) {
  const auto c = static_cast<std::size_t>(l.channels);
  Ref r{VecD(c), VecD(c), VecD(c), VecD(x.size())};
  if (fixed_mean) {
    r.mean = *fixed_mean;
    for (std::size_t k = 0; k < c; ++k) r.invstd[k] = 1.0 / std::sqrt((*fixed_var)[k] + eps);
  } else {
    std::vector<norm_math::Statistics> st(c);
    norm_math::statistics(x.data(), l, st.data());
    norm_math::mean_invstd(st.data(), l.channels, eps, r.mean.data(), r.invstd.data());
    for (std::size_t k = 0; k < c; ++k) r.unbiased[k] = norm_math::variance_unbiased<double>(st[k]);
  }
  norm_math::forward(x.data(), l, r.mean.data(), r.invstd.data(), w ? w->data() : nullptr,
                     b ? b->data() : nullptr, axis, r.y.data());
  return r;
}

// --- tensors and tolerances ----------------------------------------------------------

Tensor tensor(const VecD& v, Shape s, DType d) {
  const VecF f(v.begin(), v.end());
  return Tensor::from_f32(f.data(), std::move(s), d);
}

VecD values(const Tensor& t) {
  VecF f(static_cast<std::size_t>(t.numel()));
  t.to_f32(f.data());
  return VecD(f.begin(), f.end());
}

// The spacing of dtype d at v: 2^(max(⌊log2|v|⌋, emin) − mantissa bits).
double ulp_of(double v, DType d) {
  const FormatSpec& s = format_of(d).spec;
  const int e = v == 0 ? s.emin() : std::max(std::ilogb(v), s.emin());
  return std::ldexp(1.0, e - s.mantissa_bits);
}

// Error model of the float layer against the double formulas: the layer's
// FP32 arithmetic is off by at most kUlps f32 ulps of `scale` (a bound on the
// magnitudes that enter the value, worked out per quantity below), and the
// value is then rounded once into its dtype (half an ulp of d). Returns the
// worst ratio of error to bound (<= 1 passes).
constexpr double kUlps = 8;
double worst_ratio(const VecD& got, const VecD& ref, const VecD& scale, DType d) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = 0.5 * ulp_of(ref[i], d) + kUlps * 0x1p-24 * scale[i];
    worst = std::max(worst, std::fabs(got[i] - ref[i]) / bound);
  }
  return worst;
}

// Whether every value is one of dtype d's (the rounding happened).
bool fits(const VecD& v, DType d) {
  for (double x : v) {
    const auto f = static_cast<float>(x);
    if (Tensor::from_f32(&f, {1}, d).value(0) != f) return false;
  }
  return true;
}

Context context(DType d) { return Context(uniform_policy(d)); }

// A BatchNorm "bn" with these FP32 values, then the policy's dtypes.
BatchNorm make_bn(const VecD& w, const VecD& b, const VecD& rm, const VecD& rv, const Policy& policy,
                  BatchNorm::Options o = {}) {
  BatchNorm bn(static_cast<int>(w.size()), o);
  bn.set_path("bn");
  const auto c = static_cast<std::int64_t>(w.size());
  bn.weight = Parameter("bn.weight", tensor(w, {c}, DType::f32));
  bn.bias = Parameter("bn.bias", tensor(b, {c}, DType::f32));
  bn.running_mean = tensor(rm, {c}, DType::f32);
  bn.running_var = tensor(rv, {c}, DType::f32);
  bn.apply_policy(policy);
  return bn;
}

/// A policy that asks for FP16 arithmetic everywhere (no real recipe does).
using mpt_test::HalfComputePolicy;

Layout layout(const Shape& s) {
  Layout l{s[0], s[1], 1};
  for (std::size_t d = 2; d < s.size(); ++d) l.inner *= s[d];
  return l;
}

}  // namespace

// --- FP64: the formulas against finite differences ------------------------------------

TEST_CASE("BatchNorm backward matches finite differences (FP64), [N,C] and [N,C,H,W], affine or not") {
  for (const Shape& shape : {Shape{5, 3}, Shape{3, 2, 2, 3}}) {
    const Layout l = layout(shape);
    const auto n = static_cast<std::size_t>(l.numel()), c = static_cast<std::size_t>(l.channels);
    for (bool affine : {true, false}) {
      for (bool batch : {true, false}) {
        CAPTURE(shape_string(shape));
        CAPTURE(affine);
        CAPTURE(batch);
        VecD x = randn(n, 1, 0.5, 1.5), w = randn(c, 2, 1.0, 0.5), b = randn(c, 3);
        const VecD r = randn(n, 4);  // loss = Σ r ⊙ y, so dy = r
        // Eval: fixed statistics (running estimates) that do not depend on x.
        const VecD rm = randn(c, 5), rv{0.7, 1.9, 1.3};
        const double eps = 1e-3;
        const auto loss = [&] {
          const Ref f = ref_forward(x, l, eps, affine ? &w : nullptr, affine ? &b : nullptr,
                                    AffineAxis::channel, batch ? nullptr : &rm, batch ? nullptr : &rv);
          return dot(f.y, r);
        };
        const Ref f = ref_forward(x, l, eps, affine ? &w : nullptr, affine ? &b : nullptr,
                                  AffineAxis::channel, batch ? nullptr : &rm, batch ? nullptr : &rv);
        VecD dx(n), dw(c), db(c);
        norm_math::backward(x.data(), r.data(), l, f.mean.data(), f.invstd.data(),
                            affine ? w.data() : nullptr, AffineAxis::channel, batch, dx.data(), dw.data(),
                            db.data());
        CHECK(rel_err(dx, numeric_grad(loss, x)) < kTol);
        if (affine) {
          CHECK(rel_err(dw, numeric_grad(loss, w)) < kTol);
          CHECK(rel_err(db, numeric_grad(loss, b)) < kTol);
        }
        if (batch) {
          // With batch statistics, dx of every channel sums to zero: the
          // mean is subtracted, so shifting a channel changes nothing.
          for (std::size_t k = 0; k < c; ++k) {
            double s = 0;
            for (std::int64_t nn = 0; nn < l.outer; ++nn)
              for (std::int64_t i = 0; i < l.inner; ++i)
                s += dx[static_cast<std::size_t>(l.offset(nn, static_cast<std::int64_t>(k), i))];
            CHECK(std::fabs(s) < 1e-12);
          }
        }
      }
    }
  }
}

// --- PyTorch's semantics, by hand -------------------------------------------------------

TEST_CASE("running statistics after three batches, momentum 0.1, with the unbiased variance") {
  BatchNorm bn(2);
  bn.set_path("bn");
  Context ctx = context(DType::f32);
  CHECK(bn.training());
  CHECK(bn.running_mean.dtype() == DType::f32);
  CHECK(values(bn.running_mean) == VecD{0, 0});
  CHECK(values(bn.running_var) == VecD{1, 1});
  CHECK(values(bn.weight.master) == VecD{1, 1});
  CHECK(values(bn.bias.master) == VecD{0, 0});
  // Batch 1, [4, 2]: channel 0 is {1, 2, 3, 4} (mean 2.5, Σ(x−mean)² = 5),
  // channel 1 is {−1, 1, −1, 1} (mean 0, Σ = 4).
  bn.forward(tensor({1, -1, 2, 1, 3, -1, 4, 1}, {4, 2}, DType::f32), ctx);
  CHECK(bn.num_batches_tracked == 1);
  // The batch statistics normalize with the biased variance, 5/4 and 4/4 ...
  CHECK(bn.mean().value(0) == doctest::Approx(2.5).epsilon(1e-7));
  CHECK(bn.invstd().value(0) == doctest::Approx(1 / std::sqrt(1.25 + 1e-5)).epsilon(1e-6));
  CHECK(bn.invstd().value(1) == doctest::Approx(1 / std::sqrt(1.0 + 1e-5)).epsilon(1e-6));
  // ... and fold the unbiased one, 5/3 and 4/3, into the running variance.
  CHECK(bn.running_mean.value(0) == doctest::Approx(0.9 * 0 + 0.1 * 2.5).epsilon(1e-6));
  CHECK(bn.running_mean.value(1) == doctest::Approx(0.0).epsilon(1e-6));
  CHECK(bn.running_var.value(0) == doctest::Approx(0.9 * 1 + 0.1 * 5.0 / 3).epsilon(1e-6));
  CHECK(bn.running_var.value(1) == doctest::Approx(0.9 * 1 + 0.1 * 4.0 / 3).epsilon(1e-6));
  // Batches 2 and 3: the same rule again, from these values.
  double rm0 = 0.25, rv0 = 0.9 + 0.1 * 5.0 / 3, rm1 = 0.0, rv1 = 0.9 + 0.1 * 4.0 / 3;
  // Batch 2, channel 0 {0, 4, 8} (mean 4, Σ = 32, unbiased 16); channel 1 {1, 1, 4} (mean 2, Σ = 6, unbiased
  // 3).
  bn.forward(tensor({0, 1, 4, 1, 8, 4}, {3, 2}, DType::f32), ctx);
  rm0 = 0.9 * rm0 + 0.1 * 4, rv0 = 0.9 * rv0 + 0.1 * 16, rm1 = 0.9 * rm1 + 0.1 * 2, rv1 = 0.9 * rv1 + 0.1 * 3;
  // Batch 3, channel 0 {−2, 2} (mean 0, unbiased 8); channel 1 {10, 11} (mean 10.5, unbiased 0.5).
  bn.forward(tensor({-2, 10, 2, 11}, {2, 2}, DType::f32), ctx);
  rm0 = 0.9 * rm0 + 0.1 * 0, rv0 = 0.9 * rv0 + 0.1 * 8, rm1 = 0.9 * rm1 + 0.1 * 10.5,
  rv1 = 0.9 * rv1 + 0.1 * 0.5;
  CHECK(bn.num_batches_tracked == 3);
  CHECK(bn.running_mean.value(0) == doctest::Approx(rm0).epsilon(1e-6));
  CHECK(bn.running_mean.value(1) == doctest::Approx(rm1).epsilon(1e-6));
  CHECK(bn.running_var.value(0) == doctest::Approx(rv0).epsilon(1e-6));
  CHECK(bn.running_var.value(1) == doctest::Approx(rv1).epsilon(1e-6));
}

TEST_CASE("the statistics of [N, C, H, W] and [N, C, L] run over N·H·W and N·L") {
  // One channel of {1, 2, 3, 4} as [2, 1, 1, 2] and as [1, 1, 4] (N = 1 is
  // fine: four values per channel); a second channel of zeros for [N, C, L].
  for (const Shape& s : {Shape{2, 1, 1, 2}, Shape{1, 1, 4}}) {
    CAPTURE(shape_string(s));
    BatchNorm bn(1);
    Context ctx = context(DType::f32);
    bn.forward(tensor({1, 2, 3, 4}, s, DType::f32), ctx);
    CHECK(bn.mean().value(0) == doctest::Approx(2.5).epsilon(1e-7));
    CHECK(bn.invstd().value(0) == doctest::Approx(1 / std::sqrt(1.25 + 1e-5)).epsilon(1e-6));
    CHECK(bn.running_var.value(0) == doctest::Approx(0.9 + 0.1 * 5.0 / 3).epsilon(1e-6));  // M − 1 = 3
  }
  BatchNorm bn(2);
  Context ctx = context(DType::f32);
  // [2, 2, 3]: channel 0 holds rows 0 and 2 of the 4x3 view, channel 1 rows 1 and 3.
  const Tensor y = bn.forward(tensor({1, 2, 3, 0, 0, 0, 4, 5, 6, 0, 0, 0}, {2, 2, 3}, DType::f32), ctx);
  CHECK(bn.mean().value(0) == doctest::Approx(3.5).epsilon(1e-7));
  CHECK(bn.mean().value(1) == 0.0f);
  CHECK(y.shape() == Shape{2, 2, 3});
  CHECK(y.value(3) == 0.0f);  // a constant channel normalizes to 0 (eps keeps invstd finite)
}

TEST_CASE("momentum nullopt is the cumulative average of the batch statistics") {
  BatchNorm::Options o;
  o.momentum = std::nullopt;
  BatchNorm bn(1, o);
  Context ctx = context(DType::f32);
  // m = 1/num_batches_tracked: 1, 1/2, 1/3 — the first batch replaces the
  // initial 0 and 1, then the estimates are plain averages.
  const VecD means{2.5, 4.0, 0.0}, unbiased{5.0 / 3, 16.0, 8.0};
  bn.forward(tensor({1, 2, 3, 4}, {4, 1}, DType::f32), ctx);
  CHECK(bn.running_mean.value(0) == doctest::Approx(2.5).epsilon(1e-7));
  CHECK(bn.running_var.value(0) == doctest::Approx(5.0 / 3).epsilon(1e-6));
  bn.forward(tensor({0, 4, 8}, {3, 1}, DType::f32), ctx);
  bn.forward(tensor({-2, 2}, {2, 1}, DType::f32), ctx);
  CHECK(bn.num_batches_tracked == 3);
  CHECK(bn.running_mean.value(0) == doctest::Approx((2.5 + 4.0 + 0.0) / 3).epsilon(1e-6));
  CHECK(bn.running_var.value(0) == doctest::Approx((5.0 / 3 + 16.0 + 8.0) / 3).epsilon(1e-6));
}

TEST_CASE("eval normalizes with the running estimates and leaves them alone") {
  BatchNorm bn(2);
  Context ctx = context(DType::f32);
  bn.running_mean = tensor({1.0, -2.0}, {2}, DType::f32);
  bn.running_var = tensor({4.0, 9.0}, {2}, DType::f32);
  bn.weight = Parameter("weight", tensor({2.0, 0.5}, {2}, DType::f32));
  bn.bias = Parameter("bias", tensor({0.25, -1.0}, {2}, DType::f32));
  bn.eval();
  CHECK_FALSE(bn.training());
  // One sample is fine in eval: no batch statistics are needed.
  const Tensor y = bn.forward(tensor({3.0, 1.0}, {1, 2}, DType::f32), ctx);
  // (3 − 1)/√(4 + 1e-5)·2 + 0.25 and (1 + 2)/√(9 + 1e-5)·0.5 − 1.
  CHECK(y.value(0) == doctest::Approx(2.0 / std::sqrt(4 + 1e-5) * 2 + 0.25).epsilon(1e-6));
  CHECK(y.value(1) == doctest::Approx(3.0 / std::sqrt(9 + 1e-5) * 0.5 - 1).epsilon(1e-6));
  CHECK(bn.num_batches_tracked == 0);
  CHECK(values(bn.running_mean) == VecD{1.0, -2.0});
  CHECK(values(bn.running_var) == VecD{4.0, 9.0});
  // Backward in eval: dx = dy·γ·invstd of the running variance; dγ = Σ dy·x̂.
  const Tensor dx = bn.backward(tensor({1.0, 1.0}, {1, 2}, DType::f32), ctx);
  CHECK(dx.value(0) == doctest::Approx(2 / std::sqrt(4 + 1e-5)).epsilon(1e-6));
  CHECK(dx.value(1) == doctest::Approx(0.5 / std::sqrt(9 + 1e-5)).epsilon(1e-6));
  CHECK(bn.weight.grad.value(0) == doctest::Approx(2.0 / std::sqrt(4 + 1e-5)).epsilon(1e-6));
  CHECK(bn.bias.grad.value(1) == 1.0f);

  // Without running estimates, eval normalizes with the batch's, as PyTorch.
  BatchNorm::Options o;
  o.track_running_stats = false;
  BatchNorm free(1, o);
  CHECK(free.running_mean.numel() == 0);
  free.eval();
  const Tensor z = free.forward(tensor({1, 3}, {2, 1}, DType::f32), ctx);
  CHECK(z.value(0) == doctest::Approx(-1 / std::sqrt(1 + 1e-5)).epsilon(1e-6));
  CHECK(free.num_batches_tracked == 0);
  CHECK_THROWS_WITH_AS(free.forward(tensor({1}, {1, 1}, DType::f32), ctx),
                       "BatchNorm: expected more than 1 value per channel when training, got x of shape 1x1",
                       std::invalid_argument);
}

TEST_CASE("one value per channel is refused in training, as PyTorch") {
  BatchNorm bn(3);
  bn.set_path("bn");
  Context ctx = context(DType::f32);
  CHECK_THROWS_WITH_AS(
      bn.forward(Tensor(DType::f32, {1, 3}), ctx),
      "BatchNorm bn: expected more than 1 value per channel when training, got x of shape 1x3",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      bn.forward(Tensor(DType::f32, {1, 3, 1, 1}), ctx),
      "BatchNorm bn: expected more than 1 value per channel when training, got x of shape 1x3x1x1",
      std::invalid_argument);
  CHECK(bn.num_batches_tracked == 0);
  CHECK_NOTHROW(bn.forward(Tensor(DType::f32, {1, 3, 2}), ctx));  // two values per channel
}

TEST_CASE("eps is added to the variance inside the square root") {
  // One channel {0, 2}: mean 1, biased variance 1. With eps = 0.5 the output
  // is ±1/√1.5 (not ±1/(1 + 0.5), not ±1/√2.5 from the unbiased variance).
  BatchNorm::Options o;
  o.eps = 0.5;
  BatchNorm bn(1, o);
  Context ctx = context(DType::f32);
  const Tensor y = bn.forward(tensor({0, 2}, {2, 1}, DType::f32), ctx);
  CHECK(y.value(0) == doctest::Approx(-1 / std::sqrt(1.5)).epsilon(1e-7));
  CHECK(y.value(1) == doctest::Approx(1 / std::sqrt(1.5)).epsilon(1e-7));
  CHECK(bn.invstd().value(0) == doctest::Approx(1 / std::sqrt(1.5)).epsilon(1e-7));
  // In eval too: running var 0.9·1 + 0.1·2 = 1.1, so 1/√(1.1 + 0.5).
  bn.eval();
  const Tensor z = bn.forward(tensor({0.1}, {1, 1}, DType::f32), ctx);
  CHECK(z.value(0) == doctest::Approx(0.0 / std::sqrt(1.6)).epsilon(1e-6));
  const Tensor dx = bn.backward(tensor({1}, {1, 1}, DType::f32), ctx);
  CHECK(dx.value(0) == doctest::Approx(1 / std::sqrt(1.1 + 0.5)).epsilon(1e-6));
}

// --- precision ----------------------------------------------------------------------------

TEST_CASE("uniform f16: f16 output, f16 running estimates and parameter copies, f32 statistics") {
  const auto f16 = uniform_policy(DType::f16);
  BatchNorm bn = make_bn({1, 1, 1}, {0, 0, 0}, {0, 0, 0}, {1, 1, 1}, *f16);
  Context ctx(f16);
  const Tensor x = tensor(randn(60, 10, 2.0), {4, 3, 5}, DType::f16);
  const Tensor y = bn.forward(x, ctx);
  CHECK(y.dtype() == DType::f16);
  CHECK(bn.running_mean.dtype() == DType::f16);
  CHECK(bn.running_var.dtype() == DType::f16);
  CHECK(bn.running_mean.bytes() == 2 * 3);
  CHECK(bn.running_var.bytes() == 2 * 3);
  CHECK(bn.weight.model_dtype() == DType::f16);
  CHECK(bn.weight.weights().dtype() == DType::f16);
  CHECK(bn.bias.weights().dtype() == DType::f16);
  CHECK(bn.weight.master.dtype() == DType::f32);
  CHECK(bn.mean().dtype() == DType::f32);
  CHECK(bn.invstd().dtype() == DType::f32);
  CHECK(ctx.casts().casts == 0);
  // Saved for backward: x as read (shared with the caller's tensor, f16)
  // and the f32 mean and invstd: 2·60 + 4·3 + 4·3 bytes.
  CHECK(bn.saved().front()->shares_storage_with(x));
  CHECK(distinct_bytes(bn.saved()) == 2 * 60 + 12 + 12);
  const Tensor dx = bn.backward(tensor(randn(60, 11), {4, 3, 5}, DType::f16), ctx);
  CHECK(dx.dtype() == DType::f16);
  CHECK(bn.weight.grad.dtype() == DType::f32);
  CHECK(fits(values(bn.weight.grad), DType::f16));  // rounded into the weight's dtype first
  // Going back to f32 widens the running estimates exactly.
  const VecD rm16 = values(bn.running_mean);
  bn.apply_policy(UniformPolicy(DType::f32));
  CHECK(bn.running_mean.dtype() == DType::f32);
  CHECK(values(bn.running_mean) == rm16);
  CHECK(bn.weight.model_bytes() == 0);
}

TEST_CASE("KeepF32Policy keeps batch_norm in FP32, by op name or by path") {
  const auto f16 = uniform_policy(DType::f16);
  const auto by_op = std::make_shared<KeepF32Policy>(f16, std::vector<std::string>{},
                                                     std::vector<std::string>{"batch_norm"});
  const auto by_path = std::make_shared<KeepF32Policy>(f16, std::vector<std::string>{"bn"});
  for (const auto& policy : {std::shared_ptr<const Policy>(by_op), std::shared_ptr<const Policy>(by_path)}) {
    CAPTURE(policy->describe());
    BatchNorm bn = make_bn({1, 1}, {0, 0}, {0, 0}, {1, 1}, *policy);
    Context ctx(policy);
    const Tensor x = tensor(randn(8, 12), {4, 2}, DType::f16);
    const Tensor y = bn.forward(x, ctx);
    CHECK(y.dtype() == DType::f32);
    CHECK(bn.running_mean.dtype() == DType::f32);
    CHECK(bn.running_var.bytes() == 4 * 2);
    CHECK(bn.weight.model_dtype() == DType::f32);
    CHECK(ctx.casts().casts == 1);  // the f16 input, cast up at the island's boundary
    // The input gradient leaves in the dtype the input arrived in.
    const Tensor dx = bn.backward(tensor(randn(8, 13), {4, 2}, DType::f32), ctx);
    CHECK(dx.dtype() == DType::f16);
    CHECK(ctx.casts().casts == 2);
  }
  // A layer at another path stays f16 under by_path.
  BatchNorm other(2);
  other.set_path("bn2");
  other.apply_policy(*by_path);
  CHECK(other.running_mean.dtype() == DType::f16);
}

TEST_CASE("a policy asking for f16 compute is refused") {
  BatchNorm bn(2);
  Context ctx(std::make_shared<HalfComputePolicy>());
  CHECK_THROWS_WITH_AS(
      bn.forward(Tensor(DType::f16, {4, 2}), ctx),
      "batch_norm: the policy asks for f16 compute; batch_norm computes its statistics in f32; "
      "FP16 statistics are Chapter 3's pitfalls, not a policy choice",
      std::invalid_argument);
}

TEST_CASE("the float layer is the double formulas on its widened inputs, rounded where it rounds") {
  const std::int64_t c = 3;
  for (DType d : {DType::f32, DType::f16, DType::bf16}) {
    for (const Shape& shape : {Shape{8, 3}, Shape{4, 3, 2, 5}}) {
      CAPTURE(std::string(dtype_name(d)));
      CAPTURE(shape_string(shape));
      const Layout l = layout(shape);
      const auto n = static_cast<std::size_t>(l.numel());
      const double m = 0.1, eps = 1e-5;
      BatchNorm bn = make_bn(randn(3, 20, 1.0, 0.3), randn(3, 21, 0.0, 0.5), randn(3, 22, 0.0, 0.5),
                             {0.5, 1.5, 2.5}, UniformPolicy(d));
      Context ctx = context(d);
      const Tensor xt = tensor(randn(n, 23, 0.7, 1.3), shape, d), dyt = tensor(randn(n, 24), shape, d);
      // What the layer reads, widened exactly.
      const VecD x = values(xt), dy = values(dyt), w = values(bn.weight.weights()),
                 b = values(bn.bias.weights()), rm = values(bn.running_mean), rv = values(bn.running_var);

      const Tensor y = bn.forward(xt, ctx);
      const Ref f = ref_forward(x, l, eps, &w, &b, AffineAxis::channel);
      // Magnitudes entering each value: |x|·invstd (cancelled by the mean)
      // and |x̂| scaled by |γ|, plus |β| for y; the running update's terms.
      VecD a(c, 0.0);  // max |x|·invstd per channel
      for (std::size_t e = 0; e < n; ++e) {
        const auto k = static_cast<std::size_t>((static_cast<std::int64_t>(e) / l.inner) % c);
        a[k] = std::max(a[k], std::fabs(x[e]) * f.invstd[k]);
      }
      VecD sy(n), sdx(n);
      VecD sum_g(c, 0.0), sum_gx(c, 0.0), sdw(c, 0.0), sdb(c, 0.0);
      for (std::size_t e = 0; e < n; ++e) {
        const auto k = static_cast<std::size_t>((static_cast<std::int64_t>(e) / l.inner) % c);
        const double xhat = (x[e] - f.mean[k]) * f.invstd[k];
        sy[e] = std::fabs(w[k]) * (a[k] + std::fabs(xhat)) + std::fabs(b[k]);
        sum_g[k] += std::fabs(w[k] * dy[e]);
        sum_gx[k] += std::fabs(w[k] * dy[e] * xhat);
        sdw[k] += std::fabs(dy[e]) * (std::fabs(xhat) + a[k]);
        sdb[k] += std::fabs(dy[e]);
      }
      CHECK(worst_ratio(values(y), f.y, sy, d) <= 1.0);
      // The statistics stay f32: no rounding into d.
      VecD smean(c), sinv(c), srm(c), srv(c), rm_ref(c), rv_ref(c);
      for (std::size_t k = 0; k < c; ++k) {
        smean[k] = a[k] / f.invstd[k];
        sinv[k] = f.invstd[k] * (1 + a[k]);
        rm_ref[k] = (1 - m) * rm[k] + m * f.mean[k];
        rv_ref[k] = (1 - m) * rv[k] + m * f.unbiased[k];
        srm[k] = std::fabs(rm[k]) + smean[k];
        srv[k] = std::fabs(rv[k]) + f.unbiased[k] * (1 + a[k]);
      }
      CHECK(worst_ratio(values(bn.mean()), f.mean, smean, DType::f32) <= 1.0);
      CHECK(worst_ratio(values(bn.invstd()), f.invstd, sinv, DType::f32) <= 1.0);
      // The running estimates: computed in FP32, rounded once into d.
      CHECK(bn.running_mean.dtype() == d);
      CHECK(worst_ratio(values(bn.running_mean), rm_ref, srm, d) <= 1.0);
      CHECK(worst_ratio(values(bn.running_var), rv_ref, srv, d) <= 1.0);

      const Tensor dx = bn.backward(dyt, ctx);
      VecD dx_ref(n), dw_ref(c), db_ref(c);
      norm_math::backward(x.data(), dy.data(), l, f.mean.data(), f.invstd.data(), w.data(),
                          AffineAxis::channel, true, dx_ref.data(), dw_ref.data(), db_ref.data());
      for (std::size_t e = 0; e < n; ++e) {
        const auto k = static_cast<std::size_t>((static_cast<std::int64_t>(e) / l.inner) % c);
        const double xhat = std::fabs((x[e] - f.mean[k]) * f.invstd[k]);
        const double mm = static_cast<double>(l.count());
        sdx[e] = f.invstd[k] * (std::fabs(w[k] * dy[e]) + (sum_g[k] + xhat * sum_gx[k]) / mm) * (1 + a[k]);
      }
      CHECK(dx.dtype() == d);
      CHECK(worst_ratio(values(dx), dx_ref, sdx, d) <= 1.0);
      // Parameter gradients: FP32 sums rounded into the weights' dtype d.
      CHECK(worst_ratio(values(bn.weight.grad), dw_ref, sdw, d) <= 1.0);
      CHECK(worst_ratio(values(bn.bias.grad), db_ref, sdb, d) <= 1.0);
      CHECK(fits(values(bn.weight.grad), d));
      CHECK(fits(values(bn.bias.grad), d));

      // Eval: the running estimates as stored, widened.
      bn.eval();
      const VecD rm2 = values(bn.running_mean), rv2 = values(bn.running_var);
      const Tensor ye = bn.forward(xt, ctx);
      const Ref fe = ref_forward(x, l, eps, &w, &b, AffineAxis::channel, &rm2, &rv2);
      VecD sye(n);
      for (std::size_t e = 0; e < n; ++e) {
        const auto k = static_cast<std::size_t>((static_cast<std::int64_t>(e) / l.inner) % c);
        sye[e] = std::fabs(w[k]) * (std::fabs(x[e]) + std::fabs(rm2[k])) * fe.invstd[k] * 2 + std::fabs(b[k]);
      }
      CHECK(worst_ratio(values(ye), fe.y, sye, d) <= 1.0);
      CHECK(values(bn.running_mean) == rm2);
    }
  }
}

TEST_CASE("the float layer runs norm_math<float> exactly, rounding only where it stores") {
  for (DType d : {DType::f32, DType::f16, DType::bf16}) {
    CAPTURE(std::string(dtype_name(d)));
    const Shape shape{4, 3, 2, 3};
    const Layout l = layout(shape);
    const auto n = static_cast<std::size_t>(l.numel());
    BatchNorm bn =
        make_bn(randn(3, 30, 1.0, 0.3), randn(3, 31), randn(3, 32), {0.5, 1.5, 2.5}, UniformPolicy(d));
    Context ctx = context(d);
    const Tensor xt = tensor(randn(n, 33, -0.4, 2.0), shape, d), dyt = tensor(randn(n, 34), shape, d);
    VecF x(n), dy(n), w(3), b(3), rm(3), rv(3);
    xt.to_f32(x.data());
    dyt.to_f32(dy.data());
    bn.weight.weights().to_f32(w.data());
    bn.bias.weights().to_f32(b.data());
    bn.running_mean.to_f32(rm.data());
    bn.running_var.to_f32(rv.data());
    std::vector<norm_math::Statistics> st(3);
    VecF mean(3), invstd(3), y(n), dx(n), dw(3), db(3);
    norm_math::statistics(x.data(), l, st.data());
    norm_math::mean_invstd(st.data(), 3, 1e-5f, mean.data(), invstd.data());
    norm_math::forward(x.data(), l, mean.data(), invstd.data(), w.data(), b.data(), AffineAxis::channel,
                       y.data());
    for (std::size_t k = 0; k < 3; ++k) {
      rm[k] = norm_math::running_update(rm[k], mean[k], 0.1f);
      rv[k] = norm_math::running_update(rv[k], norm_math::variance_unbiased<float>(st[k]), 0.1f);
    }
    norm_math::backward(x.data(), dy.data(), l, mean.data(), invstd.data(), w.data(), AffineAxis::channel,
                        true, dx.data(), dw.data(), db.data());
    const auto rounded = [d](const VecF& v) {
      return values(Tensor::from_f32(v.data(), {static_cast<std::int64_t>(v.size())}, d));
    };
    CHECK(values(bn.forward(xt, ctx)) == rounded(y));
    CHECK(values(bn.mean()) == VecD(mean.begin(), mean.end()));
    CHECK(values(bn.running_mean) == rounded(rm));
    CHECK(values(bn.running_var) == rounded(rv));
    CHECK(values(bn.backward(dyt, ctx)) == rounded(dx));
    CHECK(values(bn.weight.grad) == rounded(dw));
    CHECK(values(bn.bias.grad) == rounded(db));
    // Gradients accumulate into the FP32 grad, as PyTorch's .grad does.
    bn.backward(dyt, ctx);
    VecD twice = rounded(dw);
    for (double& v : twice) v = static_cast<float>(2 * v);
    CHECK(values(bn.weight.grad) == twice);
  }
}

// --- the guard --------------------------------------------------------------------------

TEST_CASE("guard_running_update: an inf in the batch leaves the running estimates alone") {
  const float inf = std::numeric_limits<float>::infinity();
  for (bool guard : {true, false}) {
    CAPTURE(guard);
    BatchNorm::Options o;
    o.guard_running_update = guard;
    const auto f16 = uniform_policy(DType::f16);
    BatchNorm bn = make_bn({1, 1}, {0, 0}, {0.5, -0.25}, {2, 3}, *f16, o);
    Context ctx(f16);
    // Channel 0 gets an inf in the middle of the batch (an overflowed fp16
    // activation); channel 1 is finite.
    const VecF x{1, 2, inf, 1, 3, 3, 4, 5};
    const Tensor xt = Tensor::from_f32(x.data(), {4, 2}, DType::f16);
    bn.forward(xt, ctx);
    // Σx is inf, so the mean is inf (PyTorch's answer), and M2 has inf − inf:
    // NaN.
    CHECK(std::isinf(bn.mean().value(0)));
    CHECK(std::isnan(bn.invstd().value(0)));
    if (guard) {
      CHECK(bn.running_update_skipped());
      CHECK(bn.num_batches_tracked == 0);
      CHECK(values(bn.running_mean) == VecD{0.5, -0.25});  // both channels untouched
      CHECK(values(bn.running_var) == VecD{2, 3});
    } else {
      CHECK_FALSE(bn.running_update_skipped());
      CHECK(bn.num_batches_tracked == 1);
      CHECK(std::isinf(bn.running_mean.value(0)));  // 0.9·0.5 + 0.1·inf
      CHECK(std::isnan(bn.running_var.value(0)));
      CHECK(std::isfinite(bn.running_var.value(1)));
    }
    // A finite batch afterwards is folded in as usual.
    bn.forward(tensor({1, 2, 3, 4}, {2, 2}, DType::f16), ctx);
    CHECK_FALSE(bn.running_update_skipped());
    CHECK(bn.num_batches_tracked == (guard ? 1 : 2));
    if (guard) CHECK(bn.running_mean.value(0) == doctest::Approx(0.9 * 0.5 + 0.1 * 2).epsilon(1e-3));
  }
}

TEST_CASE("guard_running_update: a finite mean with an overflowed variance is skipped too") {
  // ±10²⁰ in f32: the mean is 0 and Σ(x − mean)² = 2·10⁴⁰, held in double;
  // the variance 10⁴⁰ (biased) and 2·10⁴⁰ (unbiased) overflow FP32 when
  // rounded into it, while invstd, computed in double, is 10⁻²⁰ (PyTorch
  // stores its var_sum in float first, and gets invstd 0).
  BatchNorm::Options o;
  o.guard_running_update = true;
  BatchNorm bn(1, o);
  Context ctx = context(DType::f32);
  bn.forward(tensor({-1e20, 1e20}, {2, 1}, DType::f32), ctx);
  CHECK(bn.mean().value(0) == 0.0f);
  CHECK(bn.invstd().value(0) == doctest::Approx(1e-20).epsilon(1e-6));
  CHECK(bn.running_update_skipped());
  CHECK(bn.num_batches_tracked == 0);
  CHECK(bn.running_var.value(0) == 1.0f);
}

// --- trace, train/eval, errors -----------------------------------------------------------

TEST_CASE("trace entries: what batch_norm read, computed in and wrote") {
  const auto f16 = uniform_policy(DType::f16);
  BatchNorm bn = make_bn({1, 1, 1}, {0, 0, 0}, {0, 0, 0}, {1, 1, 1}, *f16);
  Context ctx(f16);
  Trace trace;
  ctx.set_trace(&trace);
  bn.forward(tensor(randn(24, 40), {2, 3, 2, 2}, DType::f32), ctx);
  bn.backward(tensor(randn(24, 41), {2, 3, 2, 2}, DType::f16), ctx);
  bn.eval();
  bn.forward(tensor(randn(24, 42), {2, 3, 2, 2}, DType::f16), ctx);
  const auto& es = trace.entries();
  REQUIRE(es.size() == 5);  // cast x, forward, backward, cast dx back to f32, eval forward
  CHECK(es[0].op == "cast");
  const TraceEntry& fw = es[1];
  CHECK(fw.op == "batch_norm");
  CHECK(fw.path == "bn");
  CHECK(fw.phase == Phase::forward);
  CHECK(fw.compute == DType::f32);
  REQUIRE(fw.inputs.size() == 3);
  CHECK(fw.inputs[0].name == "x");
  CHECK(fw.inputs[0].dtype == DType::f16);
  CHECK(fw.inputs[1].name == "weight");
  CHECK(fw.inputs[1].dtype == DType::f16);
  REQUIRE(fw.outputs.size() == 5);
  CHECK(fw.outputs[0].name == "y");
  CHECK(fw.outputs[0].dtype == DType::f16);
  CHECK(fw.outputs[0].bytes == 48);
  CHECK(fw.outputs[1].name == "mean");
  CHECK(fw.outputs[1].dtype == DType::f32);
  CHECK(fw.outputs[2].name == "invstd");
  CHECK(fw.outputs[2].dtype == DType::f32);
  CHECK(fw.outputs[3].name == "running_mean");
  CHECK(fw.outputs[3].dtype == DType::f16);
  CHECK(fw.outputs[3].bytes == 6);
  CHECK(fw.outputs[4].name == "running_var");
  const TraceEntry& bw = es[2];
  CHECK(bw.op == "batch_norm");
  CHECK(bw.phase == Phase::backward);
  CHECK(bw.compute == DType::f32);
  REQUIRE(bw.outputs.size() == 3);
  CHECK(bw.outputs[0].name == "dx");
  CHECK(bw.outputs[0].dtype == DType::f16);
  CHECK(bw.outputs[1].name == "weight.grad");
  CHECK(bw.outputs[1].dtype == DType::f16);
  CHECK(bw.outputs[1].bytes == 6);
  CHECK(bw.outputs[2].name == "bias.grad");
  CHECK(es[3].op == "cast");
  CHECK(es[3].phase == Phase::backward);
  // In eval the running estimates are read, and nothing but y is written.
  const TraceEntry& ev = es[4];
  REQUIRE(ev.inputs.size() == 5);
  CHECK(ev.inputs[3].name == "running_mean");
  CHECK(ev.inputs[4].dtype == DType::f16);
  REQUIRE(ev.outputs.size() == 1);
  CHECK(ev.outputs[0].name == "y");
}

TEST_CASE("train() and eval() reach every BatchNorm of a Sequential") {
  Sequential net;
  net.emplace<BatchNorm>("bn1", 2);
  Sequential& inner = net.emplace<Sequential>("block");
  inner.emplace<BatchNorm>("bn2", 2);
  auto& bn1 = static_cast<BatchNorm&>(net.child(0));
  auto& bn2 = static_cast<BatchNorm&>(inner.child(0));
  CHECK(net.training());
  CHECK(bn1.training());
  CHECK(bn2.training());
  Context ctx = context(DType::f32);
  const Tensor x = tensor({1, 2, 3, 5, 0, 4}, {3, 2}, DType::f32);
  net.forward(x, ctx);
  CHECK(bn1.num_batches_tracked == 1);
  CHECK(bn2.num_batches_tracked == 1);
  net.eval();
  CHECK_FALSE(net.training());
  CHECK_FALSE(bn1.training());
  CHECK_FALSE(bn2.training());
  const VecD rm1 = values(bn1.running_mean), rm2 = values(bn2.running_mean);
  net.forward(x, ctx);
  CHECK(bn1.num_batches_tracked == 1);  // no update in eval
  CHECK(bn2.num_batches_tracked == 1);
  CHECK(values(bn1.running_mean) == rm1);
  CHECK(values(bn2.running_mean) == rm2);
  net.train();
  CHECK(bn1.training());
  CHECK(bn2.training());
  inner.train(false);  // a subtree alone
  CHECK(bn1.training());
  CHECK_FALSE(bn2.training());
}

TEST_CASE("BatchNorm without affine: no parameters, y = x̂") {
  BatchNorm::Options o;
  o.affine = false;
  BatchNorm bn(2, o);
  CHECK(bn.parameters().empty());
  bn.apply_policy(UniformPolicy(DType::f16));
  CHECK(bn.running_mean.dtype() == DType::f16);
  Context ctx = context(DType::f32);
  const Tensor y = bn.forward(tensor({0, 1, 2, 3}, {2, 2}, DType::f32), ctx);
  CHECK(y.value(0) == doctest::Approx(-1 / std::sqrt(1 + 1e-5)).epsilon(1e-6));
  CHECK(y.value(3) == doctest::Approx(1 / std::sqrt(1 + 1e-5)).epsilon(1e-6));
  // dy = x̂ itself: with Σx̂ = 0 and Σx̂² = M·var/(var + eps),
  // dx = invstd·x̂·eps/(var + eps) — zero but for eps. Here var = 1.
  const Tensor dx = bn.backward(y, ctx);
  CHECK(dx.value(0) == doctest::Approx(-1e-5 / ((1 + 1e-5) * (1 + 1e-5))).epsilon(1e-3));
  CHECK(dx.value(3) == doctest::Approx(1e-5 / ((1 + 1e-5) * (1 + 1e-5))).epsilon(1e-3));
}

TEST_CASE("BatchNorm: wrong shapes and options are one-line errors") {
  CHECK_THROWS_WITH_AS(BatchNorm(0), "BatchNorm: num_features must be >= 1, got 0", std::invalid_argument);
  BatchNorm::Options bad_eps;
  bad_eps.eps = -1;
  CHECK_THROWS_WITH_AS(BatchNorm(2, bad_eps), "BatchNorm: eps must be finite and >= 0, got -1",
                       std::invalid_argument);
  BatchNorm::Options bad_m;
  bad_m.momentum = 1.5;
  CHECK_THROWS_WITH_AS(
      BatchNorm(2, bad_m),
      "BatchNorm: momentum must be in [0, 1], or nullopt for the cumulative average; got 1.5",
      std::invalid_argument);
  BatchNorm bn(3);
  bn.set_path("bn");
  Context ctx = context(DType::f32);
  const std::string takes = " but the layer takes [N, 3], [N, 3, L] or [N, 3, H, W]";
  const std::string two = "BatchNorm bn: x is 4x5" + takes, one = "BatchNorm bn: x is 3" + takes,
                    five = "BatchNorm bn: x is 2x3x1x1x1" + takes;
  CHECK_THROWS_WITH_AS(bn.forward(Tensor(DType::f32, {4, 5}), ctx), two.c_str(), std::invalid_argument);
  CHECK_THROWS_WITH_AS(bn.forward(Tensor(DType::f32, {3}), ctx), one.c_str(), std::invalid_argument);
  CHECK_THROWS_WITH_AS(bn.forward(Tensor(DType::f32, {2, 3, 1, 1, 1}), ctx), five.c_str(),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(bn.forward(Tensor(DType::f32, {0, 3}), ctx),
                       "BatchNorm bn: x is 0x3; every size must be >= 1", std::invalid_argument);
  CHECK_THROWS_WITH_AS(bn.backward(Tensor(DType::f32, {4, 3}), ctx),
                       "BatchNorm bn::backward: call forward() first", std::logic_error);
  bn.forward(Tensor(DType::f32, {4, 3}), ctx);
  CHECK_THROWS_WITH_AS(bn.backward(Tensor(DType::f32, {4, 3, 1}), ctx),
                       "BatchNorm bn: dy is 4x3x1, expected 4x3", std::invalid_argument);
  bn.running_var = Tensor(DType::f32, {2});
  CHECK_THROWS_WITH_AS(bn.forward(Tensor(DType::f32, {4, 3}), ctx),
                       "BatchNorm bn: running_mean is 3 and running_var 2, expected 3 each",
                       std::invalid_argument);
}
