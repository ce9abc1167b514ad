// Chapter 07 — FP8 training: private to src/mpt/fp8 — the AVX2 and AVX-512
// loops of the FP8 quantize (quantize_avx2.cpp, quantize_avx512.cpp),
// declared with plain types.
// Depends on: the standard library only. The two files, compiled with
// -mavx2 and -mavx512f, include nothing else of the library, so no inline
// function of another header is ever emitted there with wide instructions
// in it (the linker could keep that copy for the callers on other CPUs).
// Each loop is only called after cpuid said so (quantize_raw.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mpt::fp8::detail {

/// An FP8 format's encode as plain numbers, computed by the caller, so that
/// the vector files call no inline function of a shared header.
struct Fp8Encode {
  int mantissa_bits;            ///< m: 3 (E4M3) or 2 (E5M2)
  std::uint32_t min_normal;     ///< the fp32 bits of 2^emin, the smallest normal
  float subnormal_magic;        ///< 2^(emin − m + 23): |v| + this rounds |v| to the subnormal step
  std::uint32_t rebias;         ///< (127 − bias) << m: fp32's exponent field to the format's
  std::uint32_t max_code;       ///< the code of +max (E4M3 0x7E, E5M2 0x7B)
  std::uint32_t overflow_code;  ///< +beyond without saturation: NaN (E4M3 0x7F) or inf (E5M2 0x7C)
  std::uint32_t nan_code;       ///< the canonical +NaN (E4M3 0x7F, E5M2 0x7E)
  bool saturate;                ///< clamp what lies beyond ±max to ±max
  int emax;                     ///< the format's largest exponent (E4M3 8, E5M2 15): FLOOR's offset
  float max_norm_rcp;           ///< fp32(1 / max): RCEIL's factor
};

/// Outcomes counted by the vector loops (beyond: saturated or overflowed).
struct RawCounts {
  std::size_t beyond = 0;   ///< beyond ±max after rounding, or ±inf
  std::size_t nan = 0;      ///< NaN values
  std::size_t flushed = 0;  ///< non-zero x whose code is ±0
};

/// codes[i] = quantize_element(x[i], scale, f, saturate).code for i < n,
/// outcomes counted into c; returns max |x[i]| with NaN ignored (0 for n = 0).
float quantize_tensor_avx2(const float* x, std::size_t n, float scale, std::uint8_t* codes,
                           const Fp8Encode& k, RawCounts& c);
/// One row of an MX matrix: each run of 32 values of x[0..cols) (the last
/// may be shorter) gets its amax (NaN ignored), its E8M0 code by the rule
/// (floor_rule: FLOOR, else RCEIL; mx_scale_code's value) and its codes;
/// e8m0[b] and, if not null, block_amax[b] are written.
void quantize_mx_row_avx2(const float* x, std::size_t cols, bool floor_rule, std::uint8_t* codes,
                          std::uint8_t* e8m0, float* block_amax, const Fp8Encode& k, RawCounts& c);

/// max |x[i]| for i < n, NaN ignored, 0 for n = 0 (amax_of's value), sixteen
/// lanes wide (quantize_avx512.cpp).
float amax_avx512(const float* x, std::size_t n);
/// quantize_tensor_avx2 sixteen lanes wide (quantize_avx512.cpp): the same
/// codes, amax and counts.
float quantize_tensor_avx512(const float* x, std::size_t n, float scale, std::uint8_t* codes,
                             const Fp8Encode& k, RawCounts& c);
/// Every row of an MX matrix (rows × cols, row-major) as
/// quantize_mx_row_avx2 does one row, sixteen lanes wide: the same codes,
/// E8M0 codes (rows × ceil(cols / 32)), amaxes and counts. It takes the
/// whole matrix so that its loop can run on across rows.
void quantize_mx_avx512(const float* x, std::size_t rows, std::size_t cols, bool floor_rule,
                        std::uint8_t* codes, std::uint8_t* e8m0, float* block_amax, const Fp8Encode& k,
                        RawCounts& c);

}  // namespace mpt::fp8::detail
