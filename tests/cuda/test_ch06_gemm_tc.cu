// Chapter 06 — per-task precision policies: the tensor-core GEMM
// (kernels/nn/gemm_tc.cu), fp16 and bf16 inputs, FP32 output, and the FP32
// CUDA-core GEMM gemm_f32 (kernels/nn/gemm_fp16.cu), against naive CPU
// references written here.
// Depends on: mpt (round_element.hpp: fp16 and bf16 encode and decode,
// codes.hpp), mpt::kernels (kernels/nn/nn_kernels.hpp), gpu_test_support.hpp.
// Without a usable GPU it exits 77 (CTest: Skipped).
//
// Two references per output, both the naive triple loop over op(A) and
// op(B) as Chapter 2's conventions define them (tests/cuda/test_ch02_gemm.cu):
//  - ref32: the products in FP32 (exact for two fp16 or two bf16 values),
//    summed in FP32 in the order k = 0..K-1, started at +0: what a CPU
//    loop gives, inf and NaN included;
//  - ref64: the same products summed in double, with sum_k |a_mk b_kn|
//    beside it, for the error bound.
// The tensor core adds in its own order with its own rounding (see the
// kernel's header comment), so outside the exact cases below the GPU is
// held to the order-independent bound of test_ch02_gemm.cu:
//     |ref64 - c| <= K * 2^-23 * sum_k |a_mk| |b_kn|
// (an inner product of K terms in any order errs by at most gamma_K =
// K u / (1 - K u) times that sum, u = 2^-24; Higham, Accuracy and Stability
// of Numerical Algorithms, 2nd ed., 2002, ch. 3; K * 2^-23 covers it with a
// factor of two to spare while K u < 1/2).
//
// Every case runs in both formats, with all four transpose combinations,
// once per poison of kPoisonBytes (C and seven guard elements after it
// filled first with 0xFF, a NaN, then with 0x5A, finite garbage), so an
// output the kernel skips, or a write past the end of C, fails in at least
// one of the two runs.
#define DOCTEST_CONFIG_IMPLEMENT
#include "gpu_test_support.hpp"
#include "kernels/nn/nn_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "mpt/formats/codes.hpp"
#include "mpt/formats/round_element.hpp"

namespace {

using mpt::cuda::Trans;
using mpt::test::DeviceArray;

/// One input format: its code type, its spec, and its special codes.
struct Fp16In {
  using Code = mpt::Fp16Code;
  static constexpr const mpt::FormatSpec& spec = mpt::formats::fp16;
  static constexpr const char* name = "fp16";
  static constexpr std::uint16_t kNaN = 0x7E00, kInf = 0x7C00, kNegInf = 0xFC00;
};
struct Bf16In {
  using Code = mpt::Bf16Code;
  static constexpr const mpt::FormatSpec& spec = mpt::formats::bf16;
  static constexpr const char* name = "bf16";
  static constexpr std::uint16_t kNaN = 0x7FC0, kInf = 0x7F80, kNegInf = 0xFF80;
};

template <class F>
std::uint16_t encode(float x) {
  return static_cast<std::uint16_t>(
      mpt::encode_exact(mpt::round_to_format(x, F::spec, mpt::RoundingMode::nearest_even,
                                             mpt::OverflowMode::infinity, mpt::SubnormalMode::keep),
                        F::spec));
}

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

struct Shape {
  int M, N, K;
};

/// op(X), rows x cols, as row-major codes stored transposed when t is set.
struct Operand {
  std::vector<std::uint16_t> codes;
  int rows, cols;
  bool t;
  const mpt::FormatSpec* spec;
  std::uint16_t& code(int r, int c) {
    return t ? codes[static_cast<std::size_t>(c) * rows + r] : codes[static_cast<std::size_t>(r) * cols + c];
  }
  float at(int r, int c) const {
    return mpt::decode(
        t ? codes[static_cast<std::size_t>(c) * rows + r] : codes[static_cast<std::size_t>(r) * cols + c],
        *spec);
  }
};

enum class Inputs { small_integers, normal };
const char* inputs_name(Inputs i) { return i == Inputs::small_integers ? "small integers" : "normal"; }

/// rows x cols values of the given kind in format F, stored as op or transposed.
template <class F>
Operand make_operand(int rows, int cols, bool t, Inputs kind, std::mt19937_64& rng) {
  Operand o{std::vector<std::uint16_t>(static_cast<std::size_t>(rows) * cols), rows, cols, t, &F::spec};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::uint16_t& c : o.codes)
    c = kind == Inputs::small_integers ? encode<F>(static_cast<float>(static_cast<int>(rng() % 17) - 8))
                                       : encode<F>(normal(rng));
  return o;
}

