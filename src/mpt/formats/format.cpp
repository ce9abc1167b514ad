// Chapter 01 — floating-point formats and their limits.
// Depends on: format.hpp. Every limit is computed from the descriptor.
#include "mpt/formats/format.hpp"

#include <cmath>
#include <stdexcept>

namespace mpt {

Limits limits_of(const FormatSpec& s) {
  Limits l{};
  l.precision = s.precision();
  l.emin = s.emin();
  l.emax = s.emax();
  // max = (max significand) * 2^(emax - m): (2 - 2^-m)·2^emax for IEEE
  // formats, (2 - 2^(1-m))·2^emax for E4M3 whose all-ones code is NaN.
  l.max = std::ldexp(static_cast<double>(s.max_significand()), s.emax() - s.mantissa_bits);
  l.min_normal = std::ldexp(1.0, s.emin());
  l.min_subnormal = std::ldexp(1.0, s.emin() - s.mantissa_bits);
  l.epsilon = std::ldexp(1.0, -s.mantissa_bits);
  l.unit_roundoff = std::ldexp(1.0, -s.precision());
  // Finite codes per sign: every exponent field below all-ones times every
  // fraction, plus (E4M3) the all-ones exponent without its NaN code.
  const std::uint64_t per_sign = s.has_inf() ? ((std::uint64_t{1} << s.exponent_bits) - 1) << s.mantissa_bits
                                             : (std::uint64_t{1} << (s.exponent_bits + s.mantissa_bits)) - 1;
  l.finite_codes = 2 * per_sign;
  l.finite_values = l.finite_codes - 1;
  l.has_inf = s.has_inf();
  l.storage_bytes = s.storage_bits / 8;
  return l;
}

const std::vector<Format>& all_formats() {
  static const std::vector<Format> table{
      {"fp32", "IEEE binary32, the master-weight and accumulation format", formats::fp32,
       OverflowMode::infinity},
      {"tf32", "TensorFloat-32: fp32 range, fp16 precision (tensor-core GEMM input)", formats::tf32,
       OverflowMode::infinity},
      {"bf16", "bfloat16: fp32 range, 8-bit precision", formats::bf16, OverflowMode::infinity},
      {"fp16", "IEEE binary16", formats::fp16, OverflowMode::infinity},
      {"e4m3", "OCP FP8 E4M3: no inf, NaN only at S.1111.111", formats::e4m3, OverflowMode::saturate},
      {"e5m2", "OCP FP8 E5M2: IEEE-like, with inf", formats::e5m2, OverflowMode::saturate},
  };
  return table;
}

const Format* find_format(std::string_view name) {
  for (const Format& f : all_formats())
    if (f.name == name) return &f;
  return nullptr;
}

std::string format_names() {
  std::string s;
  for (const Format& f : all_formats()) {
    if (!s.empty()) s += ", ";
    s += f.name;
  }
  return s;
}

const Format& format_named(std::string_view name) {
  if (const Format* f = find_format(name)) return *f;
  throw std::invalid_argument("unknown format '" + std::string(name) + "'; valid formats: " + format_names());
}

}  // namespace mpt
