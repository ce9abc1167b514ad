// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the Conv2d layer.
// The FP64 formulas (conv_math<double>) against central finite differences
// and against the convolution written out as loops (no column matrix); the
// mixed-precision layer against those loops, rounded where a GPU rounds;
// its policy questions, trace entries and errors; and a small CNN on 8×8
// images, end to end.
// Depends on: mpt/nn/layers/conv.hpp, conv_math.hpp, pooling.hpp, activations.hpp,
// linear.hpp, losses.hpp, layer_math.hpp, module.hpp; the core tier
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
#include "mpt/nn/layers/activations.hpp"
#include "mpt/nn/layers/conv.hpp"
#include "mpt/nn/layers/conv_math.hpp"
#include "mpt/nn/layers/layer_math.hpp"
#include "mpt/nn/layers/linear.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/layers/pooling.hpp"
#include "mpt/nn/module.hpp"

using namespace mpt;
using MatD = Mat<double>;

namespace {

MatD randn(Eigen::Index r, Eigen::Index c, std::uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  MatD m(r, c);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = scale * rng.normal();
  return m;
}

// Central differences, as in the Chapter 2 layer tests. A convolution is
// linear in each of x, w and b, so the truncation term vanishes and only
// the FP64 rounding ε·|f|/h ≈ 1e-10 remains: 1e-6 is a safe tolerance
// that any wrong index or dropped term (an O(1) relative error) exceeds.
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

// One convolution's sizes: x [n, c, h, w], weight [out, c, k, k].
struct ConvCase {
  std::int64_t n, c, h, w, out, k, stride, pad;
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
};

// Several shapes: stride 1 and 2, padding 0 and 1, non-square inputs, a
// 1×1 kernel, a kernel as large as the padded input.
const std::vector<ConvCase> kCases = {
    {2, 3, 5, 4, 2, 3, 1, 0}, {1, 2, 6, 7, 3, 3, 2, 1}, {2, 1, 4, 5, 2, 2, 2, 0},
    {2, 2, 5, 3, 3, 1, 1, 0}, {1, 2, 3, 5, 2, 5, 1, 1}, {3, 2, 7, 6, 4, 3, 2, 1},
};

// The convolution written out as seven loops over (n, o, y, x, c, i, j) in
// double, reading the padded input by its definition — no column matrix.
// x [N, C·H·W], w [out, C·k·k], b [1, out] or empty. With `magnitude` it
// sums |w|·|x| (and |b|) instead: the scale of the rounding-error bound.
MatD direct_conv(const MatD& x, const MatD& w, const MatD& b, const ConvCase& s, bool magnitude = false) {
  MatD y = MatD::Zero(s.n, s.out * s.oh() * s.ow());
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t o = 0; o < s.out; ++o)
      for (std::int64_t oy = 0; oy < s.oh(); ++oy)
        for (std::int64_t ox = 0; ox < s.ow(); ++ox) {
          double acc = b.size() > 0 ? (magnitude ? std::fabs(b(0, o)) : b(0, o)) : 0.0;
          for (std::int64_t c = 0; c < s.c; ++c)
            for (std::int64_t i = 0; i < s.k; ++i)
              for (std::int64_t j = 0; j < s.k; ++j) {
                const std::int64_t iy = oy * s.stride - s.pad + i, ix = ox * s.stride - s.pad + j;
                if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;  // a padding zero
                const double wv = w(o, (c * s.k + i) * s.k + j), xv = x(n, (c * s.h + iy) * s.w + ix);
                acc += magnitude ? std::fabs(wv) * std::fabs(xv) : wv * xv;
              }
          y(n, (o * s.oh() + oy) * s.ow() + ox) = acc;
        }
  return y;
}

struct Grads {
  MatD dx, dw, db;
};

