// Chapter 02 — loss scaling and FP32 master weights: the register tiles and
// blocking of the packed GEMM (gemm.hpp) and its AVX2 and AVX-512
// micro-kernels.
// Depends on: the standard library only — gemm_avx2.cpp and gemm_avx512.cpp,
// compiled with -mavx2 -mfma and -mavx512f, include nothing else, so no
// inline function of another header is ever emitted there with those
// instructions in it (the linker could keep that copy for the portable
// callers).
#pragma once

#include <cstdint>

namespace mpt {

/// The register tile of the micro-kernels: kGemmMR rows × kGemmNR columns
/// of C.
inline constexpr std::int64_t kGemmMR = 6;
/// See kGemmMR: the portable and AVX2 micro-kernels' width (two ymm).
inline constexpr std::int64_t kGemmNR = 16;
/// The AVX-512 micro-kernel's width (two zmm): its op(B) panels are packed
/// kGemmNR512 columns wide. The width changes how many chains run side by
/// side, never the order inside one.
inline constexpr std::int64_t kGemmNR512 = 32;
/// The blocking of the packed loops: k in blocks of kGemmKC (a kMR × kKC
/// panel of A and a kKC × kNR panel of B stay in L1), rows of C in blocks
/// of kGemmMC (the packed A block stays in L2), columns in blocks of
/// kGemmNC. Only the speed depends on them, never a bit of the result.
inline constexpr std::int64_t kGemmKC = 256;
/// See kGemmKC.
inline constexpr std::int64_t kGemmMC = 144;
/// See kGemmKC.
inline constexpr std::int64_t kGemmNC = 3072;

namespace detail {
/// The AVX2 + FMA micro-kernel (gemm_avx2.cpp; call only when
/// avx2_available(), which checks FMA too): the kGemmMR × kGemmNR tile of C
/// at c (rows ldc apart) gets kc more steps of its chains from the packed
/// panels ap (kc × kGemmMR, k-major) and bp (kc × kGemmNR, k-major, 32-byte
/// aligned). With load_c the chains continue from the values in c, else
/// they start at +0.
void gemm_micro_avx2(std::int64_t kc, const float* ap, const float* bp, float* c, std::int64_t ldc,
                     bool load_c);
/// The AVX-512 micro-kernel (gemm_avx512.cpp; call only when
/// gemm_avx512_available()): gemm_micro_avx2's contract on a kGemmMR ×
/// kGemmNR512 tile, bp (kc × kGemmNR512, k-major) 64-byte aligned.
void gemm_micro_avx512(std::int64_t kc, const float* ap, const float* bp, float* c, std::int64_t ldc,
                       bool load_c);
}  // namespace detail

}  // namespace mpt
