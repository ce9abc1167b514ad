// Chapter 07 — FP8 training: the AVX2 loops of quantize_raw.hpp's fast
// path. Compiled with -mavx2 and only called after cpuid says so.
// Depends on: quantize_simd.hpp.
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
//  - below it: the code is |v| / 2^(emin − m) rounded to nearest even,
//    which the hardware's own rounding of |v| + 2^(emin − m + 23) gives
//    (the magic-number trick; the default rounding mode, no DAZ);
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

#include "mpt/fp8/quantize_simd.hpp"

namespace mpt::fp8::detail {
namespace {

/// The encode's constants as vectors (built per call, not at namespace
/// scope: a global initialiser would run AVX2 code at start-up).
struct Consts {
  __m256i abs_mask, sign_mask, round_rebias, one, min_normal, max_code, beyond_code, nan_code, inf_bits,
      magic_bits;
  __m256 magic;
  explicit Consts(const Fp8Encode& k, int shift) {
    abs_mask = _mm256_set1_epi32(0x7fffffff);
    sign_mask = _mm256_set1_epi32(static_cast<int>(0x80000000u));
    // half an ulp of the target less one, with the re-bias folded in (it is a
    // multiple of 2^shift, so subtracting it before the shift is exact)
    round_rebias = _mm256_set1_epi32(static_cast<int>(((1u << (shift - 1)) - 1u) - (k.rebias << shift)));
    one = _mm256_set1_epi32(1);
    min_normal = _mm256_set1_epi32(static_cast<int>(k.min_normal));
    max_code = _mm256_set1_epi32(static_cast<int>(k.max_code));
    beyond_code = _mm256_set1_epi32(static_cast<int>(k.saturate ? k.max_code : k.overflow_code));
    nan_code = _mm256_set1_epi32(static_cast<int>(k.nan_code));
    inf_bits = _mm256_set1_epi32(0x7f800000);
    magic = _mm256_set1_ps(k.subnormal_magic);
    magic_bits = _mm256_castps_si256(magic);
  }
};

/// Lane counters of the counted outcomes (each lane adds 1 by subtracting an
/// all-ones mask). over: beyond max or NaN; the beyond count is over − nan.
struct Counters {
  __m256i over = _mm256_setzero_si256(), nan = _mm256_setzero_si256(), flushed = _mm256_setzero_si256();
};

inline std::size_t lane_sum(__m256i v) {
  alignas(32) std::uint32_t l[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), v);
  std::size_t s = 0;
  for (std::uint32_t x : l) s += x;
  return s;
}

inline void add_counts(const Counters& k, RawCounts& c) {
  const std::size_t nan = lane_sum(k.nan);
  c.beyond += lane_sum(k.over) - nan;
  c.nan += nan;
  c.flushed += lane_sum(k.flushed);
}

/// Eight codes (one per 32-bit lane) of x × s. Shift = 23 − m.
template <int Shift>
inline __m256i encode8(__m256 x, __m256 s, const Consts& k, Counters& n) {
  const __m256i u = _mm256_castps_si256(_mm256_mul_ps(x, s));
  const __m256i a = _mm256_and_si256(u, k.abs_mask);
  const __m256i sign = _mm256_srli_epi32(_mm256_and_si256(u, k.sign_mask), 24);
  // normal: round to nearest even on the bits and re-bias (lanes below the
  // smallest normal come out wrong here and are replaced below)
  const __m256i last = _mm256_and_si256(_mm256_srli_epi32(a, Shift), k.one);
  const __m256i normal =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(a, k.round_rebias), last), Shift);
  // subnormal: |v| + 2^(emin − m + 23) rounds, in hardware and to nearest
  // even, to a multiple of 2^(emin − m), the target's step there; the bits
  // above the magic number's are the code
  const __m256i sub =
      _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), k.magic)), k.magic_bits);
  __m256i mag = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(k.min_normal, a));
  const __m256i nan = _mm256_cmpgt_epi32(a, k.inf_bits);
  const __m256i over = _mm256_cmpgt_epi32(mag, k.max_code);  // beyond max, or NaN
  mag = _mm256_blendv_epi8(mag, k.beyond_code, over);
  mag = _mm256_blendv_epi8(mag, k.nan_code, nan);
  // x != 0 as C++ reads it (true for NaN, but a NaN's code is never 0)
  const __m256i nonzero = _mm256_castps_si256(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_NEQ_UQ));
  const __m256i flushed = _mm256_and_si256(_mm256_cmpeq_epi32(mag, _mm256_setzero_si256()), nonzero);
  n.over = _mm256_sub_epi32(n.over, over);
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

/// Floats ahead that the per-tensor loop asks the cache for (a prefetch
/// past the end is harmless: it never faults).
constexpr std::size_t kPrefetch = 512;

template <int Shift>
float tensor_loop(const float* x, std::size_t n, float scale, std::uint8_t* codes, const Consts& kc,
                  RawCounts& c) {
  // A local copy: the byte stores to codes may alias kc, which would reload it every time.
  const Consts k = kc;
  const __m256 s = _mm256_set1_ps(scale);
  Counters cnt;
  __m256 m0 = _mm256_setzero_ps(), m1 = m0;
  // 16 values at i: their codes, their |x| into the running amaxes.
  const auto step = [&](std::size_t i) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i + kPrefetch), _MM_HINT_T0);
    const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
    m0 = amax_lanes(m0, x0, k);
    m1 = amax_lanes(m1, x1, k);
    const __m128i c16 = pack16(encode8<Shift>(x0, s, k, cnt), encode8<Shift>(x1, s, k, cnt));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), c16);
  };
  // Four streams, as the AVX-512 loop walks them (quantize_avx512.cpp says
  // why): x in four equal parts of whole 16-value steps, then what is left.
  const std::size_t q = n / 64 * 16;
  for (std::size_t i = 0; i < q; i += 16) {
    step(i);
    step(q + i);
    step(2 * q + i);
    step(3 * q + i);
  }
  std::size_t i = 4 * q;
  for (; i + 16 <= n; i += 16) step(i);
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

