// Chapter 02 — precision as data: the storage types a tensor can hold.
// Depends on: Chapter 1's formats tier (format.hpp for the descriptors,
// storage.hpp for the C++ types with real sizes).
//
// A DType is a value, not a property of a whole run: every tensor carries
// one, and the Policy (policy.hpp) tells each op which to read, compute and
// store in. Each DType is tied to its Chapter 1 format descriptor, so its
// limits, its rounding and its size come from one place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <Eigen/Core>

#include "mpt/formats/format.hpp"
#include "mpt/formats/storage.hpp"

namespace mpt {

/// The storage types, widest first. The names are the short ones PyTorch
/// users know from `torch.float32` & co. (f32, bf16, f16) and OCP's FP8 names.
enum class DType : std::uint8_t {
  f32,   ///< IEEE binary32, 4 bytes (float)
  bf16,  ///< bfloat16, 2 bytes (Eigen::bfloat16)
  f16,   ///< IEEE binary16, 2 bytes (Eigen::half)
  e4m3,  ///< OCP FP8 E4M3, 1 byte (Fp8E4M3): max 448, no inf
  e5m2,  ///< OCP FP8 E5M2, 1 byte (Fp8E5M2): max 57344
};

/// Every DType, in declaration order (for tables and error messages).
inline constexpr DType kAllDTypes[] = {DType::f32, DType::bf16, DType::f16, DType::e4m3, DType::e5m2};

/// The Chapter 1 format a dtype stores: fp32, bf16, fp16, e4m3, e5m2.
const Format& format_of(DType d);
/// "f32", "bf16", "f16", "e4m3" or "e5m2".
std::string_view dtype_name(DType d);
/// Parse a dtype name; the Chapter 1 format names are accepted too ("fp16"
/// is f16, "fp32" is f32). Throws std::invalid_argument with a one-line
/// message naming the valid choices ("tf32" is a format but not a storage
/// type, and the message says so).
DType dtype_named(std::string_view name);
/// "f32, bf16, f16, e4m3, e5m2" — for error messages and help texts.
std::string dtype_names();
/// Bytes one stored element occupies: 4, 2, 2, 1, 1 (from the descriptor).
std::size_t bytes_per_element(DType d);
/// True for the one-byte FP8 types.
constexpr bool is_fp8(DType d) { return d == DType::e4m3 || d == DType::e5m2; }

/// The C++ type an element of dtype D is stored as.
template <DType D>
struct StorageOf;
/// f32 elements are floats.
template <>
struct StorageOf<DType::f32> {
  using type = float;  ///< the element type
};
/// bf16 elements are Eigen::bfloat16 (2 bytes).
template <>
struct StorageOf<DType::bf16> {
  using type = Eigen::bfloat16;  ///< the element type
};
/// f16 elements are Eigen::half (2 bytes).
template <>
struct StorageOf<DType::f16> {
  using type = Eigen::half;  ///< the element type
};
/// e4m3 elements are one-byte codes.
template <>
struct StorageOf<DType::e4m3> {
  using type = Fp8E4M3;  ///< the element type
};
/// e5m2 elements are one-byte codes.
template <>
struct StorageOf<DType::e5m2> {
  using type = Fp8E5M2;  ///< the element type
};

/// The dtype whose elements are stored as T; only the five storage types
/// have one, so any other T does not compile.
template <class T>
struct DTypeOf;
/// float is f32.
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::f32;  ///< the dtype
};
/// Eigen::bfloat16 is bf16.
template <>
struct DTypeOf<Eigen::bfloat16> {
  static constexpr DType value = DType::bf16;  ///< the dtype
};
/// Eigen::half is f16.
template <>
struct DTypeOf<Eigen::half> {
  static constexpr DType value = DType::f16;  ///< the dtype
};
/// Fp8E4M3 is e4m3.
template <>
struct DTypeOf<Fp8E4M3> {
  static constexpr DType value = DType::e4m3;  ///< the dtype
};
/// Fp8E5M2 is e5m2.
template <>
struct DTypeOf<Fp8E5M2> {
  static constexpr DType value = DType::e5m2;  ///< the dtype
};

}  // namespace mpt
