// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the order of a
// channel's sums, and the channel-by-channel CPU forward the layers run,
// against a textbook two-pass reference, an independent loop in the
// documented order, and the whole-tensor formulas rounded once.
// Depends on: mpt/nn/cpu/norm_cpu.hpp, norm_math.hpp, welford.hpp,
// batch_norm.hpp, layer_norm.hpp, the core tier (Tensor, Context, Rng).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/nn/cpu/norm_cpu.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/layer_norm.hpp"
#include "mpt/nn/layers/norm_math.hpp"
#include "mpt/nn/layers/welford.hpp"

using namespace mpt;
using norm_math::AffineAxis;
using norm_math::Layout;
using VecF = std::vector<float>;

namespace {

std::vector<double> normals(std::size_t n, double mean, double sd, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<double> v(n);
  for (double& x : v) x = mean + sd * rng.normal();
  return v;
}

VecF to_float(const std::vector<double>& v) { return VecF(v.begin(), v.end()); }

// The textbook two-pass statistics in double.
struct TwoPass {
  double mean = 0, m2 = 0;
};
template <class T>
TwoPass two_pass(const T* x, std::size_t n) {
  TwoPass r;
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]);
  r.mean = sum / static_cast<double>(n);
  for (std::size_t i = 0; i < n; ++i)
    r.m2 += (static_cast<double>(x[i]) - r.mean) * (static_cast<double>(x[i]) - r.mean);
  return r;
}

double rel(double a, double b) { return std::fabs(a - b) / std::fabs(b); }

std::uint32_t bits(float v) {
  std::uint32_t u = 0;
  std::memcpy(&u, &v, 4);
  return u;
}

// Equal bits, or both NaN (which NaN two NaNs of different signs give is
// not promised: IEEE leaves it open, and compilers commute + and ×).
bool same(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  std::uint64_t ua = 0, ub = 0;
  std::memcpy(&ua, &a, 8);
  std::memcpy(&ub, &b, 8);
  return ua == ub;
}

bool same(const norm_math::Statistics& a, const norm_math::Statistics& b) {
  return a.count == b.count && same(a.mean, b.mean) && same(a.m2, b.m2);
}

// The order norm_math.hpp documents, written out again for one channel of
// `runs` runs of n values, run r at x + r·stride: value i of every run into
// lane i mod 16 in double, runs in order; the lanes added (0+1)+(2+3) within
// each four, then the fours pairwise; mean = total / count; then the same
// for (x − mean)².
norm_math::Statistics documented_order(const float* x, std::size_t n, std::size_t runs = 1,
                                       std::size_t stride = 0) {
  const auto total = [](const double* l) {
    const double q0 = (l[0] + l[1]) + (l[2] + l[3]), q1 = (l[4] + l[5]) + (l[6] + l[7]);
    const double q2 = (l[8] + l[9]) + (l[10] + l[11]), q3 = (l[12] + l[13]) + (l[14] + l[15]);
    return (q0 + q1) + (q2 + q3);
  };
  double lane[16] = {}, sq[16] = {};
  for (std::size_t r = 0; r < runs; ++r)
    for (std::size_t i = 0; i < n; ++i) lane[i % 16] += static_cast<double>(x[r * stride + i]);
  norm_math::Statistics s;
  s.count = static_cast<std::int64_t>(n * runs);
  s.mean = total(lane) / static_cast<double>(s.count);
  for (std::size_t r = 0; r < runs; ++r)
    for (std::size_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(x[r * stride + i]) - s.mean;
      sq[i % 16] += d * d;
    }
  s.m2 = total(sq);
  return s;
}

const std::size_t kLengths[] = {1,  2,  7,   15,  16,  17,  31,   63,   64,
                                65, 71, 127, 128, 129, 200, 1000, 1024, 4096};

// A tensor of values rounded into d (RNE).
Tensor tensor(const VecF& v, Shape s, DType d) { return Tensor::from_f32(v.data(), std::move(s), d); }