// The three gradients by the same seven loops: every product w·x of the
// forward sends dy·w to x's position, dy·x to w's; db sums dy.
Grads direct_conv_backward(const MatD& x, const MatD& w, const MatD& dy, const ConvCase& s,
                           bool magnitude = false) {
  Grads g{MatD::Zero(x.rows(), x.cols()), MatD::Zero(w.rows(), w.cols()), MatD::Zero(1, s.out)};
  const auto f = [magnitude](double v) { return magnitude ? std::fabs(v) : v; };
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t o = 0; o < s.out; ++o)
      for (std::int64_t oy = 0; oy < s.oh(); ++oy)
        for (std::int64_t ox = 0; ox < s.ow(); ++ox) {
          const double d = f(dy(n, (o * s.oh() + oy) * s.ow() + ox));
          g.db(0, o) += d;
          for (std::int64_t c = 0; c < s.c; ++c)
            for (std::int64_t i = 0; i < s.k; ++i)
              for (std::int64_t j = 0; j < s.k; ++j) {
                const std::int64_t iy = oy * s.stride - s.pad + i, ix = ox * s.stride - s.pad + j;
                if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                const std::int64_t wi = (c * s.k + i) * s.k + j, xi = (c * s.h + iy) * s.w + ix;
                g.dx(n, xi) += d * f(w(o, wi));
                g.dw(o, wi) += d * f(x(n, xi));
              }
        }
  return g;
}

// A tensor of `shape` holding m's values rounded into d.
Tensor tensor_of(const MatD& m, Shape shape, DType d) {
  const MatrixF f = m.cast<float>();
  return Tensor::from_f32(f.data(), std::move(shape), d);
}

// A tensor's values widened to double, as [size(0), rest] (a 1-D tensor: one row).
MatD widen(const Tensor& t) {
  const std::int64_t rows = t.dim() <= 1 ? 1 : t.size(0);
  MatD m(rows, rows == 0 ? 0 : t.numel() / rows);
  for (std::int64_t i = 0; i < t.numel(); ++i) m.data()[i] = t.value(i);
  return m;
}

float round_down(double v) {
  float f = static_cast<float>(v);
  if (static_cast<double>(f) > v) f = std::nextafter(f, -std::numeric_limits<float>::infinity());
  return f;
}
float round_up(double v) {
  float f = static_cast<float>(v);
  if (static_cast<double>(f) < v) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f;
}
float rounded_into(float v, DType p) { return p == DType::f32 ? v : round_value(v, format_of(p)); }

// The elements of `got` that are not one rounding into p of a value within
// `terms`·u·scale of the exact `ref` (u = 2^-24, FP32's unit roundoff; a
// sum of `terms` rounded operations is that close to the exact sum).
// Rounding is monotone, so such a result lies between the roundings of
// ref − tol and ref + tol, each taken outward from double first. Returns
// how many elements fall outside.
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
        MESSAGE("element " << i << ": got " << y << ", expected within [" << lo << ", " << hi << "] (exact "
                           << ref.data()[i] << ")");
      ++bad;
    }
  }
  return bad;
}

Conv2d conv_of(const ConvCase& s, std::uint64_t seed, bool bias = true) {
  const MatD w = randn(s.out, s.c * s.k * s.k, seed, 0.5), b = randn(1, s.out, seed + 1, 0.5);
  Conv2dOptions o;
  o.stride = static_cast<int>(s.stride);
  o.padding = static_cast<int>(s.pad);
  o.bias = bias;
  Conv2d conv(tensor_of(w, {s.out, s.c, s.k, s.k}, DType::f32),
              bias ? tensor_of(b, {s.out}, DType::f32) : Tensor(), o);
  conv.set_path("conv");
  return conv;
}

std::string case_name(const ConvCase& s) {
  return "x " + shape_string({s.n, s.c, s.h, s.w}) + ", " + std::to_string(s.out) + " filters " +
         std::to_string(s.k) + "x" + std::to_string(s.k) + ", stride " + std::to_string(s.stride) +
         ", padding " + std::to_string(s.pad);
}

// A policy that asks for f16 compute: what conv2d must refuse.
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

// --- FP64: the formulas ------------------------------------------------------------------

