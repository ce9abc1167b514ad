// Chapter 01 — floating-point formats and their limits: one distinct C++ type
// per storage format's bit pattern (fp16, bf16, E4M3, E5M2 codes).
// Depends on: format_spec.hpp (FormatSpec, the stock formats, MPT_HD) and
// round_element.hpp (decode, for Fp8::to_float). Plain C++17, no Eigen:
// host-and-device, so the CUDA kernel headers (kernels/*/*_kernels.hpp) and
// the .cu files include it.
//
// fp16 and bf16 are both 16 bits, so as raw std::uint16_t* an array of bf16
// codes passes silently where fp16 codes are expected and every value comes
// out wrong. Each format's code is therefore its own one-member struct: the
// compiler rejects the mix-up, and the layout stays exactly the raw integer's
// (checked below), so kernels may read an array of codes as an array of
// integers.
#pragma once

#include <cstdint>
#include <type_traits>

#include "mpt/formats/format_spec.hpp"
#include "mpt/formats/round_element.hpp"

namespace mpt {

/// One IEEE binary16 (fp16) value as its 16-bit code (sign, 5 exponent
/// bits, 10 fraction bits); the type of fp16 data at the kernel API.
struct Fp16Code {
  std::uint16_t bits;  ///< the binary16 bit pattern
};

/// One bfloat16 value as its 16-bit code (sign, 8 exponent bits, 7 fraction
/// bits); the type of bf16 data at the kernel API. Not convertible to or
/// from Fp16Code: same size, different format.
struct Bf16Code {
  std::uint16_t bits;  ///< the bfloat16 bit pattern
};

/// One FP8 value: the byte and, through the tag, which codec reads it.
/// Fp8E4M3 and Fp8E5M2 are the FP8 codes at the kernel API and in
/// storage.hpp's CPU storage.
template <const FormatSpec& Spec>
struct Fp8 {
  std::uint8_t code = 0;                           ///< the format's bit pattern
  static constexpr const FormatSpec& spec = Spec;  ///< the format the code is read in
  /// The value whose bit pattern is c.
  MPT_HD static Fp8 from_code(std::uint8_t c) {
    Fp8 v;
    v.code = c;
    return v;
  }
  /// The value as a float (exact). The spec is copied into a compile-time
  /// constant first: device code may not read the host variable Spec names.
  MPT_HD float to_float() const {
    constexpr FormatSpec f = Spec;
    return decode(code, f);
  }
};
using Fp8E4M3 = Fp8<formats::e4m3>;  ///< OCP E4M3: max 448, no inf
using Fp8E5M2 = Fp8<formats::e5m2>;  ///< OCP E5M2: max 57344, IEEE-like

// Each code is exactly its raw integer: same size and alignment, standard
// layout with the integer as its only (and so first) member, trivially
// copyable. That is what lets kernels/*.cu and storage.cpp reinterpret an
// array of codes as an array of integers, and cudaMemcpy them as bytes.
static_assert(sizeof(Fp16Code) == 2 && alignof(Fp16Code) == alignof(std::uint16_t),
              "Fp16Code must be exactly a uint16_t");
static_assert(sizeof(Bf16Code) == 2 && alignof(Bf16Code) == alignof(std::uint16_t),
              "Bf16Code must be exactly a uint16_t");
static_assert(sizeof(Fp8E4M3) == 1 && alignof(Fp8E4M3) == alignof(std::uint8_t),
              "Fp8E4M3 must be exactly a uint8_t");
static_assert(sizeof(Fp8E5M2) == 1 && alignof(Fp8E5M2) == alignof(std::uint8_t),
              "Fp8E5M2 must be exactly a uint8_t");
static_assert(std::is_standard_layout_v<Fp16Code> && std::is_trivially_copyable_v<Fp16Code> &&
                  std::is_standard_layout_v<Bf16Code> && std::is_trivially_copyable_v<Bf16Code> &&
                  std::is_standard_layout_v<Fp8E4M3> && std::is_trivially_copyable_v<Fp8E4M3> &&
                  std::is_standard_layout_v<Fp8E5M2> && std::is_trivially_copyable_v<Fp8E5M2>,
              "codes must be standard-layout and trivially copyable");

}  // namespace mpt