// The whole-tensor formulas on the widened x, y rounded once into `out`:
// what norm_cpu::forward must give, bit for bit.
struct Whole {
  std::vector<norm_math::Statistics> stats;
  VecF mean, invstd;
  Tensor y;
};
Whole whole(const Tensor& x, const Layout& l, AffineAxis axis, const float* w, const float* b, float eps,
            DType out, const VecF* given_mean = nullptr, const VecF* given_invstd = nullptr) {
  Whole r;
  const auto c = static_cast<std::size_t>(l.channels);
  const VecF xf = widened(x);
  if (given_mean) {
    r.mean = *given_mean;
    r.invstd = *given_invstd;
  } else {
    r.stats.resize(c);
    r.mean.resize(c);
    r.invstd.resize(c);
    norm_math::statistics(xf.data(), l, r.stats.data());
    norm_math::mean_invstd(r.stats.data(), l.channels, eps, r.mean.data(), r.invstd.data());
  }
  VecF y(xf.size());
  norm_math::forward(xf.data(), l, r.mean.data(), r.invstd.data(), w, b, axis, y.data());
  r.y = Tensor::from_f32(y.data(), x.shape(), out);
  return r;
}

// The first element where two tensors' codes differ (NaN codes count as
// equal, see same()), or -1.
std::int64_t first_difference(const Tensor& a, const Tensor& b) {
  REQUIRE(a.dtype() == b.dtype());
  REQUIRE(a.numel() == b.numel());
  const VecF va = widened(a), vb = widened(b);
  const std::size_t e = bytes_per_element(a.dtype());
  const auto* ca = static_cast<const unsigned char*>(a.raw());
  const auto* cb = static_cast<const unsigned char*>(b.raw());
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const auto k = static_cast<std::size_t>(i);
    if (std::isnan(va[k]) && std::isnan(vb[k])) continue;
    if (std::memcmp(ca + k * e, cb + k * e, e) != 0) return i;
  }
  return -1;
}

const Implementation kImpls[] = {Implementation::automatic, Implementation::portable};
const char* name(Implementation i) { return i == Implementation::portable ? "portable" : "automatic"; }

}  // namespace

// --- the order of a channel's sums ---------------------------------------------------

TEST_CASE("norm_math::statistics takes the documented order, and agrees with the textbook two-pass") {
  const VecF x = to_float(normals(4096, -2.0, 1.5, 2));
  for (std::size_t n : kLengths) {
    CAPTURE(n);
    norm_math::Statistics s;
    norm_math::statistics(x.data(), Layout{1, 1, static_cast<std::int64_t>(n)}, &s);
    CHECK(same(s, documented_order(x.data(), n)));
    const TwoPass ref = two_pass(x.data(), n);
    CHECK(rel(s.mean, ref.mean) < 1e-14);
    if (n > 1) CHECK(rel(s.m2, ref.m2) < 1e-13);
  }
  // A channel of several runs: the runs in the order of n, each run's value
  // i into lane i mod 16 (so the lanes of a run of 71 do not continue where
  // the previous run's stopped).
  const Layout l{5, 3, 71};
  std::vector<norm_math::Statistics> st(3);
  norm_math::statistics(x.data(), l, st.data());
  for (std::size_t c = 0; c < 3; ++c)
    CHECK(same(st[c], documented_order(x.data() + c * 71, 71, 5, 3 * std::size_t{71})));
  // The empty set: count 0, mean and M2 0 (not 0/0).
  norm_math::Statistics none;
  norm_math::statistics(x.data(), Layout{1, 1, 0}, &none);
  CHECK(none.count == 0);
  CHECK(none.mean == 0.0);
  CHECK(none.m2 == 0.0);
}