TEST_CASE(
    "conv2d: the FP64 formulas are the written-out convolution, and their backward matches "
    "finite differences") {
  for (const ConvCase& s : kCases) {
    CAPTURE(case_name(s));
    const conv_math::Geometry g = s.geometry();
    REQUIRE(g.oh() == s.oh());
    REQUIRE(g.ow() == s.ow());
    MatD x = randn(s.n, s.c * s.h * s.w, 100 + s.k), w = randn(s.out, s.c * s.k * s.k, 200 + s.h),
         b = randn(1, s.out, 300 + s.w);
    const MatD r = randn(s.n, s.out * s.oh() * s.ow(), 400 + s.c);
    const MatD y = conv_math::conv2d_forward<double>(x, w, b, g);
    CHECK((y - direct_conv(x, w, b, s)).cwiseAbs().maxCoeff() < 1e-12);
    CHECK((conv_math::conv2d_forward<double>(x, w, MatD(), g) - direct_conv(x, w, MatD(), s))
              .cwiseAbs()
              .maxCoeff() < 1e-12);
    // loss = Σ R ⊙ y, so dy = R.
    const auto loss = [&] { return conv_math::conv2d_forward<double>(x, w, b, g).cwiseProduct(r).sum(); };
    const auto grads = conv_math::conv2d_backward<double>(x, w, r, g);
    CHECK(rel_err(grads.dx, numeric_grad(loss, x)) < kTol);
    CHECK(rel_err(grads.dw, numeric_grad(loss, w)) < kTol);
    CHECK(rel_err(grads.db, numeric_grad(loss, b)) < kTol);
    // The written-out backward agrees too (it is the reference below).
    const Grads d = direct_conv_backward(x, w, r, s);
    CHECK((grads.dx - d.dx).cwiseAbs().maxCoeff() < 1e-12);
    CHECK((grads.dw - d.dw).cwiseAbs().maxCoeff() < 1e-12);
    CHECK((grads.db - d.db).cwiseAbs().maxCoeff() < 1e-12);
  }
}

TEST_CASE("im2col: windows row by row, channels then kernel rows in a row, padding read as zero") {
  // x [1, 1, 2, 3] = [[1 2 3], [4 5 6]], k 2, stride 1, padding 1: output
  // 3x4, so 12 rows of 4; row (1, 1) is the window over x[0..1][0..1].
  const MatD x = (MatD(1, 6) << 1, 2, 3, 4, 5, 6).finished();
  conv_math::Geometry g;
  g.n = 1;
  g.c = 1;
  g.h = 2;
  g.w = 3;
  g.win = {2, 1, 1};
  const MatD cols = conv_math::im2col<double>(x, g);
  REQUIRE(cols.rows() == 12);
  REQUIRE(cols.cols() == 4);
  CHECK(cols.row(0) == (MatD(1, 4) << 0, 0, 0, 1).finished());   // top-left corner: only x[0][0]
  CHECK(cols.row(5) == (MatD(1, 4) << 1, 2, 4, 5).finished());   // (1, 1)
  CHECK(cols.row(11) == (MatD(1, 4) << 6, 0, 0, 0).finished());  // bottom-right corner: only x[1][2]
  // col2im adds each entry back where it came from: all-ones columns give
  // each pixel the number of windows that read it (4 for every pixel here).
  CHECK(conv_math::col2im<double>(MatD::Ones(12, 4), g) == MatD::Constant(1, 6, 4.0));
}

// --- the mixed-precision layer ------------------------------------------------------------

TEST_CASE("Conv2d forward: FP32 accumulation of the widened inputs, one rounding into the output dtype") {
  for (DType p : {DType::f32, DType::f16, DType::bf16})
    for (const ConvCase& s : kCases) {
      CAPTURE(std::string(dtype_name(p)));
      CAPTURE(case_name(s));
      for (bool bias : {true, false}) {
        CAPTURE(bias);
        Conv2d conv = conv_of(s, 10 + s.h, bias);
        conv.apply_policy(UniformPolicy(p));
        Context ctx(uniform_policy(p));
        const Tensor xt = tensor_of(randn(s.n, s.c * s.h * s.w, 20 + s.w), {s.n, s.c, s.h, s.w}, p);
        const Tensor y = conv.forward(xt, ctx);
        CHECK(y.dtype() == p);
        CHECK(y.shape() == Shape{s.n, s.out, s.oh(), s.ow()});
        CHECK(ctx.casts().casts == 0);  // every operand already in p
        // The reference: the written-out convolution of exactly the values
        // the layer read (its model copies, the input), in double.
        const MatD x = widen(xt), w = widen(conv.weight.weights());
        const MatD b = bias ? widen(conv.bias.weights()) : MatD();
        const MatD ref = direct_conv(x, w, b, s), scale = direct_conv(x, w, b, s, true);
        // A dot product of K = C·k·k terms plus the bias: K + 1 roundings
        // in FP32 at most (the products of f16/bf16 values are exact).
        CHECK(outside_one_rounding(y, ref, scale, static_cast<double>(s.c * s.k * s.k + 2), p) == 0);
      }
    }
}