/// The two CPU references of the header comment, and sum_k |a_mk b_kn|.
struct Reference {
  std::vector<float> ref32;
  std::vector<double> ref64, abs_sum;
};
Reference reference_gemm(const Operand& a, const Operand& b, const Shape& s) {
  const std::size_t mn = static_cast<std::size_t>(s.M) * s.N;
  Reference r{std::vector<float>(mn), std::vector<double>(mn), std::vector<double>(mn)};
  for (int m = 0; m < s.M; ++m)
    for (int n = 0; n < s.N; ++n) {
      float acc32 = 0.0f;
      double acc64 = 0.0, abs_sum = 0.0;
      for (int k = 0; k < s.K; ++k) {
        const float x = a.at(m, k), y = b.at(k, n);
        acc32 += x * y;
        const double p = static_cast<double>(x) * y;
        acc64 += p;
        abs_sum += std::fabs(p);
      }
      const std::size_t i = static_cast<std::size_t>(m) * s.N + n;
      r.ref32[i] = acc32;
      r.ref64[i] = acc64;
      r.abs_sum[i] = abs_sum;
    }
  return r;
}

/// Uploads A and B, poisons C (M*N outputs and 7 guard elements) with
/// `poison`, runs gemm_tc and returns C with the guard elements.
template <class F>
std::vector<float> run_gpu(const Operand& a, const Operand& b, const Shape& s, Trans ta, Trans tb,
                           unsigned char poison) {
  using Code = typename F::Code;
  auto typed = [](const std::vector<std::uint16_t>& raw) {
    std::vector<Code> out;
    for (std::uint16_t c : raw) out.push_back(Code{c});
    return out;
  };
  DeviceArray<Code> d_a(typed(a.codes)), d_b(typed(b.codes));
  DeviceArray<float> d_c(static_cast<std::size_t>(s.M) * s.N + 7);
  d_c.poison(poison);
  mpt::cuda::gemm_tc(ta, tb, s.M, s.N, s.K, d_a.get(), d_b.get(), d_c.get());
  return d_c.download();
}

/// Counts the guard elements after C that no longer hold the poison.
std::size_t guards_written(const std::vector<float>& c, std::size_t mn, unsigned char poison,
                           const char* label) {
  std::size_t bad = 0;
  for (std::size_t i = mn; i < mn + 7; ++i)
    if (bits(c[i]) != bits(mpt::test::poison_value<float>(poison)) && bad++ < 3)
      std::printf("%s: guard element %zu after C was written\n", label, i - mn);
  return bad;
}

