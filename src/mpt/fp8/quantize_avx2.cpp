// Chapter 07 — FP8 training: the AVX2 loops of quantize_raw.hpp's fast
// path. Compiled with -mavx2 and only called after cpuid says so.
// Depends on: quantize_raw_impl.hpp.
//
// As in amp/unscale_avx2.cpp, this file calls no inline function of a
// shared header (quantize_element, amax_step, ...): one compiled here with
// -mavx2 could be the copy the linker keeps for everyone, and then run on a
// CPU without AVX2. What it needs of them comes in as plain numbers
// (Fp8Encode), and the tails go through the vector code on padded copies.
//
// Why the bits are quantize_element's, eight lanes at a time:
//  - v = x × scale is the same single IEEE multiply;
//  - |v| at or above the format's smallest normal: round to nearest even
//    on the fp32 bits — add half an ulp of the target less one, plus the
//    bit that will become the last (ties go to even), drop 23 − m bits —
//    and re-bias the exponent field; a carry into the exponent is the
//    rounding up to the next binade, as it should be;
//  - below it: the code is |v| / 2^(emin − m), a product by a power of two
//    (exact) rounded to an integer, to nearest even (_mm256_round_ps);
//  - a code above max's is beyond the range (±inf included): ±max when
//    saturating, else the format's NaN (E4M3) or ±inf (E5M2), as
//    round_to_format with overflow to infinity gives and encode_exact
//    encodes; NaN gives the canonical NaN; the sign of v is kept throughout;
//  - flushed: a zero code from a non-zero x. amax: MAXPS ignores a NaN in
//    its first operand, amax_step's rule.
// tests/cpu/test_ch07_quantize_raw_avx2.cpp holds every lane to the
// portable loop's bits and counts.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "mpt/fp8/quantize_raw_impl.hpp"

namespace mpt::fp8::detail {
namespace {

/// The encode's constants as vectors (built per call, not at namespace
/// scope: a global initialiser would run AVX2 code at start-up).
struct Consts {
  __m256i abs_mask, half_less_one, one, rebias, min_normal, max_code, beyond_code, nan_code, inf_bits;
  __m256 sub_scale;
  explicit Consts(const Fp8Encode& k, int shift) {
    abs_mask = _mm256_set1_epi32(0x7fffffff);
    half_less_one = _mm256_set1_epi32((1 << (shift - 1)) - 1);
    one = _mm256_set1_epi32(1);
    rebias = _mm256_set1_epi32(static_cast<int>(k.rebias));
    min_normal = _mm256_set1_epi32(static_cast<int>(k.min_normal));
    max_code = _mm256_set1_epi32(static_cast<int>(k.max_code));
    beyond_code = _mm256_set1_epi32(static_cast<int>(k.saturate ? k.max_code : k.overflow_code));
    nan_code = _mm256_set1_epi32(static_cast<int>(k.nan_code));
    inf_bits = _mm256_set1_epi32(0x7f800000);
    sub_scale = _mm256_set1_ps(k.subnormal_scale);
  }
};

/// Lane counters of the three counted outcomes (each lane adds 1 by
/// subtracting an all-ones mask).
struct Counters {
  __m256i beyond = _mm256_setzero_si256(), nan = _mm256_setzero_si256(), flushed = _mm256_setzero_si256();
};

inline std::size_t lane_sum(__m256i v) {
  alignas(32) std::uint32_t l[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), v);
  std::size_t s = 0;
  for (std::uint32_t x : l) s += x;
  return s;
}

inline void add_counts(const Counters& k, RawCounts& c) {
  c.beyond += lane_sum(k.beyond);
  c.nan += lane_sum(k.nan);
  c.flushed += lane_sum(k.flushed);
}

/// Eight codes (one per 32-bit lane) of x × s. Shift = 23 − m.
template <int Shift>
inline __m256i encode8(__m256 x, __m256 s, const Consts& k, Counters& n) {
  const __m256i u = _mm256_castps_si256(_mm256_mul_ps(x, s));
  const __m256i a = _mm256_and_si256(u, k.abs_mask);
  const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(u, 31), 7);
  // normal: round to nearest even on the bits, then re-bias
  const __m256i last = _mm256_and_si256(_mm256_srli_epi32(a, Shift), k.one);
  const __m256i normal = _mm256_sub_epi32(
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(a, k.half_less_one), last), Shift), k.rebias);
  // subnormal: |v| / 2^(emin − m), rounded to nearest even
  const __m256 scaled = _mm256_mul_ps(_mm256_castsi256_ps(a), k.sub_scale);
  const __m256i sub =
      _mm256_cvttps_epi32(_mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m256i mag = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(k.min_normal, a));
  const __m256i nan = _mm256_cmpgt_epi32(a, k.inf_bits);
  const __m256i beyond = _mm256_andnot_si256(nan, _mm256_cmpgt_epi32(mag, k.max_code));
  mag = _mm256_blendv_epi8(mag, k.beyond_code, beyond);
  mag = _mm256_blendv_epi8(mag, k.nan_code, nan);
  // x != 0 as C++ reads it (true for NaN, but a NaN's code is never 0)
  const __m256i nonzero = _mm256_castps_si256(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_NEQ_UQ));
  const __m256i flushed = _mm256_and_si256(_mm256_cmpeq_epi32(mag, _mm256_setzero_si256()), nonzero);
  n.beyond = _mm256_sub_epi32(n.beyond, beyond);
  n.nan = _mm256_sub_epi32(n.nan, nan);
  n.flushed = _mm256_sub_epi32(n.flushed, flushed);
  return _mm256_or_si256(mag, sign);
}

