// Chapter 02 — loss scaling and FP32 master weights: the AVX2 + FMA
// micro-kernel of the FP32 GEMM (gemm.hpp).
// Depends on: gemm_kernel.hpp. Compiled with -mavx2 -mfma and -ffp-contract=off
// (the only fused multiply-adds are the written ones), and only called
// after cpuid says so.
//
// The kGemmMR × kGemmNR = 6 × 16 tile of C lives in 12 ymm registers, each
// lane one output element's chain. A step of k loads 16 values of the
// packed op(B) row (two registers), broadcasts each of the 6 values of the
// packed op(A) column and does 12 vfmadd231ps: lane by lane
// acc = fma(a, b, acc), one rounding, exactly the portable micro-kernel's
// std::fma. k runs in order, so every lane's chain is the chain of the
// contract, and the bits are the portable path's
// (tests/cpu/test_ch02_gemm_avx2.cpp holds them to it).
#include <immintrin.h>

#include <cstdint>

#include "mpt/nn/cpu/gemm_kernel.hpp"

namespace mpt::detail {

static_assert(kGemmMR == 6 && kGemmNR == 16, "gemm_micro_avx2 is written for a 6 x 16 tile");

void gemm_micro_avx2(std::int64_t kc, const float* ap, const float* bp, float* c, std::int64_t ldc,
                     bool load_c) {
  __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
  if (load_c) {
    c00 = _mm256_loadu_ps(c + 0 * ldc), c01 = _mm256_loadu_ps(c + 0 * ldc + 8);
    c10 = _mm256_loadu_ps(c + 1 * ldc), c11 = _mm256_loadu_ps(c + 1 * ldc + 8);
    c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
    c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
    c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
    c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
  } else {
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
  }
  for (std::int64_t p = 0; p < kc; ++p, ap += 6, bp += 16) {
    const __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8);
    __m256 a = _mm256_broadcast_ss(ap + 0);
    c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01);
    a = _mm256_broadcast_ss(ap + 1);
    c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11);
    a = _mm256_broadcast_ss(ap + 2);
    c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21);
    a = _mm256_broadcast_ss(ap + 3);
    c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31);
    a = _mm256_broadcast_ss(ap + 4);
    c40 = _mm256_fmadd_ps(a, b0, c40), c41 = _mm256_fmadd_ps(a, b1, c41);
    a = _mm256_broadcast_ss(ap + 5);
    c50 = _mm256_fmadd_ps(a, b0, c50), c51 = _mm256_fmadd_ps(a, b1, c51);
  }
  _mm256_storeu_ps(c + 0 * ldc, c00), _mm256_storeu_ps(c + 0 * ldc + 8, c01);
  _mm256_storeu_ps(c + 1 * ldc, c10), _mm256_storeu_ps(c + 1 * ldc + 8, c11);
  _mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
  _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
  _mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 4 * ldc + 8, c41);
  _mm256_storeu_ps(c + 5 * ldc, c50), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}

}  // namespace mpt::detail
