// Chapter 07 — FP8 training: the per-element and per-scale math of scaled
// FP8, shared by the CPU reference and the CUDA kernels.
// Depends on: formats/round_element.hpp (round_to_format, encode_exact,
// decode, format_max) and e8m0.hpp. Plain C++17, host-and-device, as
// amp/scaler_math.hpp is: the kernels run exactly the code the CPU tests cover.
//
// Convention: a scale multiplies. A value x is stored as the FP8 code of
// x × scale and read back as code × (1 / scale), as the core Tensor's scale
// does (Tensor::from_f32_scaled). Transformer Engine keeps the same scale
// and multiplies by its reciprocal scale_inv when it dequantizes; the MX
// specification stores the reciprocal instead, a power of two 2^e in E8M0,
// and divides by it (x / 2^e): its scale here is 2^-e.
//
// The sources, each cited where it is used, all read at one commit:
//  - Transformer Engine (NVIDIA/TransformerEngine), commit
//    d0067d0da6cb01811b8072a7d304f0e00344ce2b:
//    transformer_engine/common/recipe/__init__.py (the recipes' fields),
//    transformer_engine/common/recipe/delayed_scaling.cu (the delayed
//    update), transformer_engine/common/recipe/recipe_common.cuh
//    (compute_scale_from_amax, current scaling), and the MXFP8 casts
//    (transformer_engine/common/cast/mxfp8/quantize_mxfp8.cuh:
//    float_to_e8m0(amax × max_norm_rcp)).
//  - OCP Microscaling Formats (MX) Specification v1.0 (2023), section 6.3
//    (shared exponent floor(log2 amax) − emax_elem) and 5.4.1 (E8M0).
//  - torchao (pytorch/ao), torchao/prototype/mx_formats/mx_tensor.py at commit
//    b88afaf4156aeddde1971c000a0cf11a52ce03d5: to_mx with
//    ScaleCalculationMode.FLOOR and RCEIL, the names used here.
#pragma once

#include <cstdint>

#include "mpt/formats/format_spec.hpp"
#include "mpt/formats/round_element.hpp"
#include "mpt/fp8/e8m0.hpp"