/// Checks (1), (2), (3), (5), (6) of the brief for one shape, storage, format
/// and kind of input, each with both poisons.
template <class F>
void check_case(const Shape& s, Trans ta, Trans tb, Inputs kind, std::mt19937_64& rng) {
  const bool tA = ta == Trans::yes, tB = tb == Trans::yes;
  const Operand a = make_operand<F>(s.M, s.K, tA, kind, rng);
  const Operand b = make_operand<F>(s.K, s.N, tB, kind, rng);
  const Reference ref = reference_gemm(a, b, s);
  const std::size_t mn = static_cast<std::size_t>(s.M) * s.N;
  if (kind == Inputs::small_integers) {
    // The premise of the bit-exact check: |a|, |b| <= 8 and K <= 4096 make
    // every product and partial sum an integer below 2^24 in magnitude, so
    // FP32 sums them exactly in any order: ref32 is the exact product.
    REQUIRE(s.K <= 4096);
    for (std::size_t i = 0; i < mn; ++i) REQUIRE(static_cast<double>(ref.ref32[i]) == ref.ref64[i]);
  }
  for (unsigned char poison : mpt::test::kPoisonBytes) {
    char label[160];
    std::snprintf(label, sizeof label, "%s M=%d N=%d K=%d op(A)%s op(B)%s %s, poison %#x", F::name, s.M, s.N,
                  s.K, tA ? "^T" : "", tB ? "^T" : "", inputs_name(kind), poison);
    const std::vector<float> c = run_gpu<F>(a, b, s, ta, tb, poison);
    std::size_t bad = 0, bound_bad = 0;
    double max_ratio = 0;
    for (std::size_t i = 0; i < mn; ++i) {
      const int m = static_cast<int>(i / s.N), n = static_cast<int>(i % s.N);
      if (kind == Inputs::small_integers) {
        // (1) Bit-exact: the exact integer, +0 for a zero sum (K = 0
        // included). Proves the tiles meet the right rows and columns (any
        // misplaced, missing or doubled term changes an integer) and that
        // every output is written (a poison never equals both runs' value).
        if (bits(c[i]) != bits(ref.ref32[i]) && bad++ < 5)
          std::printf("%s: C[%d][%d] want %a got %a\n", label, m, n, ref.ref32[i], c[i]);
      } else {
        // (2) The order-independent bound against the double reference.
        // Proves the accumulation is FP32 (an fp16 or bf16 accumulator, 11
        // or 8 significand bits, would exceed it) whatever order and
        // rounding the tensor core uses; a skipped output (NaN or ~1.5e16)
        // fails it.
        const double err = std::fabs(ref.ref64[i] - static_cast<double>(c[i]));
        const double bound = s.K * std::ldexp(1.0, -23) * ref.abs_sum[i];
        if (bound > 0) max_ratio = std::max(max_ratio, err / bound);
        if (!(err <= bound) && bound_bad++ < 5)
          std::printf("%s: C[%d][%d] = %a, exact %.17g: error %g above the bound %g\n", label, m, n, c[i],
                      ref.ref64[i], err, bound);
      }
    }
    // (6) Nothing is written past C.
    bad += guards_written(c, mn, poison, label);
    if (bad || bound_bad)
      std::printf("%s: %zu mismatches, %zu above the bound, max err/bound %g\n", label, bad, bound_bad,
                  max_ratio);
    CHECK_MESSAGE(bad == 0, label, ": ", bad, " outputs differ from the exact result or guards written");
    CHECK_MESSAGE(bound_bad == 0, label, ": ", bound_bad, " outputs outside K 2^-23 sum|ab|");
  }
}

/// (3) Shapes: 1x1x1 (one tile, almost all padding), K = 0 (no MMA at all:
/// zeros), sizes that are not multiples of 16 in every dimension, one full
/// tile, exact multiples of 16 beside them, K far above one tile, and
/// single rows and columns.
const Shape kShapes[] = {{1, 1, 1},   {1, 1, 0},   {17, 33, 5},    {64, 48, 80},  {16, 16, 16}, {16, 16, 17},
                         {33, 1, 40}, {3, 200, 7}, {100, 70, 300}, {1, 50, 1000}, {31, 17, 15}};

template <class F>
void check_all_shapes(Inputs kind, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes})
      for (const Shape& s : kShapes) check_case<F>(s, ta, tb, kind, rng);
}

