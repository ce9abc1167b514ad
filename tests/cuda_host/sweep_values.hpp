// Chapter 01 — floating-point formats and their limits (test inputs).
// Depends on: mpt/round_element.hpp (decode) and the standard library only.
// The inputs that break a rounding if anything does: hand-picked boundaries,
// every code of a format with the midpoints between neighbours, and random
// floats. Shared by tests/cuda_host (CUDA's host conversions) and tests/cuda
// (the GPU kernels).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "mpt/formats/round_element.hpp"

namespace mpt::test {

inline float float_from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
inline std::uint32_t bits_from_float(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

/// Hand-picked values where fp16, bf16, E4M3 and E5M2 roundings go wrong
/// when they go wrong, each with both signs.
inline std::vector<float> adversarial_values() {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> positive = {
      0.0f, inf, std::numeric_limits<float>::quiet_NaN(),
      float_from_bits(0x7f800001u),  // signalling NaN with a payload
      float_from_bits(0x7fc12345u),  // quiet NaN with a payload
      // fp16: max, the last float below the overflow threshold, the
      // threshold itself (a tie that rounds to even = inf), 2^16
      65504.0f, std::nextafter(65520.0f, 0.0f), 65520.0f, 65536.0f, 65519.0f, 65505.0f,
      // fp16 subnormals: min subnormal, half of it (tie to 0), 3/2 of it (tie
      // to 2^-23), just either side, the largest subnormal, min normal
      0x1p-24f, 0x1p-25f, 0x1.8p-24f, 0x1.8p-25f, 0x1.000002p-25f, 0x1.fffffep-26f, 0x1.ff8p-15f,
      0x1.ffcp-15f, 0x1p-14f, 0x1.004p-14f,
      // fp16 and bf16 ties around 1 (round to even: down, then up)
      1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f,
      // bf16: max, the overflow tie, just below it, min subnormal and its half
      float_from_bits(0x7f7f0000u), float_from_bits(0x7f7f8000u), float_from_bits(0x7f7f7fffu), 0x1p-133f,
      0x1p-134f, 0x1.8p-134f, 0x1p-126f,
      // E4M3: max, the saturating tie 464, above it, 480 (would be the NaN
      // code), subnormal 2^-9 and its ties
      448.0f, 464.0f, std::nextafter(464.0f, inf), std::nextafter(464.0f, 0.0f), 480.0f, 512.0f, 0x1p-9f,
      0x1p-10f, 0x1.8p-10f, 0x1p-6f,
      // E5M2: max, the overflow tie 61440, above and below, 2^16
      57344.0f, 61440.0f, std::nextafter(61440.0f, inf), std::nextafter(61440.0f, 0.0f), 0x1p-16f, 0x1p-17f,
      0x1.8p-17f,
      // fp32 extremes: max, min normal, the float subnormals
      std::numeric_limits<float>::max(), std::numeric_limits<float>::min(), float_from_bits(1u),
      float_from_bits(2u), float_from_bits(3u), float_from_bits(0x007fffffu), float_from_bits(0x00400000u),
      1.0f, 3.0f, 0.1f};
  std::vector<float> out;
  for (float x : positive) {
    out.push_back(x);
    out.push_back(-x);
  }
  return out;
}

/// For format f, both signs of: every finite code's value, the midpoint
/// between every pair of neighbouring finite codes (the RNE ties), the
/// overflow threshold max + gap/2, and the floats one ulp either side of
/// each midpoint. For fp16 and bf16 that is all 2^16 codes.
inline std::vector<float> code_boundaries(const FormatSpec& f) {
  const std::uint32_t positive_codes = 1u << (f.exponent_bits + f.mantissa_bits);
  std::vector<double> values;
  for (std::uint32_t c = 0; c < positive_codes; ++c) {
    const float v = decode(c, f);
    if (std::isfinite(v)) values.push_back(v);  // codes ascend with their values
  }
  std::vector<float> out;
  auto add_both_signs = [&out](float x) {
    out.push_back(x);
    out.push_back(-x);
  };
  auto add_midpoint = [&](double mid) {
    const float m = static_cast<float>(mid);
    if (static_cast<double>(m) != mid || !std::isfinite(m)) return;  // not a float
    add_both_signs(m);
    add_both_signs(std::nextafter(m, 0.0f));
    add_both_signs(std::nextafter(m, std::numeric_limits<float>::infinity()));
  };
  for (std::size_t i = 0; i < values.size(); ++i) {
    add_both_signs(static_cast<float>(values[i]));
    if (i + 1 < values.size()) add_midpoint((values[i] + values[i + 1]) / 2);
  }
  const std::size_t k = values.size();
  add_midpoint(values[k - 1] + (values[k - 1] - values[k - 2]) / 2);  // overflow threshold
  return out;
}

/// n floats with uniformly random bit patterns (NaNs, infs, subnormals and
/// huge values included, in their natural proportions).
inline void append_random_bits(std::vector<float>& out, std::size_t n, std::mt19937_64& rng) {
  for (std::size_t i = 0; i < n; ++i) out.push_back(float_from_bits(static_cast<std::uint32_t>(rng())));
}

/// n floats with a random sign, random 23 fraction bits and an exponent
/// drawn uniformly from f's interesting span: from below half its smallest
/// subnormal to above its max, so that every class (flush, subnormal,
/// normal, overflow) is well represented.
inline void append_random_in_range(std::vector<float>& out, const FormatSpec& f, std::size_t n,
                                   std::mt19937_64& rng) {
  const int lo = std::max(f.emin() - f.mantissa_bits - 3, -126);
  const int hi = std::min(f.emax() + 2, 127);
  std::uniform_int_distribution<int> exponent(lo, hi);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t r = static_cast<std::uint32_t>(rng());
    const std::uint32_t biased = static_cast<std::uint32_t>(exponent(rng) + 127);
    out.push_back(float_from_bits((r & 0x807fffffu) | (biased << 23)));
  }
}

/// Adversarial values at both ends (the far end goes through a vector
/// kernel's scalar tail), random bit patterns and random values spread over
/// each narrow format's range in between; n values in all.
inline std::vector<float> mixed_inputs(std::size_t n, std::uint64_t seed) {
  const std::vector<float> adversarial = adversarial_values();
  std::mt19937_64 rng(seed);
  std::vector<float> v = adversarial;
  const std::size_t random = n - 2 * adversarial.size();
  append_random_bits(v, random / 5, rng);
  for (const FormatSpec& f : {formats::fp16, formats::bf16, formats::e4m3, formats::e5m2})
    append_random_in_range(v, f, random / 5, rng);
  append_random_bits(v, n - adversarial.size() - v.size(), rng);
  v.insert(v.end(), adversarial.begin(), adversarial.end());
  return v;
}

}  // namespace mpt::test
