// Chapter 01 — floating-point formats and their limits.
// Depends on: nothing (plain C++17; also compiled by nvcc for kernels/).
//
// The table-driven description of a binary floating-point format, in the
// spirit of CPFloat's format descriptors: a handful of integers from which
// every limit (max, min normal, epsilon, ...) is *derived*, never typed in.
// This header is host-and-device: kernels/ include it, so the CUDA casts and
// the CPU reference read the same descriptor.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MPT_HD __host__ __device__
#else
#define MPT_HD
#endif

namespace mpt {

/// How a format spends its all-ones exponent field.
enum class SpecialEncoding : std::uint8_t {
  /// IEEE 754 style: exponent all ones means inf (mantissa 0) or NaN.
  ieee,
  /// OCP FP8 E4M3 ("fn"): no inf; only S.1111.111 is NaN, every other
  /// all-ones-exponent code is a finite normal number.
  nan_only_all_ones,
};

/// A binary floating-point format described by its fields.
/// Only the stored fields are here; everything else is derived.
struct FormatSpec {
  int exponent_bits;        ///< width of the exponent field
  int mantissa_bits;        ///< stored fraction bits (precision p = mantissa_bits + 1)
  int bias;                 ///< exponent bias
  SpecialEncoding special;  ///< what the all-ones exponent field means
  int storage_bits;         ///< bytes actually used per value, times 8

  /// Precision p: significant bits of a normal number, the implicit leading 1 included.
  MPT_HD constexpr int precision() const { return mantissa_bits + 1; }
  /// Whether the format has ±inf (IEEE encodings do; E4M3 does not).
  MPT_HD constexpr bool has_inf() const { return special == SpecialEncoding::ieee; }
  /// Smallest normal exponent, emin = 1 - bias.
  MPT_HD constexpr int emin() const { return 1 - bias; }
  /// Largest exponent of a finite number.
  MPT_HD constexpr int emax() const {
    return special == SpecialEncoding::ieee ? (1 << exponent_bits) - 2 - bias
                                            : (1 << exponent_bits) - 1 - bias;
  }
  /// Largest significand of a finite number, as an integer multiple of
  /// 2^-mantissa_bits: all ones for IEEE, all ones minus one for E4M3
  /// (S.1111.111 is NaN).
  MPT_HD constexpr std::uint32_t max_significand() const {
    return special == SpecialEncoding::ieee ? (2u << mantissa_bits) - 1u : (2u << mantissa_bits) - 2u;
  }
};

/// The stock formats. fp32 and tf32 live in 32-bit containers; tf32 is fp32
/// with 13 low fraction bits forced to zero (what tensor cores read).
namespace formats {
/// IEEE binary32: 8 exponent bits, 23 fraction bits.
inline constexpr FormatSpec fp32{8, 23, 127, SpecialEncoding::ieee, 32};
/// TensorFloat-32: fp32's exponent, fp16's 10 fraction bits, in 32 bits.
inline constexpr FormatSpec tf32{8, 10, 127, SpecialEncoding::ieee, 32};
/// bfloat16: fp32's exponent, 7 fraction bits.
inline constexpr FormatSpec bf16{8, 7, 127, SpecialEncoding::ieee, 16};
/// IEEE binary16: 5 exponent bits, 10 fraction bits.
inline constexpr FormatSpec fp16{5, 10, 15, SpecialEncoding::ieee, 16};
/// OCP FP8 E4M3: 4 exponent bits, 3 fraction bits, no inf.
inline constexpr FormatSpec e4m3{4, 3, 7, SpecialEncoding::nan_only_all_ones, 8};
/// OCP FP8 E5M2: 5 exponent bits, 2 fraction bits, IEEE-like.
inline constexpr FormatSpec e5m2{5, 2, 15, SpecialEncoding::ieee, 8};
}  // namespace formats

}  // namespace mpt
