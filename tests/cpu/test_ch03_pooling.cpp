// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: MaxPool2d,
// AvgPool2d, Flatten and Unflatten. The FP64 pooling formulas against
// central finite differences; values worked by hand (ties, NaN, −∞,
// padding); the mixed-precision layers against pooling written out in the
// test; their policy questions, trace entries and errors; the reshapes as
// views that ask and cast nothing.
// Depends on: mpt/nn/layers/pooling.hpp, conv_math.hpp, module.hpp; the core tier
// (Context, policies, Trace, Rng); Chapter 1's rounding.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/formats/rounding.hpp"
#include "mpt/nn/layers/conv_math.hpp"
#include "mpt/nn/layers/pooling.hpp"
#include "mpt/nn/module.hpp"

using namespace mpt;
using MatD = Mat<double>;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

MatD randn(Eigen::Index r, Eigen::Index c, std::uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  MatD m(r, c);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = scale * rng.normal();
  return m;
}

// Central differences. Average pooling is linear, so only FP64 rounding
// (≈1e-10 relative) remains; max pooling is linear between ties, and
// normal draws put the values of a window ~1e-2 apart, far more than the
// step h = 1e-6, so no step changes an argmax.
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

struct PoolCase {
  std::int64_t n, c, h, w, k, stride, pad;
  std::int64_t oh() const { return (h + 2 * pad - k) / stride + 1; }
  std::int64_t ow() const { return (w + 2 * pad - k) / stride + 1; }
  conv_math::Geometry geometry() const {
    conv_math::Geometry g;
    g.n = n;
    g.c = c;
    g.h = h;
    g.w = w;
    g.win = {k, stride, pad};
    return g;
  }
  Shape in() const { return {n, c, h, w}; }
  Shape out() const { return {n, c, oh(), ow()}; }
};

// Stride = kernel and stride 2 with padding 1 (overlapping windows),
// stride 1 (much overlap), non-square inputs.
const std::vector<PoolCase> kCases = {
    {2, 3, 4, 6, 2, 2, 0}, {1, 2, 6, 7, 3, 2, 1}, {2, 1, 5, 5, 3, 1, 1},
    {1, 2, 4, 5, 2, 1, 0}, {2, 2, 7, 4, 3, 3, 1},
};

std::string case_name(const PoolCase& s) {
  return "x " + shape_string(s.in()) + ", window " + std::to_string(s.k) + " stride " +
         std::to_string(s.stride) + " padding " + std::to_string(s.pad);
}

Tensor tensor_of(const MatD& m, Shape shape, DType d) {
  const MatrixF f = m.cast<float>();
  return Tensor::from_f32(f.data(), std::move(shape), d);
}

Tensor tensor_of(const std::vector<float>& v, Shape shape, DType d = DType::f32) {
  return Tensor::from_f32(v.data(), std::move(shape), d);
}

std::vector<float> values(const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  t.to_f32(v.data());
  return v;
}

MatD widen(const Tensor& t) {
  MatD m(t.size(0), t.numel() / t.size(0));
  for (std::int64_t i = 0; i < t.numel(); ++i) m.data()[i] = t.value(i);
  return m;
}

// Pooling written out in the test, by its definition: every window of the
// padded input, the positions inside the input visited row by row. Max: the
// largest value, the first one on ties (no NaN in these inputs). Mean: the
// sum over k·k, padding counted as zeros. `magnitude` sums |x| instead.
struct Pooled {
  MatD y;                           // [N, C·H'·W']
  std::vector<std::int64_t> first;  // max only: each window's argmax column in x's row
};
Pooled direct_pool(const MatD& x, const PoolCase& s, bool max, bool magnitude = false) {
  Pooled r{MatD::Zero(s.n, s.c * s.oh() * s.ow()), {}};
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t c = 0; c < s.c; ++c)
      for (std::int64_t oy = 0; oy < s.oh(); ++oy)
        for (std::int64_t ox = 0; ox < s.ow(); ++ox) {
          double best = -std::numeric_limits<double>::infinity(), sum = 0;
          std::int64_t at = -1;
          for (std::int64_t i = 0; i < s.k; ++i)
            for (std::int64_t j = 0; j < s.k; ++j) {
              const std::int64_t iy = oy * s.stride - s.pad + i, ix = ox * s.stride - s.pad + j;
              if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
              const std::int64_t col = (c * s.h + iy) * s.w + ix;
              const double v = x(n, col);
              sum += magnitude ? std::fabs(v) : v;
              if (at < 0 || v > best) {
                best = v;
                at = col;
              }
            }
          r.y(n, (c * s.oh() + oy) * s.ow() + ox) = max ? best : sum / static_cast<double>(s.k * s.k);
          if (max) r.first.push_back(at);
        }
  return r;
}

