// Chapter 02 — loss scaling and FP32 master weights: the fp16-input,
// FP32-accumulate GEMM (kernels/nn/gemm_fp16.cu) against a naive CPU reference.
// Depends on: mpt (round_element.hpp: fp16 encode/decode), mpt::kernels,
// gpu_test_support.hpp. Without a usable GPU it exits 77 (CTest: Skipped).
//
// The reference (below) upcasts the fp16 inputs to fp32 and sums the
// products in fp32 in the fixed order k = 0..K-1. Three checks, strictest
// first:
//  1. Small integers (CUTLASS style): |a|, |b| <= 8 and K <= 4096, so every
//     partial sum is an integer below 2^24 and exact in fp32 in ANY order:
//     the output must equal the exact integer result, bit for bit.
//  2. Same order, bit for bit: a product of two fp16 values is exact in fp32
//     (11 + 11 significand bits), so the kernels' fmaf(a, b, acc) rounds once
//     like the CPU's acc += a * b, and both kernels sum in k order. Any input,
//     inf and NaN included (NaN: any payload — a GPU returns the canonical
//     NaN, x86 its own; inf must match with its sign).
//  3. The error model every summation order must meet (what a split-K or
//     tensor-core version will be held to): for finite results,
//         |ref64 - c| <= K * eps(fp32) * sum_k |a_mk| |b_kn|,  eps = 2^-23,
//     where ref64 is the product in double. An inner product of K terms
//     summed in any order has error at most gamma_K = K u / (1 - K u) times
//     that sum (Higham, Accuracy and Stability of Numerical Algorithms, 2nd
//     ed., 2002, ch. 3), with u = 2^-24 = eps/2: K eps covers it with room
//     to spare while K u < 1/2.
#define DOCTEST_CONFIG_IMPLEMENT
#include "gpu_test_support.hpp"
#include "kernels/nn/nn_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "mpt/formats/round_element.hpp"
#include "sweep_values.hpp"

namespace {

/// The GEMM version's name, for messages.
const char* gemm_version_name(mpt::cuda::GemmVersion v) {
  return v == mpt::cuda::GemmVersion::naive ? "naive" : "tiled";
}

using mpt::cuda::GemmVersion;
using mpt::cuda::Trans;
using mpt::test::bits_from_float;
using mpt::test::DeviceArray;

constexpr mpt::FormatSpec kFp16 = mpt::formats::fp16;

std::uint16_t to_fp16(float x) {
  return static_cast<std::uint16_t>(
      mpt::encode_exact(mpt::round_to_format(x, kFp16, mpt::RoundingMode::nearest_even,
                                             mpt::OverflowMode::infinity, mpt::SubnormalMode::keep),
                        kFp16));
}
float from_fp16(std::uint16_t c) { return mpt::decode(c, kFp16); }
bool fp16_is_nan(std::uint16_t c) { return (c & 0x7c00u) == 0x7c00u && (c & 0x03ffu) != 0; }

/// Raw codes as the kernels' typed fp16 codes, for upload.
std::vector<mpt::Fp16Code> typed(const std::vector<std::uint16_t>& raw) {
  std::vector<mpt::Fp16Code> out;
  for (std::uint16_t c : raw) out.push_back(mpt::Fp16Code{c});
  return out;
}

struct Shape {
  int M, N, K;
};

/// A row-major matrix of fp16 codes holding op(X) (rows x cols), stored
/// transposed when `t` says so.
struct Operand {
  std::vector<std::uint16_t> codes;
  int rows, cols;
  bool t;
  float at(int r, int c) const {
    return from_fp16(t ? codes[static_cast<std::size_t>(c) * rows + r]
                       : codes[static_cast<std::size_t>(r) * cols + c]);
  }
};

/// The naive reference: fp32 products, summed in fp32 in order k = 0..K-1.
std::vector<float> reference_gemm(const Operand& a, const Operand& b, const Shape& s) {
  std::vector<float> c(static_cast<std::size_t>(s.M) * s.N);
  for (int m = 0; m < s.M; ++m)
    for (int n = 0; n < s.N; ++n) {
      float acc = 0.0f;
      for (int k = 0; k < s.K; ++k) acc += a.at(m, k) * b.at(k, n);
      c[static_cast<std::size_t>(m) * s.N + n] = acc;
    }
  return c;
}

enum class Inputs { small_integers, normal, adversarial, huge };
const char* inputs_name(Inputs i) {
  switch (i) {
    case Inputs::small_integers: return "small integers";
    case Inputs::normal: return "normal";
    case Inputs::adversarial: return "adversarial";
    case Inputs::huge: return "huge";
  }
  return "?";
}

/// rows x cols fp16 values of the given kind, stored as op or transposed.
Operand make_operand(int rows, int cols, bool t, Inputs kind, std::mt19937_64& rng) {
  Operand o{std::vector<std::uint16_t>(static_cast<std::size_t>(rows) * cols), rows, cols, t};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::uint16_t& c : o.codes) {
    switch (kind) {
      case Inputs::small_integers: c = to_fp16(static_cast<float>(static_cast<int>(rng() % 17) - 8)); break;
      case Inputs::normal: c = to_fp16(normal(rng)); break;
      case Inputs::adversarial:
        // One in 16 is any fp16 code at all: inf, NaN, subnormals, ±65504.
        c = rng() % 16 == 0 ? static_cast<std::uint16_t>(rng()) : to_fp16(normal(rng));
        break;
      case Inputs::huge:
        // fp16's largest values and its smallest subnormals side by side:
        // fp16 outputs overflow to inf, fp32 sums cancel badly.
        c = to_fp16((rng() % 2 ? 65504.0f : 0x1p-24f) * (rng() % 2 ? 1.0f : -1.0f));
        break;
    }
  }
  return o;
}

