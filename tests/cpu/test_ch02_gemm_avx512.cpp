// Chapter 02 — loss scaling and FP32 master weights: the AVX-512 micro-kernel
// of the GEMM (src/mpt/nn/cpu/gemm_avx512.cpp) gives the AVX2 kernel's bits,
// the portable std::fma kernel's and the naive loop's, on every shape that
// crosses a block boundary (its 32-wide panels have edges where the
// 16-wide ones have none), every Op, and operands with inf, NaN, subnormals
// and -0. Without AVX-512F this program exits 77 (CTest: Skipped): there is
// nothing to compare, and nothing passed.
// Depends on: mpt/nn/cpu/gemm.hpp, test_ch02_gemm_cases.hpp, doctest.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "mpt/nn/cpu/gemm.hpp"
#include "test_ch02_gemm_cases.hpp"

using namespace mpt;

namespace {

// gemm_cases::run with a kernel named: C starts as NaN, padding included.
std::vector<float> run_with(const gemm_cases::Operands<float>& o, GemmKernel kernel) {
  std::vector<float> c(static_cast<std::size_t>(o.m * o.ldc), std::numeric_limits<float>::quiet_NaN());
  gemm_fma(o.m, o.n, o.k, o.a.data(), o.lda, o.op_a, o.b.data(), o.ldb, o.op_b, c.data(), o.ldc, kernel);
  return c;
}

}  // namespace

TEST_CASE("gemm_fma: the AVX-512 micro-kernel gives the portable, AVX2 and naive bits, everywhere") {
  std::uint64_t seed = 5000;
  std::vector<std::vector<std::int64_t>> shapes = gemm_cases::shapes();
  // Widths around the 32-wide panel: one short of it, it, one past, and a
  // block edge (kGemmNC) that is not a multiple of 32.
  for (const std::int64_t n : {31, 32, 33, 65, 3073}) shapes.push_back({7, n, 300});
  for (const auto& s : shapes)
    for (Op oa : {Op::N, Op::T})
      for (Op ob : {Op::N, Op::T})
        for (auto v : {gemm_cases::Values::spread, gemm_cases::Values::special}) {
          const auto o = gemm_cases::make<float>(s[0], s[1], s[2], oa, ob, seed++, v);
          CAPTURE(o.name());
          CAPTURE(v == gemm_cases::Values::special);
          const std::vector<float> wide = run_with(o, GemmKernel::avx512);
          CHECK(gemm_cases::differing(o, wide, run_with(o, GemmKernel::portable)) == 0);
          CHECK(gemm_cases::differing(o, wide, gemm_cases::naive(o)) == 0);
          if (avx2_available()) CHECK(gemm_cases::differing(o, wide, run_with(o, GemmKernel::avx2)) == 0);
        }
}

TEST_CASE("gemm_fma: Implementation::automatic runs the AVX-512 kernel where there is one") {
  const auto o = gemm_cases::make<float>(128, 512, 256, Op::N, Op::T, 42);
  CHECK(gemm_cases::differing(o, gemm_cases::run(o, Implementation::automatic),
                              run_with(o, GemmKernel::avx512)) == 0);
}

int main(int argc, char** argv) {
  if (!gemm_avx512_available()) {
    std::printf("SKIPPED %s: this CPU or build has no AVX-512F GEMM kernel to compare\n",
                argc > 0 ? argv[0] : "avx512 test");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