TEST_CASE("Conv2d backward: dW, db and dx are one rounding of the FP64 gradients; grads accumulate") {
  for (DType p : {DType::f32, DType::f16, DType::bf16})
    for (const ConvCase& s : kCases) {
      CAPTURE(std::string(dtype_name(p)));
      CAPTURE(case_name(s));
      Conv2d conv = conv_of(s, 30 + s.c);
      conv.apply_policy(UniformPolicy(p));
      Context ctx(uniform_policy(p));
      const Tensor xt = tensor_of(randn(s.n, s.c * s.h * s.w, 40 + s.k), {s.n, s.c, s.h, s.w}, p);
      const Tensor dyt =
          tensor_of(randn(s.n, s.out * s.oh() * s.ow(), 50 + s.w), {s.n, s.out, s.oh(), s.ow()}, p);
      conv.forward(xt, ctx);
      const Tensor dx = conv.backward(dyt, ctx);
      CHECK(dx.dtype() == p);
      CHECK(dx.shape() == xt.shape());
      CHECK(ctx.casts().casts == 0);
      const MatD x = widen(xt), w = widen(conv.weight.weights()), dy = widen(dyt);
      const Grads ref = direct_conv_backward(x, w, dy, s), scale = direct_conv_backward(x, w, dy, s, true);
      const double positions = static_cast<double>(s.n * s.oh() * s.ow());
      // dx: a sum over out channels (the GEMM) then over the windows that
      // read the pixel (col2im), all in FP32: at most out + k² roundings.
      CHECK(outside_one_rounding(dx, ref.dx, scale.dx, static_cast<double>(s.out + s.k * s.k + 1), p) == 0);
      // The FP32 master gradients hold dW and db rounded into the weights' dtype.
      CHECK(conv.weight.grad.dtype() == DType::f32);
      CHECK(conv.weight.grad.shape() == Shape{s.out, s.c, s.k, s.k});
      CHECK(outside_one_rounding(conv.weight.grad, ref.dw, scale.dw, positions + 1, p) == 0);
      CHECK(outside_one_rounding(conv.bias.grad, ref.db, scale.db, positions + 1, p) == 0);
      // A second backward adds the same gradients again (PyTorch's .grad
      // accumulation); without input gradients dx is empty.
      const MatD g1 = widen(conv.weight.grad), b1 = widen(conv.bias.grad);
      conv.set_input_grad(false);
      CHECK(conv.backward(dyt, ctx).numel() == 0);
      CHECK(widen(conv.weight.grad) == 2.0 * g1);
      CHECK(widen(conv.bias.grad) == 2.0 * b1);
    }
}

TEST_CASE("Conv2d initialisation is PyTorch's: weight then bias, uniform in ±1/sqrt(in·k·k)") {
  Rng rng(7);
  const Conv2d conv(3, 5, 3, rng, Conv2dOptions{2, 1, true});
  CHECK(conv.weight.master.shape() == Shape{5, 3, 3, 3});
  CHECK(conv.bias.master.shape() == Shape{5});
  CHECK(conv.in_channels() == 3);
  CHECK(conv.out_channels() == 5);
  CHECK(conv.kernel_size() == 3);
  CHECK(conv.options().stride == 2);
  CHECK(conv.options().padding == 1);
  // The same draws, replayed: 135 weights, then 5 biases, all in ±1/√27.
  const double bound = 1.0 / std::sqrt(27.0);
  Rng replay(7);
  for (std::int64_t i = 0; i < conv.weight.master.numel(); ++i)
    CHECK(conv.weight.master.value(i) == static_cast<float>(replay.uniform(-bound, bound)));
  for (std::int64_t i = 0; i < conv.bias.master.numel(); ++i)
    CHECK(conv.bias.master.value(i) == static_cast<float>(replay.uniform(-bound, bound)));
  // Without a bias there is one parameter, and nothing is drawn for it.
  Rng rng2(7);
  Conv2d nobias(3, 5, 3, rng2, Conv2dOptions{1, 0, false});
  CHECK(nobias.parameters().size() == 1);
  CHECK(nobias.bias.master.numel() == 0);
  CHECK(nobias.weight.master.value(0) == conv.weight.master.value(0));
}