/// Run one configuration on the GPU (fp32 and fp16 outputs, with 7 guard
/// elements after C) and check it, once for each poison of kPoisonBytes: a
/// NaN poison alone would pass where a NaN is expected and never written.
void check_case(const Shape& s, Trans ta, Trans tb, GemmVersion v, Inputs kind, std::mt19937_64& rng) {
  const bool tA = ta == Trans::yes, tB = tb == Trans::yes;
  const Operand a = make_operand(s.M, s.K, tA, kind, rng);
  const Operand b = make_operand(s.K, s.N, tB, kind, rng);
  const std::vector<float> want = reference_gemm(a, b, s);
  const std::size_t mn = static_cast<std::size_t>(s.M) * s.N;
  for (unsigned char poison_byte : mpt::test::kPoisonBytes) {
    char label[160];
    std::snprintf(label, sizeof label, "%s M=%d N=%d K=%d op(A)%s op(B)%s %s, poison %#x",
                  gemm_version_name(v), s.M, s.N, s.K, tA ? "^T" : "", tB ? "^T" : "", inputs_name(kind),
                  poison_byte);

    DeviceArray<mpt::Fp16Code> d_a(typed(a.codes)), d_b(typed(b.codes));
    DeviceArray<float> d_c(mn + 7);
    DeviceArray<mpt::Fp16Code> d_h(mn + 7);
    d_c.poison(poison_byte);
    d_h.poison(poison_byte);
    mpt::cuda::gemm_fp16(ta, tb, s.M, s.N, s.K, d_a.get(), d_b.get(), d_c.get(), v);
    mpt::cuda::gemm_fp16(ta, tb, s.M, s.N, s.K, d_a.get(), d_b.get(), d_h.get(), v);
    const std::vector<float> c = d_c.download();
    std::vector<std::uint16_t> h;
    for (mpt::Fp16Code code : d_h.download()) h.push_back(code.bits);

    std::size_t bad = 0, bound_bad = 0;
    double max_err = 0, max_ratio = 0;
    for (std::size_t i = 0; i < mn; ++i) {
      const int m = static_cast<int>(i / s.N), n = static_cast<int>(i % s.N);
      // 1 and 2: the same-order reference, bit for bit (exact integers for kind 1).
      const bool same = mpt::test::same_float(want[i], c[i]);
      const std::uint16_t want_h = to_fp16(want[i]);
      const bool same_h = want_h == h[i] || (fp16_is_nan(want_h) && fp16_is_nan(h[i]));
      if (!same || !same_h) {
        if (bad++ < 5)
          std::printf("%s: C[%d][%d] want %a (fp16 %#06x) got %a (fp16 %#06x)\n", label, m, n, want[i],
                      want_h, c[i], h[i]);
      }
      // 3: the order-independent bound, against double.
      if (std::isfinite(want[i])) {
        double exact = 0, abs_sum = 0;
        for (int k = 0; k < s.K; ++k) {
          const double p = static_cast<double>(a.at(m, k)) * b.at(k, n);
          exact += p;
          abs_sum += std::fabs(p);
        }
        const double err = std::fabs(exact - c[i]);
        const double bound = s.K * std::ldexp(1.0, -23) * abs_sum;
        max_err = std::max(max_err, err);
        if (bound > 0) max_ratio = std::max(max_ratio, err / bound);
        if (!(err <= bound) && bound_bad++ < 5)
          std::printf("%s: C[%d][%d] error %g above the bound %g\n", label, m, n, err, bound);
        if (kind == Inputs::small_integers && c[i] != exact && bad++ < 5)
          std::printf("%s: C[%d][%d] = %a, exact %.17g\n", label, m, n, c[i], exact);
      }
    }
    for (std::size_t i = mn; i < mn + 7; ++i) {
      if (bits_from_float(c[i]) != bits_from_float(mpt::test::poison_value<float>(poison_byte)) ||
          h[i] != mpt::test::poison_value<std::uint16_t>(poison_byte)) {
        if (bad++ < 5) std::printf("%s: guard element %zu after C was written\n", label, i - mn);
      }
    }
    if (bad || bound_bad)
      std::printf("%s: %zu mismatches, %zu above the bound; max |err| %g, max err/bound %g\n", label, bad,
                  bound_bad, max_err, max_ratio);
    CHECK_MESSAGE(bad == 0, label, ": ", bad, " mismatches against the same-order reference");
    CHECK_MESSAGE(bound_bad == 0, label, ": ", bound_bad, " outputs outside K eps sum|ab|");
  }
}

