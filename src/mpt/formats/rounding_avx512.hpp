// Chapter 01 — private to src/mpt/formats: the AVX-512 fast paths of the
// fp16/bf16 conversions (rounding_avx512.cpp), declared with plain types.
// Depends on: the standard library only — rounding_avx512.cpp, compiled with
// -mavx512f, includes nothing else of the library, so no inline function
// of another header is ever emitted there with AVX-512 instructions in it
// (the linker could keep that copy for the callers on other CPUs).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mpt::detail {

/// Whether this CPU and build can run the two loops below (rounding.cpp).
bool avx512_conversions_available();

/// fp16 (bf16 = false) or bf16 codes → fp32, 16 at a time, exactly as
/// decode() (a NaN becomes the canonical quiet NaN with its sign). Returns
/// the elements done, a multiple of 16; the rest is the caller's.
std::size_t decode16_avx512(const std::uint16_t* in, float* out, std::size_t n, bool bf16);

/// fp32 → fp16 or bf16 codes with IEEE round-to-nearest-even, overflow to
/// inf and subnormals kept (the caller checks is_ieee_default), 16 at a
/// time, exactly as encode_exact(round_one()). Returns the elements done.
std::size_t encode16_avx512(const float* in, std::uint16_t* out, std::size_t n, bool bf16);

}  // namespace mpt::detail
