// Chapter 07 — FP8 training: the AVX2 primitives of quantize_raw.hpp's
// fast path. Compiled with -mavx2 and only called after cpuid says so.
// Depends on: quantize_raw_impl.hpp, formats/rounding_impl.hpp
// (encode8_avx2: the formats tier's AVX2 round-and-encode to an 8-bit
// format, tested there to give round_to_format's and encode_exact's bits).
//
// As in amp/unscale_avx2.cpp, this file calls no inline function of a
// shared header (quantize_element, amax_step, ...): one compiled here with
// -mavx2 could be the copy the linker keeps for everyone, and then run on a
// CPU without AVX2. What it needs of them comes in as plain numbers
// (Fp8Finish), and the scalar tails go through the vector code on a padded
// copy.
//
// Why the bits are quantize_element's: v = x × scale is the same single
// IEEE multiply; encode8_avx2 rounds v to nearest even with subnormals kept
// and overflow to inf (E5M2) or NaN (E4M3) — quantize_element's rounding —
// and encodes it. quantize_element then only relabels: a NaN v keeps its
// NaN code; a non-finite code from a v that is not NaN is "beyond max" and
// becomes ±max (the sign of v) when saturating; a zero code from a
// non-zero x is "flushed". finish_avx2 does exactly that, lane by lane.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "mpt/formats/rounding_impl.hpp"
#include "mpt/fp8/quantize_raw_impl.hpp"

namespace mpt::fp8::detail {
namespace {

/// |x| per lane (the sign bit cleared). The mask is built here, not as a
/// namespace-scope constant: a global initialiser would run AVX2 code at
/// start-up, before anyone asked cpuid.
inline __m256 abs8(__m256 x) { return _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }

/// The largest lane (no lane is NaN).
inline float hmax8(__m256 m) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

/// running, raised to |x| lane by lane where |x| is larger; a NaN |x|
/// leaves running as it is (MAXPS returns its second operand when either
/// is NaN) — amax_step's rule.
inline __m256 amax_lanes(__m256 running, __m256 x) { return _mm256_max_ps(abs8(x), running); }

/// One scalar value's amax step, by bits (no inline header function).
inline float amax_one(float running, float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u &= 0x7fffffffu;
  float a;
  std::memcpy(&a, &u, 4);
  return u <= 0x7f800000u && a > running ? a : running;
}

inline int popcount8(__m256i mask) {
  return __builtin_popcount(static_cast<unsigned int>(_mm256_movemask_ps(_mm256_castsi256_ps(mask))));
}

/// Eight codes relabelled as quantize_element would (see the file comment).
inline __m256i finish8(__m256 x, __m256 v, __m256i code, const Fp8Finish& k, RawCounts& c) {
  const __m256i mag = _mm256_and_si256(code, _mm256_set1_epi32(0x7f));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i nonfinite =
      _mm256_cmpeq_epi32(_mm256_and_si256(mag, _mm256_set1_epi32(static_cast<int>(k.nonfinite_mask))),
                         _mm256_set1_epi32(static_cast<int>(k.nonfinite_value)));
  const __m256i beyond = _mm256_andnot_si256(nan, nonfinite);
  // x != 0 as C++ reads it (true for NaN, but a NaN's code is never 0)
  const __m256i nonzero = _mm256_castps_si256(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_NEQ_UQ));
  const __m256i flushed = _mm256_and_si256(_mm256_cmpeq_epi32(mag, _mm256_setzero_si256()), nonzero);
  c.beyond += static_cast<std::size_t>(popcount8(beyond));
  c.nan += static_cast<std::size_t>(popcount8(nan));
  c.flushed += static_cast<std::size_t>(popcount8(flushed));
  if (!k.saturate) return code;
  const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(_mm256_castps_si256(v), 31), 7);
  const __m256i clamped = _mm256_or_si256(sign, _mm256_set1_epi32(static_cast<int>(k.max_code)));
  return _mm256_blendv_epi8(code, clamped, beyond);
}

inline __m128i pack8(__m256i code) {
  const __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
  return _mm_packus_epi16(w16, w16);
}

}  // namespace

float amax_avx2(const float* x, std::size_t n) {
  __m256 m0 = _mm256_setzero_ps(), m1 = m0;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    m0 = amax_lanes(m0, _mm256_loadu_ps(x + i));
    m1 = amax_lanes(m1, _mm256_loadu_ps(x + i + 8));
  }
  for (; i + 8 <= n; i += 8) m0 = amax_lanes(m0, _mm256_loadu_ps(x + i));
  float a = hmax8(_mm256_max_ps(m0, m1));
  for (; i < n; ++i) a = amax_one(a, x[i]);
  return a;
}

void block_amax_avx2(const float* x, std::size_t n, float* amax) {
  std::size_t i = 0, b = 0;
  for (; i + 32 <= n; i += 32, ++b) {
    const __m256 m0 =
        amax_lanes(amax_lanes(_mm256_setzero_ps(), _mm256_loadu_ps(x + i)), _mm256_loadu_ps(x + i + 8));
    const __m256 m1 =
        amax_lanes(amax_lanes(_mm256_setzero_ps(), _mm256_loadu_ps(x + i + 16)), _mm256_loadu_ps(x + i + 24));
    amax[b] = hmax8(_mm256_max_ps(m0, m1));
  }
  if (i < n) amax[b] = amax_avx2(x + i, n - i);
}

void scale_avx2(const float* x, float scale, float* v, std::size_t n) {
  const __m256 s = _mm256_set1_ps(scale);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), s));
  for (; i < n; ++i) v[i] = x[i] * scale;
}

void finish_avx2(const float* x, const float* v, std::uint8_t* codes, std::size_t n, const Fp8Finish& k,
                 RawCounts& c) {
  const mpt::detail::RoundParams p{k.spec, RoundingMode::nearest_even, OverflowMode::infinity,
                                   SubnormalMode::keep, 0};
  mpt::detail::encode8_avx2(v, codes, n, p, 0);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i code = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i),
                     pack8(finish8(_mm256_loadu_ps(x + i), _mm256_loadu_ps(v + i), code, k, c)));
  }
  if (i < n) {
    // The tail on padded copies: padding lanes (x = v = 0, code 0) count nothing.
    const std::size_t m = n - i;
    float xt[8] = {}, vt[8] = {};
    std::uint8_t ct[16] = {};
    std::memcpy(xt, x + i, m * sizeof(float));
    std::memcpy(vt, v + i, m * sizeof(float));
    std::memcpy(ct, codes + i, m);
    const __m256i code = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(ct)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(ct),
                     pack8(finish8(_mm256_loadu_ps(xt), _mm256_loadu_ps(vt), code, k, c)));
    std::memcpy(codes + i, ct, m);
  }
}

}  // namespace mpt::fp8::detail
