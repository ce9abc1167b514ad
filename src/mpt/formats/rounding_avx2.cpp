// Chapter 01 — floating-point formats and their limits.
// Depends on: rounding_impl.hpp. Compiled with -mavx2 -mf16c -mfma and only
// called after cpuid says so. Eight lanes of round_element.hpp's
// round_to_format, step for step, so the bits match the portable loop
// (tests/cpu/test_ch01_rounding.cpp holds them to it, including NaN).
#include <immintrin.h>

#include <cstring>

#include "mpt/formats/rounding_impl.hpp"

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
  const std::uint32_t h0 =
      static_cast<std::uint32_t>(seed) ^ static_cast<std::uint32_t>(seed >> 32) * 0x85ebca6bu;
  const std::uint32_t hi = static_cast<std::uint32_t>(first >> 32) * 0x7f4a7c15u;
  const __m256i idx =
      _mm256_add_epi32(set1(static_cast<std::uint32_t>(first)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i h = _mm256_xor_si256(set1(h0 ^ hi), _mm256_mullo_epi32(idx, set1(0x9e3779b9u)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, set1(0x85ebca6bu));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, set1(0xc2b2ae35u));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  return h;
}

/// The kernels, chosen once per call so the inner loops carry no mode branches.
enum class Kernel { nearest_magic, nearest, toward_zero, stochastic };

/// The precomputed per-call constants of the kernels.
struct Consts {
  __m256i emin_biased, base_shift, one, abs_mask, sign_mask, exp_inf, qnan;
  __m256i magic_lo, magic_hi, magic_shift;
  __m256 maxv, flush_below, over_finite, over_inf;
  Kernel kernel = Kernel::nearest;
  explicit Consts(const RoundParams& p) {
    const FormatSpec& f = p.spec;
    emin_biased = _mm256_set1_epi32(f.emin() + 127);
    base_shift = _mm256_set1_epi32(23 - f.mantissa_bits);
    one = _mm256_set1_epi32(1);
    abs_mask = set1(0x7fffffffu);
    sign_mask = set1(0x80000000u);
    exp_inf = set1(0x7f800000u);
    qnan = set1(0x7fc00000u);
    magic_lo = _mm256_set1_epi32((f.emin() + 127) << 23);
    magic_hi = _mm256_set1_epi32((f.emax() + 1 + 127) << 23);
    magic_shift = _mm256_set1_epi32((23 - f.mantissa_bits) << 23);
    maxv = _mm256_set1_ps(format_max(f));
    // y < 0 never holds for a magnitude, so a zero limit disables flushing
    flush_below = _mm256_set1_ps(p.subnormals == SubnormalMode::flush ? pow2f(f.emin()) : 0.0f);
    // What replaces a magnitude above max, for finite and for infinite inputs
    // (round_to_format's overflow rules, precomputed).
    const __m256 inf_or_nan = _mm256_castsi256_ps(set1(f.has_inf() ? 0x7f800000u : 0x7fc00000u));
    if (p.overflow == OverflowMode::saturate) {
      over_finite = over_inf = maxv;
    } else if (p.mode == RoundingMode::toward_zero) {
      over_finite = maxv;
      over_inf = inf_or_nan;
    } else {
      over_finite = over_inf = inf_or_nan;
    }
    switch (p.mode) {
      case RoundingMode::stochastic: kernel = Kernel::stochastic; break;
      case RoundingMode::toward_zero: kernel = Kernel::toward_zero; break;
      case RoundingMode::nearest_even:
        // |x| + 2^(k + 23 - m) must stay finite in fp32 for the magic trick
        kernel = f.emax() + 1 + 127 + 23 - f.mantissa_bits <= 254 ? Kernel::nearest_magic : Kernel::nearest;
        break;
    }
  }
};

/// Overflow replacement, flushing, sign and NaN: the common tail of every
/// kernel. `y` is the rounded magnitude, `a` the input's magnitude bits.
inline __m256 finish8(__m256 y, __m256i a, __m256i sign, const Consts& c) {
  const __m256 over = _mm256_cmp_ps(y, c.maxv, _CMP_GT_OQ);
  const __m256 input_inf = _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, c.exp_inf));
  y = _mm256_blendv_ps(y, _mm256_blendv_ps(c.over_finite, c.over_inf, input_inf), over);
  y = _mm256_andnot_ps(_mm256_cmp_ps(y, c.flush_below, _CMP_LT_OQ), y);
  const __m256i out = _mm256_or_si256(_mm256_castps_si256(y), sign);
  const __m256i is_nan = _mm256_cmpgt_epi32(a, c.exp_inf);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(out, _mm256_or_si256(sign, c.qnan), is_nan));
}