TEST_CASE("norm_cpu::run_statistics gives norm_math's bits, also on inf, NaN, -0, subnormals, huge values") {
  VecF x = to_float(normals(4096, 0.5, 3.0, 4));
  VecF special = x;
  special[3] = -0.0f;
  special[70] = 1e-40f;  // an fp32 subnormal
  special[200] = 3e38f;  // its square is far beyond FP32: fine in double
  special[1500] = std::numeric_limits<float>::infinity();
  special[2900] = std::numeric_limits<float>::quiet_NaN();
  for (const VecF* v : {&x, &special})
    for (std::size_t n : kLengths)
      for (Implementation impl : kImpls) {
        CAPTURE(n);
        CAPTURE(name(impl));
        const norm_math::Statistics got =
            norm_cpu::run_statistics(v->data(), static_cast<std::int64_t>(n), impl);
        norm_math::Statistics ref;
        norm_math::statistics(v->data(), Layout{1, 1, static_cast<std::int64_t>(n)}, &ref);
        CHECK(same(got, ref));
      }
  // The specials do reach the statistics: 3e38 squared is kept (FP32 would
  // overflow), an inf makes the mean inf and M2 NaN, a NaN makes both NaN.
  const norm_math::Statistics big = norm_cpu::run_statistics(special.data(), 1000);
  CHECK(std::isfinite(big.m2));
  CHECK(big.m2 > 8e76);
  CHECK(std::isinf(norm_cpu::run_statistics(special.data(), 2000).mean));
  CHECK(std::isnan(norm_cpu::run_statistics(special.data(), 4096).mean));
}

// --- the channel-by-channel forward -----------------------------------------------

TEST_CASE("norm_cpu::forward is the whole-tensor formulas rounded once, bit for bit") {
  struct Case {
    Layout l;
    AffineAxis axis;
  };
  // BatchNorm-like (channel weights) and LayerNorm-like (position weights),
  // runs of exactly one block, of many blocks with a tail, not a multiple of 8.
  const Case cases[] = {{{4, 3, 100}, AffineAxis::channel},  {{2, 2, 64}, AffineAxis::channel},
                        {{3, 2, 1030}, AffineAxis::channel}, {{7, 2, 72}, AffineAxis::channel},
                        {{1, 5, 1000}, AffineAxis::inner},   {{1, 3, 130}, AffineAxis::inner},
                        {{1, 4, 1024}, AffineAxis::inner}};
  for (const Case& k : cases) {
    const Layout& l = k.l;
    const auto n = static_cast<std::size_t>(l.numel());
    const auto na = static_cast<std::size_t>(norm_math::affine_size(l, k.axis));
    const VecF w = to_float(normals(na, 1.0, 0.5, 10)), b = to_float(normals(na, 0.0, 0.5, 11));
    // A drift along the tensor, so that the runs of a channel differ (merging
    // runs of alike statistics hides which order they were merged in).
    VecF xv = to_float(normals(n, 0.7, 2.0, 12));
    for (std::size_t i = 0; i < n; ++i) xv[i] += 1e-3f * static_cast<float>(i);
    for (DType xd : {DType::f32, DType::f16, DType::bf16})
      for (DType out : {DType::f32, DType::f16, DType::bf16})
        for (bool affine : {true, false})
          for (bool given : {false, true})
            for (Implementation impl : kImpls) {
              CAPTURE(shape_string({l.outer, l.channels, l.inner}));
              CAPTURE(std::string(dtype_name(xd)) + " -> " + std::string(dtype_name(out)));
              CAPTURE(affine);
              CAPTURE(given);
              CAPTURE(name(impl));
              const Tensor x = tensor(xv, {l.outer, l.channels, l.inner}, xd);
              const float* wp = affine ? w.data() : nullptr;
              const float* bp = affine ? b.data() : nullptr;
              const auto c = static_cast<std::size_t>(l.channels);
              const VecF gm = to_float(normals(c, 0.5, 0.2, 13)), gi = to_float(normals(c, 1.5, 0.2, 14));
              const Whole ref = given ? whole(x, l, k.axis, wp, bp, 1e-5f, out, &gm, &gi)
                                      : whole(x, l, k.axis, wp, bp, 1e-5f, out);
              std::vector<norm_math::Statistics> st(c);
              VecF mean = given ? gm : VecF(c), invstd = given ? gi : VecF(c);
              const Tensor y =
                  norm_cpu::forward(x, l, k.axis, wp, bp, 1e-5f, out, given ? nullptr : st.data(),
                                    mean.data(), invstd.data(), impl);
              CHECK(y.dtype() == out);
              CHECK(y.shape() == x.shape());
              CHECK(first_difference(y, ref.y) == -1);
              for (std::size_t j = 0; j < c; ++j) {
                CHECK(bits(mean[j]) == bits(ref.mean[j]));
                CHECK(bits(invstd[j]) == bits(ref.invstd[j]));
                if (!given) CHECK(same(st[j], ref.stats[j]));
              }
            }
  }
}

