// Chapter 07 — FP8 training: FP8 tensors — codes, their scales and the amax
// of what each scale covers — and quantize, dequantize, amax over arrays.
// Depends on: fp8_math.hpp (the per-element encode and the scale rules),
// core/dtype.hpp (DType::e4m3, DType::e5m2).
//
// One scale per tensor (the per-tensor recipes, recipes.hpp) or one per
// block of 32 values along the reduction dimension (MX). Every element goes
// through quantize_element(), the function the CUDA kernels will call, and
// what happened to it is counted: saturation hides overflow (an inf becomes
// ±448 without a trace), so the count is the trace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/fp8/fp8_math.hpp"

namespace mpt::fp8 {

/// Elements per MX block (OCP MX v1.0: k = 32 for every concrete MX format).
inline constexpr std::size_t kMxBlockSize = 32;

/// How many values met each fate on their way into FP8 (Fp8Outcome).
struct Fp8Counts {
  std::size_t saturated = 0;   ///< clamped to ±max (beyond it after rounding, or ±inf), saturation on
  std::size_t overflowed = 0;  ///< beyond ±max or ±inf with saturation off: NaN (E4M3) or ±inf (E5M2)
  std::size_t nan = 0;         ///< NaN inputs (their codes are NaN)
  std::size_t flushed = 0;     ///< values that were not zero and became ±0
  /// Count one element's outcome.
  void add(Fp8Outcome o);
};

/// An FP8 tensor: a rows × cols matrix (row-major; a vector is one row) of
/// E4M3 or E5M2 codes, and its scales, which multiply (code ≈ value ×
/// scale). Per-tensor: one scale (block 0). MX: one scale per block of
/// `block` consecutive values of a row, the reduction dimension of a matrix
/// product, the last block of a row possibly shorter (as if padded with
/// zeros, which change no amax).
struct Fp8Tensor {
  DType dtype = DType::e4m3;        ///< e4m3 or e5m2
  std::size_t rows = 0;             ///< rows (1 for a vector)
  std::size_t cols = 0;             ///< values per row
  std::size_t block = 0;            ///< values per scale along a row; 0: one scale for the whole tensor
  bool saturate = true;             ///< whether out-of-range values were clamped (else NaN / inf)
  std::vector<std::uint8_t> codes;  ///< rows × cols codes of dtype
  std::vector<float> scales;        ///< per tensor: one; MX: rows × blocks_per_row(), row by row
  std::vector<float> amax;          ///< one per scale: the largest |value| it covers (NaN ignored)
  std::vector<std::uint8_t> e8m0;   ///< MX only: each block's E8M0 code, 2^e with scale = 2^-e
  Fp8Counts counts;                 ///< what happened to the values

  /// Scales per row: 1 per tensor, ceil(cols / block) for MX.
  std::size_t blocks_per_row() const;
  /// The index into scales (and amax, e8m0) of the scale element i (row-major) was quantized with.
  std::size_t scale_index(std::size_t i) const;
  /// The format of dtype.
  const FormatSpec& spec() const;
};

/// The format of an FP8 dtype; std::invalid_argument for any other dtype,
/// naming the two.
const FormatSpec& fp8_spec(DType d);

/// max |x[i]|, NaN ignored, inf kept (amax_step over the array); 0 for n = 0.
float amax_of(const float* x, std::size_t n);

/// x[0..n) quantized with one given scale (a vector: rows 1): each code is
/// quantize_element(x[i], scale). The scale must be finite and > 0, as
/// Tensor::from_f32_scaled requires (std::invalid_argument otherwise); with
/// the same scale, and saturation, the codes are that Tensor's bits.
Fp8Tensor quantize_with_scale(const float* x, std::size_t n, DType d, float scale, bool saturate = true);

/// A rows × cols matrix quantized MX-style: each run of `block` values of a
/// row gets its own E8M0 scale from its amax by `rule` (mx_scale_code), and
/// its values are quantize_element(x, 2^-e). std::invalid_argument for a
/// block of 0.
Fp8Tensor quantize_mx(const float* x, std::size_t rows, std::size_t cols, DType d, MxScaleRule rule,
                      bool saturate = true, std::size_t block = kMxBlockSize);

/// Every code read back: dequantize_element(code, 1 / its scale). For MX the
/// reciprocal is exactly 2^e; for a per-tensor scale it is 1 / scale
/// rounded to fp32 once (Transformer Engine's scale_inv, the core Tensor's
/// read).
std::vector<float> dequantize(const Fp8Tensor& t);

}  // namespace mpt::fp8
