// Chapter 02 — loss scaling and FP32 master weights: the AVX-512 micro-kernel
// of the FP32 GEMM (gemm.hpp), twice the AVX2 kernel's width.
// Depends on: gemm_kernel.hpp. Compiled with -mavx512f and -ffp-contract=off
// (the only fused multiply-adds are the written ones), and only called
// after gemm_avx512_available() says so.
//
// The kGemmMR × kGemmNR512 = 6 × 32 tile of C lives in 12 zmm registers, each
// lane one output element's chain. A step of k loads 32 values of the
// packed op(B) row (two registers), broadcasts each of the 6 values of the
// packed op(A) column and does 12 vfmadd231ps: lane by lane
// acc = fma(a, b, acc), one rounding, exactly the portable micro-kernel's
// std::fma. k runs in order, so every lane's chain is the chain of the
// contract, and the bits are the portable path's and the AVX2 path's: a
// wider register changes how many chains run side by side, never the order
// inside one (tests/cpu/test_ch02_gemm_avx512.cpp holds them to it).
#include <immintrin.h>

#include <cstdint>

#include "mpt/nn/cpu/gemm_kernel.hpp"

namespace mpt::detail {

static_assert(kGemmMR == 6 && kGemmNR512 == 32, "gemm_micro_avx512 is written for a 6 x 32 tile");

void gemm_micro_avx512(std::int64_t kc, const float* ap, const float* bp, float* c, std::int64_t ldc,
                       bool load_c) {
  __m512 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
  if (load_c) {
    c00 = _mm512_loadu_ps(c + 0 * ldc), c01 = _mm512_loadu_ps(c + 0 * ldc + 16);
    c10 = _mm512_loadu_ps(c + 1 * ldc), c11 = _mm512_loadu_ps(c + 1 * ldc + 16);
    c20 = _mm512_loadu_ps(c + 2 * ldc), c21 = _mm512_loadu_ps(c + 2 * ldc + 16);
    c30 = _mm512_loadu_ps(c + 3 * ldc), c31 = _mm512_loadu_ps(c + 3 * ldc + 16);
    c40 = _mm512_loadu_ps(c + 4 * ldc), c41 = _mm512_loadu_ps(c + 4 * ldc + 16);
    c50 = _mm512_loadu_ps(c + 5 * ldc), c51 = _mm512_loadu_ps(c + 5 * ldc + 16);
  } else {
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm512_setzero_ps();
  }
  for (std::int64_t p = 0; p < kc; ++p, ap += 6, bp += 32) {
    const __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16);
    __m512 a = _mm512_set1_ps(ap[0]);
    c00 = _mm512_fmadd_ps(a, b0, c00), c01 = _mm512_fmadd_ps(a, b1, c01);
    a = _mm512_set1_ps(ap[1]);
    c10 = _mm512_fmadd_ps(a, b0, c10), c11 = _mm512_fmadd_ps(a, b1, c11);
    a = _mm512_set1_ps(ap[2]);
    c20 = _mm512_fmadd_ps(a, b0, c20), c21 = _mm512_fmadd_ps(a, b1, c21);
    a = _mm512_set1_ps(ap[3]);
    c30 = _mm512_fmadd_ps(a, b0, c30), c31 = _mm512_fmadd_ps(a, b1, c31);
    a = _mm512_set1_ps(ap[4]);
    c40 = _mm512_fmadd_ps(a, b0, c40), c41 = _mm512_fmadd_ps(a, b1, c41);
    a = _mm512_set1_ps(ap[5]);
    c50 = _mm512_fmadd_ps(a, b0, c50), c51 = _mm512_fmadd_ps(a, b1, c51);
  }
  _mm512_storeu_ps(c + 0 * ldc, c00), _mm512_storeu_ps(c + 0 * ldc + 16, c01);
  _mm512_storeu_ps(c + 1 * ldc, c10), _mm512_storeu_ps(c + 1 * ldc + 16, c11);
  _mm512_storeu_ps(c + 2 * ldc, c20), _mm512_storeu_ps(c + 2 * ldc + 16, c21);
  _mm512_storeu_ps(c + 3 * ldc, c30), _mm512_storeu_ps(c + 3 * ldc + 16, c31);
  _mm512_storeu_ps(c + 4 * ldc, c40), _mm512_storeu_ps(c + 4 * ldc + 16, c41);
  _mm512_storeu_ps(c + 5 * ldc, c50), _mm512_storeu_ps(c + 5 * ldc + 16, c51);
}

}  // namespace mpt::detail
