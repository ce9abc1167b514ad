// Chapter 07 — FP8 training: the CUDA kernels of the fp8 tier
// (mpt_kernels_fp8): per-tensor amax, quantize with the amax and the counts
// fused in, MX block quantize with E8M0 scales, and dequantize, in
// kernels/fp8/fp8.cu.
// Depends on: kernels/formats/formats_kernels.hpp (KernelVersion),
// mpt/core/dtype.hpp (DType::e4m3, e5m2), mpt/fp8/fp8_math.hpp
// (MxScaleRule; plain C++17). Host-only: no CUDA types, so CPU code and
// cling notebooks can include it.
//
// Every pointer named d_* is a DEVICE pointer (cudaMalloc'd). All work goes
// to the default stream and returns as soon as it is queued; a CUDA error
// throws std::runtime_error carrying CUDA's error name and text. Codes are
// raw bytes, as mpt::fp8::Fp8Tensor::codes holds them.
//
// Every element goes through mpt::fp8::quantize_element and every MX scale
// through mpt::fp8::mx_scale_code, the host-and-device functions the CPU
// reference (src/mpt/fp8/quantize.cpp) runs: the CPU's codes, E8M0 codes,
// amax and counts are the GPU's, bit for bit (tests/cuda/test_ch07_fp8.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/formats/formats_kernels.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/fp8/fp8_math.hpp"

namespace mpt::cuda {

/// What happened to the values of one quantize call, counted on the device
/// (mpt::fp8::Fp8Counts's fields, as 64-bit integers). Integer sums: the
/// same whatever order the threads add in.
struct Fp8DeviceCounts {
  unsigned long long saturated = 0;   ///< clamped to ±max (saturation on)
  unsigned long long overflowed = 0;  ///< beyond ±max with saturation off: NaN (E4M3) or ±inf (E5M2)
  unsigned long long nan = 0;         ///< NaN inputs
  unsigned long long flushed = 0;     ///< non-zero values whose code is ±0
};

/// *d_amax = max |d_x[i]| over n values, NaN ignored and ±inf kept, 0 for
/// n = 0: mpt::fp8::amax_of, bit for bit. NaN: amax_step's rule, the CPU's
/// fmaxf semantics (a NaN operand never wins; Transformer Engine's amax
/// kernels behave the same). Deterministic: the maximum of non-NaN values
/// is exact and independent of the order it is taken in, so every
/// reduction order gives the same bits; the kernels still combine in a
/// fixed order within a block.
///   simple:     one block of 256 threads walks the whole array (grid
///               stride), then a fixed tree in shared memory.
///   vectorized: many blocks, 16-byte loads, a fixed tree per block; the
///               block results meet in one atomicMax on the fp32 bits
///               (non-negative floats order as their bit patterns).
void fp8_amax(const float* d_x, std::size_t n, float* d_amax, KernelVersion v = KernelVersion::vectorized);

/// Per-tensor quantize with the amax fused in: d_codes[i] =
/// quantize_element(d_x[i], *d_scale, dtype, saturate).code, *d_amax = the
/// amax of d_x (as fp8_amax), and *d_counts = what happened (both reset
/// here first). The scale is read on the device (Transformer Engine keeps
/// it there), finite and > 0 as mpt::fp8::quantize_with_scale requires (not
/// checked: it is on the device). mpt::fp8::quantize_with_scale's codes,
/// amax and counts, bit for bit. dtype: DType::e4m3 or e5m2
/// (std::invalid_argument otherwise).
///   simple:     one thread per element, one atomic per element that
///               counts or raises the amax.
///   vectorized: four elements per thread (a 16-byte load, a 4-byte
///               store), counts and amax reduced in the block first.
void fp8_quantize_per_tensor(const float* d_x, std::size_t n, DType dtype, const float* d_scale,
                             bool saturate, std::uint8_t* d_codes, float* d_amax, Fp8DeviceCounts* d_counts,
                             KernelVersion v = KernelVersion::vectorized);

/// MX block quantize of a rows × cols row-major matrix: each run of 32
/// values of a row (mpt::fp8::kMxBlockSize; the last of a row may be
/// shorter) gets its E8M0 code from its amax by `rule`
/// (mpt::fp8::mx_scale_code), and its values are quantize_element(x,
/// e8m0_reciprocal(code)). d_e8m0: rows × ceil(cols / 32) codes;
/// d_block_amax (may be null): each block's amax; *d_counts reset here
/// first. mpt::fp8::quantize_mx's codes, e8m0, amax and counts, bit for bit.
///   simple:     one thread per block of 32: its amax, then its 32 values.
///   vectorized: one warp per block, one value per lane: the amax by a
///               fixed butterfly of warp shuffles, loads and stores
///               coalesced (128 contiguous bytes per warp).
void fp8_quantize_mx(const float* d_x, std::size_t rows, std::size_t cols, DType dtype, fp8::MxScaleRule rule,
                     bool saturate, std::uint8_t* d_codes, std::uint8_t* d_e8m0, float* d_block_amax,
                     Fp8DeviceCounts* d_counts, KernelVersion v = KernelVersion::vectorized);

/// Per-tensor dequantize: d_out[i] = dequantize_element(d_codes[i], 1 /
/// *d_scale rounded to fp32, dtype) — mpt::fp8::dequantize of a per-tensor
/// Fp8Tensor, bit for bit (NaN codes: a NaN, any payload).
void fp8_dequantize_per_tensor(const std::uint8_t* d_codes, std::size_t n, DType dtype, const float* d_scale,
                               float* d_out, KernelVersion v = KernelVersion::vectorized);

/// MX dequantize: d_out[i] = decode(code) × 2^e of its block's E8M0 code
/// (e8m0_to_float) — mpt::fp8::dequantize of an MX Fp8Tensor, bit for bit.
void fp8_dequantize_mx(const std::uint8_t* d_codes, const std::uint8_t* d_e8m0, std::size_t rows,
                       std::size_t cols, DType dtype, float* d_out,
                       KernelVersion v = KernelVersion::vectorized);

}  // namespace mpt::cuda
