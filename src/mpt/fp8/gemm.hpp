// Chapter 07 — FP8 training: the FP8 GEMM as the hardware does it — FP8
// operands with their per-tensor scales, FP32 accumulation, both descales
// applied to the accumulator, one rounding into bf16, f16 or f32.
// Depends on: nn/cpu/gemm.hpp (gemm_fma: the library's one summation order),
// core/tensor.hpp (FP8 Tensors and their scales), quantize.hpp (fp8_spec,
// Fp8Tensor and dequantize for the MX GEMM).
//
// What an FP8 GEMM on Hopper (cuBLASLt with FP8 A and B, Transformer
// Engine's te.Linear) computes, emulated on the CPU:
//
//   C = (op(Â) · op(B̂)) × d + bias,   d = (1/s_a) × (1/s_b),
//
// where Â, B̂ are the operands' FP8 codes read as numbers (each decoded
// exactly to FP32: an E4M3 or E5M2 value has at most 3 significant bits),
// s_a and s_b their scales (which multiply: code ≈ value × s), 1/s each
// rounded to FP32 once (TE's scale_inv, the Tensor's read), d their FP32
// product. The products are summed as gemm_fma sums every product of the
// library — one fma chain per output over k = 0..K−1 from +0 — so the
// result is bit for bit decode-then-gemm_fma. Each product of two FP8
// values is exact in FP32 (4 significant bits times 4 at most: 8 bits), so the only roundings are the chain's
// additions, the multiply by d, the bias's addition, and the one rounding into `out`. The bias (any dtype) is
// widened to FP32 and added after the descale, as cuBLASLt's bias epilogue does on the scaled result.
#pragma once

#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/fp8/quantize.hpp"
#include "mpt/nn/cpu/gemm.hpp"

namespace mpt::fp8 {

/// The descale of an FP8 Tensor: 1 / its scale rounded to FP32 (1 without a scale).
float descale_of(const Tensor& t);

/// The codes of an FP8 Tensor (1-D or 2-D) read as numbers: decoded exactly to
/// FP32, without the scale; t.rows() × t.cols() values, row-major.
/// std::invalid_argument for a tensor that is not e4m3 or e5m2.
std::vector<float> decode_codes(const Tensor& t);

/// C = op(A) · op(B) × descale_of(A) × descale_of(B) [+ bias], rounded once
/// into `out` (see the top of the file). A and B: 2-D (or 1-D: one row)
/// FP8 Tensors, e4m3 or e5m2 each (any mix: E4M3 × E5M2 is the backward's
/// product); bias: cols(C) elements of any dtype. std::invalid_argument for
/// an operand that is not FP8, inner dimensions that differ or a bias of
/// the wrong size.
Tensor fp8_gemm(const Tensor& a, Op op_a, const Tensor& b, Op op_b, DType out, const Tensor* bias = nullptr);

/// MX (block scales along k): C [m, n] = A · Bᵀ [+ bias], rounded once into
/// `out`, where A (m × k) and B (n × k) are Fp8Tensors quantized with one
/// scale per block of their rows (quantize_mx: the blocks run along k, the
/// "TN" layout block-scaled tensor cores require; B is W as a Linear stores
/// it, [out, in]). Each element is read as code × 2^e (its block's E8M0
/// scale, dequantize()), exact in FP32 for every value a model produces
/// (a read that would leave FP32's normal range — |code × 2^e| beyond FLT_MAX
/// or below 2^-126 — is not exact, and no hardware result is claimed for
/// it); then the products run in the one order, gemm_fma's chain over k.
/// With exact reads, each product a·b is the block-scaled product
/// (code_a·code_b)·2^(e_a+e_b) exactly, so this is the sum a block-scaled
/// GEMM forms, in the library's order. std::invalid_argument for an operand
/// without block scales, different k or block sizes, or a bias of the wrong
/// size.
Tensor fp8_gemm_mx(const Fp8Tensor& a, const Fp8Tensor& b, DType out, const Tensor* bias = nullptr);

}  // namespace mpt::fp8
