// Chapter 01 — floating-point formats and their limits.
// Depends on: rounding.hpp, Eigen (Eigen::half, Eigen::bfloat16).
//
// Storage with real sizes: an fp16 element occupies 2 bytes (Eigen::half),
// bf16 likewise (Eigen::bfloat16), FP8 one byte (a code plus its codec).
// Conversions from fp32 go through the same rounding as round_array, so a
// stored value is always exactly round_value(x).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <Eigen/Core>

#include "mpt/formats/rounding.hpp"

namespace mpt {

/// One FP8 value: the byte and, through the tag, which codec reads it.
template <const FormatSpec& Spec>
struct Fp8 {
  std::uint8_t code = 0;                             ///< the format's bit pattern
  static constexpr const FormatSpec& spec = Spec;    ///< the format the code is read in
  /// The value whose bit pattern is c.
  static Fp8 from_code(std::uint8_t c) { Fp8 v; v.code = c; return v; }
  /// The value as a float (exact).
  float to_float() const { return decode(code, Spec); }
};
using Fp8E4M3 = Fp8<formats::e4m3>;  ///< OCP E4M3: max 448, no inf
using Fp8E5M2 = Fp8<formats::e5m2>;  ///< OCP E5M2: max 57344, IEEE-like
static_assert(sizeof(Fp8E4M3) == 1 && sizeof(Eigen::half) == 2 && sizeof(Eigen::bfloat16) == 2,
              "storage types must have their real sizes");

/// fp32 → fp16 storage (2 bytes each).
void to_fp16(const float* in, Eigen::half* out, std::size_t n, const RoundingOptions& o = {});
/// fp32 → bf16 storage (2 bytes each).
void to_bf16(const float* in, Eigen::bfloat16* out, std::size_t n, const RoundingOptions& o = {});
/// fp32 → E4M3 codes (1 byte each); saturates unless o.overflow says otherwise.
void to_e4m3(const float* in, Fp8E4M3* out, std::size_t n, const RoundingOptions& o = {});
/// fp32 → E5M2 codes (1 byte each); saturates unless o.overflow says otherwise.
void to_e5m2(const float* in, Fp8E5M2* out, std::size_t n, const RoundingOptions& o = {});

/// fp16 storage → fp32 (exact).
void from_fp16(const Eigen::half* in, float* out, std::size_t n);
/// bf16 storage → fp32 (exact).
void from_bf16(const Eigen::bfloat16* in, float* out, std::size_t n);
/// E4M3 codes → fp32 (exact).
void from_e4m3(const Fp8E4M3* in, float* out, std::size_t n);
/// E5M2 codes → fp32 (exact).
void from_e5m2(const Fp8E5M2* in, float* out, std::size_t n);

}  // namespace mpt
