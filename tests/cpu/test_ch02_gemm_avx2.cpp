// Chapter 02 — loss scaling and FP32 master weights: the AVX2 + FMA
// micro-kernel of the GEMM (src/mpt/nn/cpu/gemm_avx2.cpp) gives the portable
// std::fma micro-kernel's bits and the naive loop's, on every shape that
// crosses a block boundary, every Op, and operands with inf, NaN,
// subnormals and -0. Without AVX2 this program exits 77 (CTest: Skipped):
// there is nothing to compare, and nothing passed.
// Depends on: mpt/nn/cpu/gemm.hpp, avx2_test_main.hpp, test_ch02_gemm_cases.hpp.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "avx2_test_main.hpp"
#include "mpt/nn/cpu/gemm.hpp"
#include "test_ch02_gemm_cases.hpp"

using namespace mpt;

TEST_CASE("gemm_fma: the AVX2 micro-kernel gives the portable bits and the naive loop's, everywhere") {
  std::uint64_t seed = 1000;
  for (const auto& s : gemm_cases::shapes())
    for (Op oa : {Op::N, Op::T})
      for (Op ob : {Op::N, Op::T})
        for (auto v : {gemm_cases::Values::spread, gemm_cases::Values::special}) {
          const auto o = gemm_cases::make<float>(s[0], s[1], s[2], oa, ob, seed++, v);
          CAPTURE(o.name());
          CAPTURE(v == gemm_cases::Values::special);
          const std::vector<float> avx2 = gemm_cases::run(o, Implementation::avx2);
          CHECK(gemm_cases::differing(o, avx2, gemm_cases::run(o, Implementation::portable)) == 0);
          CHECK(gemm_cases::differing(o, avx2, gemm_cases::naive(o)) == 0);
        }
}

TEST_CASE("gemm_fma: the MLP's shapes, AVX2 against portable") {
  // The chapter's MLP (256-512-512-10, batch 128): forward x·Wᵀ, dW = dyᵀ·x
  // and dx = dy·W of its widest layer.
  for (const auto& s :
       std::vector<std::vector<std::int64_t>>{{128, 512, 256}, {512, 512, 128}, {128, 10, 512}}) {
    for (Op oa : {Op::N, Op::T})
      for (Op ob : {Op::N, Op::T}) {
        const auto o = gemm_cases::make<float>(s[0], s[1], s[2], oa, ob, 42);
        CAPTURE(o.name());
        CHECK(gemm_cases::differing(o, gemm_cases::run(o, Implementation::avx2),
                                    gemm_cases::run(o, Implementation::portable)) == 0);
      }
  }
}

int main(int argc, char** argv) { return mpt_test::avx2_test_main(argc, argv); }