namespace mpt::fp8 {

/// What happened to one value on its way into FP8.
enum class Fp8Outcome : std::uint8_t {
  in_range,    ///< rounded to a finite code (exact zero included)
  saturated,   ///< beyond ±max after rounding, or ±inf: clamped to ±max (saturation on)
  overflowed,  ///< beyond ±max after rounding, or ±inf, with saturation off: NaN (E4M3) or ±inf (E5M2)
  nan,         ///< x × scale is NaN (a NaN input): the code is NaN
  flushed,     ///< x is not zero, but its code is ±0 (underflow)
};

/// One element's code and what happened to it.
struct Fp8Element {
  std::uint8_t code;   ///< the format's bit pattern
  Fp8Outcome outcome;  ///< how it got there
};

/// x is NaN, by bits (fast-math flags cannot fold it away).
MPT_HD inline bool is_nan_bits(float x) { return (mpt::detail::bits_of(x) & 0x7fffffffu) > 0x7f800000u; }
/// x is ±inf or NaN, by bits.
MPT_HD inline bool is_non_finite_bits(float x) {
  return (mpt::detail::bits_of(x) & 0x7f800000u) == 0x7f800000u;
}

/// The FP8 encode, one element: x × scale in fp32 (one rounding, as the
/// kernels multiply), then rounded to nearest, ties to even, into `f`
/// (formats::e4m3 or formats::e5m2), subnormals kept. A result beyond the
/// format's largest value (E4M3 448, E5M2 57344) — and ±inf — is clamped to
/// ±max when `saturate` (OCP's saturating conversion, CUDA's
/// __NV_SATFINITE, what Transformer Engine's casts do); otherwise it becomes
/// NaN in E4M3, which has no inf, and ±inf in E5M2 (__NV_NOSAT). "Beyond"
/// is judged after rounding: 464 lies halfway between 448 and the next
/// binade step 480 and rounds to even, to 448, in both modes; anything above
/// 464 overflows.
MPT_HD inline Fp8Element quantize_element(float x, float scale, const FormatSpec& f, bool saturate) {
  const float v = x * scale;
  float y = round_to_format(v, f, RoundingMode::nearest_even, OverflowMode::infinity, SubnormalMode::keep);
  Fp8Outcome outcome = Fp8Outcome::in_range;
  if (is_nan_bits(v)) {
    outcome = Fp8Outcome::nan;
  } else if (is_non_finite_bits(y)) {
    // round_to_format gives inf (E5M2) or NaN (E4M3) exactly when the
    // rounded magnitude lies beyond the format's max, or v is infinite.
    if (saturate) {
      const std::uint32_t sign = mpt::detail::bits_of(v) & 0x80000000u;
      y = mpt::detail::float_of(mpt::detail::bits_of(format_max(f)) | sign);
      outcome = Fp8Outcome::saturated;
    } else {
      outcome = Fp8Outcome::overflowed;
    }
  } else if (y == 0.0f && x != 0.0f) {
    outcome = Fp8Outcome::flushed;
  }
  return {static_cast<std::uint8_t>(encode_exact(y, f)), outcome};
}

/// The FP8 decode, one element: code × scale_inv, where scale_inv is
/// 1 / scale rounded once to fp32 (Transformer Engine's scale_inv; exact
/// for a power-of-two scale). NaN and inf codes stay NaN and inf.
MPT_HD inline float dequantize_element(std::uint8_t code, float scale_inv, const FormatSpec& f) {
  return decode(code, f) * scale_inv;
}

/// The largest magnitude seen so far and one more value: fmaxf(running, |x|),
/// which ignores a NaN x (as Transformer Engine's amax kernels, built on
/// fmaxf, do) and keeps an infinite one.
MPT_HD inline float amax_step(float running, float x) {
  const float a = mpt::detail::float_of(mpt::detail::bits_of(x) & 0x7fffffffu);
  return is_nan_bits(a) || !(a > running) ? running : a;
}

// ---------------------------------------------------------------------------
// Per-tensor scales.

/// The largest FP8 value a recipe aims the amax at: the format's max divided
/// by 2^margin, in fp32 (Transformer Engine's scaled_max = fp8_max ×
/// 2^-margin, delayed_scaling.cu; exact for the whole margins its recipes
/// take; recipes.hpp accepts 0 ≤ margin ≤ kMaxMargin).
MPT_HD inline float scaled_max(const FormatSpec& f, int margin) {
  return format_max(f) * mpt::detail::pow2f(-margin);
}

/// Delayed scaling's scale from the amax its history chose: scaled_max /
/// amax when the amax is finite and > 0; otherwise (0, inf, NaN) the
/// previous scale is kept. A quotient that overflows fp32 (amax tiny)
/// becomes FLT_MAX. Transformer Engine's amax_and_scale_update kernels,
/// transformer_engine/common/recipe/delayed_scaling.cu (commit
/// d0067d0da6cb01811b8072a7d304f0e00344ce2b), "Update scale".
MPT_HD inline float delayed_scale_from_amax(float amax, float previous_scale, float scaled_max_value) {
  //! [delayed-scale]
  float scale = previous_scale;
  if (!is_non_finite_bits(amax) && amax > 0.0f) scale = scaled_max_value / amax;
  if (is_non_finite_bits(scale) && !is_nan_bits(scale)) scale = mpt::detail::float_of(0x7f7fffffu);
  return scale;
  //! [delayed-scale]
}

/// Current scaling's scale from this tensor's own amax, Transformer
/// Engine's compute_scale_from_amax (transformer_engine/common/recipe/
/// recipe_common.cuh, commit d0067d0da6cb01811b8072a7d304f0e00344ce2b):
/// the amax is first raised to amax_epsilon (a floor; NaN passes); an amax
/// of 0, inf or NaN gives scale 1 (there is no previous scale to keep);
/// otherwise scale = scaled_max / amax, FLT_MAX where that overflows
/// (fp32 input: the largest value of the input type), and with
/// power_2_scale its mantissa bits are cleared: the scale is rounded DOWN to
/// a power of two, so amax × scale stays ≤ scaled_max.
MPT_HD inline float current_scale_from_amax(float amax, float scaled_max_value, bool power_2_scale,
                                            float amax_epsilon) {
  if (amax < amax_epsilon) amax = amax_epsilon;
  if (is_non_finite_bits(amax) || amax == 0.0f) return 1.0f;
  float scale = scaled_max_value / amax;
  if (is_non_finite_bits(scale)) scale = mpt::detail::float_of(0x7f7fffffu);
  if (power_2_scale) scale = mpt::detail::float_of(mpt::detail::bits_of(scale) & 0xff800000u);
  return scale;
}

// ---------------------------------------------------------------------------
// MX block scales (E8M0).

/// The two rules for an MX block's shared exponent that exist in practice
/// (torchao's ScaleCalculationMode names).
enum class MxScaleRule : std::uint8_t {
  /// OCP MX v1.0, section 6.3: e = floor(log2 amax) − emax_elem (emax_elem
  /// 8 for E4M3, 15 for E5M2). The amax lands in [2^emax, 2^(emax+1)), whose
  /// top (E4M3: above 448, i.e. significands above 1.75; above 464 after
  /// rounding) lies beyond the element format: a block's largest values can
  /// saturate.
  floor,
  /// NVIDIA's (cuBLAS's block quantization, Transformer Engine's MXFP8
  /// casts): e = ceil(log2(amax / max_norm)), the smallest power of two that
  /// brings the amax to ≤ max_norm: nothing saturates, but the scale can be
  /// up to 2× smaller than FLOOR's, so the block's small values lose a
  /// binade (flush to zero sooner).
  rceil,
};

/// An MX block's E8M0 code from its amax (NaN already ignored by amax_step,
/// so only a caller's NaN gives 0xFF).
///  - floor: e = (the fp32 exponent field of amax) − 127 − emax_elem,
///    clamped to [-127, 127] — torchao's bit computation; for a subnormal or
///    zero amax the field reads as 2^-127, and the clamp makes that exact
///    (floor(log2) − emax would be below -127 anyway). An all-zero block
///    gets 2^-127 (code 0). An infinite amax reads as 2^128: e = 128 − emax.
///  - rceil: e8m0_round_up(amax × fp32(1 / max_norm)) — Transformer
///    Engine's float_to_e8m0(amax × max_norm_rcp), the product rounded to
///    fp32 first, exactly as its kernels compute it; an all-zero block gets
///    code 0, an infinite amax 2^127.
MPT_HD inline std::uint8_t mx_scale_code(float amax, const FormatSpec& f, MxScaleRule rule) {
  //! [mx-scale-rules]
  if (is_nan_bits(amax)) return kE8M0Nan;
  if (rule == MxScaleRule::floor) {
    const int field = static_cast<int>((mpt::detail::bits_of(amax) >> 23) & 0xffu);
    return e8m0_from_exponent(field - kE8M0Bias - f.emax());
  }
  const float max_norm_rcp = static_cast<float>(1.0 / static_cast<double>(format_max(f)));
  return e8m0_round_up(amax * max_norm_rcp);
  //! [mx-scale-rules]
}

}  // namespace mpt::fp8
