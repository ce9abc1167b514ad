// Chapter 01 — floating-point formats and their limits.
// Depends on: rounding_impl.hpp. Compiled with -mavx2 -mf16c -mfma and only
// called after cpuid says so. Eight lanes of round_element.hpp's
// round_to_format, step for step, so the bits match the portable loop
// (tests/cpu/test_ch01_rounding.cpp holds them to it, including NaN).
#include <immintrin.h>

#include <cstring>

#include "mpt/rounding_impl.hpp"

namespace mpt::detail {
namespace {

inline __m256i set1(std::uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }

/// Unsigned a < b on 32-bit lanes (AVX2 compares are signed).
inline __m256i lt_u32(__m256i a, __m256i b) {
  const __m256i flip = set1(0x80000000u);
  return _mm256_cmpgt_epi32(_mm256_xor_si256(b, flip), _mm256_xor_si256(a, flip));
}

/// sr_random_bits(seed, first + lane) for 8 lanes, when the 8 indices share
/// their upper 32 bits (the caller checks).
inline __m256i random_bits8(std::uint64_t seed, std::uint64_t first) {
  const std::uint32_t h0 = static_cast<std::uint32_t>(seed) ^
                           static_cast<std::uint32_t>(seed >> 32) * 0x85ebca6bu;
  const std::uint32_t hi = static_cast<std::uint32_t>(first >> 32) * 0x7f4a7c15u;
  const __m256i idx = _mm256_add_epi32(set1(static_cast<std::uint32_t>(first)),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i h = _mm256_xor_si256(set1(h0 ^ hi), _mm256_mullo_epi32(idx, set1(0x9e3779b9u)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, set1(0x85ebca6bu));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, set1(0xc2b2ae35u));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  return h;
}

/// The precomputed per-call constants of the generic kernel.
struct Consts {
  __m256i emin_biased, base_shift, one, mant_mask, implicit, abs_mask, sign_mask, exp_inf;
  __m256 maxv, min_normal, overflow_value;
  bool saturate, toward_zero, flush, stochastic, nearest;
  explicit Consts(const RoundParams& p) {
    emin_biased = _mm256_set1_epi32(p.spec.emin() + 127);
    base_shift = _mm256_set1_epi32(23 - p.spec.mantissa_bits);
    one = _mm256_set1_epi32(1);
    mant_mask = set1(0x7fffffu);
    implicit = set1(0x800000u);
    abs_mask = set1(0x7fffffffu);
    sign_mask = set1(0x80000000u);
    exp_inf = set1(0x7f800000u);
    maxv = _mm256_set1_ps(format_max(p.spec));
    min_normal = _mm256_set1_ps(pow2f(p.spec.emin()));
    overflow_value = _mm256_castsi256_ps(set1(p.spec.has_inf() ? 0x7f800000u : 0x7fc00000u));
    saturate = p.overflow == OverflowMode::saturate;
    toward_zero = p.mode == RoundingMode::toward_zero;
    flush = p.subnormals == SubnormalMode::flush;
    stochastic = p.mode == RoundingMode::stochastic;
    nearest = p.mode == RoundingMode::nearest_even;
  }
};

/// Eight lanes of round_to_format; `rnd` is read in stochastic mode only.
inline __m256 round8(__m256 x, const Consts& c, __m256i rnd) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i sign = _mm256_and_si256(u, c.sign_mask);
  const __m256i a = _mm256_and_si256(u, c.abs_mask);
  const __m256i biased = _mm256_srli_epi32(a, 23);
  const __m256i e_eff = _mm256_max_epi32(biased, c.one);
  const __m256i is_normal = _mm256_cmpgt_epi32(biased, _mm256_setzero_si256());
  const __m256i sig = _mm256_or_si256(_mm256_and_si256(a, c.mant_mask),
                                      _mm256_and_si256(is_normal, c.implicit));
  const __m256i below =
      _mm256_max_epi32(_mm256_sub_epi32(c.emin_biased, e_eff), _mm256_setzero_si256());
  const __m256i shift = _mm256_add_epi32(c.base_shift, below);
  const __m256i q = _mm256_add_epi32(_mm256_sub_epi32(e_eff, _mm256_set1_epi32(150)), shift);

  __m256i r;
  if (c.stochastic) {
    const __m256i kept = _mm256_srlv_epi32(sig, shift);  // 0 when shift >= 32
    const __m256i low_mask = _mm256_sub_epi32(_mm256_sllv_epi32(c.one, shift), c.one);
    const __m256i dropped = _mm256_and_si256(sig, low_mask);  // all of sig when shift >= 32
    // Counts outside [0, 31] give 0, so exactly one of the two terms survives.
    const __m256i threshold = _mm256_or_si256(
        _mm256_sllv_epi32(dropped, _mm256_sub_epi32(_mm256_set1_epi32(32), shift)),
        _mm256_srlv_epi32(dropped, _mm256_sub_epi32(shift, _mm256_set1_epi32(32))));
    r = _mm256_sub_epi32(kept, lt_u32(rnd, threshold));  // mask is -1 where rounding up
  } else {
    const __m256i s = _mm256_min_epi32(shift, _mm256_set1_epi32(25));
    const __m256i kept = _mm256_srlv_epi32(sig, s);
    if (c.nearest) {
      const __m256i unit = _mm256_sllv_epi32(c.one, s);
      const __m256i dropped = _mm256_and_si256(sig, _mm256_sub_epi32(unit, c.one));
      const __m256i half = _mm256_srli_epi32(unit, 1);  // 0 when nothing is dropped
      const __m256i above = _mm256_cmpgt_epi32(dropped, half);
      const __m256i tie_odd = _mm256_and_si256(
          _mm256_and_si256(_mm256_cmpeq_epi32(dropped, half),
                           _mm256_cmpeq_epi32(_mm256_and_si256(kept, c.one), c.one)),
          _mm256_cmpgt_epi32(half, _mm256_setzero_si256()));
      r = _mm256_sub_epi32(kept, _mm256_or_si256(above, tie_odd));
    } else {
      r = kept;
    }
  }

  // 2^q: normal powers by exponent field, subnormal ones by a single bit
  // (a negative count gives 0, matching the scalar code's q < -149 case).
  const __m256i p2_normal = _mm256_slli_epi32(_mm256_add_epi32(q, _mm256_set1_epi32(127)), 23);
  const __m256i p2_sub = _mm256_sllv_epi32(c.one, _mm256_add_epi32(q, _mm256_set1_epi32(149)));
  const __m256i q_normal = _mm256_cmpgt_epi32(q, _mm256_set1_epi32(-127));
  const __m256 p2 = _mm256_castsi256_ps(_mm256_blendv_epi8(p2_sub, p2_normal, q_normal));
  __m256 y = _mm256_mul_ps(_mm256_cvtepi32_ps(r), p2);

  const __m256 over = _mm256_cmp_ps(y, c.maxv, _CMP_GT_OQ);
  __m256 replacement;
  if (c.saturate) {
    replacement = c.maxv;
  } else if (c.toward_zero) {
    const __m256 input_inf = _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, c.exp_inf));
    replacement = _mm256_blendv_ps(c.maxv, c.overflow_value, input_inf);
  } else {
    replacement = c.overflow_value;
  }
  y = _mm256_blendv_ps(y, replacement, over);
  if (c.flush) {
    const __m256 tiny = _mm256_cmp_ps(y, c.min_normal, _CMP_LT_OQ);
    y = _mm256_andnot_ps(tiny, y);
  }
  __m256i out = _mm256_or_si256(_mm256_castps_si256(y), sign);
  const __m256i is_nan = _mm256_cmpgt_epi32(a, c.exp_inf);
  out = _mm256_blendv_epi8(out, _mm256_or_si256(sign, set1(0x7fc00000u)), is_nan);
  return _mm256_castsi256_ps(out);
}