TEST_CASE("Conv2d precision is the policy's: f16 storage, FP32 islands, f16 compute refused") {
  const ConvCase s{2, 3, 5, 4, 2, 3, 1, 1};
  const Tensor x32 = tensor_of(randn(2, 60, 60), {2, 3, 5, 4}, DType::f32);
  SUBCASE("uniform f16: the input cast once, everything stored in f16") {
    Conv2d conv = conv_of(s, 61);
    conv.apply_policy(UniformPolicy(DType::f16));
    CHECK(conv.weight.weights().dtype() == DType::f16);
    CHECK(conv.bias.weights().dtype() == DType::f16);
    CHECK(conv.weight.model_bytes() == 54 * 2);  // really 2 bytes an element
    CHECK(conv.bias.model_bytes() == 2 * 2);
    CHECK(conv.weight.master.dtype() == DType::f32);
    Context ctx(uniform_policy(DType::f16));
    const Tensor y = conv.forward(x32, ctx);
    CHECK(y.dtype() == DType::f16);
    CHECK(ctx.casts().casts == 1);
    CHECK(ctx.casts().bytes == 120 * 2);
    // It keeps the input as the op read it: the f16 copy, 2 bytes an element.
    REQUIRE(conv.saved().size() == 1);
    CHECK(conv.saved()[0]->dtype() == DType::f16);
    CHECK(distinct_bytes(conv.saved()) == 120 * 2);
    // The gradient leaves in the input's dtype (the cast's backward).
    const Tensor dx = conv.backward(Tensor(DType::f16, y.shape()), ctx);
    CHECK(dx.dtype() == DType::f32);
    CHECK(ctx.casts().casts == 2);
  }
  SUBCASE("kept in FP32 by op name or by path inside an f16 policy") {
    for (const auto& keep :
         {std::make_shared<KeepF32Policy>(uniform_policy(DType::f16), std::vector<std::string>{},
                                          std::vector<std::string>{"conv2d"}),
          std::make_shared<KeepF32Policy>(uniform_policy(DType::f16), std::vector<std::string>{"conv"})}) {
      CAPTURE(keep->describe());
      Conv2d conv = conv_of(s, 62);
      conv.apply_policy(*keep);
      CHECK(conv.weight.weights().dtype() == DType::f32);
      CHECK(conv.weight.model_bytes() == 0);  // forward reads the master
      Context ctx(keep);
      const Tensor x16 = x32.to(DType::f16);
      const Tensor y = conv.forward(x16, ctx);
      CHECK(y.dtype() == DType::f32);
      CHECK(ctx.casts().casts == 1);  // the f16 input, up to f32 at the island's edge
      const MatD x = widen(x16), w = widen(conv.weight.master), b = widen(conv.bias.master);
      CHECK(outside_one_rounding(y, direct_conv(x, w, b, s), direct_conv(x, w, b, s, true), 29.0,
                                 DType::f32) == 0);
      CHECK(conv.backward(Tensor(DType::f32, y.shape()), ctx).dtype() == DType::f16);
    }
  }
  SUBCASE("f16 compute is refused in one line") {
    Conv2d conv = conv_of(s, 63);
    Context ctx(std::make_shared<F16ComputePolicy>());
    CHECK_THROWS_WITH_AS(
        conv.forward(x32, ctx),
        "conv2d: the policy asks for f16 compute; conv2d accumulates in f32 (as linear does)",
        std::invalid_argument);
  }
}