float round_down(double v) {
  float f = static_cast<float>(v);
  if (static_cast<double>(f) > v) f = std::nextafter(f, -kInf);
  return f;
}
float round_up(double v) {
  float f = static_cast<float>(v);
  if (static_cast<double>(f) < v) f = std::nextafter(f, kInf);
  return f;
}
float rounded_into(float v, DType p) { return p == DType::f32 ? v : round_value(v, format_of(p)); }

// Elements of `got` that are not one rounding into p of a value within
// terms·u·scale of the exact `ref` (u = 2^-24), as in the Conv2d tests.
std::int64_t outside_one_rounding(const Tensor& got, const MatD& ref, const MatD& scale, double terms,
                                  DType p) {
  REQUIRE(got.numel() == ref.size());
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double tol = terms * std::ldexp(1.0, -24) * scale.data()[i];
    const float lo = rounded_into(round_down(ref.data()[i] - tol), p);
    const float hi = rounded_into(round_up(ref.data()[i] + tol), p);
    const float y = got.value(i);
    if (!(lo <= y && y <= hi)) {
      if (bad == 0)
        MESSAGE("element " << i << ": got " << y << ", expected within [" << lo << ", " << hi << "]");
      ++bad;
    }
  }
  return bad;
}

class F16ComputePolicy final : public Policy {
 public:
  std::string describe() const override { return "f16 compute"; }

 protected:
  OpPrecision decide_op(const OpInfo&, const OpQuery&) const override {
    return {DType::f16, DType::f16, DType::f16};
  }
  DType parameter_dtype_of(const OpInfo&, std::string_view) const override { return DType::f16; }
};

}  // namespace

// --- FP64: the formulas --------------------------------------------------------------------

TEST_CASE(
    "pooling: the FP64 formulas are the written-out windows, and their backward matches finite differences") {
  for (const PoolCase& s : kCases) {
    CAPTURE(case_name(s));
    const conv_math::Geometry g = s.geometry();
    MatD x = randn(s.n, s.c * s.h * s.w, 500 + s.h);
    const MatD r = randn(s.n, s.c * s.oh() * s.ow(), 600 + s.w);
    const conv_math::MaxPool<double> mp = conv_math::max_pool2d_forward<double>(x, g);
    const Pooled dm = direct_pool(x, s, true);
    CHECK(mp.y == dm.y);
    CHECK(mp.argmax == dm.first);
    CHECK((conv_math::avg_pool2d_forward<double>(x, g) - direct_pool(x, s, false).y).cwiseAbs().maxCoeff() <
          1e-14);
    const auto max_loss = [&] { return conv_math::max_pool2d_forward<double>(x, g).y.cwiseProduct(r).sum(); };
    const auto avg_loss = [&] { return conv_math::avg_pool2d_forward<double>(x, g).cwiseProduct(r).sum(); };
    CHECK(rel_err(conv_math::max_pool2d_backward<double>(r, mp.argmax, g), numeric_grad(max_loss, x)) < 1e-6);
    CHECK(rel_err(conv_math::avg_pool2d_backward<double>(r, g), numeric_grad(avg_loss, x)) < 1e-6);
  }
}

// --- values worked by hand --------------------------------------------------------------------

TEST_CASE("max and average pooling of a 4x4 image, by hand") {
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i)
    x[static_cast<std::size_t>(i)] = static_cast<float>(i + 1);  // rows 1..4, 5..8, ...
  Context ctx(uniform_policy(DType::f32));
  MaxPool2d mp(2);
  CHECK(mp.window().stride == 2);  // stride 0: the kernel size
  const Tensor ym = mp.forward(tensor_of(x, {1, 1, 4, 4}), ctx);
  CHECK(ym.shape() == Shape{1, 1, 2, 2});
  CHECK(values(ym) == std::vector<float>{6, 8, 14, 16});
  AvgPool2d ap(2);
  CHECK(values(ap.forward(tensor_of(x, {1, 1, 4, 4}), ctx)) == std::vector<float>{3.5f, 5.5f, 11.5f, 13.5f});
  // Backward: max pooling sends each dy to its window's maximum, average
  // pooling a quarter of it to every pixel of the window.
  const Tensor dy = tensor_of(std::vector<float>{4, 8, 12, 16}, {1, 1, 2, 2});
  CHECK(values(mp.backward(dy, ctx)) == std::vector<float>{0, 0, 0, 0, 0, 4, 0, 8, 0, 0, 0, 0, 0, 12, 0, 16});
  CHECK(values(ap.backward(dy, ctx)) == std::vector<float>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4});
}

