// Chapter 01 — rounding float → format (test inputs): the boundary values
// the CPU rounding suites round, shared by test_ch01_rounding.cpp (the
// portable path against an independent oracle) and
// test_ch01_rounding_avx2.cpp (the AVX2 path against the portable one).
// Header-only (the CMake glob picks up test_ch*_*.cpp only). Depends on:
// mpt/formats/format.hpp (the formats, their limits), round_element.hpp
// (decode), rounding.hpp.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "mpt/formats/format.hpp"
#include "mpt/formats/round_element.hpp"
#include "mpt/formats/rounding.hpp"

namespace mpt_test {

/// For every format, the values around its smallest normal 2^emin, where
/// flush-to-zero starts: 2^(emin-1), 1.5 * 2^(emin-1), the largest
/// subnormal, the midpoint between it and 2^emin (a tie that rounds to
/// 2^emin, which is even), the float just below 2^emin (rounds up to it
/// under RNE, down to the largest subnormal under RTZ) and 2^emin itself;
/// both signs.
inline std::vector<float> flush_threshold_values() {
  std::vector<float> v;
  for (const mpt::Format& f : mpt::all_formats()) {
    const int emin = mpt::limits_of(f.spec).emin, m = f.spec.mantissa_bits;
    const float min_normal = std::ldexp(1.0f, emin);
    for (float x : {std::ldexp(1.0f, emin - 1), 1.5f * std::ldexp(1.0f, emin - 1),
                    min_normal - std::ldexp(1.0f, emin - m), min_normal - std::ldexp(1.0f, emin - m - 1),
                    std::nextafter(min_normal, 0.0f), min_normal}) {
      v.push_back(x);
      v.push_back(-x);
    }
  }
  return v;
}

inline std::vector<float> boundary_values() {
  std::vector<float> v{0.0f,
                       -0.0f,
                       INFINITY,
                       -INFINITY,
                       NAN,
                       -NAN,
                       FLT_MAX,
                       -FLT_MAX,
                       FLT_MIN,
                       FLT_TRUE_MIN,
                       65504.0f,
                       65519.996f,
                       65520.0f,
                       65536.0f,
                       std::ldexp(1.0f, -24),
                       std::ldexp(1.0f, -25),
                       3 * std::ldexp(1.0f, -26),
                       std::ldexp(1.0f, -14),
                       448.0f,
                       464.0f,
                       480.0f,
                       57344.0f,
                       61440.0f,
                       1.0f,
                       1.0f + std::ldexp(1.0f, -11),
                       1.0f + 3 * std::ldexp(1.0f, -11),
                       0.1f,
                       1e-8f,
                       1e-40f};
  const std::vector<float> t = flush_threshold_values();
  v.insert(v.end(), t.begin(), t.end());
  // every fp16 code, its neighbours in fp32, and the midpoints to the next code
  for (std::uint32_t c = 0; c < 0x7c00; ++c) {
    const float a = mpt::decode(c, mpt::formats::fp16), b = mpt::decode(c + 1, mpt::formats::fp16);
    const float mid = static_cast<float>((static_cast<double>(a) + b) / 2);
    for (float base : {a, mid})
      for (float x : {std::nextafter(base, -INFINITY), base, std::nextafter(base, INFINITY)}) {
        v.push_back(x);
        v.push_back(-x);
      }
  }
  return v;
}

}  // namespace mpt_test