TEST_CASE("Conv2d trace: what it read, computed in and wrote, in both passes") {
  const ConvCase s{2, 3, 5, 4, 2, 3, 2, 1};
  Conv2d conv = conv_of(s, 70);
  conv.apply_policy(UniformPolicy(DType::bf16));
  Context ctx(uniform_policy(DType::bf16));
  Trace trace;
  ctx.set_trace(&trace);
  const Tensor y = conv.forward(tensor_of(randn(2, 60, 71), {2, 3, 5, 4}, DType::f32), ctx);
  CHECK(y.shape() == Shape{2, 2, 3, 2});
  REQUIRE(trace.entries().size() == 2);
  CHECK(trace.entries()[0].op == "cast");
  const TraceEntry& f = trace.entries()[1];
  CHECK(f.phase == Phase::forward);
  CHECK(f.path == "conv");
  CHECK(f.op == "conv2d");
  CHECK(f.compute == DType::f32);
  REQUIRE(f.inputs.size() == 3);
  CHECK(f.inputs[0].name == "x");
  CHECK(f.inputs[0].dtype == DType::bf16);
  CHECK(f.inputs[0].shape == Shape{2, 3, 5, 4});
  CHECK(f.inputs[1].name == "weight");
  CHECK(f.inputs[1].shape == Shape{2, 3, 3, 3});
  CHECK(f.inputs[1].bytes == 54 * 2);
  CHECK(f.inputs[2].name == "bias");
  REQUIRE(f.outputs.size() == 1);
  CHECK(f.outputs[0].name == "y");
  CHECK(f.outputs[0].dtype == DType::bf16);
  CHECK(f.outputs[0].shape == Shape{2, 2, 3, 2});
  CHECK(f.bytes_written() == 24 * 2);
  trace.clear();
  conv.backward(Tensor(DType::bf16, y.shape()), ctx);
  REQUIRE(trace.entries().size() == 2);  // the op, then dx cast back to the input's f32
  const TraceEntry& b = trace.entries()[0];
  CHECK(b.phase == Phase::backward);
  CHECK(b.op == "conv2d");
  REQUIRE(b.inputs.size() == 3);
  CHECK(b.inputs[0].name == "dy");
  CHECK(b.inputs[1].name == "x");
  CHECK(b.inputs[2].name == "weight");
  REQUIRE(b.outputs.size() == 3);
  CHECK(b.outputs[0].name == "dx");
  CHECK(b.outputs[0].dtype == DType::bf16);
  CHECK(b.outputs[0].shape == Shape{2, 3, 5, 4});
  CHECK(b.outputs[1].name == "weight.grad");
  CHECK(b.outputs[1].dtype == DType::bf16);
  CHECK(b.outputs[1].bytes == 54 * 2);
  CHECK(b.outputs[2].name == "bias.grad");
  CHECK(trace.entries()[1].op == "cast");
  CHECK(trace.entries()[1].outputs[0].dtype == DType::f32);
  // Without a bias, no bias is read or written.
  Conv2d plain = conv_of(s, 72, false);
  plain.apply_policy(UniformPolicy(DType::bf16));
  trace.clear();
  plain.forward(Tensor(DType::bf16, {2, 3, 5, 4}), ctx);
  plain.backward(Tensor(DType::bf16, y.shape()), ctx);
  REQUIRE(trace.entries().size() == 2);
  CHECK(trace.entries()[0].inputs.size() == 2);
  CHECK(trace.entries()[1].outputs.size() == 2);
}

