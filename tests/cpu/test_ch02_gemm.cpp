// Chapter 02 — loss scaling and FP32 master weights: the GPU-style GEMM
// (f16/bf16 inputs, FP32 accumulation, one rounding of the result) and the
// fp16-accumulate pitfall GEMM.
// Depends on: mpt/nn/cpu/gemm.hpp, mpt/nn/data/data.hpp (Rng), Chapter 1 rounding.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "mpt/formats/rounding.hpp"
#include "mpt/nn/cpu/gemm.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/parameter.hpp"

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

TEST_CASE("gemm: Eigen's product plans with fixed cache sizes, so every machine sums in the same order") {
  // Eigen reads the caches from the CPU; its depth blocking follows the L1
  // size, and with it the grouping of the k products of each output. After
  // the library's first product the sizes are the fixed ones, whatever this
  // CPU has (a machine with 48 KiB of L1 gave other bits in the chapters).
  const MatrixF a = small_ints(3, 5, 2, 1), b = small_ints(5, 4, 2, 2);
  (void)gemm(Tensor::from_f32(a.data(), {3, 5}, DType::f32), Op::N,
             Tensor::from_f32(b.data(), {5, 4}, DType::f32), Op::N, DType::f32);
  CHECK(Eigen::l1CacheSize() == 32 * 1024);
  CHECK(Eigen::l2CacheSize() == 1024 * 1024);
  CHECK(Eigen::l3CacheSize() == 32 * 1024 * 1024);
}