TEST_CASE("norm_cpu::forward on inf, NaN, -0, fp16 subnormals and an overflowing y") {
  const Layout l{2, 3, 136};
  const auto n = static_cast<std::size_t>(l.numel());
  VecF xv = to_float(normals(n, 0.0, 1.0, 20));
  xv[5] = std::numeric_limits<float>::infinity();         // channel 0: inf, then an inf mean and NaN M2
  xv[136 + 9] = std::numeric_limits<float>::quiet_NaN();  // channel 1
  xv[272 + 1] = -0.0f;                                    // channel 2: finite, with -0,
  xv[272 + 2] = 0x1p-20f;                                 // an fp16 subnormal,
  xv[272 + 3] = 40000.0f;                                 // and a value whose y overflows fp16
  const VecF w{1.0f, 1.0f, 30000.0f}, b{0.0f, 0.0f, 0.0f};
  for (DType xd : {DType::f32, DType::f16})
    for (DType out : {DType::f32, DType::f16})
      for (Implementation impl : kImpls) {
        CAPTURE(std::string(dtype_name(xd)) + " -> " + std::string(dtype_name(out)));
        CAPTURE(name(impl));
        const Tensor x = tensor(xv, {2, 3, 136}, xd);
        const Whole ref = whole(x, l, AffineAxis::channel, w.data(), b.data(), 1e-5f, out);
        std::vector<norm_math::Statistics> st(3);
        VecF mean(3), invstd(3);
        const Tensor y = norm_cpu::forward(x, l, AffineAxis::channel, w.data(), b.data(), 1e-5f, out,
                                           st.data(), mean.data(), invstd.data(), impl);
        CHECK(first_difference(y, ref.y) == -1);
        for (std::size_t j = 0; j < 3; ++j) CHECK(same(st[j], ref.stats[j]));
        CHECK(std::isinf(mean[0]));  // an inf makes the mean inf (PyTorch's answer), M2 NaN
        CHECK(std::isnan(invstd[0]));
        CHECK(std::isnan(mean[1]));
        CHECK(std::isfinite(mean[2]));
        const VecF yv = widened(y);
        CHECK(std::isnan(yv[0]));
        if (out == DType::f16) CHECK(std::isinf(yv[272 + 3]));  // 30000 · x̂ > 65504
      }
}