TEST_CASE("Conv2d: wrong shapes and options are one-line errors naming what would be valid") {
  const ConvCase s{1, 3, 5, 5, 2, 5, 1, 1};
  Conv2d conv = conv_of(s, 80);
  Context ctx(uniform_policy(DType::f32));
  CHECK_THROWS_WITH_AS(conv.forward(Tensor(DType::f32, {2, 2, 5, 5}), ctx),
                       "Conv2d conv: x is 2x2x5x5 but the layer takes [N, 3, H, W]", std::invalid_argument);
  CHECK_THROWS_WITH_AS(conv.forward(Tensor(DType::f32, {2, 75}), ctx),
                       "Conv2d conv: x is 2x75 but the layer takes [N, 3, H, W]", std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      conv.forward(Tensor(DType::f32, {1, 3, 2, 6}), ctx),
      "Conv2d conv: the padded input is 4x8 but the kernel is 5x5; H and W + 2*padding must be "
      ">= kernel_size",
      std::invalid_argument);
  conv.forward(Tensor(DType::f32, {1, 3, 3, 4}), ctx);  // 5x6 padded: fits, y [1, 2, 1, 2]
  CHECK_THROWS_WITH_AS(conv.backward(Tensor(DType::f32, {1, 2, 2, 1}), ctx),
                       "Conv2d conv: dy is 1x2x2x1, expected 1x2x1x2", std::invalid_argument);
  Rng rng(1);
  CHECK_THROWS_WITH_AS(Conv2d(3, 4, 0, rng),
                       "Conv2d: in_channels, out_channels and kernel_size must be >= 1, got 3, 4, 0",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(Conv2d(3, 4, 3, rng, Conv2dOptions{0, 0, true}),
                       "Conv2d: stride must be >= 1 and padding >= 0, got stride 0 and padding 0",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(Conv2d(Tensor(DType::f32, {4, 3, 3, 2}), Tensor(DType::f32, {4})),
                       "Conv2d: weight must be [out, in, k, k] with a square kernel, got 4x3x3x2",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(Conv2d(Tensor(DType::f32, {4, 3, 3, 3}), Tensor(DType::f32, {3})),
                       "Conv2d: bias must be [4] for weight 4x3x3x3, got 3", std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      Conv2d(Tensor(DType::f32, {4, 3, 3, 3}), Tensor(DType::f32, {4}), Conv2dOptions{1, 0, false}),
      "Conv2d: options.bias is false but a bias 4 was given; pass Tensor() or set options.bias",
      std::invalid_argument);
}

// --- a small CNN, end to end -------------------------------------------------------------------

TEST_CASE("a CNN on 8x8 images: Unflatten, Conv2d, ReLU, MaxPool2d, Flatten, Linear") {
  // Chapter 2's digits are rows of 64 pixels; Unflatten makes them images.
  Rng rng(2024);
  Sequential net;
  net.emplace<Unflatten>("unflatten", Shape{1, 8, 8});
  net.emplace<Conv2d>("conv1", 1, 4, 3, rng, Conv2dOptions{1, 1, true});
  net.emplace<ReLU>("relu1");
  net.emplace<MaxPool2d>("pool1", 2);
  net.emplace<Flatten>("flatten");
  net.emplace<Linear>("fc", 4 * 4 * 4, 10, rng);
  net.apply_policy(UniformPolicy(DType::f32));
  const std::int64_t batch = 6;
  const MatD pixels = randn(batch, 64, 2025);
  const std::vector<int> labels{3, 1, 4, 1, 5, 9};
  Context ctx(uniform_policy(DType::f32));
  const Tensor logits = net.forward(tensor_of(pixels, {batch, 64}, DType::f32), ctx);
  CHECK(logits.shape() == Shape{batch, 10});
  net.backward(cross_entropy_backward(logits, labels), ctx);
  const std::vector<Parameter*> params = net.parameters();
  REQUIRE(params.size() == 4);
  CHECK(params[0]->name == "conv1.weight");
  CHECK(params[3]->name == "fc.bias");
  for (const Parameter* p : params) {
    CAPTURE(p->name);
    const MatD g = widen(p->grad);
    CHECK(g.allFinite());
    CHECK(g.cwiseAbs().maxCoeff() > 0.0);
  }

  // The same network in FP64 from the library's double formulas; its loss
  // by central differences in a few conv weights and biases against the
  // FP32 network's gradient.
  Conv2d& conv = static_cast<Conv2d&>(*net.find("conv1"));
  Linear& fc = static_cast<Linear&>(*net.find("fc"));
  MatD wc = widen(conv.weight.master), bc = widen(conv.bias.master);
  const MatD wf = widen(fc.weight.master), bf = widen(fc.bias.master);
  const ConvCase cs{batch, 1, 8, 8, 4, 3, 1, 1};
  conv_math::Geometry pool = cs.geometry();
  pool.c = 4;
  pool.win = {2, 2, 0};
  const auto loss = [&] {
    const MatD h =
        layer_math::relu_forward<double>(conv_math::conv2d_forward<double>(pixels, wc, bc, cs.geometry()));
    const MatD z =
        layer_math::linear_forward<double>(conv_math::max_pool2d_forward<double>(h, pool).y, wf, bf);
    return layer_math::cross_entropy_forward<double>(z, labels);
  };
  CHECK(cross_entropy_loss(logits, labels) == doctest::Approx(loss()).epsilon(1e-5));
  const MatD fd_w = numeric_grad(loss, wc), fd_b = numeric_grad(loss, bc);
  const MatD gw = widen(conv.weight.grad), gb = widen(conv.bias.grad);
  // An FP32 network's gradient: relative error ~1e-6; 1e-4 catches any
  // wrong routing (an O(1) error in some entries).
  CHECK(rel_err(gw, fd_w) < 1e-4);
  CHECK(rel_err(gb, fd_b) < 1e-4);
  for (Eigen::Index i : {0, 7, 13, 22, 35}) {
    CAPTURE(i);
    CHECK(gw.data()[i] == doctest::Approx(fd_w.data()[i]).epsilon(1e-3).scale(1e-3));
  }

  // The same network in f16: every stored value f16, the reshapes free.
  net.apply_policy(UniformPolicy(DType::f16));
  Context half(uniform_policy(DType::f16));
  const Tensor z16 = net.forward(tensor_of(pixels, {batch, 64}, DType::f32), half);
  CHECK(z16.dtype() == DType::f16);
  CHECK(half.casts().casts == 1);  // only the images, at conv1's boundary
  for (const Parameter* p : net.parameters()) CHECK(p->weights().dtype() == DType::f16);
}