/// mx_scale_code(amax, f, rule) from Fp8Encode's numbers (amax is never
/// NaN here: NaN values were left out of it). FLOOR: the exponent field of
/// amax less 127 and emax, clamped to E8M0's range. RCEIL: amax × fp32(1 /
/// max) rounded up to a power of two (e8m0_round_up's rule).
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

/// One MX block of 32 values x0..x3 (zero-padded if short): its amax, code and 32 codes.
template <int Shift>
inline void mx_block(__m256 x0, __m256 x1, __m256 x2, __m256 x3, bool floor_rule, const Fp8Encode& e,
                     const Consts& k, Counters& cnt, std::uint8_t* out32, std::uint8_t& code_out,
                     float& amax_out) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 a =
      _mm256_max_ps(amax_lanes(amax_lanes(zero, x0, k), x1, k), amax_lanes(amax_lanes(zero, x2, k), x3, k));
  const float amax = hmax8(a);
  const std::uint32_t code = scale_code(amax, floor_rule, e);
  const __m256 s = _mm256_set1_ps(scale_of(code));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out32),
                   pack16(encode8<Shift>(x0, s, k, cnt), encode8<Shift>(x1, s, k, cnt)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out32 + 16),
                   pack16(encode8<Shift>(x2, s, k, cnt), encode8<Shift>(x3, s, k, cnt)));
  code_out = static_cast<std::uint8_t>(code);
  amax_out = amax;
}

template <int Shift>
void mx_row(const float* x, std::size_t cols, bool floor_rule, std::uint8_t* codes, std::uint8_t* e8m0,
            float* block_amax, const Fp8Encode& e, const Consts& kc, RawCounts& c) {
  const Consts k = kc;  // see tensor_loop
  const Fp8Encode ek = e;
  Counters cnt;
  std::size_t i = 0, b = 0;
  float amax = 0.0f;
  // Full blocks in groups of eight: first their amaxes and E8M0 codes (eight
  // independent chains the core overlaps), then their codes, from L1. One
  // block at a time would wait, block after block, for its amax to travel
  // through a horizontal max, a scalar code and a broadcast.
  constexpr std::size_t kGroup = 8;
  float scale[kGroup], am[kGroup];
  while (i + 32 <= cols) {
    const std::size_t g_blocks = (cols - i) / 32 < kGroup ? (cols - i) / 32 : kGroup;
    for (std::size_t g = 0; g < g_blocks; ++g) {
      const float* p = x + i + 32 * g;
      _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch), _MM_HINT_T0);
      const __m256 zero = _mm256_setzero_ps();
      am[g] = hmax8(_mm256_max_ps(
          amax_lanes(amax_lanes(zero, _mm256_loadu_ps(p), k), _mm256_loadu_ps(p + 8), k),
          amax_lanes(amax_lanes(zero, _mm256_loadu_ps(p + 16), k), _mm256_loadu_ps(p + 24), k)));
    }
    for (std::size_t g = 0; g < g_blocks; ++g) {
      const std::uint32_t code = scale_code(am[g], floor_rule, ek);
      scale[g] = scale_of(code);
      e8m0[b + g] = static_cast<std::uint8_t>(code);
      if (block_amax != nullptr) block_amax[b + g] = am[g];
    }
    for (std::size_t g = 0; g < g_blocks; ++g) {
      const float* p = x + i + 32 * g;
      const __m256 s = _mm256_set1_ps(scale[g]);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i + 32 * g),
                       pack16(encode8<Shift>(_mm256_loadu_ps(p), s, k, cnt),
                              encode8<Shift>(_mm256_loadu_ps(p + 8), s, k, cnt)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i + 32 * g + 16),
                       pack16(encode8<Shift>(_mm256_loadu_ps(p + 16), s, k, cnt),
                              encode8<Shift>(_mm256_loadu_ps(p + 24), s, k, cnt)));
    }
    i += 32 * g_blocks;
    b += g_blocks;
    if ((b & 0xffff) < kGroup) {  // lane counters are 32-bit: empty them now and then
      add_counts(cnt, c);
      cnt = Counters{};
    }
  }
  if (i < cols) {
    // The short last block on a zero-padded copy: a padding 0 raises no amax,
    // has code 0 and counts nothing.
    const std::size_t m = cols - i;
    float xt[32] = {};
    std::uint8_t ct[32];
    std::memcpy(xt, x + i, m * sizeof(float));
    mx_block<Shift>(_mm256_loadu_ps(xt), _mm256_loadu_ps(xt + 8), _mm256_loadu_ps(xt + 16),
                    _mm256_loadu_ps(xt + 24), floor_rule, ek, k, cnt, ct, e8m0[b], amax);
    if (block_amax != nullptr) block_amax[b] = amax;
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

void quantize_mx_row_avx2(const float* x, std::size_t cols, bool floor_rule, std::uint8_t* codes,
                          std::uint8_t* e8m0, float* block_amax, const Fp8Encode& k, RawCounts& c) {
  const Consts v(k, 23 - k.mantissa_bits);
  if (k.mantissa_bits == 3) {
    mx_row<20>(x, cols, floor_rule, codes, e8m0, block_amax, k, v, c);
  } else {
    mx_row<21>(x, cols, floor_rule, codes, e8m0, block_amax, k, v, c);
  }
}

}  // namespace mpt::fp8::detail
