// Chapter 02 — loss scaling and FP32 master weights: the CUDA kernels of
// the nn tier (mpt::kernels_nn): the FP16-input, FP32-accumulate GEMM, in
// kernels/nn/gemm_fp16.cu.
// Depends on: kernels/formats/formats_kernels.hpp (and through it
// mpt/formats/codes.hpp: Fp16Code). Host-only: no CUDA types, so CPU
// code and cling notebooks can include it.
//
// Every pointer named d_* is a DEVICE pointer (cudaMalloc'd). All work goes
// to the default stream. A CUDA error throws std::runtime_error carrying
// CUDA's error name and text.
#pragma once

#include <cstdint>

#include "kernels/formats/formats_kernels.hpp"

namespace mpt::cuda {

// --- FP16-input, FP32-accumulate GEMM (kernels/nn/gemm_fp16.cu) ----------------

/// Whether a GEMM operand is read as stored (no) or transposed (yes).
enum class Trans : int {
  no = 0,   ///< op(X) = X
  yes = 1,  ///< op(X) = X^T
};

/// The GEMM kernels, simplest first.
enum class GemmVersion : int {
  naive = 1,  ///< one thread per output, operands read straight from global memory
  tiled = 2,  ///< 16x16 shared-memory tiles: each operand value loaded once per tile
};

/// C = op(A) · op(B), all row-major and contiguous, fp16 inputs given as
/// IEEE binary16 codes (Fp16Code, so bf16 codes do not compile), products
/// and sums in FP32:
///   op(A): M x K — A stored as [M, K] (ta = no) or [K, M] (ta = yes)
///   op(B): K x N — B stored as [K, N] (tb = no) or [N, K] (tb = yes)
///   C:     M x N, FP32
/// A Linear layer y = x W^T with x [batch, in], W [out, in] (PyTorch's
/// layout) is gemm_fp16(no, yes, batch, out, in, x, W, y); its backward is
/// dx = dy W: (no, no, batch, in, out, dy, W, dx) and dW = dy^T x:
/// (yes, no, out, in, batch, dy, x, dW).
/// Each output sums its K products in order k = 0..K-1 with one FMA each.
/// A product of two fp16 values is exact in FP32, so an FMA equals "round
/// the sum once": the result is bit for bit a CPU loop acc += a*b in the same
/// order (NaN payloads aside). M, N, K >= 0; K == 0 gives zeros; M above
/// 65535 * 16 = 1048560 (the grid's y limit) throws std::length_error. Queued.
void gemm_fp16(Trans ta, Trans tb, int M, int N, int K, const Fp16Code* d_a, const Fp16Code* d_b, float* d_c,
               GemmVersion v = GemmVersion::tiled);

/// As above with C stored as fp16 codes: the FP32 sum rounded once to fp16
/// (nearest-even, overflow to ±inf, subnormals kept, NaN → 0x7E00 with its
/// sign), via round_element.hpp's round_to_format, as mpt::encode_array does.
void gemm_fp16(Trans ta, Trans tb, int M, int N, int K, const Fp16Code* d_a, const Fp16Code* d_b,
               Fp16Code* d_c, GemmVersion v = GemmVersion::tiled);

}  // namespace mpt::cuda
