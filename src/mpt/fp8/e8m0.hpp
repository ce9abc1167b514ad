// Chapter 07 — FP8 training: E8M0, the power-of-two scale of an MX block.
// Depends on: formats/round_element.hpp (bits_of, float_of, MPT_HD) only.
// Host-and-device: the CPU reference and the later CUDA kernels call these
// exact functions.
//
// E8M0 (OCP Microscaling Formats (MX) Specification v1.0, section 5.4.1) is
// an unsigned byte holding only a biased exponent: code c stands for
// 2^(c − 127), c = 0..254 covering 2^-127..2^127; 0xFF is NaN. There is no
// sign, no zero and no infinity. Every value is a float: 2^-127 is the fp32
// subnormal 0x00400000, 2^127 the largest power of two of fp32.
//
// An MX block stores its elements as x / 2^e, and this project's scales
// multiply (stored = value × scale): the block's scale is 2^-e, the
// reciprocal of the E8M0 value, and dequantizing multiplies by 2^e again.
#pragma once

#include <cstdint>

#include "mpt/formats/round_element.hpp"

namespace mpt::fp8 {

/// The exponent bias of E8M0: code c stands for 2^(c − 127).
inline constexpr int kE8M0Bias = 127;
/// The one E8M0 code that is not a power of two: NaN.
inline constexpr std::uint8_t kE8M0Nan = 0xFF;
/// The smallest and largest exponent E8M0 holds: 2^-127 and 2^127.
inline constexpr int kE8M0MinExponent = -127;
/// See kE8M0MinExponent.
inline constexpr int kE8M0MaxExponent = 127;

/// The code of 2^e, with e clamped to [-127, 127] (never NaN).
MPT_HD inline std::uint8_t e8m0_from_exponent(int e) {
  const int c = e < kE8M0MinExponent ? kE8M0MinExponent : (e > kE8M0MaxExponent ? kE8M0MaxExponent : e);
  return static_cast<std::uint8_t>(c + kE8M0Bias);
}

/// 2^(c − 127) as a float, exact (code 0 gives the fp32 subnormal 2^-127);
/// 0xFF gives a quiet NaN.
MPT_HD inline float e8m0_to_float(std::uint8_t code) {
  if (code == kE8M0Nan) return mpt::detail::float_of(0x7fc00000u);
  if (code == 0) return mpt::detail::float_of(0x00400000u);  // 2^-127: a subnormal, mantissa bit 22
  return mpt::detail::float_of(static_cast<std::uint32_t>(code) << 23);
}

/// 2^-(c − 127), the reciprocal of e8m0_to_float(c), exact: the scale an MX
/// block's elements are multiplied by before they are rounded. 0xFF gives NaN.
/// (Transformer Engine's ptx::exp2f_rcp<float>.)
MPT_HD inline float e8m0_reciprocal(std::uint8_t code) {
  if (code == kE8M0Nan) return mpt::detail::float_of(0x7fc00000u);
  return e8m0_to_float(static_cast<std::uint8_t>(254 - code));
}

/// The smallest E8M0 value ≥ |v|: round up to a power of two, saturating at
/// 2^127 (code 0xFE) — also for +inf — with 0 and everything up to 2^-127
/// giving 2^-127 (code 0) and NaN giving 0xFF. This is Transformer Engine's
/// ptx::float_to_e8m0 (its software path; on Blackwell the instruction
/// cvt.rp.satfinite.ue8m0x2.f32 does the same), from
/// transformer_engine/common/util/ptx_arch_spec.cuh at commit
/// d0067d0da6cb01811b8072a7d304f0e00344ce2b. The sign of v is ignored: the
/// callers pass an amax.
MPT_HD inline std::uint8_t e8m0_round_up(float v) {
  const std::uint32_t a = mpt::detail::bits_of(v) & 0x7fffffffu;
  if (a > 0x7f800000u) return kE8M0Nan;
  if (a == 0x7f800000u) return 0xFE;
  std::uint32_t exponent = a >> 23;
  const std::uint32_t mantissa = a & 0x7fffffu;
  // A mantissa means v lies above 2^(exponent − 127): one binade up, except
  // at the top (satfinite) and for subnormals up to 2^-127 (which is 0x400000).
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
  return static_cast<std::uint8_t>(exponent);
}

}  // namespace mpt::fp8
