// Chapter 07 — FP8 training: private to src/mpt/fp8 — the AVX2 primitives
// behind quantize_raw.hpp (quantize_avx2.cpp) and the loops that drive them
// (quantize_raw.cpp).
// Depends on: quantize_raw.hpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mpt/fp8/quantize_raw.hpp"

#if defined(MPT_HAVE_AVX2_PATH)
namespace mpt::fp8::detail {

/// What turns the codes of a non-saturating rounding into quantize_element's
/// codes and outcomes: plain numbers, computed by the caller, so that the
/// AVX2 file calls no inline function of a shared header.
struct Fp8Finish {
  FormatSpec spec;                ///< the element format
  std::uint32_t nonfinite_mask;   ///< (code & 0x7f & mask) == value: the code is NaN or ±inf
  std::uint32_t nonfinite_value;  ///< see nonfinite_mask
  std::uint32_t max_code;         ///< the code of +max
  bool saturate;                  ///< clamp what lies beyond ±max to ±max
};

/// Outcomes counted by finish_avx2 (beyond: saturated or overflowed).
struct RawCounts {
  std::size_t beyond = 0;   ///< beyond ±max after rounding, or ±inf
  std::size_t nan = 0;      ///< NaN values
  std::size_t flushed = 0;  ///< non-zero x whose code is ±0
};

/// max |x[i]|, NaN ignored, 0 for n = 0 (amax_of's value).
float amax_avx2(const float* x, std::size_t n);
/// amax_avx2 of each run of 32 values of x[0..n) (the last may be shorter) into amax[].
void block_amax_avx2(const float* x, std::size_t n, float* amax);
/// v[i] = x[i] × scale, one fp32 rounding each.
void scale_avx2(const float* x, float scale, float* v, std::size_t n);
/// codes[i] = quantize_element(x[i], scale, spec, saturate).code given v[i]
/// = x[i] × scale, and the outcomes counted into c.
void finish_avx2(const float* x, const float* v, std::uint8_t* codes, std::size_t n, const Fp8Finish& k,
                 RawCounts& c);

/// quantize_into's AVX2 path (arguments already checked).
float quantize_into_avx2(const float* x, std::size_t n, const FormatSpec& f, float scale, bool saturate,
                         std::uint8_t* codes, Fp8Counts& counts);
/// quantize_mx_into's AVX2 path (arguments already checked).
void quantize_mx_into_avx2(const float* x, std::size_t rows, std::size_t cols, const FormatSpec& f,
                           MxScaleRule rule, bool saturate, std::uint8_t* codes, std::uint8_t* e8m0,
                           float* block_amax, Fp8Counts& counts);

}  // namespace mpt::fp8::detail
#endif
