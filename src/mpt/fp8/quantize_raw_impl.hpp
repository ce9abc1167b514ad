// Chapter 07 — FP8 training: private to src/mpt/fp8 (and its tests) — the
// vector paths of quantize_raw.hpp, which drive the AVX2 and AVX-512 loops
// of quantize_simd.hpp (quantize_raw.cpp).
// Depends on: quantize_raw.hpp, quantize_simd.hpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mpt/fp8/quantize_raw.hpp"
#include "mpt/fp8/quantize_simd.hpp"

namespace mpt::fp8::detail {

/// The vector loops quantize_into and quantize_mx_into run: AVX-512 where
/// the CPU has it (mpt::detail::avx512_conversions_available), else AVX2.
/// The tests name each to compare both on one machine.
enum class SimdWidth { avx2, avx512 };
/// AVX-512 where this CPU and build have it, else AVX2.
SimdWidth widest();

/// quantize_into's vector path with the loops of `w` (arguments already checked).
float quantize_into_simd(const float* x, std::size_t n, const FormatSpec& f, float scale, bool saturate,
                         std::uint8_t* codes, Fp8Counts& counts, SimdWidth w);
/// quantize_mx_into's vector path with the loops of `w` (arguments already checked).
void quantize_mx_into_simd(const float* x, std::size_t rows, std::size_t cols, const FormatSpec& f,
                           MxScaleRule rule, bool saturate, std::uint8_t* codes, std::uint8_t* e8m0,
                           float* block_amax, Fp8Counts& counts, SimdWidth w);

}  // namespace mpt::fp8::detail