/// True when indices first .. first+7 share their upper 32 bits.
inline bool same_high_word(std::uint64_t first) {
  return (first >> 32) == ((first + 7) >> 32);
}

/// Canonical quiet NaN (sign kept) wherever the input was NaN.
inline __m256i fix_nan32(__m256i result, __m256i u) {
  const __m256i a = _mm256_and_si256(u, set1(0x7fffffffu));
  const __m256i is_nan = _mm256_cmpgt_epi32(a, set1(0x7f800000u));
  const __m256i qnan = _mm256_or_si256(_mm256_and_si256(u, set1(0x80000000u)), set1(0x7fc00000u));
  return _mm256_blendv_epi8(result, qnan, is_nan);
}

/// fp16 RNE by the F16C instruction (IEEE binary16 conversion in hardware).
inline __m128i fp16_codes8(__m256 x) {
  __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // Hardware keeps NaN payloads; the project's canonical NaN drops them.
  const __m256i u = _mm256_castps_si256(x);
  const __m256i a = _mm256_and_si256(u, set1(0x7fffffffu));
  const __m256i is_nan = _mm256_cmpgt_epi32(a, set1(0x7f800000u));
  const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(is_nan),
                                        _mm256_extracti128_si256(is_nan, 1));
  const __m128i sign16 = _mm_and_si128(h, _mm_set1_epi16(static_cast<short>(0x8000)));
  const __m128i canon = _mm_or_si128(sign16, _mm_set1_epi16(0x7e00));
  return _mm_blendv_epi8(h, canon, nan16);
}