TEST_CASE("an fp16 NaN with a payload is read as the canonical quiet NaN, as Tensor::to_f32 reads it") {
  // One NaN code with payload bits (0x7d23) among finite fp16 values: the
  // statistics of its channel and every y of that channel are NaN. Read as
  // to_f32 reads it, the NaN is 0x7fc00000 and every NaN that follows from
  // it is that one; an AVX2 path keeping F16C's payload would give others.
  const Layout l{1, 2, 256};
  VecF xv = to_float(normals(512, 1.0, 1.0, 30));
  Tensor x = tensor(xv, {1, 2, 256}, DType::f16);
  {
    // Write the code through a copy of the buffer: the tensor API rounds every
    // value it is given, and no rounding makes a NaN with a payload.
    std::vector<std::uint16_t> codes(512);
    std::memcpy(codes.data(), x.raw(), 1024);
    codes[77] = 0x7d23;
    Tensor f16 = Tensor::uninitialized(DType::f16, {1, 2, 256});
    std::memcpy(const_cast<void*>(f16.raw()), codes.data(), 1024);
    x = f16;
  }
  REQUIRE(std::isnan(x.value(77)));
  for (DType out : {DType::f32, DType::f16})
    for (Implementation impl : kImpls) {
      CAPTURE(std::string(dtype_name(out)));
      CAPTURE(name(impl));
      const Whole ref = whole(x, l, AffineAxis::inner, nullptr, nullptr, 1e-5f, out);
      std::vector<norm_math::Statistics> st(2);
      VecF mean(2), invstd(2);
      const Tensor y = norm_cpu::forward(x, l, AffineAxis::inner, nullptr, nullptr, 1e-5f, out, st.data(),
                                         mean.data(), invstd.data(), impl);
      CHECK(bits(mean[0]) == 0x7fc00000u);
      CHECK(same(st[0].m2, ref.stats[0].m2));
      // Every code of y, NaNs included, as the formulas and from_f32 give it.
      CHECK(std::memcmp(y.raw(), ref.y.raw(), y.bytes()) == 0);
      // With given (finite) statistics, as BatchNorm's eval mode, the NaN x
      // gives one NaN y among finite ones: canonical too.
      const VecF gm{0.5f, 1.0f}, gi{2.0f, 0.5f};
      VecF m2 = gm, i2 = gi;
      const Whole ref_given = whole(x, l, AffineAxis::inner, nullptr, nullptr, 1e-5f, out, &gm, &gi);
      const Tensor yg = norm_cpu::forward(x, l, AffineAxis::inner, nullptr, nullptr, 1e-5f, out, nullptr,
                                          m2.data(), i2.data(), impl);
      CHECK(std::isnan(yg.value(77)));
      CHECK(std::isfinite(yg.value(76)));
      CHECK(std::memcmp(yg.raw(), ref_given.y.raw(), yg.bytes()) == 0);
    }
}

TEST_CASE("norm_cpu::forward reads a scaled tensor as to_f32 does, and refuses a layout of another size") {
  const Layout l{2, 2, 70};
  const VecF xv = to_float(normals(280, 0.3, 1.0, 40));
  const Tensor x = Tensor::from_f32_scaled(xv.data(), {2, 2, 70}, DType::f16, 8.0f);
  for (Implementation impl : kImpls) {
    const Whole ref = whole(x, l, AffineAxis::channel, nullptr, nullptr, 1e-5f, DType::f32);
    std::vector<norm_math::Statistics> st(2);
    VecF mean(2), invstd(2);
    const Tensor y = norm_cpu::forward(x, l, AffineAxis::channel, nullptr, nullptr, 1e-5f, DType::f32,
                                       st.data(), mean.data(), invstd.data(), impl);
    CHECK(first_difference(y, ref.y) == -1);
    CHECK(bits(mean[1]) == bits(ref.mean[1]));
  }
  VecF mean(2), invstd(2);
  CHECK_THROWS_WITH_AS(norm_cpu::forward(x, Layout{2, 2, 71}, AffineAxis::channel, nullptr, nullptr, 1e-5f,
                                         DType::f32, nullptr, mean.data(), invstd.data()),
                       "norm_cpu::forward: x has 280 elements but the layout (2, 2, 71) has 284",
                       std::invalid_argument);
}

// --- the layers on runs that fill blocks ---------------------------------------------

