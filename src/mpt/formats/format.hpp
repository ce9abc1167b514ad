// Chapter 01 — floating-point formats and their limits.
// Depends on: format_spec.hpp, round_element.hpp.
//
// The named formats of the project and the limits derived from their
// descriptors. Every number printed by `mpt formats` comes from here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mpt/formats/format_spec.hpp"
#include "mpt/formats/round_element.hpp"

namespace mpt {

/// A named format: its descriptor plus the project's conventions for it.
struct Format {
  std::string_view name;         ///< "fp32", "tf32", "bf16", "fp16", "e4m3", "e5m2"
  std::string_view description;  ///< one line for tables
  FormatSpec spec;               ///< the fields; everything else is derived
  /// Overflow convention when the caller does not choose: IEEE formats go to
  /// inf; the FP8 formats saturate to ±max (as Transformer Engine's casts do).
  OverflowMode default_overflow;
};

/// Values derived from a FormatSpec (all exact in double).
struct Limits {
  int precision;                ///< p, significand bits including the implicit one
  int emin;                     ///< smallest normal exponent
  int emax;                     ///< largest finite exponent
  double max;                   ///< largest finite value
  double min_normal;            ///< 2^emin
  double min_subnormal;         ///< 2^(emin - mantissa_bits)
  double epsilon;               ///< machine epsilon, 2^(1-p): gap from 1 to the next value
  double unit_roundoff;         ///< u = 2^-p: max relative error of round-to-nearest
  std::uint64_t finite_codes;   ///< bit patterns holding finite values (±0 counted twice)
  std::uint64_t finite_values;  ///< distinct finite values (±0 counted once)
  bool has_inf;                 ///< whether the format has ±inf
  int storage_bytes;            ///< bytes one stored value occupies
};

/// Limits derived from the descriptor alone.
Limits limits_of(const FormatSpec& spec);

/// The stock formats, in table order (widest first).
const std::vector<Format>& all_formats();

/// Look a format up by name; nullptr when unknown.
const Format* find_format(std::string_view name);

/// Look a format up by name; throws std::invalid_argument with a one-line
/// message naming the valid choices when unknown.
const Format& format_named(std::string_view name);

/// "fp32, tf32, bf16, fp16, e4m3, e5m2" — for error messages and help.
std::string format_names();

}  // namespace mpt
