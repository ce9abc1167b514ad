// Chapter 07 — FP8 training: the AVX-512 loops of quantize_raw.hpp's fast
// path, sixteen lanes at a time. Compiled with -mavx512f and only called
// after cpuid says so (quantize_raw.cpp: widest()).
// Depends on: quantize_simd.hpp (the standard library only; see there why).
//
// Lane for lane the arithmetic of quantize_avx2.cpp, whose comment says why
// it gives quantize_element's bits; here the lane masks are mask registers
// and the counts their popcounts. tests/cpu/test_ch07_quantize_raw_avx512.cpp
// holds every lane to the portable loop's bits and counts.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "mpt/fp8/quantize_simd.hpp"

namespace mpt::fp8::detail {
namespace {

/// The encode's constants as vectors (built per call, not at namespace scope:
/// a global initialiser would run AVX-512 code at start-up).
struct Consts {
  __m512i abs_mask, sign_mask, round_rebias, one, min_normal, max_code, beyond_code, nan_code, inf_bits,
      magic_bits;
  __m512 magic;
  explicit Consts(const Fp8Encode& k, int shift) {
    abs_mask = _mm512_set1_epi32(0x7fffffff);
    sign_mask = _mm512_set1_epi32(static_cast<int>(0x80000000u));
    round_rebias = _mm512_set1_epi32(static_cast<int>(((1u << (shift - 1)) - 1u) - (k.rebias << shift)));
    one = _mm512_set1_epi32(1);
    min_normal = _mm512_set1_epi32(static_cast<int>(k.min_normal));
    max_code = _mm512_set1_epi32(static_cast<int>(k.max_code));
    beyond_code = _mm512_set1_epi32(static_cast<int>(k.saturate ? k.max_code : k.overflow_code));
    nan_code = _mm512_set1_epi32(static_cast<int>(k.nan_code));
    inf_bits = _mm512_set1_epi32(0x7f800000);
    magic = _mm512_set1_ps(k.subnormal_magic);
    magic_bits = _mm512_castps_si512(magic);
  }
};

/// The counted outcomes (over: beyond max or NaN; beyond = over − nan).
struct Counters {
  std::size_t over = 0, nan = 0, flushed = 0;
};

inline void add_counts(const Counters& n, RawCounts& c) {
  c.beyond += n.over - n.nan;
  c.nan += n.nan;
  c.flushed += n.flushed;
}

inline std::size_t popcount16(__mmask16 m) { return static_cast<std::size_t>(__builtin_popcount(m)); }

/// Sixteen codes of x × s, as bytes. Shift = 23 − m.
template <int Shift>
inline __m128i encode16(__m512 x, __m512 s, const Consts& k, Counters& n) {
  const __m512i u = _mm512_castps_si512(_mm512_mul_ps(x, s));
  const __m512i a = _mm512_and_si512(u, k.abs_mask);
  const __m512i sign = _mm512_srli_epi32(_mm512_and_si512(u, k.sign_mask), 24);
  const __m512i last = _mm512_and_si512(_mm512_srli_epi32(a, Shift), k.one);
  const __m512i normal =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(a, k.round_rebias), last), Shift);
  const __m512i sub =
      _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), k.magic)), k.magic_bits);
  __m512i mag = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(k.min_normal, a), normal, sub);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(a, k.inf_bits);
  const __mmask16 over = _mm512_cmpgt_epi32_mask(mag, k.max_code);  // beyond max, or NaN
  mag = _mm512_mask_blend_epi32(over, mag, k.beyond_code);
  mag = _mm512_mask_blend_epi32(nan, mag, k.nan_code);
  // x != 0 as C++ reads it (true for NaN, but a NaN's code is never 0)
  const __mmask16 flushed = static_cast<__mmask16>(_mm512_cmpeq_epi32_mask(mag, _mm512_setzero_si512()) &
                                                   _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_NEQ_UQ));
  n.over += popcount16(over);
  n.nan += popcount16(nan);
  n.flushed += popcount16(flushed);
  return _mm512_cvtepi32_epi8(_mm512_or_si512(mag, sign));
}

/// running raised to |x| lane by lane; a NaN |x| leaves running as it is
/// (VMAXPS returns its second operand when either is NaN).
inline __m512 amax_lanes(__m512 running, __m512 x, const Consts& k) {
  return _mm512_max_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), k.abs_mask)), running);
}

/// The largest lane (no lane is NaN).
inline float hmax16(__m512 m) { return _mm512_reduce_max_ps(m); }

/// Floats ahead that the loops ask the cache for (a prefetch never faults).
constexpr std::size_t kPrefetch = 512;

template <int Shift>
float tensor_loop(const float* x, std::size_t n, float scale, std::uint8_t* codes, const Consts& kc,
                  RawCounts& c) {
  const Consts k = kc;  // a local copy: the byte stores to codes may alias kc
  const __m512 s = _mm512_set1_ps(scale);
  Counters cnt;
  __m512 m0 = _mm512_setzero_ps(), m1 = m0;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i + kPrefetch), _MM_HINT_T0);
    const __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
    m0 = amax_lanes(m0, x0, k);
    m1 = amax_lanes(m1, x1, k);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), encode16<Shift>(x0, s, k, cnt));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i + 16), encode16<Shift>(x1, s, k, cnt));
  }
  for (; i < n; i += 16) {
    // The tail, sixteen at a time through masked loads and stores: masked-off
    // lanes read as 0, which has code 0, counts nothing and raises no amax.
    const std::size_t m = n - i < 16 ? n - i : 16;
    const __mmask16 live = static_cast<__mmask16>((1u << m) - 1u);
    const __m512 x0 = _mm512_maskz_loadu_ps(live, x + i);
    m0 = amax_lanes(m0, x0, k);
    std::uint8_t ct[16];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(ct), encode16<Shift>(x0, s, k, cnt));
    std::memcpy(codes + i, ct, m);  // (byte-masked stores would need AVX-512BW)
  }
  add_counts(cnt, c);
  return hmax16(_mm512_max_ps(m0, m1));
}