/// Sixteen codes (two vectors of lanes) as 16 bytes, in order.
inline __m128i pack16(__m256i c0, __m256i c1) {
  const __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(c0, c1), 0xD8);  // 16-bit, in order
  return _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}

/// running raised to |x| lane by lane; a NaN |x| leaves running as it is
/// (MAXPS returns its second operand when either is NaN).
inline __m256 amax_lanes(__m256 running, __m256 x, const Consts& k) {
  return _mm256_max_ps(_mm256_and_ps(x, _mm256_castsi256_ps(k.abs_mask)), running);
}

/// The largest lane (no lane is NaN).
inline float hmax8(__m256 m) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

template <int Shift>
float tensor_loop(const float* x, std::size_t n, float scale, std::uint8_t* codes, const Consts& k,
                  RawCounts& c) {
  const __m256 s = _mm256_set1_ps(scale);
  Counters cnt;
  __m256 m0 = _mm256_setzero_ps(), m1 = m0;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
    m0 = amax_lanes(m0, x0, k);
    m1 = amax_lanes(m1, x1, k);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i),
                     pack16(encode8<Shift>(x0, s, k, cnt), encode8<Shift>(x1, s, k, cnt)));
  }
  if (i < n) {
    // The tail on a zero-padded copy: a padding 0 has code 0, counts nothing, raises no amax.
    const std::size_t m = n - i;
    float xt[16] = {};
    std::uint8_t ct[16];
    std::memcpy(xt, x + i, m * sizeof(float));
    const __m256 x0 = _mm256_loadu_ps(xt), x1 = _mm256_loadu_ps(xt + 8);
    m0 = amax_lanes(m0, x0, k);
    m1 = amax_lanes(m1, x1, k);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(ct),
                     pack16(encode8<Shift>(x0, s, k, cnt), encode8<Shift>(x1, s, k, cnt)));
    std::memcpy(codes + i, ct, m);
  }
  add_counts(cnt, c);
  return hmax8(_mm256_max_ps(m0, m1));
}

template <int Shift>
void blocks_loop(const float* x, std::size_t n, const float* scales, std::uint8_t* codes, const Consts& k,
                 RawCounts& c) {
  Counters cnt;
  std::size_t i = 0, b = 0;
  for (; i + 32 <= n; i += 32, ++b) {
    const __m256 s = _mm256_set1_ps(scales[b]);
    const __m256i c0 = encode8<Shift>(_mm256_loadu_ps(x + i), s, k, cnt);
    const __m256i c1 = encode8<Shift>(_mm256_loadu_ps(x + i + 8), s, k, cnt);
    const __m256i c2 = encode8<Shift>(_mm256_loadu_ps(x + i + 16), s, k, cnt);
    const __m256i c3 = encode8<Shift>(_mm256_loadu_ps(x + i + 24), s, k, cnt);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), pack16(c0, c1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i + 16), pack16(c2, c3));
  }
  if (i < n) {
    const std::size_t m = n - i;
    float xt[32] = {};
    std::uint8_t ct[32];
    std::memcpy(xt, x + i, m * sizeof(float));
    const __m256 s = _mm256_set1_ps(scales[b]);
    for (std::size_t j = 0; j < 32; j += 16)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(ct + j),
                       pack16(encode8<Shift>(_mm256_loadu_ps(xt + j), s, k, cnt),
                              encode8<Shift>(_mm256_loadu_ps(xt + j + 8), s, k, cnt)));
    std::memcpy(codes + i, ct, m);
  }
  add_counts(cnt, c);
}

}  // namespace

float quantize_tensor_avx2(const float* x, std::size_t n, float scale, std::uint8_t* codes,
                           const Fp8Encode& k, RawCounts& c) {
  const int shift = 23 - k.mantissa_bits;
  const Consts v(k, shift);
  return k.mantissa_bits == 3 ? tensor_loop<20>(x, n, scale, codes, v, c)
                              : tensor_loop<21>(x, n, scale, codes, v, c);
}

void quantize_blocks_avx2(const float* x, std::size_t n, const float* scales, std::uint8_t* codes,
                          const Fp8Encode& k, RawCounts& c) {
  const int shift = 23 - k.mantissa_bits;
  const Consts v(k, shift);
  if (k.mantissa_bits == 3) {
    blocks_loop<20>(x, n, scales, codes, v, c);
  } else {
    blocks_loop<21>(x, n, scales, codes, v, c);
  }
}

void block_amax_avx2(const float* x, std::size_t n, float* amax) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  std::size_t i = 0, b = 0;
  for (; i + 32 <= n; i += 32, ++b) {
    const __m256 m0 = _mm256_max_ps(
        _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask),
        _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i + 8), abs_mask), _mm256_setzero_ps()));
    const __m256 m1 = _mm256_max_ps(
        _mm256_and_ps(_mm256_loadu_ps(x + i + 16), abs_mask),
        _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i + 24), abs_mask), _mm256_setzero_ps()));
    amax[b] = hmax8(_mm256_max_ps(m0, m1));
  }
  if (i < n) {
    float xt[32] = {};
    std::memcpy(xt, x + i, (n - i) * sizeof(float));
    __m256 m = _mm256_setzero_ps();
    for (std::size_t j = 0; j < 32; j += 8)
      m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xt + j), abs_mask), m);
    amax[b] = hmax8(m);
  }
}

}  // namespace mpt::fp8::detail