/// (4) inf and NaN propagate. Small integers everywhere (finite sums are
/// exact, so they are checked bit for bit too) except:
///  - op(A)[2][5] = NaN: all of row 2 of C must be NaN, whatever B holds
///    (NaN x 0 is NaN too: column 0 of op(B) is made 0 at k = 5);
///  - op(A)[7][11] = +inf and op(B)[11][3] = 0: C[7][3] must be NaN
///    (inf x 0), and the rest of row 7 ±inf or NaN as the CPU finds it;
///  - op(B)[20][13] = -inf: column 13 follows the CPU (±inf, or NaN where
///    op(A)[m][20] is 0 or row m holds the opposite infinity).
/// Everything else must be what the FP32 CPU loop gives: NaN where it gives
/// NaN (any payload), the same infinity, the same finite bits. Shape 20 x 19
/// x 37: edge tiles in all three dimensions, so the padding must not turn
/// the stored outputs' infinities into NaN (a padded k that met an inf would).
template <class F>
void check_specials(Trans ta, Trans tb, std::mt19937_64& rng) {
  const Shape s{20, 19, 37};
  const bool tA = ta == Trans::yes, tB = tb == Trans::yes;
  Operand a = make_operand<F>(s.M, s.K, tA, Inputs::small_integers, rng);
  Operand b = make_operand<F>(s.K, s.N, tB, Inputs::small_integers, rng);
  a.code(2, 5) = F::kNaN;
  b.code(5, 0) = 0;
  a.code(7, 11) = F::kInf;
  b.code(11, 3) = 0;
  b.code(20, 13) = F::kNegInf;
  const Reference ref = reference_gemm(a, b, s);
  // The premises, on the CPU reference itself.
  for (int n = 0; n < s.N; ++n) REQUIRE(std::isnan(ref.ref32[2 * s.N + n]));
  REQUIRE(std::isnan(ref.ref32[7 * s.N + 3]));
  const std::size_t mn = static_cast<std::size_t>(s.M) * s.N;
  for (unsigned char poison : mpt::test::kPoisonBytes) {
    char label[160];
    std::snprintf(label, sizeof label, "%s specials op(A)%s op(B)%s, poison %#x", F::name, tA ? "^T" : "",
                  tB ? "^T" : "", poison);
    const std::vector<float> c = run_gpu<F>(a, b, s, ta, tb, poison);
    // The NaN row and inf x 0, named (the general comparison below covers
    // them too; these say what failed).
    bool row_nan = true;
    for (int n = 0; n < s.N; ++n) row_nan = row_nan && std::isnan(c[2 * s.N + n]);
    CHECK_MESSAGE(row_nan, label, ": a NaN in row 2 of op(A) must make all of row 2 of C NaN");
    CHECK_MESSAGE(std::isnan(c[7 * s.N + 3]), label, ": inf x 0 must give NaN in C[7][3]");
    std::size_t bad = 0, infs = 0;
    for (std::size_t i = 0; i < mn; ++i) {
      if (std::isinf(ref.ref32[i])) ++infs;
      if (!mpt::test::same_float(ref.ref32[i], c[i]) && bad++ < 5)
        std::printf("%s: C[%zu][%zu] want %a got %a\n", label, i / s.N, i % s.N, ref.ref32[i], c[i]);
    }
    bad += guards_written(c, mn, poison, label);
    REQUIRE(infs > 0);  // the case does test that infinities survive
    CHECK_MESSAGE(bad == 0, label, ": ", bad, " outputs differ from the CPU's FP32 loop");
  }
}

