// Chapter 01 — floating-point formats and their limits.
// Depends on: format.hpp, rounding.hpp (round_value), round_element.hpp
// (encode_exact, decode), range_classify.hpp (the outcome classes).
//
// The bit-level explainer behind `mpt explain`: what happens, bit by bit,
// when one number is stored in one format.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "mpt/formats/format.hpp"
#include "mpt/formats/range_classify.hpp"

namespace mpt {

/// What a stored code holds.
enum class ValueKind : std::uint8_t {
  zero,       ///< ±0
  subnormal,  ///< exponent field 0, nonzero fraction: fewer than p significant bits
  normal,     ///< the full precision p
  infinity,   ///< ±inf (IEEE formats only)
  nan,        ///< not a number
};

/// Lower-case name of a kind ("zero", "subnormal", "normal", "inf", "nan").
std::string_view value_kind_name(ValueKind k);

/// Everything about storing one value in one format with round-to-nearest-
/// even, the format's default overflow convention (Format::default_overflow:
/// inf for IEEE formats, saturation to ±max for FP8) and gradual underflow.
///
/// The input is rounded *once*, directly from its double value (no double
/// rounding through fp32), so explain(0.1, fp16) describes the real number
/// 0.1000000000000000055511151231257827... rounded to fp16.
struct Explanation {
  const Format* format = nullptr;  ///< the format explained (points into all_formats())
  double input = 0;                ///< the value asked about
  float stored = 0;                ///< the rounded value; every stock format is a subset of fp32
  std::uint32_t code = 0;          ///< the format's bit pattern, right-aligned
  int code_bits = 0;               ///< 1 + exponent_bits + mantissa_bits
  std::string code_hex;            ///< code in hex, zero-padded to whole nibbles: "0x7bff"
  std::string sign_field;          ///< the sign bit, "0" or "1"
  std::string exponent_field;      ///< exponent field bits, most significant first
  std::string mantissa_field;      ///< fraction field bits, most significant first
  int biased_exponent = 0;         ///< the exponent field read as an unsigned integer
  /// The power of two that scales the significand: field - bias for normal
  /// numbers, emin for subnormals and zero (the field 0 means emin, not
  /// -bias), 0 for inf and NaN.
  int exponent = 0;
  ValueKind kind = ValueKind::zero;  ///< what the stored code holds
  /// The significand in binary, "1.fff…" (normal) or "0.fff…" (subnormal,
  /// zero); empty for inf and NaN. stored = ±significand × 2^exponent.
  std::string significand_binary;
  std::string input_exact;      ///< the input's exact decimal expansion
  std::string stored_exact;     ///< the stored value's exact decimal expansion
  std::string stored_shortest;  ///< shortest decimal that reads back as the same float
  /// stored - input. Exact whenever the result is finite and not saturated
  /// (the error of rounding to a coarser format needs fewer bits than the
  /// input has); ±inf when the stored value is ±inf, 0 when a NaN or an inf
  /// is stored unchanged.
  double abs_error = 0;
  /// Whether abs_error is the exact difference (checked with Knuth's
  /// TwoSum). Only a saturated or overflowed result can make it inexact.
  bool abs_error_is_exact = true;
  std::string abs_error_exact;  ///< abs_error's exact decimal expansion
  double rel_error = 0;         ///< abs_error / |input|; 0 when input is 0
  /// The format's spacing at the stored value: 2^(max(e, emin) - m) for
  /// 2^e <= |stored| < 2^(e+1) (the gap to the next larger magnitude);
  /// NaN for inf and NaN.
  double ulp = 0;
  double error_ulps = 0;  ///< abs_error / ulp (at most 0.5 in magnitude for RNE, unless overflow)
  /// Next representable value below the stored one (toward -inf): at -max
  /// that is -inf for a format with inf and nothing for E4M3; nothing for
  /// -inf and NaN. Below ±0 is -min_subnormal.
  std::optional<float> next_below;
  /// Next representable value above the stored one, mirroring next_below.
  std::optional<float> next_above;
  /// What storing did, in the range report's classes (range_classify.hpp),
  /// decided for the exact input: for an fp32 input it equals classify(x).
  RangeClass outcome = RangeClass::zero;
  /// What storing did, in one sentence: "exact", "rounded", or why the
  /// value overflowed, saturated, became subnormal or flushed to zero.
  std::string note;
};

/// Explain storing `x` in format `f` (see Explanation for the rounding used).
Explanation explain(double x, const Format& f);
/// Explain storing the fp32 value `x` (exactly the double of the same value).
Explanation explain(float x, const Format& f);

/// Multi-line human-readable explanation, one field a line.
std::string render_text(const Explanation& e);

/// The exact decimal expansion of a double: every binary fraction has a
/// finite one (2^-k = 5^k / 10^k). "inf", "-inf", "nan" for the others;
/// "-0" for negative zero.
std::string exact_decimal(double x);

/// The shortest decimal that reads back (strtof) as the same float.
std::string shortest_decimal(float x);

/// The shortest decimal that reads back (strtod) as the same double.
std::string shortest_decimal(double x);

/// "2^-14" when x is ±a power of two, otherwise the shortest decimal of x
/// (the fp32 spelling when x is an fp32 value, the fp64 one otherwise).
std::string power_of_two_or_decimal(double x);

}  // namespace mpt