/// bf16 RNE as bit arithmetic: add 0x7fff plus the lowest kept bit, then
/// truncate. Carries run into the exponent, so overflow reaches inf exactly.
inline __m256i bf16_round_bits8(__m256i u) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), set1(1u));
  const __m256i r = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, set1(0x7fffu)), lsb),
                                     set1(0xffff0000u));
  return fix_nan32(r, u);
}

/// Encode eight rounded values (the output of round8) as codes of `spec`
/// (encode_exact, lane by lane).
inline __m256i encode8(__m256 y, const FormatSpec& spec) {
  const int m = spec.mantissa_bits;
  const __m256i u = _mm256_castps_si256(y);
  const __m256i a = _mm256_and_si256(u, set1(0x7fffffffu));
  const __m256i sign_out =
      _mm256_slli_epi32(_mm256_srli_epi32(u, 31), spec.exponent_bits + m);
  // normal: re-bias the exponent and keep the top m fraction bits
  const __m256i normal = _mm256_sub_epi32(
      _mm256_srli_epi32(a, 23 - m),
      _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(127 - spec.bias) << m)));
  // subnormal in the target: the fraction field is |y| / 2^(emin - m)
  const __m256 scaled = _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(pow2f(m - spec.emin())));
  const __m256i subnormal = _mm256_cvttps_epi32(scaled);
  const __m256i is_sub =
      _mm256_cmpgt_epi32(_mm256_set1_epi32((spec.emin() + 127) << 23), a);
  __m256i code = _mm256_blendv_epi8(normal, subnormal, is_sub);
  const std::uint32_t all_ones = (1u << spec.exponent_bits) - 1u;
  const std::uint32_t nan_frac = spec.has_inf() ? (1u << (m - 1)) : (1u << m) - 1u;
  const __m256i is_inf = _mm256_cmpeq_epi32(a, set1(0x7f800000u));
  const __m256i is_nan = _mm256_cmpgt_epi32(a, set1(0x7f800000u));
  code = _mm256_blendv_epi8(code, set1(all_ones << m), is_inf);
  code = _mm256_blendv_epi8(code, set1((all_ones << m) | nan_frac), is_nan);
  return _mm256_or_si256(code, sign_out);
}

