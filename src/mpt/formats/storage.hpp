// Chapter 01 — floating-point formats and their limits.
// Depends on: rounding.hpp, codes.hpp (the FP8 code types), Eigen
// (Eigen::half, Eigen::bfloat16).
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

#include "mpt/formats/codes.hpp"
#include "mpt/formats/rounding.hpp"

namespace mpt {

// Fp8, Fp8E4M3 and Fp8E5M2 (one byte each) are defined in codes.hpp, with
// the fp16 and bf16 codes of the kernel API.
static_assert(sizeof(Eigen::half) == 2 && sizeof(Eigen::bfloat16) == 2,
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