TEST_CASE("max pooling: ties go to the first maximum, NaN wins, -inf windows route to their first pixel") {
  Context ctx(uniform_policy(DType::f32));
  MaxPool2d mp(2);
  // Two 2x2 windows side by side: {3, 1 / 3, 3} ties at 3, first is (0, 0);
  // {2, 2 / 2, 1} ties at 2, first is (0, 2).
  const Tensor ties = tensor_of(std::vector<float>{3, 1, 2, 2, 3, 3, 2, 1}, {1, 1, 2, 4});
  CHECK(values(mp.forward(ties, ctx)) == std::vector<float>{3, 2});
  const Tensor dy = tensor_of(std::vector<float>{10, 20}, {1, 1, 1, 2});
  CHECK(values(mp.backward(dy, ctx)) == std::vector<float>{10, 0, 20, 0, 0, 0, 0, 0});
  // {9, NaN / NaN, 2}: a NaN beats the 9 before it and is not beaten by the
  // 2 after it; of two NaNs the later one holds the argmax (PyTorch's CPU
  // kernel replaces the maximum by every NaN it meets). {5, 4 / -inf, -inf}: 5.
  const Tensor nan = tensor_of(std::vector<float>{9, kNaN, 5, 4, kNaN, 2, -kInf, -kInf}, {1, 1, 2, 4});
  const std::vector<float> y = values(mp.forward(nan, ctx));
  CHECK(std::isnan(y[0]));
  CHECK(y[1] == 5.0f);
  CHECK(values(mp.backward(dy, ctx)) == std::vector<float>{0, 0, 20, 0, 10, 0, 0, 0});
  // A window of -inf only: the maximum is -inf, at the window's first pixel.
  const Tensor low = tensor_of(std::vector<float>{-kInf, -kInf, -kInf, -kInf}, {1, 1, 2, 2});
  CHECK(values(mp.forward(low, ctx)) == std::vector<float>{-kInf});
  CHECK(values(mp.backward(tensor_of(std::vector<float>{1}, {1, 1, 1, 1}), ctx)) ==
        std::vector<float>{1, 0, 0, 0});
}