template <typename Store>
void for_each8(const float* in, std::size_t n, const RoundParams& p, std::uint64_t first,
               Store store) {
  const Consts c(p);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t idx = first + i;
    if (c.stochastic && !same_high_word(idx)) {
      float tmp[8];
      for (int k = 0; k < 8; ++k) tmp[k] = round_one(in[i + k], p, idx + k);
      store(i, _mm256_loadu_ps(tmp));
      continue;
    }
    const __m256i rnd = c.stochastic ? random_bits8(p.seed, idx) : _mm256_setzero_si256();
    store(i, round8(_mm256_loadu_ps(in + i), c, rnd));
  }
  if (i < n) {  // tail through the same lanes, padded
    float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(buf, in + i, (n - i) * sizeof(float));
    float tmp[8];
    for (int k = 0; k < 8; ++k) tmp[k] = k < static_cast<int>(n - i) ? round_one(buf[k], p, first + i + k) : 0.0f;
    store(i, _mm256_loadu_ps(tmp), n - i);
  }
}

}  // namespace

void round_avx2(const float* in, float* out, std::size_t n, const RoundParams& p,
                std::uint64_t first) {
  std::size_t i = 0;
  if (is_ieee_default(p) && p.spec.exponent_bits == 5 && p.spec.mantissa_bits == 10) {
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(fp16_codes8(_mm256_loadu_ps(in + i))));
  } else if (is_ieee_default(p) && p.spec.exponent_bits == 8 && p.spec.mantissa_bits == 7) {
    for (; i + 8 <= n; i += 8) {
      const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bf16_round_bits8(u));
    }
  } else {
    for_each8(in, n, p, first,
              [&](std::size_t j, __m256 v, std::size_t count = 8) {
                if (count == 8) {
                  _mm256_storeu_ps(out + j, v);
                } else {
                  float tmp[8];
                  _mm256_storeu_ps(tmp, v);
                  std::memcpy(out + j, tmp, count * sizeof(float));
                }
              });
    return;
  }
  for (; i < n; ++i) out[i] = round_one(in[i], p, first + i);
}

void encode16_avx2(const float* in, std::uint16_t* out, std::size_t n, const RoundParams& p,
                   std::uint64_t first) {
  std::size_t i = 0;
  if (is_ieee_default(p) && p.spec.exponent_bits == 5 && p.spec.mantissa_bits == 10) {
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), fp16_codes8(_mm256_loadu_ps(in + i)));
  } else if (is_ieee_default(p) && p.spec.exponent_bits == 8 && p.spec.mantissa_bits == 7) {
    for (; i + 8 <= n; i += 8) {
      const __m256i r = _mm256_srli_epi32(
          bf16_round_bits8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))), 16);
      const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), packed);
    }
  } else {
    for_each8(in, n, p, first, [&](std::size_t j, __m256 v, std::size_t count = 8) {
      const __m256i code = encode8(v, p.spec);
      const __m128i packed =
          _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
      if (count == 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), packed);
      } else {
        std::uint16_t tmp[8];
        _mm_storeu_si128(reinterpret_cast<__m128i*>(tmp), packed);
        std::memcpy(out + j, tmp, count * sizeof(std::uint16_t));
      }
    });
    return;
  }
  for (; i < n; ++i) out[i] = static_cast<std::uint16_t>(encode_exact(round_one(in[i], p, first + i), p.spec));
}

void encode8_avx2(const float* in, std::uint8_t* out, std::size_t n, const RoundParams& p,
                  std::uint64_t first) {
  for_each8(in, n, p, first, [&](std::size_t j, __m256 v, std::size_t count = 8) {
    const __m256i code = encode8(v, p.spec);
    const __m128i w16 =
        _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
    const __m128i w8 = _mm_packus_epi16(w16, w16);
    if (count == 8) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + j), w8);
    } else {
      std::uint8_t tmp[16];
      _mm_storeu_si128(reinterpret_cast<__m128i*>(tmp), w8);
      std::memcpy(out + j, tmp, count);
    }
  });
}

}  // namespace mpt::detail
