// Chapter 02 — loss scaling and FP32 master weights: the GPU-style GEMM
// (f16/bf16 inputs, FP32 accumulation, one rounding of the result), its one
// summation order (a fused multiply-add chain per output in k order, the
// GPU kernels' order) and the fp16-accumulate pitfall GEMM.
// Depends on: mpt/nn/cpu/gemm.hpp, mpt/nn/data/data.hpp (Rng), Chapter 1 rounding,
// test_ch02_gemm_cases.hpp (the naive loop, the shapes, the special values).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "mpt/formats/rounding.hpp"
#include "mpt/nn/cpu/gemm.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/parameter.hpp"
#include "test_ch02_gemm_cases.hpp"

using namespace mpt;

namespace {

// A matrix of small integers in [-r, r]: every product and partial sum of a
// short GEMM is an exact small integer in fp16/bf16/fp32 (CUTLASS's trick
// for bit-exact checks).
MatrixF small_ints(Eigen::Index rows, Eigen::Index cols, int r, std::uint64_t seed) {
  Rng rng(seed);
  MatrixF m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i)
    m.data()[i] = static_cast<float>(static_cast<int>(rng.below(2 * r + 1)) - r);
  return m;
}

MatrixF normals(Eigen::Index rows, Eigen::Index cols, std::uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  MatrixF m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(scale * rng.normal());
  return m;
}

Eigen::MatrixXd op(const MatrixF& m, Op o) {
  Eigen::MatrixXd d = m.cast<double>();
  return o == Op::T ? Eigen::MatrixXd(d.transpose()) : d;
}

/// Element (r, c) of a tensor's matrix view, widened to f32.
float at(const Tensor& t, Eigen::Index r, Eigen::Index c) { return t.value(r * t.cols() + c); }

