// Chapter 07 — FP8 training: the FP8 GEMM (fp8/gemm.hpp) bit for bit
// decode-then-gemm_fma, and within a stated bound of the exact product.
// Depends on: mpt/fp8/gemm.hpp, mpt/fp8/quantize.hpp, mpt/nn/cpu/gemm.hpp,
// test_support.hpp.
//
// The bound. The operands' values are â = code_a / s_a and b̂ = code_b / s_b
// exactly (in double). Each product code_a·code_b is exact in FP32 (4 × 4
// significant bits), the chain of K fused multiply-adds rounds K times, the
// descale d = fl(fl(1/s_a)·fl(1/s_b)) carries three roundings, the multiply
// by d one more and the bias's addition one: every computed output c obeys
//   |c − Σ_k â_k·b̂_k − bias| ≤ γ_{K+5} · (Σ_k |â_k·b̂_k| + |bias|),
// γ_n = n·u / (1 − n·u), u = 2^-24 — with f32 output. A bf16 or f16 output
// is that f32 result rounded once (checked bit for bit).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mpt/core/tensor.hpp"
#include "mpt/fp8/gemm.hpp"
#include "mpt/fp8/quantize.hpp"
#include "mpt/nn/cpu/gemm.hpp"
#include "test_support.hpp"

