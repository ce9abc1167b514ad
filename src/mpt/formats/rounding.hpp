// Chapter 01 — floating-point formats and their limits.
// Depends on: format.hpp, round_element.hpp.
//
// Round fp32 data to any stock format, element by element (the reference)
// or whole arrays (vectorized with AVX2/F16C where the CPU has them; the
// portable path gives identical bits and tests hold them to it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "mpt/formats/format.hpp"

namespace mpt {

/// How to round. The defaults are IEEE round-to-nearest-even, the format's
/// overflow convention and gradual underflow.
struct RoundingOptions {
  RoundingMode mode = RoundingMode::nearest_even;  ///< direction for values between two neighbours
  std::optional<OverflowMode> overflow;            ///< unset: Format::default_overflow
  SubnormalMode subnormals = SubnormalMode::keep;  ///< keep subnormal results or flush them to ±0
  std::uint64_t seed = 0;  ///< stochastic rounding only; element i uses bits (seed, i)
};

/// Which array implementation to use (tests compare them).
enum class Implementation { automatic, portable, avx2 };

/// True when this CPU and build can run the AVX2/F16C path.
bool avx2_available();

/// Round one value. `index` is the element's position (stochastic mode
/// draws its random bits from (seed, index)).
float round_value(float x, const Format& f, const RoundingOptions& o = {}, std::uint64_t index = 0);

/// Round n floats; out may alias in. Element i uses index first_index + i,
/// so chunked and whole-array calls agree bit for bit.
void round_array(const float* in, float* out, std::size_t n, const Format& f, const RoundingOptions& o = {},
                 std::uint64_t first_index = 0, Implementation impl = Implementation::automatic);

/// Round and encode n floats to the format's bit patterns, right-aligned in
/// uint32 (the storage types in storage.hpp narrow these to 1 or 2 bytes).
void encode_array(const float* in, std::uint32_t* codes, std::size_t n, const Format& f,
                  const RoundingOptions& o = {}, std::uint64_t first_index = 0);

/// Parse "rne" | "rtz" | "sr"; throws std::invalid_argument naming the choices.
RoundingMode rounding_mode_named(std::string_view name);
/// The short name of a mode: "rne", "rtz" or "sr" (what rounding_mode_named reads).
std::string_view rounding_mode_name(RoundingMode m);

}  // namespace mpt
