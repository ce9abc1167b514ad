// Chapter 01 — floating-point formats and their limits.
// Depends on: explain.hpp, rounding.hpp (round_value), round_element.hpp
// (encode_exact, decode). Only the standard library otherwise: the exact
// decimal expansion is a few lines of schoolbook big-number arithmetic.
#include "mpt/formats/explain.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

#include "mpt/formats/rounding.hpp"

namespace mpt {

namespace {

// A non-negative integer in base 10^9, least significant limb first.
using BigDecimal = std::vector<std::uint32_t>;
constexpr std::uint32_t kLimbBase = 1000000000u;

void multiply_small(BigDecimal& n, std::uint32_t factor) {
  std::uint64_t carry = 0;
  for (std::uint32_t& limb : n) {
    const std::uint64_t t = static_cast<std::uint64_t>(limb) * factor + carry;
    limb = static_cast<std::uint32_t>(t % kLimbBase);
    carry = t / kLimbBase;
  }
  while (carry) {
    n.push_back(static_cast<std::uint32_t>(carry % kLimbBase));
    carry /= kLimbBase;
  }
}

std::string to_digits(const BigDecimal& n) {
  std::string s = std::to_string(n.back());
  char buf[16];
  for (std::size_t i = n.size() - 1; i-- > 0;) {
    std::snprintf(buf, sizeof buf, "%09u", static_cast<unsigned>(n[i]));
    s += buf;
  }
  return s;
}

std::string bits_string(std::uint32_t value, int width) {
  std::string s(static_cast<std::size_t>(width), '0');
  for (int i = 0; i < width; ++i)
    if ((value >> (width - 1 - i)) & 1u) s[static_cast<std::size_t>(i)] = '1';
  return s;
}

// Round a double to the float nearest it *in the round-to-odd sense*: the
// truncation, with the last bit forced to 1 when anything was cut off. A
// float rounded this way and then rounded (RNE) to a format with at least
// two fewer bits of precision gives the same result as rounding the double
// directly — the sticky last bit keeps "exactly halfway" and "just above
// halfway" apart. (Boldo & Melquiond, "When double rounding is odd", 2005.)
float round_to_odd_float(double x) {
  float f = static_cast<float>(x);
  if (std::isnan(x) || static_cast<double>(f) == x) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u |= 1u;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The float to hand to round_value so that the format sees x rounded once.
float single_rounding_input(double x, const FormatSpec& s) {
  const bool two_spare_bits = s.precision() + 2 <= 24 && s.emin() - s.mantissa_bits - 2 >= -149;
  // Without two spare bits the format is fp32 itself, and the plain cast
  // is the one correct rounding.
  return two_spare_bits ? round_to_odd_float(x) : static_cast<float>(x);
}

// The number of significant bits in a subnormal's fraction field.
int significant_bits(std::uint32_t frac) {
  int n = 0;
  while (frac) {
    ++n;
    frac >>= 1;
  }
  return n;
}

// Knuth's TwoSum: true when a + b is exactly representable in double.
bool sum_is_exact(double a, double b) {
  const double s = a + b;
  if (!std::isfinite(s)) return false;
  const double bp = s - a;
  const double ap = s - bp;
  return (a - ap) + (b - bp) == 0.0;
}

RangeClass outcome_of(const Explanation& e, bool overflowed) {
  if (!std::isfinite(e.input)) return RangeClass::nonfinite;
  if (e.input == 0) return RangeClass::zero;
  if (overflowed) return RangeClass::overflow;
  if (e.stored == 0) return RangeClass::flushed_to_zero;
  if (e.kind == ValueKind::subnormal) return RangeClass::subnormal_result;
  return static_cast<double>(e.stored) == e.input ? RangeClass::exact : RangeClass::rounded;
}

std::string note_for(const Explanation& e, const Format& f) {
  const Limits l = limits_of(f.spec);
  const std::string name(f.name);
  const std::string max = shortest_decimal(static_cast<float>(l.max));  // every max is an fp32 value
  switch (e.outcome) {
    case RangeClass::nonfinite:
      if (std::isnan(e.input)) return "NaN stays NaN (stored as the canonical quiet NaN)";
      if (std::isinf(e.stored)) return "inf is stored as inf";
      if (std::isnan(e.stored)) return name + " has no inf: inf becomes NaN";
      return "inf saturates to " + std::string(e.stored < 0 ? "-" : "") + max + " (" + name +
             "'s overflow convention)";
    case RangeClass::zero: return "zero is stored exactly (the sign is kept)";
    case RangeClass::overflow:
      if (std::isinf(e.stored)) return "overflow: |x| rounds beyond max " + max + ", so it becomes inf";
      if (std::isnan(e.stored)) return "overflow: " + name + " has no inf, so it becomes NaN";
      return "overflow: |x| rounds beyond max " + max + "; saturated to ±max (" + name +
             "'s overflow convention; an IEEE cast would give inf or NaN)";
    case RangeClass::flushed_to_zero:
      return "underflow: |x| is at most half the smallest subnormal (" +
             power_of_two_or_decimal(l.min_subnormal / 2) + "), so it rounds to zero";
    case RangeClass::subnormal_result: {
      const std::uint32_t frac = e.code & ((1u << f.spec.mantissa_bits) - 1u);
      return std::string("subnormal: |x| is below min normal ") + power_of_two_or_decimal(l.min_normal) +
             ", so only " + std::to_string(significant_bits(frac)) + " of " + std::to_string(l.precision) +
             " significant bits remain" +
             (static_cast<double>(e.stored) == e.input ? " (exact)" : " (rounded)");
    }
    case RangeClass::exact: return "exact: the value is representable";
    case RangeClass::rounded: break;
  }
  return "rounded to the nearest representable value (ties to even)";
}

}  // namespace

std::string_view value_kind_name(ValueKind k) {
  switch (k) {
    case ValueKind::zero: return "zero";
    case ValueKind::subnormal: return "subnormal";
    case ValueKind::normal: return "normal";
    case ValueKind::infinity: return "inf";
    case ValueKind::nan: return "nan";
  }
  return "?";
}

std::string exact_decimal(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  const std::string sign = std::signbit(x) ? "-" : "";
  if (x == 0) return sign + "0";
  // |x| = mant * 2^exp with an odd integer mant.
  int exp = 0;
  const double frac = std::frexp(std::fabs(x), &exp);
  auto mant = static_cast<std::uint64_t>(std::ldexp(frac, 53));
  exp -= 53;
  while ((mant & 1u) == 0) {
    mant >>= 1;
    ++exp;
  }
  BigDecimal n;
  for (std::uint64_t m = mant; m; m /= kLimbBase) n.push_back(static_cast<std::uint32_t>(m % kLimbBase));
  if (exp >= 0) {
    for (int i = 0; i < exp; ++i) multiply_small(n, 2);
    return sign + to_digits(n);
  }
  // mant * 2^-k = mant * 5^k / 10^k: the digits of mant * 5^k with the
  // decimal point k places from the right.
  const int k = -exp;
  for (int i = 0; i < k; ++i) multiply_small(n, 5);
  std::string digits = to_digits(n);
  if (static_cast<int>(digits.size()) <= k)
    digits.insert(0, static_cast<std::size_t>(k) + 1 - digits.size(), '0');
  digits.insert(digits.size() - static_cast<std::size_t>(k), ".");
  return sign + digits;  // mant is odd, so the last digit is 5: nothing to trim
}

std::string shortest_decimal(float x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

std::string shortest_decimal(double x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

std::string power_of_two_or_decimal(double x) {
  if (std::isfinite(x) && x != 0) {
    int e = 0;
    const double frac = std::frexp(std::fabs(x), &e);
    if (frac == 0.5) return std::string(x < 0 ? "-" : "") + "2^" + std::to_string(e - 1);
  }
  // Prefer the shorter fp32 spelling when x is an fp32 value (all limits are).
  const float xf = static_cast<float>(x);
  return static_cast<double>(xf) == x ? shortest_decimal(xf) : shortest_decimal(x);
}

Explanation explain(double x, const Format& f) {
  const FormatSpec& s = f.spec;
  Explanation e;
  e.format = &f;
  e.input = x;
  e.input_exact = exact_decimal(x);

  const float xf = single_rounding_input(x, s);
  e.stored = round_value(xf, f);  // RNE, f's default overflow convention, subnormals kept
  RoundingOptions ieee_overflow;
  ieee_overflow.overflow = OverflowMode::infinity;
  const bool overflowed = std::isfinite(x) && !std::isfinite(round_value(xf, f, ieee_overflow));

  // The fields.
  const int m = s.mantissa_bits;
  const int ebits = s.exponent_bits;
  e.code = encode_exact(e.stored, s);
  e.code_bits = 1 + ebits + m;
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%0*x", (e.code_bits + 3) / 4, static_cast<unsigned>(e.code));
  e.code_hex = hex;
  const std::uint32_t frac = e.code & ((1u << m) - 1u);
  const std::uint32_t expf = (e.code >> m) & ((1u << ebits) - 1u);
  e.sign_field = bits_string(e.code >> (ebits + m), 1);
  e.exponent_field = bits_string(expf, ebits);
  e.mantissa_field = bits_string(frac, m);
  e.biased_exponent = static_cast<int>(expf);

  const double v = e.stored;
  if (std::isnan(v)) {
    e.kind = ValueKind::nan;
  } else if (std::isinf(v)) {
    e.kind = ValueKind::infinity;
  } else if (v == 0) {
    e.kind = ValueKind::zero;
  } else if (std::fabs(v) < std::ldexp(1.0, s.emin())) {
    e.kind = ValueKind::subnormal;
  } else {
    e.kind = ValueKind::normal;
  }
  switch (e.kind) {
    case ValueKind::normal:
      e.exponent = e.biased_exponent - s.bias;
      e.significand_binary = "1." + e.mantissa_field;
      break;
    case ValueKind::subnormal:
    case ValueKind::zero:
      e.exponent = s.emin();
      e.significand_binary = "0." + e.mantissa_field;
      break;
    default: e.exponent = 0; break;
  }

  // Values.
  e.stored_exact = exact_decimal(v);
  e.stored_shortest = shortest_decimal(e.stored);
  e.abs_error = v - x;
  e.abs_error_is_exact = std::isfinite(v) && std::isfinite(x) && sum_is_exact(v, -x);
  if (std::isnan(x) && std::isnan(v)) e.abs_error = 0;  // nothing was lost
  if (std::isinf(x) && v == x) e.abs_error = 0;
  e.abs_error_exact = e.abs_error_is_exact ? exact_decimal(e.abs_error) : shortest_decimal(e.abs_error);
  e.rel_error =
      x == 0 || !std::isfinite(x) ? (e.abs_error == 0 ? 0 : e.abs_error) : e.abs_error / std::fabs(x);
  if (std::isfinite(v)) {
    int ex = s.emin();
    if (v != 0) {
      std::frexp(std::fabs(v), &ex);
      ex = ex - 1 < s.emin() ? s.emin() : ex - 1;
    }
    e.ulp = std::ldexp(1.0, ex - m);
    e.error_ulps = e.abs_error / e.ulp;
  } else {
    e.ulp = std::numeric_limits<double>::quiet_NaN();
    e.error_ulps = std::isnan(v) || e.abs_error == 0 ? 0 : e.abs_error;
  }

  // Neighbours: sign-magnitude codes, so stepping the magnitude by one code
  // moves to the adjacent value; a NaN code means there is no next value.
  if (!std::isnan(v)) {
    const std::uint32_t sign_bit = 1u << (ebits + m);
    const std::uint32_t mag = e.code & (sign_bit - 1u);
    const bool negative = e.code & sign_bit;
    auto larger = [&](std::uint32_t sign) -> std::optional<float> {
      if (mag + 1 >= sign_bit) return std::nullopt;
      const float n = decode(sign | (mag + 1), s);
      if (std::isnan(n)) return std::nullopt;
      return n;
    };
    auto smaller = [&](std::uint32_t sign) -> std::optional<float> {
      return decode(sign | (mag - 1), s);  // mag > 0 here; from ±min_subnormal this is ±0
    };
    if (negative && mag != 0) {
      e.next_below = larger(sign_bit);
      e.next_above = smaller(sign_bit);
    } else if (mag == 0) {
      // Around ±0 the neighbours are the smallest subnormals of either sign.
      e.next_below = decode(sign_bit | 1u, s);
      e.next_above = decode(1u, s);
    } else {
      e.next_below = smaller(0);
      e.next_above = larger(0);
    }
  }

  e.outcome = outcome_of(e, overflowed);
  e.note = note_for(e, f);
  return e;
}

Explanation explain(float x, const Format& f) { return explain(static_cast<double>(x), f); }

std::string render_text(const Explanation& e) {
  const Format& f = *e.format;
  std::ostringstream o;
  auto row = [&](const char* label, const std::string& value) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "  %-13s ", label);
    o << buf << value << '\n';
  };
  auto value_or_none = [](const std::optional<float>& v) {
    return v ? shortest_decimal(*v) : std::string("none");
  };

  o << shortest_decimal(e.input) << " stored as " << f.name << " (" << f.description << ")\n";
  row("input", e.input_exact == shortest_decimal(e.input)
                   ? e.input_exact
                   : shortest_decimal(e.input) + " = " + e.input_exact + " exactly");
  row("stored", e.stored_exact +
                    (e.stored_exact == e.stored_shortest ? "" : "  (shortest: " + e.stored_shortest + ")"));
  row("what happened", e.note);
  row("bits", e.sign_field + " " + e.exponent_field + " " + e.mantissa_field + "  (sign, " +
                  std::to_string(f.spec.exponent_bits) + " exponent bits, " +
                  std::to_string(f.spec.mantissa_bits) + " mantissa bits)");
  row("code", e.code_hex);
  row("kind", std::string(value_kind_name(e.kind)));
  switch (e.kind) {
    case ValueKind::normal:
      row("exponent", "field " + std::to_string(e.biased_exponent) + " - bias " +
                          std::to_string(f.spec.bias) + " = " + std::to_string(e.exponent));
      break;
    case ValueKind::subnormal:
    case ValueKind::zero:
      row("exponent", "field 0 means emin = " + std::to_string(e.exponent) + " with no implicit leading 1");
      break;
    default: row("exponent", "field all ones: " + std::string(value_kind_name(e.kind))); break;
  }
  if (!e.significand_binary.empty())
    row("value", std::string(e.sign_field == "1" ? "-" : "+") + e.significand_binary + " (binary) x 2^" +
                     std::to_string(e.exponent));
  char rel[64];
  std::snprintf(rel, sizeof rel, "%.3g", e.rel_error);
  char ulps[64];
  std::snprintf(ulps, sizeof ulps, "%.3g", e.error_ulps);
  row("error", e.abs_error_exact + (e.abs_error_is_exact ? " (exact)" : "") + "  stored - input");
  row("rel. error", std::string(rel) + "  (unit roundoff u = " +
                        power_of_two_or_decimal(limits_of(f.spec).unit_roundoff) + ")");
  if (!std::isnan(e.ulp)) {
    row("ulp", power_of_two_or_decimal(e.ulp) + " = " + shortest_decimal(static_cast<float>(e.ulp)));
    row("error/ulp", ulps);
  }
  row("next below", value_or_none(e.next_below));
  row("next above", value_or_none(e.next_above));
  return o.str();
}

}  // namespace mpt
