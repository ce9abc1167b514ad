// Chapter 07 — FP8 training: quantize into buffers the caller owns — the
// loops behind a fast per-tensor and MX quantize on the CPU, with an AVX2
// path that gives the portable loop's bits.
// Depends on: quantize.hpp (Fp8Counts, kMxBlockSize, fp8_spec),
// fp8_math.hpp (quantize_element, amax_step, mx_scale_code),
// formats/rounding.hpp (Implementation).
//
// quantize_with_scale and quantize_mx (quantize.hpp) build an Fp8Tensor and
// allocate its arrays; these fill arrays the caller already has, as a
// training step's FP8 buffers are, and return the same codes, amax, E8M0
// codes and counts. The portable loop is quantize.cpp's loop; the AVX2 one
// (quantize_avx2.cpp) multiplies by the scale eight values at a time,
// rounds and encodes them with the formats tier's AVX2 encoder, and then
// turns the codes of the non-saturating rounding into quantize_element's
// outcomes: a NaN input stays NaN, a code beyond the format's max becomes
// ±max when saturating (and is counted), a non-zero input whose code is ±0
// is counted as flushed. tests/cpu/test_ch07_quantize_raw.cpp checks the
// two paths against each other and against quantize.hpp, bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mpt/formats/rounding.hpp"
#include "mpt/fp8/quantize.hpp"

namespace mpt::fp8 {

/// codes[i] = quantize_element(x[i], scale, d, saturate).code for i < n,
/// each outcome added to `counts`; returns amax_of(x, n). The codes and
/// the amax of quantize_with_scale(x, n, d, scale, saturate), its counts
/// added to counts. The scale must be finite and > 0 (std::invalid_argument
/// otherwise, as quantize_with_scale); d e4m3 or e5m2. impl: the AVX2 loop
/// where the CPU has it (automatic), or the one asked for (avx2 on a CPU
/// without it throws std::invalid_argument).
float quantize_into(const float* x, std::size_t n, DType d, float scale, bool saturate, std::uint8_t* codes,
                    Fp8Counts& counts, Implementation impl = Implementation::automatic);

/// amax_of(x, n) (quantize.hpp): max |x[i]|, NaN ignored — through the
/// AVX-512 loop where the CPU has it, else amax_of itself. Current scaling
/// reads a tensor for its amax before it can quantize it.
float amax_vector(const float* x, std::size_t n);

/// quantize_mx(x, rows, cols, d, rule, saturate) into the caller's arrays:
/// codes (rows × cols), e8m0 (rows × ceil(cols / 32)), block_amax (the
/// same count, or null), counts added to. Blocks of kMxBlockSize.
void quantize_mx_into(const float* x, std::size_t rows, std::size_t cols, DType d, MxScaleRule rule,
                      bool saturate, std::uint8_t* codes, std::uint8_t* e8m0, float* block_amax,
                      Fp8Counts& counts, Implementation impl = Implementation::automatic);

}  // namespace mpt::fp8