/// Eight lanes of round_to_format; `rnd` is read by the stochastic kernel only.
template <Kernel K>
inline __m256 round8(__m256 x, const Consts& c, __m256i rnd) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i sign = _mm256_and_si256(u, c.sign_mask);
  const __m256i a = _mm256_and_si256(u, c.abs_mask);

  if constexpr (K == Kernel::nearest_magic) {
    // RNE by the FPU itself: with C = 2^(k + 23 - m), where 2^k is |x|'s
    // binade clamped to [emin, emax + 1], |x| + C rounds |x| to a multiple of
    // ulp(C) = 2^(k - m), the target's quantum, and subtracting C is exact.
    // Same bits as the integer kernel at a third of the work (needs the
    // default MXCSR rounding mode, as everything here).
    const __m256i k =
        _mm256_min_epi32(_mm256_max_epi32(_mm256_and_si256(a, c.exp_inf), c.magic_lo), c.magic_hi);
    const __m256 big = _mm256_castsi256_ps(_mm256_add_epi32(k, c.magic_shift));
    const __m256 y = _mm256_sub_ps(_mm256_add_ps(_mm256_castsi256_ps(a), big), big);
    return finish8(y, a, sign, c);
  } else {
    // x = sig * 2^(e_eff - 150); sig = a - (e_eff - 1) * 2^23 recovers the
    // significand with its implicit bit for normals and as is for subnormals.
    const __m256i e_eff = _mm256_max_epi32(_mm256_srli_epi32(a, 23), c.one);
    const __m256i sig = _mm256_sub_epi32(a, _mm256_slli_epi32(_mm256_sub_epi32(e_eff, c.one), 23));
    const __m256i below = _mm256_max_epi32(_mm256_sub_epi32(c.emin_biased, e_eff), _mm256_setzero_si256());
    const __m256i shift = _mm256_add_epi32(c.base_shift, below);
    const __m256i q = _mm256_add_epi32(_mm256_sub_epi32(e_eff, _mm256_set1_epi32(150)), shift);

    __m256i r;
    if constexpr (K == Kernel::stochastic) {
      // srlv/sllv give 0 for counts outside [0, 31]: with shift >= 32 the
      // first term vanishes, with shift < 32 the second does (see the scalar code).
      const __m256i added =
          _mm256_add_epi32(sig, _mm256_srlv_epi32(rnd, _mm256_sub_epi32(_mm256_set1_epi32(32), shift)));
      const __m256i r_big = _mm256_srlv_epi32(added, shift);
      const __m256i tiny_up =
          lt_u32(rnd, _mm256_srlv_epi32(sig, _mm256_sub_epi32(shift, _mm256_set1_epi32(32))));
      r = _mm256_sub_epi32(r_big, tiny_up);  // the mask is -1 where a tiny value rounds up
    } else {
      const __m256i s = _mm256_min_epi32(shift, _mm256_set1_epi32(25));
      const __m256i kept = _mm256_srlv_epi32(sig, s);
      if constexpr (K == Kernel::nearest) {
        const __m256i unit = _mm256_sllv_epi32(c.one, s);
        const __m256i dropped = _mm256_and_si256(sig, _mm256_sub_epi32(unit, c.one));
        const __m256i half = _mm256_srli_epi32(unit, 1);  // 0 when nothing is dropped
        const __m256i above = _mm256_cmpgt_epi32(dropped, half);
        const __m256i tie_odd =
            _mm256_and_si256(_mm256_and_si256(_mm256_cmpeq_epi32(dropped, half),
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
    return finish8(_mm256_mul_ps(_mm256_cvtepi32_ps(r), p2), a, sign, c);
  }
}

/// True when indices first .. first+7 share their upper 32 bits.
inline bool same_high_word(std::uint64_t first) { return (first >> 32) == ((first + 7) >> 32); }

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
  const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(is_nan), _mm256_extracti128_si256(is_nan, 1));
  const __m128i sign16 = _mm_and_si128(h, _mm_set1_epi16(static_cast<short>(0x8000)));
  const __m128i canon = _mm_or_si128(sign16, _mm_set1_epi16(0x7e00));
  return _mm_blendv_epi8(h, canon, nan16);
}

/// RNE for formats with fp32's exponent (bf16, tf32) as bit arithmetic: add
/// half a quantum minus one plus the lowest kept bit, then truncate. Carries
/// run into the exponent, so overflow reaches inf exactly, and fp32
/// subnormals round correctly because their bit patterns are linear.
inline __m256i wide_round_bits8(__m256i u, int drop) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, drop), set1(1u));
  const __m256i r = _mm256_and_si256(
      _mm256_add_epi32(_mm256_add_epi32(u, set1((1u << (drop - 1)) - 1u)), lsb), set1(~((1u << drop) - 1u)));
  return fix_nan32(r, u);
}
inline __m256i bf16_round_bits8(__m256i u) { return wide_round_bits8(u, 16); }

