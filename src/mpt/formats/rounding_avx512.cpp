// Chapter 01 — floating-point formats and their limits: the AVX-512 fast
// paths of the two conversions every emulated fp16/bf16 step runs most,
// 16 values at a time: fp16/bf16 codes → fp32 (exact) and fp32 → fp16/bf16
// codes with IEEE round-to-nearest-even. The AVX2 loops (rounding_avx2.cpp)
// do the rest, and every other format and mode.
// Depends on: rounding_avx512.hpp (plain types only). Compiled with
// -mavx512f, and only called after avx512_conversions_available() says so.
//
// The same bits as the AVX2 loops and as decode() / encode_exact(round_one())
// (tests/cpu/test_ch01_formats_avx512.cpp): fp16 by the hardware
// conversion (IEEE binary16, subnormals included), a NaN's payload dropped
// for the canonical quiet NaN with its sign, as the portable code does;
// bf16 by the integer RNE of the AVX2 loop (add half a quantum minus one
// plus the lowest kept bit, truncate), NaN likewise canonical.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "mpt/formats/rounding_avx512.hpp"

namespace mpt::detail {

namespace {

inline __m512i set1(std::uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }

/// r, except in the lanes where the fp32 bits u are a NaN: there the
/// canonical quiet NaN with u's sign.
inline __m512i with_canonical_nan16(__m512i r, __m512i u) {
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, set1(0x7fffffffu)), set1(0x7f800000u));
  const __m512i quiet = _mm512_or_si512(_mm512_and_si512(u, set1(0x80000000u)), set1(0x7fc00000u));
  return _mm512_mask_blend_epi32(nan, r, quiet);
}

/// The fp32 bits u with every NaN made the canonical quiet NaN.
inline __m512i canonical_nan16(__m512i u) { return with_canonical_nan16(u, u); }

}  // namespace

std::size_t decode16_avx512(const std::uint16_t* in, float* out, std::size_t n, bool bf16) {
  std::size_t i = 0;
  if (!bf16) {
    for (; i + 16 <= n; i += 16) {
      const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
      _mm512_storeu_si512(out + i, canonical_nan16(_mm512_castps_si512(v)));
    }
  } else {
    for (; i + 16 <= n; i += 16) {
      const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
      _mm512_storeu_si512(out + i, canonical_nan16(_mm512_slli_epi32(w, 16)));
    }
  }
  return i;
}

std::size_t encode16_avx512(const float* in, std::uint16_t* out, std::size_t n, bool bf16) {
  std::size_t i = 0;
  if (!bf16) {
    for (; i + 16 <= n; i += 16) {
      // A NaN made canonical first (quiet, payload dropped): its fp16 code
      // is then the sign and 0x7e00, as encode_exact gives.
      const __m512i u = canonical_nan16(_mm512_loadu_si512(in + i));
      const __m256i h =
          _mm512_cvtps_ph(_mm512_castsi512_ps(u), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), h);
    }
  } else {
    for (; i + 16 <= n; i += 16) {
      const __m512i u = _mm512_loadu_si512(in + i);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), set1(1u));
      const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, set1(0x7fffu)), lsb);
      const __m512i code = _mm512_srli_epi32(with_canonical_nan16(r, u), 16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(code));
    }
  }
  return i;
}

}  // namespace mpt::detail