/// mx_scale_code(amax, f, rule) from Fp8Encode's numbers, as quantize_avx2.cpp's.
inline std::uint32_t scale_code(float amax, bool floor_rule, const Fp8Encode& k) {
  std::uint32_t u;
  if (floor_rule) {
    std::memcpy(&u, &amax, 4);
    int e = static_cast<int>((u >> 23) & 0xffu) - 127 - k.emax;
    e = e < -127 ? -127 : (e > 127 ? 127 : e);
    return static_cast<std::uint32_t>(e + 127);
  }
  const float v = amax * k.max_norm_rcp;
  std::memcpy(&u, &v, 4);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return 0xFE;  // inf (NaN cannot occur)
  std::uint32_t exponent = a >> 23;
  const std::uint32_t mantissa = a & 0x7fffffu;
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
  return exponent;
}

/// e8m0_reciprocal(code) for a code that is not NaN: 2^(127 − code), exact.
inline float scale_of(std::uint32_t code) {
  const std::uint32_t c = 254 - code;
  const std::uint32_t u = c == 0 ? 0x00400000u : c << 23;
  float s;
  std::memcpy(&s, &u, 4);
  return s;
}

template <int Shift>
void mx_row(const float* x, std::size_t cols, bool floor_rule, std::uint8_t* codes, std::uint8_t* e8m0,
            float* block_amax, const Fp8Encode& e, const Consts& kc, RawCounts& c) {
  const Consts k = kc;  // see tensor_loop
  const Fp8Encode ek = e;
  Counters cnt;
  const std::size_t blocks = (cols + 31) / 32;
  // Blocks in groups of eight: their amaxes and E8M0 codes first (eight
  // independent chains), then their codes from L1 (quantize_avx2.cpp says why).
  constexpr std::size_t kGroup = 8;
  float scale[kGroup], am[kGroup];
  for (std::size_t b0 = 0; b0 < blocks; b0 += kGroup) {
    const std::size_t g_blocks = blocks - b0 < kGroup ? blocks - b0 : kGroup;
    for (std::size_t g = 0; g < g_blocks; ++g) {
      const std::size_t i = 32 * (b0 + g), m = cols - i < 32 ? cols - i : 32;
      const __mmask16 lo = static_cast<__mmask16>(m >= 16 ? 0xffffu : (1u << m) - 1u);
      const __mmask16 hi = static_cast<__mmask16>(m >= 32 ? 0xffffu : (m > 16 ? (1u << (m - 16)) - 1u : 0u));
      _mm_prefetch(reinterpret_cast<const char*>(x + i + kPrefetch), _MM_HINT_T0);
      const __m512 zero = _mm512_setzero_ps();
      am[g] = hmax16(amax_lanes(amax_lanes(zero, _mm512_maskz_loadu_ps(lo, x + i), k),
                                _mm512_maskz_loadu_ps(hi, x + i + 16), k));
    }
    for (std::size_t g = 0; g < g_blocks; ++g) {
      const std::uint32_t code = scale_code(am[g], floor_rule, ek);
      scale[g] = scale_of(code);
      e8m0[b0 + g] = static_cast<std::uint8_t>(code);
      if (block_amax != nullptr) block_amax[b0 + g] = am[g];
    }
    for (std::size_t g = 0; g < g_blocks; ++g) {
      const std::size_t i = 32 * (b0 + g), m = cols - i < 32 ? cols - i : 32;
      const __m512 s = _mm512_set1_ps(scale[g]);
      if (m == 32) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i),
                         encode16<Shift>(_mm512_loadu_ps(x + i), s, k, cnt));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i + 16),
                         encode16<Shift>(_mm512_loadu_ps(x + i + 16), s, k, cnt));
      } else {
        const __mmask16 lo = static_cast<__mmask16>(m >= 16 ? 0xffffu : (1u << m) - 1u);
        const __mmask16 hi = static_cast<__mmask16>(m > 16 ? (1u << (m - 16)) - 1u : 0u);
        std::uint8_t ct[32];
        _mm_storeu_si128(reinterpret_cast<__m128i*>(ct),
                         encode16<Shift>(_mm512_maskz_loadu_ps(lo, x + i), s, k, cnt));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(ct + 16),
                         encode16<Shift>(_mm512_maskz_loadu_ps(hi, x + i + 16), s, k, cnt));
        std::memcpy(codes + i, ct, m);  // (byte-masked stores would need AVX-512BW)
      }
    }
  }
  add_counts(cnt, c);
}

}  // namespace

float quantize_tensor_avx512(const float* x, std::size_t n, float scale, std::uint8_t* codes,
                             const Fp8Encode& k, RawCounts& c) {
  const Consts v(k, 23 - k.mantissa_bits);
  return k.mantissa_bits == 3 ? tensor_loop<20>(x, n, scale, codes, v, c)
                              : tensor_loop<21>(x, n, scale, codes, v, c);
}

void quantize_mx_row_avx512(const float* x, std::size_t cols, bool floor_rule, std::uint8_t* codes,
                            std::uint8_t* e8m0, float* block_amax, const Fp8Encode& k, RawCounts& c) {
  const Consts v(k, 23 - k.mantissa_bits);
  if (k.mantissa_bits == 3) {
    mx_row<20>(x, cols, floor_rule, codes, e8m0, block_amax, k, v, c);
  } else {
    mx_row<21>(x, cols, floor_rule, codes, e8m0, block_amax, k, v, c);
  }
}

}  // namespace mpt::fp8::detail