bool same_bits(const MatrixF& a, const MatrixF& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  for (Eigen::Index i = 0; i < a.size(); ++i) {
    const float x = a.data()[i], y = b.data()[i];
    if (!(x == y || (std::isnan(x) && std::isnan(y)))) return false;
    if (x == 0 && std::signbit(x) != std::signbit(y)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("gemm: small-integer inputs are bit-exact in every precision and transpose") {
  const MatrixF a = small_ints(6, 9, 4, 1), b = small_ints(9, 5, 4, 2);
  const Eigen::MatrixXd want = a.cast<double>() * b.cast<double>();
  for (DType p : {DType::f32, DType::f16, DType::bf16})
    for (Op oa : {Op::N, Op::T})
      for (Op ob : {Op::N, Op::T}) {
        CAPTURE(std::string(dtype_name(p)));
        const MatrixF as = oa == Op::N ? a : MatrixF(a.transpose());
        const MatrixF bs = ob == Op::N ? b : MatrixF(b.transpose());
        const Tensor c = gemm(Tensor::from_matrix(as, p), oa, Tensor::from_matrix(bs, p), ob, p);
        CHECK(c.dtype() == p);
        CHECK(c.to_matrix().cast<double>() == want);  // |entries| <= 144: exact everywhere
      }
}

TEST_CASE("gemm: fp16 inputs, fp32 accumulation, one rounding of the result") {
  const MatrixF a = normals(16, 64, 3), b = normals(64, 12, 4);
  const Tensor a16 = Tensor::from_matrix(a, DType::f16), b16 = Tensor::from_matrix(b, DType::f16);
  const Tensor c = gemm(a16, Op::N, b16, Op::N, DType::f16);
  // By definition: the fp32 product of the widened inputs, rounded once.
  const MatrixF acc = matmul<float>(a16.to_matrix(), Op::N, b16.to_matrix(), Op::N);
  CHECK(same_bits(c.to_matrix(), Tensor::from_matrix(acc, DType::f16).to_matrix()));
  // Against exact (double) products of the stored inputs: the fp32 sum is
  // within K·u32·Σ|a||b| (standard dot-product bound, K = 64), and the
  // output rounding adds at most half an fp16 ulp of the result.
  const Eigen::MatrixXd exact = a16.to_matrix().cast<double>() * b16.to_matrix().cast<double>();
  const Eigen::MatrixXd absum =
      a16.to_matrix().cast<double>().cwiseAbs() * b16.to_matrix().cast<double>().cwiseAbs();
  const MatrixF got = c.to_matrix();
  for (Eigen::Index i = 0; i < exact.rows(); ++i)
    for (Eigen::Index j = 0; j < exact.cols(); ++j) {
      const double half_ulp16 = std::ldexp(1.0, std::max(std::ilogb(exact(i, j)), -14) - 11);
      CHECK(std::fabs(got(i, j) - exact(i, j)) <= half_ulp16 + 64 * std::ldexp(1.0, -24) * absum(i, j));
    }
}

TEST_CASE("gemm: fp32 inputs match an FP64 reference within the dot-product bound") {
  const MatrixF a = normals(9, 33, 5), b = normals(12, 33, 6);
  const Tensor c =
      gemm(Tensor::from_matrix(a, DType::f32), Op::N, Tensor::from_matrix(b, DType::f32), Op::T, DType::f32);
  const Eigen::MatrixXd exact = op(a, Op::N) * op(b, Op::T);
  const Eigen::MatrixXd absum = op(a, Op::N).cwiseAbs() * op(b, Op::T).cwiseAbs();
  const MatrixF got = c.to_matrix();
  for (Eigen::Index i = 0; i < exact.rows(); ++i)
    for (Eigen::Index j = 0; j < exact.cols(); ++j)
      CHECK(std::fabs(got(i, j) - exact(i, j)) <= 33 * std::ldexp(1.0, -24) * absum(i, j));
}

TEST_CASE("gemm: the fp32 accumulator does not stagnate; the fp16 one does (pitfall)") {
  // 4096 products of 1·1. In fp32 the sum reaches 4096 (exact in fp16 too).
  // In an fp16 accumulator 2048 + 1 is a tie between 2048 and 2050 and
  // rounds to even: the sum is stuck at 2048 for good.
  const MatrixF ones_row = MatrixF::Ones(1, 4096), ones_col = MatrixF::Ones(4096, 1);
  const Tensor a = Tensor::from_matrix(ones_row, DType::f16), b = Tensor::from_matrix(ones_col, DType::f16);
  CHECK(at(gemm(a, Op::N, b, Op::N, DType::f16), 0, 0) == 4096.0f);
  CHECK(at(gemm_fp16_accumulate(a, Op::N, b, Op::N), 0, 0) == 2048.0f);
}

TEST_CASE("gemm_fp16_accumulate: one fp16 rounding per multiply-add") {
  // Independent oracle: Eigen::half arithmetic (float op, then rounded to
  // half). With small-integer inputs the products are exact fp16 values,
  // so a fused multiply-add and Eigen's separate multiply and add agree;
  // sums pass 2048, where fp16's spacing becomes 2 and rounding kicks in.
  const MatrixF a = small_ints(5, 200, 16, 7), b = small_ints(200, 4, 16, 8);
  const Tensor a16 = Tensor::from_matrix(a.cwiseAbs(), DType::f16);
  const Tensor b16 = Tensor::from_matrix(b.cwiseAbs(), DType::f16);
  const MatrixF got = gemm_fp16_accumulate(a16, Op::N, b16, Op::N).to_matrix();
  bool some_rounding = false;
  for (Eigen::Index i = 0; i < 5; ++i)
    for (Eigen::Index j = 0; j < 4; ++j) {
      Eigen::half acc(0.0f);
      double exact = 0;
      for (Eigen::Index k = 0; k < 200; ++k) {
        acc = acc + Eigen::half(std::fabs(a(i, k))) * Eigen::half(std::fabs(b(k, j)));
        exact += std::fabs(a(i, k)) * std::fabs(b(k, j));
      }
      CHECK(got(i, j) == static_cast<float>(acc));
      some_rounding |= got(i, j) != exact;
    }
  CHECK(some_rounding);  // the demo really loses something
  // Transposes read the same data.
  const Tensor aT = Tensor::from_matrix(MatrixF(a.cwiseAbs().transpose()), DType::f16);
  CHECK(same_bits(gemm_fp16_accumulate(aT, Op::T, b16, Op::N).to_matrix(), got));
  // Only fp16 inputs.
  CHECK_THROWS_AS(gemm_fp16_accumulate(Tensor::from_matrix(a, DType::bf16), Op::N,
                                       Tensor::from_matrix(b, DType::bf16), Op::N),
                  std::invalid_argument);
}

TEST_CASE("gemm_fp16_accumulate: a fused multiply-add rounds once (round-to-odd path)") {
  // acc = 2^-11 after the first term. The second product is
  // (1 + 2^-10)^2 = 1 + 2^-9 + 2^-20, not an fp16 value.
  //   fused (HFMA): fp16(2^-11 + 1 + 2^-9 + 2^-20) = 1 + 3·2^-10 (above the tie)
  //   product rounded first: fp16(1 + 2^-9) = 1 + 2^-9, then
  //   fp16(1 + 2^-9 + 2^-11) is a tie → even → 1 + 2^-9.
  MatrixF a(1, 2), b(2, 1);
  a << 0x1.0p-11f, 1.0f + 0x1.0p-10f;
  b << 1.0f, 1.0f + 0x1.0p-10f;
  const Tensor c = gemm_fp16_accumulate(Tensor::from_matrix(a, DType::f16), Op::N,
                                        Tensor::from_matrix(b, DType::f16), Op::N);
  CHECK(at(c, 0, 0) == 1.0f + 3 * 0x1.0p-10f);
  // A tie in the running sum itself still rounds to even: 1 + 2^-11 → 1.
  MatrixF t(1, 2), u(2, 1);
  t << 1.0f, 0x1.0p-11f;
  u << 1.0f, 1.0f;
  CHECK(at(gemm_fp16_accumulate(Tensor::from_matrix(t, DType::f16), Op::N, Tensor::from_matrix(u, DType::f16),
                                Op::N),
           0, 0) == 1.0f);
}

TEST_CASE("gemm: output overflow follows the output format") {
  MatrixF a(1, 2), b(2, 1);
  a << 60000.0f, 60000.0f;
  b << 1.0f, 1.0f;
  const Tensor a16 = Tensor::from_matrix(a, DType::f16), b16 = Tensor::from_matrix(b, DType::f16);
  CHECK(std::isinf(at(gemm(a16, Op::N, b16, Op::N, DType::f16), 0, 0)));
  CHECK(at(gemm(a16, Op::N, b16, Op::N, DType::f32), 0, 0) == 120000.0f);
  CHECK(at(gemm(a16, Op::N, b16, Op::N, DType::bf16), 0, 0) ==
        round_value(120000.0f, format_of(DType::bf16)));
}

TEST_CASE("gemm_bias: the bias joins the fp32 accumulator before the single rounding") {
  // acc = 1 + 2^-11 (exact in fp32, a tie in fp16); bias 2^-20 tips it up.
  // Rounding acc first and then adding the bias would give 1.
  MatrixF a(1, 2), b(2, 1), bias(1, 1);
  a << 1.0f, 0x1.0p-11f;
  b << 1.0f, 1.0f;
  bias << 0x1.0p-20f;
  const Tensor a16 = Tensor::from_matrix(a, DType::f16), b16 = Tensor::from_matrix(b, DType::f16);
  const Tensor bias16 = Tensor::from_matrix(bias, DType::f16);
  CHECK(at(bias16, 0, 0) == 0x1.0p-20f);  // an fp16 subnormal, exact
  CHECK(at(gemm(a16, Op::N, b16, Op::N, DType::f16, &bias16), 0, 0) == 1.0f + 0x1.0p-10f);
  CHECK(at(gemm(a16, Op::N, b16, Op::N, DType::f16), 0, 0) == 1.0f);
  const Tensor wrong_bias(DType::f16, {3});
  CHECK_THROWS_WITH_AS(gemm(a16, Op::N, b16, Op::N, DType::f16, &wrong_bias),
                       doctest::Contains("the bias must have 1 elements"), std::invalid_argument);
}

TEST_CASE("gemm: operand errors are explicit") {
  const Tensor a(DType::f16, {2, 3}), b(DType::bf16, {3, 2}), c(DType::f16, {4, 2});
  CHECK_THROWS_WITH_AS(gemm(a, Op::N, b, Op::N, DType::f16), doctest::Contains("inputs are f16 and bf16"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(gemm(a, Op::N, c, Op::N, DType::f16),
                       doctest::Contains("op(a) is 2x3 but op(b) is 4x2"), std::invalid_argument);
  // A Parameter's model copy is an operand as it is stored, in its dtype.
  const Parameter w = make_parameter("w", MatrixF::Ones(2, 3), DType::f16);
  CHECK(gemm(a, Op::N, w.weights(), Op::T, DType::f32).shape() == Shape{2, 2});
  // 3-D operands have no matrix view: a clear error, no reinterpretation.
  CHECK_THROWS_WITH_AS(gemm(Tensor(DType::f16, {2, 3, 1}), Op::N, c, Op::N, DType::f16),
                       doctest::Contains("a matrix view needs a 1-D or 2-D tensor"), std::logic_error);
}

// --- one summation order: the contract, bit for bit ---------------------------------

TEST_CASE("gemm_fma: every element is one fma chain in k order from +0, on every shape and every Op") {
  // The contract of gemm.hpp and of the GPU kernels (kernels/nn/gemm_fp16.cu),
  // against the naive loop, for the portable micro-kernel and for whatever
  // this CPU runs by default (the AVX2 one where there is AVX2 + FMA).
  std::uint64_t seed = 1;
  for (const auto& s : gemm_cases::shapes())
    for (Op oa : {Op::N, Op::T})
      for (Op ob : {Op::N, Op::T})
        for (auto v : {gemm_cases::Values::spread, gemm_cases::Values::special}) {
          const auto o = gemm_cases::make<float>(s[0], s[1], s[2], oa, ob, seed++, v);
          CAPTURE(o.name());
          CAPTURE(v == gemm_cases::Values::special);
          const std::vector<float> want = gemm_cases::naive(o);
          CHECK(gemm_cases::differing(o, gemm_cases::run(o, Implementation::portable), want) == 0);
          CHECK(gemm_cases::differing(o, gemm_cases::run(o, Implementation::automatic), want) == 0);
          // The data can tell orders apart: the same products summed from
          // k = K-1 down give other bits (for K >= 3 and a few outputs).
          if (v == gemm_cases::Values::spread && o.k >= 3 && o.m * o.n >= 8)
            CHECK(gemm_cases::differing(o, gemm_cases::naive(o, true), want) > 0);
        }
}

TEST_CASE("gemm_fma: K = 0 gives +0; the signs of zero follow the chain from +0") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> c(6, nan);
  const float none = 1.0f;
  gemm_fma(2, 3, 0, &none, 1, Op::N, &none, 3, Op::N, c.data(), 3);
  for (float v : c) CHECK((v == 0.0f && !std::signbit(v)));
  // Products that are all -0 (exactly): fma(-0·1, +0) = +0 — the chain
  // starts at +0, as the GPU kernels' does; both impls agree.
  const std::vector<float> neg0 = {-0.0f, -0.0f, -0.0f}, ones = {1.0f, 1.0f, 1.0f};
  for (auto impl : {Implementation::portable, Implementation::automatic}) {
    float r = nan;
    gemm_fma(1, 1, 3, neg0.data(), 3, Op::N, ones.data(), 1, Op::N, &r, 1, impl);
    CHECK((r == 0.0f && !std::signbit(r)));
    // A negative product too small for a float is -0 after its fma, and
    // the -0 products after it keep the chain at -0 (-0 + -0 = -0).
    const std::vector<float> a = {-0x1p-100f, -0.0f, 0.0f}, b = {0x1p-100f, 5.0f, -3.0f};
    gemm_fma(1, 1, 3, a.data(), 3, Op::N, b.data(), 1, Op::N, &r, 1, impl);
    CHECK((r == 0.0f && std::signbit(r)));
  }
}

TEST_CASE("gemm_fma: the FP64 reference runs the same chain in double") {
  std::uint64_t seed = 500;
  for (const auto& s : gemm_cases::shapes()) {
    if (s[0] * s[1] * s[2] > 200000) continue;  // the long ones: the float test has them
    for (Op oa : {Op::N, Op::T})
      for (Op ob : {Op::N, Op::T}) {
        const auto o =
            gemm_cases::make<double>(s[0], s[1], s[2], oa, ob, seed++, gemm_cases::Values::special);
        CAPTURE(o.name());
        CHECK(gemm_cases::differing(o, gemm_cases::run(o, Implementation::automatic), gemm_cases::naive(o)) ==
              0);
      }
  }
  // matmul<double> (the layers' reference) goes through it.
  const auto o = gemm_cases::make<double>(9, 21, 300, Op::N, Op::T, 7);
  const Eigen::Map<const Mat<double>, 0, Eigen::OuterStride<>> a(o.a.data(), 9, 300,
                                                                 Eigen::OuterStride<>(o.lda));
  const Eigen::Map<const Mat<double>, 0, Eigen::OuterStride<>> b(o.b.data(), 21, 300,
                                                                 Eigen::OuterStride<>(o.ldb));
  const Mat<double> c = matmul<double>(Mat<double>(a), Op::N, Mat<double>(b), Op::T);
  const std::vector<double> want = gemm_cases::naive(o);
  std::int64_t differ = 0;
  for (Eigen::Index i = 0; i < 9; ++i)
    for (Eigen::Index j = 0; j < 21; ++j) differ += c(i, j) != want[static_cast<std::size_t>(i * o.ldc + j)];
  CHECK(differ == 0);
}

TEST_CASE("gemm: the bias is added to the finished chain, then one rounding into the output") {
  const auto o = gemm_cases::make<float>(20, 37, 300, Op::N, Op::T, 77);
  const Eigen::Map<const MatrixF, 0, Eigen::OuterStride<>> a(o.a.data(), 20, 300,
                                                             Eigen::OuterStride<>(o.lda));
  const Eigen::Map<const MatrixF, 0, Eigen::OuterStride<>> b(o.b.data(), 37, 300,
                                                             Eigen::OuterStride<>(o.ldb));
  const Tensor at = Tensor::from_matrix(a, DType::f32), bt = Tensor::from_matrix(b, DType::f32);
  MatrixF bias = normals(1, 37, 78, 64.0);
  const Tensor biast = Tensor::from_matrix(bias, DType::f32);
  const std::vector<float> chain = gemm_cases::naive(o);
  for (DType out : {DType::f32, DType::bf16}) {
    const MatrixF got = gemm(at, Op::N, bt, Op::T, out, &biast).to_matrix();
    std::int64_t differ = 0, started_at_bias_differs = 0;
    for (Eigen::Index i = 0; i < 20; ++i)
      for (Eigen::Index j = 0; j < 37; ++j) {
        const float acc = chain[static_cast<std::size_t>(i * o.ldc + j)];
        const float want = round_value(acc + bias(0, j), format_of(out));
        differ += got(i, j) != want;
        // Starting the chain at the bias (another order) would differ.
        float from_bias = bias(0, j);
        for (Eigen::Index p = 0; p < 300; ++p) from_bias = std::fma(o.at_a(i, p), o.at_b(p, j), from_bias);
        started_at_bias_differs += round_value(from_bias, format_of(out)) != want;
      }
    CAPTURE(std::string(dtype_name(out)));
    CHECK(differ == 0);
    // (In f32 the other order shows; bf16's 8 bits mostly hide it.)
    if (out == DType::f32) CHECK(started_at_bias_differs > 0);
  }
}

TEST_CASE("gemm_fma: bad arguments are one-line errors") {
  const float x[4] = {1, 2, 3, 4};
  float c[4];
  CHECK_THROWS_WITH_AS(gemm_fma(-1, 2, 2, x, 2, Op::N, x, 2, Op::N, c, 2),
                       doctest::Contains("negative size (m=-1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(gemm_fma(2, 2, 2, x, 1, Op::N, x, 2, Op::N, c, 2),
                       doctest::Contains("lda = 1 is shorter than a row (2 elements)"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(gemm_fma(2, 2, 2, x, 2, Op::N, x, 2, Op::N, c, 1), doctest::Contains("ldc = 1"),
                       std::invalid_argument);
  const double d[4] = {1, 2, 3, 4};
  double e[4];
  CHECK_THROWS_WITH_AS(gemm_fma(2, 2, 2, d, 2, Op::N, d, 2, Op::N, e, 2, Implementation::avx2),
                       doctest::Contains("only the portable implementation"), std::invalid_argument);
  if (!avx2_available())
    CHECK_THROWS_WITH_AS(gemm_fma(2, 2, 2, x, 2, Op::N, x, 2, Op::N, c, 2, Implementation::avx2),
                         doctest::Contains("no AVX2"), std::invalid_argument);
  MatrixF m1(2, 3), m2(2, 3);
  MatrixF out;
  CHECK_THROWS_WITH_AS(multiply_into(out, m1, Op::N, m2, Op::N),
                       doctest::Contains("op(a) is 2x3 but op(b) is 2x3"), std::invalid_argument);
}
