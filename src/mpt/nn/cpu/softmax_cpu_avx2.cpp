// Chapter 04 — numerically stable softmax and cross-entropy: the AVX2 loops
// of the fused CPU kernel (softmax_cpu.hpp).
// Depends on: softmax_cpu.hpp. Compiled with -mavx2 -mfma -mf16c and
// -ffp-contract=off (the only fused multiply-adds are the written ones, the
// std::fma calls of the portable loop), and only called after cpuid says so.
//
// Every loop does, lane by lane, the IEEE operations of the portable loop
// in softmax_cpu.cpp in the same order, so the bits are the same: lane k of
// a sum takes the values j ≡ k (mod 8), the lanes are combined
// ((0 1)(2 3))((4 5)(6 7)), and the caller adds the last n mod 8 values.
// fp16 codes are widened with F16C (exact; rows with a NaN never come here,
// so no NaN payload can differ from decode()'s) and rounded with F16C (RNE:
// encode()'s bits for every non-NaN value).
#include <immintrin.h>

#include <cstdint>

#include "mpt/nn/cpu/softmax_cpu.hpp"

namespace mpt::detail {
namespace {

constexpr std::int64_t kLanes = 8;

__m256 load16(const std::uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
void store16(std::uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

float lane_tree(__m256 v) {
  alignas(32) float l[kLanes];
  _mm256_store_ps(l, v);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/// exp_core (softmax_cpu.cpp) on 8 lanes, x in [−87, 88]: the same operations.
__m256 exp8_core(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[6]);
  for (int k = 5; k >= 0; --k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[k]));
  // A NaN lane converts to INT32_MIN, which shifted by 23 adds 0.
  const __m256i n_bits = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), n_bits));
}

/// exp_fused on 8 lanes.
__m256 exp8(__m256 x) {
  const __m256 xc = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), x));
  __m256 y = exp8_core(xc);
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ));
  return _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()),
                          _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_GT_OQ));
}

/// exp_shifted on 8 lanes.
__m256 exp8_shifted(__m256 d) { return exp8_core(_mm256_max_ps(_mm256_set1_ps(-87.0f), d)); }

}  // namespace

float row_max_avx2(const std::uint16_t* z, std::int64_t n) {
  // Two vectors of lanes, for two independent chains of maxima; the max
  // does not round, so the order of the lanes cannot change the result
  // (nor can a NaN, which both the vector max and the portable loop pass over).
  __m256 mx = _mm256_set1_ps(-__builtin_inff()), my = mx;
  const std::int64_t n8 = n - n % kLanes, n16 = n - n % (2 * kLanes);
  std::int64_t j = 0;
  for (; j < n16; j += 2 * kLanes) {
    mx = _mm256_max_ps(load16(z + j), mx);  // v > mx ? v : mx, as the portable loop
    my = _mm256_max_ps(load16(z + j + kLanes), my);
  }
  for (; j < n8; j += kLanes) mx = _mm256_max_ps(load16(z + j), mx);
  mx = _mm256_max_ps(my, mx);
  alignas(32) float l[kLanes];
  _mm256_store_ps(l, mx);
  float m = l[0];
  for (int k = 1; k < kLanes; ++k) m = l[k] > m ? l[k] : m;
  return m;
}

std::int64_t row_exp_sum_avx2(const std::uint16_t* z, std::int64_t n, float m, float* e, float* sum,
                              float* shifted) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 sm = _mm256_setzero_ps(), sh = _mm256_setzero_ps();
  const std::int64_t n8 = n - n % kLanes;
  for (std::int64_t j = 0; j < n8; j += kLanes) {
    const __m256 d = _mm256_sub_ps(load16(z + j), mv);
    const __m256 v = exp8_shifted(d);
    _mm256_storeu_ps(e + j, v);
    sm = _mm256_add_ps(sm, v);
    sh = _mm256_add_ps(sh, d);
  }
  *sum = lane_tree(sm);
  *shifted = lane_tree(sh);
  return n8;
}

std::int64_t row_grad_avx2(const float* e, std::int64_t n, float inv_s, float c, float g,
                           std::uint16_t* grad) {
  const __m256 is = _mm256_set1_ps(inv_s), cv = _mm256_set1_ps(c), gv = _mm256_set1_ps(g);
  const std::int64_t n8 = n - n % kLanes;
  for (std::int64_t j = 0; j < n8; j += kLanes)
    store16(grad + j, _mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(e + j), is), cv), gv));
  return n8;
}

std::int64_t row_log_prob_avx2(const std::uint16_t* z, std::int64_t n, float lse, float* out) {
  const __m256 l = _mm256_set1_ps(lse);
  const std::int64_t n8 = n - n % kLanes;
  for (std::int64_t j = 0; j < n8; j += kLanes) _mm256_storeu_ps(out + j, _mm256_sub_ps(load16(z + j), l));
  return n8;
}

std::int64_t row_grad_from_log_prob_avx2(const float* lp, std::int64_t n, float g, float cg,
                                         std::uint16_t* grad) {
  const __m256 gv = _mm256_set1_ps(g), cgv = _mm256_set1_ps(cg);
  const std::int64_t n8 = n - n % kLanes;
  for (std::int64_t j = 0; j < n8; j += kLanes)
    store16(grad + j, _mm256_sub_ps(_mm256_mul_ps(exp8_shifted(_mm256_loadu_ps(lp + j)), gv), cgv));
  return n8;
}

std::int64_t exp_fused_avx2(const float* x, float* y, std::int64_t n) {
  const std::int64_t n8 = n - n % kLanes;
  for (std::int64_t j = 0; j < n8; j += kLanes) _mm256_storeu_ps(y + j, exp8(_mm256_loadu_ps(x + j)));
  return n8;
}

}  // namespace mpt::detail