/// gemm_f32 (kernels/nn/gemm_fp16.cu) against the CPU loop its header
/// promises, bit for bit: acc = std::fma(a, b, acc), k = 0..K-1, from +0.
/// The values are normal(0, 1) scaled by 2^e, e uniform in [-20, 20], so
/// the products are not exact in FP32 (a loop of acc += a * b rounds twice
/// and differs). Row 0 of op(A) is -2^-80 and column 0 of op(B) 2^-80 when
/// the shape has a row and a column: every product of C[0][0] underflows
/// to -0, so C[0][0] is -0, which a kernel that pads the last k-tile with
/// +0 · +0 turns into +0 (K not a multiple of 16).
void check_f32_case(const Shape& s, Trans ta, Trans tb, mpt::cuda::GemmVersion v, std::mt19937_64& rng) {
  const bool tA = ta == Trans::yes, tB = tb == Trans::yes;
  std::vector<float> a(static_cast<std::size_t>(s.M) * s.K), b(static_cast<std::size_t>(s.K) * s.N);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  for (float& x : a) x = std::ldexp(normal(rng), exponent(rng));
  for (float& x : b) x = std::ldexp(normal(rng), exponent(rng));
  // op(A)[m][k] and op(B)[k][n] in their storage.
  auto ai = [&](int m, int k) {
    return tA ? static_cast<std::size_t>(k) * s.M + m : static_cast<std::size_t>(m) * s.K + k;
  };
  auto bi = [&](int k, int n) {
    return tB ? static_cast<std::size_t>(n) * s.K + k : static_cast<std::size_t>(k) * s.N + n;
  };
  if (s.M > 0 && s.N > 0 && s.K > 0)
    for (int k = 0; k < s.K; ++k) {
      a[ai(0, k)] = -std::ldexp(1.0f, -80);
      b[bi(k, 0)] = std::ldexp(1.0f, -80);
    }
  const std::size_t mn = static_cast<std::size_t>(s.M) * s.N;
  std::vector<float> want(mn);
  std::size_t inexact = 0;
  for (int m = 0; m < s.M; ++m)
    for (int n = 0; n < s.N; ++n) {
      float acc = 0.0f, plain = 0.0f;
      for (int k = 0; k < s.K; ++k) {
        acc = std::fma(a[ai(m, k)], b[bi(k, n)], acc);
        volatile float p = a[ai(m, k)] * b[bi(k, n)];  // rounded on its own, not fused
        plain += p;
      }
      want[static_cast<std::size_t>(m) * s.N + n] = acc;
      inexact += bits(acc) != bits(plain);
    }
  // The premises: the fused loop is not the plain one here, and C[0][0] is -0.
  if (s.K > 16 && mn > 16) REQUIRE(inexact > 0);
  if (s.M > 0 && s.N > 0 && s.K > 0) REQUIRE(bits(want[0]) == 0x80000000u);
  for (unsigned char poison : mpt::test::kPoisonBytes) {
    char label[160];
    std::snprintf(label, sizeof label, "f32 %s M=%d N=%d K=%d op(A)%s op(B)%s, poison %#x",
                  v == mpt::cuda::GemmVersion::naive ? "naive" : "tiled", s.M, s.N, s.K, tA ? "^T" : "",
                  tB ? "^T" : "", poison);
    DeviceArray<float> d_a(a), d_b(b), d_c(mn + 7);
    d_c.poison(poison);
    mpt::cuda::gemm_f32(ta, tb, s.M, s.N, s.K, d_a.get(), d_b.get(), d_c.get(), v);
    const std::vector<float> c = d_c.download();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < mn; ++i)
      if (bits(c[i]) != bits(want[i]) && bad++ < 5)
        std::printf("%s: C[%zu][%zu] want %a got %a\n", label, i / s.N, i % s.N, want[i], c[i]);
    bad += guards_written(c, mn, poison, label);
    CHECK_MESSAGE(bad == 0, label, ": ", bad,
                  " outputs differ from the CPU's std::fma loop or guards written");
  }
}

}  // namespace

TEST_CASE("gemm_f32: bit for bit a CPU std::fma loop, -0 kept, every shape and storage, both versions") {
  std::mt19937_64 rng(606);
  for (const auto v : {mpt::cuda::GemmVersion::naive, mpt::cuda::GemmVersion::tiled})
    for (Trans ta : {Trans::no, Trans::yes})
      for (Trans tb : {Trans::no, Trans::yes})
        for (const Shape& s : kShapes) check_f32_case(s, ta, tb, v, rng);
  DeviceArray<float> x(4);
  CHECK_THROWS_AS(mpt::cuda::gemm_f32(Trans::no, Trans::no, -1, 2, 2, x.get(), x.get(), x.get()),
                  std::invalid_argument);
  CHECK_NOTHROW(mpt::cuda::synchronize());
}

TEST_CASE("gemm_tc: small integers are exact, every shape and storage, fp16 and bf16") {
  check_all_shapes<Fp16In>(Inputs::small_integers, mpt::test::test_seed());
  check_all_shapes<Bf16In>(Inputs::small_integers, mpt::test::test_seed() + 1);
}