/// Encode eight rounded values (the output of round8) as codes of `spec`
/// (encode_exact, lane by lane). Integer work only where possible: float
/// arithmetic with subnormal results costs microcode assists on x86.
struct EncodeConsts {
  int m, sign_shift;
  bool narrow;  // exponent narrower than fp32's: target subnormals are normal floats
  __m256i rebias, sub_limit, inf_code, nan_code;
  __m256 sub_scale;
  explicit EncodeConsts(const FormatSpec& spec) {
    m = spec.mantissa_bits;
    sign_shift = spec.exponent_bits + m;
    narrow = spec.bias != 127;
    rebias = _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(127 - spec.bias) << m));
    sub_limit = _mm256_set1_epi32((spec.emin() + 127) << 23);
    sub_scale = _mm256_set1_ps(narrow ? pow2f(m - spec.emin()) : 1.0f);
    const std::uint32_t all_ones = (1u << spec.exponent_bits) - 1u;
    const std::uint32_t nan_frac = spec.has_inf() ? (1u << (m - 1)) : (1u << m) - 1u;
    inf_code = set1(all_ones << m);
    nan_code = set1((all_ones << m) | nan_frac);
  }
};

inline __m256i encode8(__m256 y, const EncodeConsts& k) {
  const __m256i u = _mm256_castps_si256(y);
  const __m256i a = _mm256_and_si256(u, set1(0x7fffffffu));
  const __m256i sign_out = _mm256_sll_epi32(_mm256_srli_epi32(u, 31), _mm_cvtsi32_si128(k.sign_shift));
  // normal: re-bias the exponent and keep the top m fraction bits
  __m256i code = _mm256_sub_epi32(_mm256_srl_epi32(a, _mm_cvtsi32_si128(23 - k.m)), k.rebias);
  if (k.narrow) {
    // subnormal in the target: the fraction field is |y| / 2^(emin - m); the
    // product stays a normal float for the formats with a narrower exponent
    // (bias 127 formats share fp32's subnormals, where the shift above is right)
    const __m256 scaled = _mm256_mul_ps(_mm256_castsi256_ps(a), k.sub_scale);
    code = _mm256_blendv_epi8(code, _mm256_cvttps_epi32(scaled), _mm256_cmpgt_epi32(k.sub_limit, a));
  }
  code = _mm256_blendv_epi8(code, k.inf_code, _mm256_cmpeq_epi32(a, set1(0x7f800000u)));
  code = _mm256_blendv_epi8(code, k.nan_code, _mm256_cmpgt_epi32(a, set1(0x7f800000u)));
  return _mm256_or_si256(code, sign_out);
}