const Shape kShapes[] = {{1, 1, 1},   {1, 1, 0},     {17, 33, 65},   {64, 64, 64}, {3, 200, 7},
                         {33, 1, 40}, {1, 50, 1000}, {100, 70, 300}, {16, 16, 17}};

}  // namespace

TEST_CASE("gemm_fp16: every shape, storage and version against the CPU reference") {
  std::mt19937_64 rng(mpt::test::test_seed());
  for (GemmVersion v : {GemmVersion::naive, GemmVersion::tiled})
    for (Trans ta : {Trans::no, Trans::yes})
      for (Trans tb : {Trans::no, Trans::yes})
        for (const Shape& s : kShapes)
          for (Inputs kind : {Inputs::small_integers, Inputs::normal, Inputs::adversarial})
            check_case(s, ta, tb, v, kind, rng);
}

TEST_CASE("gemm_fp16: fp16's extremes — overflow to inf in the fp16 output, none in fp32") {
  std::mt19937_64 rng(mpt::test::test_seed() + 1);
  for (GemmVersion v : {GemmVersion::naive, GemmVersion::tiled})
    for (const Shape& s : {Shape{20, 24, 33}, Shape{5, 3, 512}})
      check_case(s, Trans::no, Trans::yes, v, Inputs::huge, rng);
}

TEST_CASE("gemm_fp16: the MLP's three products have the documented shapes") {
  // y = x W^T (forward), dx = dy W, dW = dy^T x (backward), with small
  // integers so each product is also checked against the exact answer.
  const int batch = 37, in = 29, out = 19;
  std::mt19937_64 rng(mpt::test::test_seed() + 2);
  for (GemmVersion v : {GemmVersion::naive, GemmVersion::tiled}) {
    check_case({batch, out, in}, Trans::no, Trans::yes, v, Inputs::small_integers, rng);  // y
    check_case({batch, in, out}, Trans::no, Trans::no, v, Inputs::small_integers, rng);   // dx
    check_case({out, in, batch}, Trans::yes, Trans::no, v, Inputs::small_integers, rng);  // dW
  }
}

TEST_CASE("gemm_fp16: empty sizes are no-ops, bad arguments throw") {
  DeviceArray<mpt::Fp16Code> d(4);
  DeviceArray<float> c(4);
  c.poison();
  CHECK_NOTHROW(mpt::cuda::gemm_fp16(Trans::no, Trans::no, 0, 4, 4, d.get(), d.get(), c.get()));
  CHECK_NOTHROW(mpt::cuda::gemm_fp16(Trans::no, Trans::no, 2, 0, 4, d.get(), d.get(), c.get()));
  CHECK(bits_from_float(c.download()[0]) == 0xffffffffu);  // nothing written
  CHECK_THROWS_AS(mpt::cuda::gemm_fp16(Trans::no, Trans::no, -1, 2, 2, d.get(), d.get(), c.get()),
                  std::invalid_argument);
  // One row more than 65535 row blocks hold, and M = INT_MAX (where M + 15
  // would overflow an int): std::length_error, before any launch.
  CHECK_THROWS_AS(mpt::cuda::gemm_fp16(Trans::no, Trans::no, 65535 * 16 + 1, 1, 1, d.get(), d.get(), c.get()),
                  std::length_error);
  CHECK_THROWS_AS(mpt::cuda::gemm_fp16(Trans::no, Trans::no, std::numeric_limits<int>::max(), 1, 1, d.get(),
                                       d.get(), c.get()),
                  std::length_error);
  CHECK_THROWS_AS(mpt::cuda::gemm_fp16(Trans::no, Trans::no, 2, 2, 2, d.get(), d.get(), c.get(),
                                       static_cast<GemmVersion>(5)),
                  std::invalid_argument);
  CHECK_NOTHROW(mpt::cuda::synchronize());
}

int main(int argc, char** argv) { return mpt::test::gpu_test_main(argc, argv); }