TEST_CASE("BatchNorm and LayerNorm with long runs: FP64 two-pass references and norm_math<float> exactly") {
  const auto f16 = uniform_policy(DType::f16);
  // BatchNorm [3, 4, 10, 13]: 130 values per (n, c) run, 390 per channel.
  {
    BatchNorm bn(4);
    bn.apply_policy(*f16);
    Context ctx(f16);
    const VecF xv = to_float(normals(std::size_t{3} * 4 * 130, 5.0, 2.0, 50));
    const Tensor x = tensor(xv, {3, 4, 10, 13}, DType::f16);
    const Tensor y = bn.forward(x, ctx);
    const VecF xw = widened(x), yv = widened(y);
    for (std::int64_t c = 0; c < 4; ++c) {
      // The FP64 two-pass statistics of the channel, written out.
      double sum = 0, sq = 0;
      for (std::int64_t n = 0; n < 3; ++n)
        for (std::int64_t i = 0; i < 130; ++i) sum += xw[static_cast<std::size_t>((n * 4 + c) * 130 + i)];
      const double mean = sum / 390;
      for (std::int64_t n = 0; n < 3; ++n)
        for (std::int64_t i = 0; i < 130; ++i) {
          const double d = xw[static_cast<std::size_t>((n * 4 + c) * 130 + i)] - mean;
          sq += d * d;
        }
      const double invstd = 1 / std::sqrt(sq / 390 + 1e-5);
      CHECK(bn.mean().value(c) == doctest::Approx(mean).epsilon(1e-6));
      CHECK(bn.invstd().value(c) == doctest::Approx(invstd).epsilon(1e-5));
      for (std::int64_t n = 0; n < 3; ++n)
        for (std::int64_t i = 0; i < 130; ++i) {
          const auto e = static_cast<std::size_t>((n * 4 + c) * 130 + i);
          const double ref = (xw[e] - mean) * invstd;  // γ = 1, β = 0
          // Half an fp16 ulp of the result, plus FP32 error on |x|·invstd.
          const double ulp = std::ldexp(1.0, std::max(std::ilogb(std::fabs(ref) + 1e-30), -14) - 10);
          CHECK(std::fabs(yv[e] - ref) <= 0.5 * ulp + 1e-5 * std::fabs(xw[e]) * invstd);
        }
    }
    // And the layer is norm_math<float> on the widened input, rounded once.
    const Layout l{3, 4, 130};
    const Whole ref = whole(x, l, AffineAxis::channel, nullptr, nullptr, 1e-5f, DType::f16);
    const VecF ones(4, 1.0f), zeros(4, 0.0f);
    const Whole ref_affine = whole(x, l, AffineAxis::channel, ones.data(), zeros.data(), 1e-5f, DType::f16);
    CHECK(first_difference(y, ref_affine.y) == -1);
    for (std::int64_t c = 0; c < 4; ++c)
      CHECK(bits(bn.mean().value(c)) == bits(ref.mean[static_cast<std::size_t>(c)]));
  }
  // LayerNorm over 200 values, 6 rows, γ and β not trivial.
  {
    LayerNorm ln({200});
    const VecF g = to_float(normals(200, 1.0, 0.3, 60)), be = to_float(normals(200, 0.0, 0.3, 61));
    ln.weight = Parameter("weight", tensor(g, {200}, DType::f32));
    ln.bias = Parameter("bias", tensor(be, {200}, DType::f32));
    ln.apply_policy(*f16);
    Context ctx(f16);
    const Tensor x = tensor(to_float(normals(1200, -3.0, 4.0, 62)), {6, 200}, DType::f16);
    const Tensor y = ln.forward(x, ctx);
    const VecF wf = widened(ln.weight.weights()), bf = widened(ln.bias.weights());
    const Whole ref = whole(x, Layout{1, 6, 200}, AffineAxis::inner, wf.data(), bf.data(), 1e-5f, DType::f16);
    CHECK(first_difference(y, ref.y) == -1);
    for (std::int64_t r = 0; r < 6; ++r) {
      CHECK(bits(ln.mean().value(r)) == bits(ref.mean[static_cast<std::size_t>(r)]));
      CHECK(bits(ln.rstd().value(r)) == bits(ref.invstd[static_cast<std::size_t>(r)]));
      const TwoPass tp = two_pass(widened(x).data() + r * 200, 200);
      CHECK(ln.mean().value(r) == doctest::Approx(tp.mean).epsilon(1e-6));
      CHECK(ln.rstd().value(r) == doctest::Approx(1 / std::sqrt(tp.m2 / 200 + 1e-5)).epsilon(1e-5));
    }
  }
}