namespace {

using mpt::DType;
using mpt::Op;
using mpt::Tensor;
using mpt_test::bits;

// A deterministic spread of magnitudes: ±(0.5 .. 2) × 2^(−6 .. 5).
std::vector<float> values(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  std::uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (float& x : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    const double m = 0.5 + 1.5 * static_cast<double>(s >> 40) / static_cast<double>(1ULL << 24);
    const int e = static_cast<int>((s >> 20) % 12) - 6;
    x = static_cast<float>(((s >> 19) & 1U ? -m : m) * std::ldexp(1.0, e));
  }
  return v;
}

// An FP8 operand [rows, cols] with `scale`, and its codes from the fp8
// tier's own encode (quantize_with_scale), which the test decodes itself.
struct Operand {
  Tensor t;
  mpt::fp8::Fp8Tensor q;
};
Operand operand(std::int64_t rows, std::int64_t cols, DType d, float scale, std::uint64_t seed) {
  const std::vector<float> x = values(static_cast<std::size_t>(rows * cols), seed);
  return {Tensor::from_f32_scaled(x.data(), {rows, cols}, d, scale),
          mpt::fp8::quantize_with_scale(x.data(), x.size(), d, scale)};
}

// The codes as numbers, decoded through the formats tier.
std::vector<float> decoded(const mpt::fp8::Fp8Tensor& q) {
  std::vector<float> v(q.codes.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = mpt::decode(q.codes[i], q.spec());
  return v;
}

struct Case {
  std::int64_t m, n, k;
  Op op_a, op_b;
  DType da, db;
  float sa, sb;
};

// Stored shapes of op(A) [m, k] and op(B) [k, n].
std::int64_t a_rows(const Case& c) { return c.op_a == Op::N ? c.m : c.k; }
std::int64_t a_cols(const Case& c) { return c.op_a == Op::N ? c.k : c.m; }
std::int64_t b_rows(const Case& c) { return c.op_b == Op::N ? c.k : c.n; }
std::int64_t b_cols(const Case& c) { return c.op_b == Op::N ? c.n : c.k; }

const Case kCases[] = {
    {7, 5, 33, Op::N, Op::T, DType::e4m3, DType::e4m3, 3.0f, 0.7f},     // forward: x · Wᵀ
    {6, 9, 40, Op::N, Op::N, DType::e5m2, DType::e4m3, 1000.0f, 5.5f},  // dx = dy · W
    {9, 4, 17, Op::T, Op::N, DType::e5m2, DType::e4m3, 0.01f, 448.0f},  // dW = dyᵀ · x
    {3, 3, 300, Op::T, Op::T, DType::e4m3, DType::e5m2, 16.0f, 0.25f},  // powers of two
};

}  // namespace

TEST_CASE("fp8_gemm is decode-then-gemm_fma, descaled and rounded once, bit for bit") {
  int which = 0;
  for (const Case& c : kCases) {
    INFO("case " << which);
    const Operand a = operand(a_rows(c), a_cols(c), c.da, c.sa, 11 + which);
    const Operand b = operand(b_rows(c), b_cols(c), c.db, c.sb, 23 + which);
    const std::vector<float> bias_v = values(static_cast<std::size_t>(c.n), 5);
    const Tensor bias = Tensor::from_f32(bias_v.data(), {c.n}, DType::bf16);
    ++which;
    // The reference: the codes decoded, the library's one order, then the epilogue.
    const std::vector<float> ad = decoded(a.q), bd = decoded(b.q);
    std::vector<float> acc(static_cast<std::size_t>(c.m * c.n));
    mpt::gemm_fma(c.m, c.n, c.k, ad.data(), a_cols(c), c.op_a, bd.data(), b_cols(c), c.op_b, acc.data(), c.n);
    const float d = (1.0f / c.sa) * (1.0f / c.sb);
    std::vector<float> want(acc.size()), bias_f(static_cast<std::size_t>(c.n));
    bias.to_f32(bias_f.data());
    for (std::size_t i = 0; i < acc.size(); ++i)
      want[i] = acc[i] * d + bias_f[i % static_cast<std::size_t>(c.n)];
    const Tensor y = mpt::fp8::fp8_gemm(a.t, c.op_a, b.t, c.op_b, DType::f32, &bias);
    REQUIRE(y.shape() == mpt::Shape{c.m, c.n});
    bool same = true;
    for (std::size_t i = 0; i < want.size(); ++i) same = same && bits(y.f32_data()[i]) == bits(want[i]);
    CHECK(same);
    // bf16 and f16 outputs: the f32 result rounded once.
    for (DType out : {DType::bf16, DType::f16}) {
      const Tensor lo = mpt::fp8::fp8_gemm(a.t, c.op_a, b.t, c.op_b, out, &bias);
      const Tensor once = Tensor::from_f32(want.data(), {c.m, c.n}, out);
      std::vector<float> l(want.size()), o(want.size());
      lo.to_f32(l.data());
      once.to_f32(o.data());
      bool same_lo = lo.dtype() == out;
      for (std::size_t i = 0; i < l.size(); ++i) same_lo = same_lo && bits(l[i]) == bits(o[i]);
      CHECK(same_lo);
    }
  }
}

TEST_CASE("fp8_gemm is within gamma_{K+5} of the exact product of the scaled values") {
  const double u = std::ldexp(1.0, -24);
  int which = 0;
  for (const Case& c : kCases) {
    INFO("case " << which);
    const Operand a = operand(a_rows(c), a_cols(c), c.da, c.sa, 31 + which);
    const Operand b = operand(b_rows(c), b_cols(c), c.db, c.sb, 43 + which);
    ++which;
    const std::vector<float> ad = decoded(a.q), bd = decoded(b.q);
    const Tensor y = mpt::fp8::fp8_gemm(a.t, c.op_a, b.t, c.op_b, DType::f32);
    const double gamma = static_cast<double>(c.k + 5) * u / (1.0 - static_cast<double>(c.k + 5) * u);
    double worst = 0;  // the largest error as a fraction of its bound
    for (std::int64_t i = 0; i < c.m; ++i)
      for (std::int64_t j = 0; j < c.n; ++j) {
        double exact = 0, mag = 0;
        for (std::int64_t k = 0; k < c.k; ++k) {
          const double av =
              static_cast<double>(
                  ad[static_cast<std::size_t>(c.op_a == Op::N ? i * a_cols(c) + k : k * a_cols(c) + i)]) /
              static_cast<double>(c.sa);
          const double bv =
              static_cast<double>(
                  bd[static_cast<std::size_t>(c.op_b == Op::N ? k * b_cols(c) + j : j * b_cols(c) + k)]) /
              static_cast<double>(c.sb);
          exact += av * bv;
          mag += std::fabs(av * bv);
        }
        const double err = std::fabs(static_cast<double>(y.f32_data()[i * c.n + j]) - exact);
        worst = std::max(worst, err / (gamma * mag + 1e-300));
      }
    CHECK(worst <= 1.0);
    // The bound is not vacuous: FP32 accumulation does err (the error is a
    // visible fraction of it somewhere in the larger cases).
    if (c.k >= 33) CHECK(worst > 1e-3);
  }
}

TEST_CASE("fp8_gemm refuses what is not an FP8 product") {
  const std::vector<float> x = values(6, 1);
  const Tensor f = Tensor::from_f32(x.data(), {2, 3}, DType::bf16);
  const Tensor e = Tensor::from_f32_scaled(x.data(), {2, 3}, DType::e4m3, 2.0f);
  CHECK_THROWS_WITH_AS(mpt::fp8::fp8_gemm(f, Op::N, e, Op::T, DType::f32),
                       doctest::Contains("valid: e4m3, e5m2"), std::invalid_argument);
  CHECK_THROWS_AS(mpt::fp8::fp8_gemm(e, Op::N, e, Op::N, DType::f32), std::invalid_argument);  // 3 vs 2
  const Tensor bias = Tensor::from_f32(x.data(), {3}, DType::f32);
  CHECK_THROWS_WITH_AS(mpt::fp8::fp8_gemm(e, Op::N, e, Op::T, DType::f32, &bias), doctest::Contains("bias"),
                       std::invalid_argument);
}

TEST_CASE("the MX GEMM: block scales along k, each element read exactly, the one order") {
  // A [m, k] and B [n, k] quantized in blocks of 32 along k (k = 80: two full
  // blocks and one of 16). Reference 1: the elements read back (code × 2^e,
  // exact) in gemm_fma's order, bit for bit. Reference 2: the exact product
  // in double, within gamma_{K+1} (K chain roundings and the bias's).
  const std::int64_t m = 5, n = 4, k = 80;
  std::vector<float> xa = values(static_cast<std::size_t>(m * k), 71),
                     xb = values(static_cast<std::size_t>(n * k), 73);
  xa[7] = 3000.0f;  // an outlier: only its own block's scale follows it
  xb[40] = -1e-3f;  // a small block neighbour in B's second block
  const std::vector<float> bias_v = values(static_cast<std::size_t>(n), 9);
  const Tensor bias = Tensor::from_f32(bias_v.data(), {n}, DType::f32);
  const double u = std::ldexp(1.0, -24);
  for (const mpt::fp8::MxScaleRule rule : {mpt::fp8::MxScaleRule::floor, mpt::fp8::MxScaleRule::rceil}) {
    const auto qa = mpt::fp8::quantize_mx(xa.data(), m, k, DType::e4m3, rule);
    const auto qb = mpt::fp8::quantize_mx(xb.data(), n, k, DType::e4m3, rule);
    REQUIRE(qa.scales.size() == static_cast<std::size_t>(m * 3));
    const Tensor y = mpt::fp8::fp8_gemm_mx(qa, qb, DType::f32, &bias);
    const std::vector<float> ra = mpt::fp8::dequantize(qa), rb = mpt::fp8::dequantize(qb);
    std::vector<float> want(static_cast<std::size_t>(m * n));
    mpt::gemm_fma(m, n, k, ra.data(), k, Op::N, rb.data(), k, Op::T, want.data(), n);
    bool same = true;
    double worst = 0;
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        const auto at = static_cast<std::size_t>(i * n + j);
        same = same && bits(y.f32_data()[at]) == bits(want[at] + bias_v[static_cast<std::size_t>(j)]);
        // The exact product from codes and E8M0 exponents, in double.
        double exact = bias_v[static_cast<std::size_t>(j)], mag = std::fabs(exact);
        for (std::int64_t kk = 0; kk < k; ++kk) {
          const auto ia = static_cast<std::size_t>(i * k + kk), ib = static_cast<std::size_t>(j * k + kk);
          const double av = static_cast<double>(mpt::decode(qa.codes[ia], qa.spec())) /
                            static_cast<double>(qa.scales[qa.scale_index(ia)]);
          const double bv = static_cast<double>(mpt::decode(qb.codes[ib], qb.spec())) /
                            static_cast<double>(qb.scales[qb.scale_index(ib)]);
          exact += av * bv;
          mag += std::fabs(av * bv);
        }
        const double gamma = static_cast<double>(k + 1) * u / (1.0 - static_cast<double>(k + 1) * u);
        worst = std::max(worst, std::fabs(static_cast<double>(y.f32_data()[at]) - exact) / (gamma * mag));
      }
    CHECK(same);
    CHECK(worst <= 1.0);
  }
  // Per-tensor scaling lets the outlier set the one scale of A: the rest of
  // A loses bits it keeps under MX, and the product is further from x's.
  const float sa = 448.0f / mpt::fp8::amax_of(xa.data(), xa.size());
  const float sb = 448.0f / mpt::fp8::amax_of(xb.data(), xb.size());
  const Tensor ta = Tensor::from_f32_scaled(xa.data(), {m, k}, DType::e4m3, sa);
  const Tensor tb = Tensor::from_f32_scaled(xb.data(), {n, k}, DType::e4m3, sb);
  const Tensor per_tensor = mpt::fp8::fp8_gemm(ta, Op::N, tb, Op::T, DType::f32);
  const Tensor mx = mpt::fp8::fp8_gemm_mx(
      mpt::fp8::quantize_mx(xa.data(), m, k, DType::e4m3, mpt::fp8::MxScaleRule::rceil),
      mpt::fp8::quantize_mx(xb.data(), n, k, DType::e4m3, mpt::fp8::MxScaleRule::rceil), DType::f32);
  double err_tensor = 0, err_mx = 0;
  for (std::int64_t i = 1; i < m; ++i)  // rows without the outlier
    for (std::int64_t j = 0; j < n; ++j) {
      double exact = 0;
      for (std::int64_t kk = 0; kk < k; ++kk)
        exact += static_cast<double>(xa[static_cast<std::size_t>(i * k + kk)]) *
                 static_cast<double>(xb[static_cast<std::size_t>(j * k + kk)]);
      err_tensor += std::fabs(per_tensor.f32_data()[i * n + j] - exact);
      err_mx += std::fabs(mx.f32_data()[i * n + j] - exact);
    }
  CHECK(err_mx < err_tensor);
  // Refused: an operand without block scales, or different k.
  const auto flat = mpt::fp8::quantize_with_scale(xa.data(), xa.size(), DType::e4m3, 1.0f);
  const auto qa = mpt::fp8::quantize_mx(xa.data(), m, k, DType::e4m3, mpt::fp8::MxScaleRule::floor);
  const auto short_b = mpt::fp8::quantize_mx(xb.data(), n, k - 8, DType::e4m3, mpt::fp8::MxScaleRule::floor);
  CHECK_THROWS_WITH_AS(mpt::fp8::fp8_gemm_mx(flat, qa, DType::f32), doctest::Contains("block scales"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(mpt::fp8::fp8_gemm_mx(qa, short_b, DType::f32), doctest::Contains("one k"),
                       std::invalid_argument);
}