TEST_CASE("gemm_tc: random values within K 2^-23 sum|ab|, every shape and storage, fp16 and bf16") {
  check_all_shapes<Fp16In>(Inputs::normal, mpt::test::test_seed() + 2);
  check_all_shapes<Bf16In>(Inputs::normal, mpt::test::test_seed() + 3);
}

TEST_CASE("gemm_tc: inf and NaN propagate as in the CPU's FP32 loop, fp16 and bf16") {
  std::mt19937_64 rng(mpt::test::test_seed() + 4);
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) {
      check_specials<Fp16In>(ta, tb, rng);
      check_specials<Bf16In>(ta, tb, rng);
    }
}

TEST_CASE("gemm_tc: the MLP's three products (Chapter 2's layouts) are exact on small integers") {
  // y = x W^T, dx = dy W, dW = dy^T x, as nn_kernels.hpp documents for
  // gemm_fp16: the same calls give the same products on the tensor cores.
  const int batch = 37, in = 29, out = 19;
  std::mt19937_64 rng(mpt::test::test_seed() + 5);
  check_case<Fp16In>({batch, out, in}, Trans::no, Trans::yes, Inputs::small_integers, rng);  // y
  check_case<Fp16In>({batch, in, out}, Trans::no, Trans::no, Inputs::small_integers, rng);   // dx
  check_case<Fp16In>({out, in, batch}, Trans::yes, Trans::no, Inputs::small_integers, rng);  // dW
  check_case<Bf16In>({batch, out, in}, Trans::no, Trans::yes, Inputs::small_integers, rng);
  check_case<Bf16In>({batch, in, out}, Trans::no, Trans::no, Inputs::small_integers, rng);
  check_case<Bf16In>({out, in, batch}, Trans::yes, Trans::no, Inputs::small_integers, rng);
}

TEST_CASE("gemm_tc: empty sizes are no-ops, bad arguments throw before any launch") {
  DeviceArray<mpt::Fp16Code> h(4);
  DeviceArray<mpt::Bf16Code> bf(4);
  DeviceArray<float> c(4);
  c.poison();
  // M = 0 or N = 0: nothing to write, and nothing is.
  CHECK_NOTHROW(mpt::cuda::gemm_tc(Trans::no, Trans::no, 0, 4, 4, h.get(), h.get(), c.get()));
  CHECK_NOTHROW(mpt::cuda::gemm_tc(Trans::no, Trans::no, 2, 0, 4, bf.get(), bf.get(), c.get()));
  CHECK(bits(c.download()[0]) == 0xffffffffu);
  CHECK_THROWS_AS(mpt::cuda::gemm_tc(Trans::no, Trans::no, -1, 2, 2, h.get(), h.get(), c.get()),
                  std::invalid_argument);
  CHECK_THROWS_AS(mpt::cuda::gemm_tc(Trans::no, Trans::no, 2, 2, -2, bf.get(), bf.get(), c.get()),
                  std::invalid_argument);
  CHECK_THROWS_AS(mpt::cuda::gemm_tc(static_cast<Trans>(2), Trans::no, 2, 2, 2, h.get(), h.get(), c.get()),
                  std::invalid_argument);
  CHECK_THROWS_AS(mpt::cuda::gemm_tc(Trans::no, Trans::no, 2, 2, 2, h.get(), h.get(), nullptr),
                  std::invalid_argument);
  // One row more than 65535 row blocks hold, and M = INT_MAX (where M + 15
  // would overflow an int): std::length_error.
  CHECK_THROWS_AS(mpt::cuda::gemm_tc(Trans::no, Trans::no, 65535 * 16 + 1, 1, 1, h.get(), h.get(), c.get()),
                  std::length_error);
  CHECK_THROWS_AS(mpt::cuda::gemm_tc(Trans::no, Trans::no, std::numeric_limits<int>::max(), 1, 1, bf.get(),
                                     bf.get(), c.get()),
                  std::length_error);
  CHECK(bits(c.download()[0]) == 0xffffffffu);
  CHECK_NOTHROW(mpt::cuda::synchronize());
}

int main(int argc, char** argv) { return mpt::test::gpu_test_main(argc, argv); }