TEST_CASE("padding: max pooling never picks it, average pooling counts it as zeros (count_include_pad)") {
  Context ctx(uniform_policy(DType::f32));
  // x = [[1 2], [3 4]], window 2, stride 1, padding 1: nine windows, each
  // corner one sees one pixel and three padding positions.
  const Tensor x = tensor_of(std::vector<float>{1, 2, 3, 4}, {1, 1, 2, 2});
  AvgPool2d ap(2, 1, 1);
  const Tensor ya = ap.forward(x, ctx);
  CHECK(ya.shape() == Shape{1, 1, 3, 3});
  // Always divided by 4 (count_include_pad=False would give 1, 1.5, 2, ... at the edges).
  CHECK(values(ya) == std::vector<float>{0.25f, 0.75f, 0.5f, 1.0f, 2.5f, 1.5f, 0.75f, 1.75f, 1.0f});
  const Tensor dy = tensor_of(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  // Each pixel is in four windows: (1+2+4+5)/4, (2+3+5+6)/4, (4+5+7+8)/4, (5+6+8+9)/4.
  CHECK(values(ap.backward(dy, ctx)) == std::vector<float>{3, 4, 6, 7});
  // All pixels -1: with padding read as 0 every output would be 0; it is -1.
  MaxPool2d mp(2, 1, 1);
  const Tensor neg = tensor_of(std::vector<float>{-1, -1, -1, -1}, {1, 1, 2, 2});
  CHECK(values(mp.forward(neg, ctx)) == std::vector<float>(9, -1.0f));
  // All tied: every window's first pixel inside the input takes its dy.
  CHECK(values(mp.backward(tensor_of(std::vector<float>(9, 1.0f), {1, 1, 3, 3}), ctx)) ==
        std::vector<float>{4, 2, 2, 1});
}

// --- the mixed-precision layers ----------------------------------------------------------------

TEST_CASE("pooling in f32/f16/bf16: FP32 math on widened inputs, one rounding into the output dtype") {
  for (DType p : {DType::f32, DType::f16, DType::bf16})
    for (const PoolCase& s : kCases) {
      CAPTURE(std::string(dtype_name(p)));
      CAPTURE(case_name(s));
      Context ctx(uniform_policy(p));
      const Tensor xt = tensor_of(randn(s.n, s.c * s.h * s.w, 700 + s.k), s.in(), p);
      const Tensor dyt = tensor_of(randn(s.n, s.c * s.oh() * s.ow(), 800 + s.h), s.out(), p);
      const MatD x = widen(xt), dy = widen(dyt);
      // Max: the output is one of the inputs, exactly.
      MaxPool2d mp(static_cast<int>(s.k), static_cast<int>(s.stride), static_cast<int>(s.pad));
      const Tensor ym = mp.forward(xt, ctx);
      CHECK(ym.dtype() == p);
      CHECK(ym.shape() == s.out());
      const Pooled ref = direct_pool(x, s, true);
      CHECK(widen(ym) == ref.y);
      // dy goes to the first maximum; overlapping windows add in FP32.
      MatD dx_ref = MatD::Zero(x.rows(), x.cols()), dx_mag = dx_ref;
      for (Eigen::Index n = 0; n < dy.rows(); ++n)
        for (Eigen::Index j = 0; j < dy.cols(); ++j) {
          const std::int64_t col = ref.first[static_cast<std::size_t>(n * dy.cols() + j)];
          dx_ref(n, col) += dy(n, j);
          dx_mag(n, col) += std::fabs(dy(n, j));
        }
      const Tensor dxm = mp.backward(dyt, ctx);
      CHECK(dxm.dtype() == p);
      CHECK(outside_one_rounding(dxm, dx_ref, dx_mag, static_cast<double>(s.k * s.k), p) == 0);
      // Mean: a sum of at most k·k values and one division, in FP32.
      AvgPool2d ap(static_cast<int>(s.k), static_cast<int>(s.stride), static_cast<int>(s.pad));
      const Tensor ya = ap.forward(xt, ctx);
      CHECK(ya.dtype() == p);
      CHECK(outside_one_rounding(ya, direct_pool(x, s, false).y, direct_pool(x, s, false, true).y,
                                 static_cast<double>(s.k * s.k + 1), p) == 0);
      // Backward: dy/k² into every pixel of the window, written out here.
      MatD da_ref = MatD::Zero(x.rows(), x.cols()), da_mag = da_ref;
      const double kk = static_cast<double>(s.k * s.k);
      for (std::int64_t n = 0; n < s.n; ++n)
        for (std::int64_t c = 0; c < s.c; ++c)
          for (std::int64_t oy = 0; oy < s.oh(); ++oy)
            for (std::int64_t ox = 0; ox < s.ow(); ++ox) {
              const double d = dy(n, (c * s.oh() + oy) * s.ow() + ox);
              for (std::int64_t i = 0; i < s.k; ++i)
                for (std::int64_t j = 0; j < s.k; ++j) {
                  const std::int64_t iy = oy * s.stride - s.pad + i, ix = ox * s.stride - s.pad + j;
                  if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                  da_ref(n, (c * s.h + iy) * s.w + ix) += d / kk;
                  da_mag(n, (c * s.h + iy) * s.w + ix) += std::fabs(d) / kk;
                }
            }
      const Tensor dxa = ap.backward(dyt, ctx);
      CHECK(dxa.dtype() == p);
      CHECK(outside_one_rounding(dxa, da_ref, da_mag, 2.0 * kk + 1, p) == 0);
      CHECK(ctx.casts().casts == 0);
    }
}

TEST_CASE("pooling precision is the policy's; trace entries") {
  const Tensor x16 = tensor_of(randn(2, 48, 900), {2, 3, 4, 4}, DType::f16);
  SUBCASE("an FP32 island by op name: the f16 input cast up, the output f32") {
    auto keep = std::make_shared<KeepF32Policy>(uniform_policy(DType::f16), std::vector<std::string>{},
                                                std::vector<std::string>{"max_pool2d", "avg_pool2d"});
    Context ctx(keep);
    MaxPool2d mp(2);
    mp.set_path("pool");
    CHECK(mp.forward(x16, ctx).dtype() == DType::f32);
    CHECK(ctx.casts().casts == 1);
    REQUIRE(mp.saved().size() == 1);
    CHECK(mp.saved()[0]->dtype() == DType::f32);  // the input as the op read it
    CHECK(mp.backward(Tensor(DType::f32, {2, 3, 2, 2}), ctx).dtype() == DType::f16);  // back in x's dtype
    AvgPool2d ap(2);
    CHECK(ap.forward(x16, ctx).dtype() == DType::f32);
    CHECK(ap.saved().empty());  // the mean's backward needs only the shape
  }
  SUBCASE("f16 compute is refused in one line") {
    Context ctx(std::make_shared<F16ComputePolicy>());
    MaxPool2d mp(2);
    CHECK_THROWS_WITH_AS(mp.forward(x16, ctx),
                         "max_pool2d: the policy asks for f16 compute; it computes in f32",
                         std::invalid_argument);
    AvgPool2d ap(2);
    CHECK_THROWS_WITH_AS(ap.forward(x16, ctx),
                         "avg_pool2d: the policy asks for f16 compute; it computes in f32",
                         std::invalid_argument);
  }
  SUBCASE("trace") {
    Context ctx(uniform_policy(DType::f16));
    Trace trace;
    ctx.set_trace(&trace);
    MaxPool2d mp(2);
    mp.set_path("pool1");
    AvgPool2d ap(2);
    ap.set_path("pool2");
    const Tensor y = mp.forward(x16, ctx);
    ap.forward(x16, ctx);
    mp.backward(Tensor(DType::f16, y.shape()), ctx);
    ap.backward(Tensor(DType::f16, y.shape()), ctx);
    REQUIRE(trace.entries().size() == 4);  // no casts: everything is f16 already
    const TraceEntry& f = trace.entries()[0];
    CHECK(f.phase == Phase::forward);
    CHECK(f.path == "pool1");
    CHECK(f.op == "max_pool2d");
    CHECK(f.compute == DType::f32);
    REQUIRE(f.inputs.size() == 1);
    CHECK(f.inputs[0].name == "x");
    CHECK(f.inputs[0].shape == Shape{2, 3, 4, 4});
    REQUIRE(f.outputs.size() == 1);
    CHECK(f.outputs[0].name == "y");
    CHECK(f.outputs[0].dtype == DType::f16);
    CHECK(f.outputs[0].shape == Shape{2, 3, 2, 2});
    CHECK(f.bytes_written() == 24 * 2);
    CHECK(trace.entries()[1].op == "avg_pool2d");
    const TraceEntry& b = trace.entries()[2];
    CHECK(b.phase == Phase::backward);
    CHECK(b.op == "max_pool2d");
    REQUIRE(b.inputs.size() == 2);
    CHECK(b.inputs[0].name == "dy");
    CHECK(b.inputs[1].name == "x");
    CHECK(b.outputs[0].name == "dx");
    CHECK(b.outputs[0].shape == Shape{2, 3, 4, 4});
    CHECK(trace.entries()[3].path == "pool2");
    CHECK(trace.entries()[3].inputs.size() == 1);  // dy only
  }
}

TEST_CASE("pooling: bad windows and wrong shapes are one-line errors naming what would be valid") {
  CHECK_THROWS_WITH_AS(MaxPool2d(0),
                       "MaxPool2d: kernel_size must be >= 1 and stride >= 0 (0: = kernel_size), got 0 and 0",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(AvgPool2d(2, -1),
                       "AvgPool2d: kernel_size must be >= 1 and stride >= 0 (0: = kernel_size), got 2 and -1",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(MaxPool2d(3, 1, 2),
                       "MaxPool2d: padding must be in 0..1 (at most half the kernel size 3), got 2",
                       std::invalid_argument);
  CHECK_THROWS_AS(AvgPool2d(2, 2, -1), std::invalid_argument);
  Context ctx(uniform_policy(DType::f32));
  MaxPool2d mp(3);
  mp.set_path("pool");
  CHECK_THROWS_WITH_AS(mp.forward(Tensor(DType::f32, {4, 4}), ctx),
                       "MaxPool2d pool: x is 4x4; pooling takes [N, C, H, W]", std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      mp.forward(Tensor(DType::f32, {1, 1, 2, 5}), ctx),
      "MaxPool2d pool: x is 1x1x2x5 but the window is 3x3 with padding 0; H and W + 2*padding must be "
      ">= kernel_size",
      std::invalid_argument);
  mp.forward(Tensor(DType::f32, {1, 2, 3, 7}), ctx);
  CHECK_THROWS_WITH_AS(mp.backward(Tensor(DType::f32, {1, 2, 2, 1}), ctx),
                       "MaxPool2d pool: dy is 1x2x2x1, expected 1x2x1x2", std::invalid_argument);
  AvgPool2d ap(2);
  CHECK_THROWS_WITH_AS(ap.forward(Tensor(DType::f32, {2, 3, 4}), ctx),
                       "AvgPool2d: x is 2x3x4; pooling takes [N, C, H, W]", std::invalid_argument);
}

// --- Flatten and Unflatten ------------------------------------------------------------------------

TEST_CASE("Flatten and Unflatten are views: shared buffers, no policy, no cast, no trace entry") {
  // An f16 policy, an f32 input: a reshape still casts nothing.
  Context ctx(uniform_policy(DType::f16));
  Trace trace;
  ctx.set_trace(&trace);
  const Tensor x = tensor_of(randn(2, 60, 1000), {2, 3, 4, 5}, DType::f32);
  Flatten flat;
  const Tensor y = flat.forward(x, ctx);
  CHECK(y.shape() == Shape{2, 60});
  CHECK(y.dtype() == DType::f32);
  CHECK(y.shares_storage_with(x));
  CHECK(values(y) == values(x));
  CHECK(flat.saved().empty());
  const Tensor dy = tensor_of(randn(2, 60, 1001), {2, 60}, DType::f32);
  const Tensor dx = flat.backward(dy, ctx);
  CHECK(dx.shape() == Shape{2, 3, 4, 5});
  CHECK(dx.shares_storage_with(dy));

  Unflatten unflat({1, 8, 8});
  const Tensor rows = tensor_of(randn(3, 64, 1002), {3, 64}, DType::bf16);
  const Tensor img = unflat.forward(rows, ctx);
  CHECK(img.shape() == Shape{3, 1, 8, 8});
  CHECK(img.dtype() == DType::bf16);
  CHECK(img.shares_storage_with(rows));
  const Tensor back = unflat.backward(Tensor(DType::bf16, {3, 1, 8, 8}), ctx);
  CHECK(back.shape() == Shape{3, 64});
  CHECK(ctx.casts().casts == 0);
  CHECK(trace.entries().empty());
  // The first layer of a network computes no input gradient.
  unflat.set_input_grad(false);
  CHECK(unflat.backward(Tensor(DType::bf16, {3, 1, 8, 8}), ctx).numel() == 0);
}

TEST_CASE("Flatten and Unflatten: wrong shapes are one-line errors") {
  Context ctx(uniform_policy(DType::f32));
  Flatten flat;
  CHECK_THROWS_WITH_AS(flat.forward(Tensor(DType::f32, {5}), ctx),
                       "Flatten: x is 5; Flatten takes [N, ...] with at least 2 dimensions",
                       std::invalid_argument);
  flat.forward(Tensor(DType::f32, {2, 3, 4}), ctx);
  CHECK_THROWS_WITH_AS(flat.backward(Tensor(DType::f32, {2, 3, 4}), ctx),
                       "Flatten: dy is 2x3x4, expected 2x12", std::invalid_argument);
  Unflatten unflat({1, 8, 8});
  unflat.set_path("unflatten");
  CHECK_THROWS_WITH_AS(unflat.forward(Tensor(DType::f32, {3, 63}), ctx),
                       "Unflatten unflatten: x is 3x63 but the layer takes [N, 64] (samples of 1x8x8)",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(Unflatten(Shape{}),
                       "Unflatten: the per-sample shape is empty; give at least one size, e.g. {1, 8, 8}",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(Unflatten(Shape{1, 0, 8}), "Unflatten: sizes must be >= 1, got 1x0x8",
                       std::invalid_argument);
}