template <Kernel K, typename Store>
void run8(const float* in, std::size_t n, const RoundParams& p, std::uint64_t first, const Consts& c,
          Store& store) {
  const std::uint64_t seed = p.seed;
  std::size_t i = 0;
  // Two independent vectors per iteration give the out-of-order core room.
  for (; i + 16 <= n; i += 16) {
    const std::uint64_t idx = first + i;
    if (K == Kernel::stochastic && !(same_high_word(idx) && same_high_word(idx + 8))) break;
    __m256i r0 = _mm256_setzero_si256(), r1 = r0;
    if constexpr (K == Kernel::stochastic) {
      r0 = random_bits8(seed, idx);
      r1 = random_bits8(seed, idx + 8);
    }
    const __m256 y0 = round8<K>(_mm256_loadu_ps(in + i), c, r0);
    const __m256 y1 = round8<K>(_mm256_loadu_ps(in + i + 8), c, r1);
    store(i, y0);
    store(i + 8, y1);
  }
  // The rest (and any block whose indices cross 2^32) element by element
  // through the scalar reference, stored through the same lanes.
  for (; i < n; i += 8) {
    const std::size_t count = n - i < 8 ? n - i : 8;
    float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (std::size_t k = 0; k < count; ++k) tmp[k] = round_one(in[i + k], p, first + i + k);
    store(i, _mm256_loadu_ps(tmp), count);
  }
}

template <typename Store>
void for_each8(const float* in, std::size_t n, const RoundParams& p, std::uint64_t first, Store store) {
  const Consts c(p);
  const RoundParams local = p;  // out may be char*: keep p's fields out of its alias set
  switch (c.kernel) {
    case Kernel::nearest_magic: run8<Kernel::nearest_magic>(in, n, local, first, c, store); break;
    case Kernel::nearest: run8<Kernel::nearest>(in, n, local, first, c, store); break;
    case Kernel::toward_zero: run8<Kernel::toward_zero>(in, n, local, first, c, store); break;
    case Kernel::stochastic: run8<Kernel::stochastic>(in, n, local, first, c, store); break;
  }
}

}  // namespace

void round_avx2(const float* in, float* out, std::size_t n, const RoundParams& p, std::uint64_t first) {
  std::size_t i = 0;
  if (is_ieee_default(p) && p.spec.exponent_bits == 5 && p.spec.mantissa_bits == 10) {
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(fp16_codes8(_mm256_loadu_ps(in + i))));
  } else if (is_ieee_default(p) && p.spec.exponent_bits == 8 && p.spec.bias == 127 &&
             p.spec.mantissa_bits < 23) {
    const int drop = 23 - p.spec.mantissa_bits;
    for (; i + 8 <= n; i += 8) {
      const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), wide_round_bits8(u, drop));
    }
  } else {
    for_each8(in, n, p, first, [&](std::size_t j, __m256 v, std::size_t count = 8) {
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
    const EncodeConsts k(p.spec);
    for_each8(in, n, p, first, [&out, k](std::size_t j, __m256 v, std::size_t count = 8) {
      const __m256i code = encode8(v, k);
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
  for (; i < n; ++i)
    out[i] = static_cast<std::uint16_t>(encode_exact(round_one(in[i], p, first + i), p.spec));
}

void encode8_avx2(const float* in, std::uint8_t* out, std::size_t n, const RoundParams& p,
                  std::uint64_t first) {
  const EncodeConsts k(p.spec);
  for_each8(in, n, p, first, [out, k](std::size_t j, __m256 v, std::size_t count = 8) {
    const __m256i code = encode8(v, k);
    const __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
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

namespace mpt::detail {
namespace {

/// NaN lanes of v become the canonical quiet NaN with v's sign, as decode()
/// returns it (F16C keeps a NaN's payload; the portable decode does not).
inline __m256 canonical_nan8(__m256 v) {
  const __m256 nan_lanes = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  const __m256 sign = _mm256_and_ps(v, _mm256_castsi256_ps(set1(0x80000000u)));
  const __m256 quiet = _mm256_or_ps(sign, _mm256_castsi256_ps(set1(0x7fc00000u)));
  return _mm256_blendv_ps(v, quiet, nan_lanes);
}

}  // namespace

void decode16_avx2(const std::uint16_t* in, float* out, std::size_t n, const FormatSpec& spec) {
  std::size_t i = 0;
  if (spec.exponent_bits == 5 && spec.mantissa_bits == 10) {
    // fp16 -> fp32 is exact: F16C's conversion, subnormals included.
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
      _mm256_storeu_ps(out + i, canonical_nan8(v));
    }
  } else if (spec.exponent_bits == 8 && spec.mantissa_bits == 7) {
    // bf16 is the top half of an fp32: widening is a shift.
    for (; i + 8 <= n; i += 8) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
      _mm256_storeu_ps(out + i, canonical_nan8(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16))));
    }
  }
  for (; i < n; ++i) out[i] = decode(in[i], spec);
}

}  // namespace mpt::detail
