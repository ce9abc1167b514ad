// Chapter 01 exercises — REFERENCE SOLUTION (MPT-REFERENCE-SOLUTION): never shipped to students.
// Depends on: ex01.hpp and mpt/format.hpp only; written from the bit layouts,
// not from mpt's rounding code, so that grading it against mpt is a real check.
// tools/make_handout.sh refuses to produce a handout that contains these lines.
#include "ex01.hpp"

#include <cmath>
#include <cstring>

namespace mpt::ex01 {

namespace {

// The only portable way in C++17 to look at a float's bits (std::bit_cast is C++20).
std::uint32_t bits_of_float(float value) {
  std::uint32_t pattern;
  std::memcpy(&pattern, &value, sizeof pattern);
  return pattern;
}

float float_from_bits(std::uint32_t pattern) {
  float value;
  std::memcpy(&value, &pattern, sizeof value);
  return value;
}

}  // namespace

std::uint16_t fp32_to_fp16_bits(float x) {
  const std::uint32_t in = bits_of_float(x);
  const std::uint32_t sign16 = (in >> 16) & 0x8000u;
  const std::uint32_t exponent_field = (in >> 23) & 0xffu;
  const std::uint32_t fraction = in & 0x7fffffu;

  if (exponent_field == 0xffu) {
    // inf keeps its meaning; every NaN, signalling or not, leaves as the quiet one.
    return static_cast<std::uint16_t>(sign16 | (fraction != 0 ? 0x7e00u : 0x7c00u));
  }
  // fp32 zeros and subnormals lie below 2^-126, far under 2^-25 (half of
  // fp16's smallest subnormal, the point where rounding starts to give
  // something other than zero).
  if (exponent_field == 0) return static_cast<std::uint16_t>(sign16);

  const int e = static_cast<int>(exponent_field) - 127;              // |x| = 1.fraction * 2^e
  if (e >= 16) return static_cast<std::uint16_t>(sign16 | 0x7c00u);  // 2^16 > 65520: inf
  if (e <= -26) return static_cast<std::uint16_t>(sign16);           // < 2^-25: zero

  // |x| = significand * 2^(e - 23) with a 24-bit integer significand.
  const std::uint32_t significand = fraction | 0x800000u;
  // fp16 keeps whole multiples of its quantum 2^(max(e, -14) - 10). Below
  // 2^-14 the quantum stops shrinking, so more bits fall off the end.
  const int dropped_bits = 13 + (e < -14 ? -14 - e : 0);  // 13 ... 24
  std::uint32_t kept = significand >> dropped_bits;
  const std::uint32_t dropped = significand & ((1u << dropped_bits) - 1u);
  const std::uint32_t halfway = 1u << (dropped_bits - 1);
  if (dropped > halfway || (dropped == halfway && (kept & 1u) != 0)) ++kept;

  if (e < -14) {
    // A subnormal result: kept is the fraction field as is. If rounding
    // carried it to 0x400, that is exactly the code of 2^-14, the smallest
    // normal number, so no special case is needed.
    return static_cast<std::uint16_t>(sign16 | kept);
  }
  // A normal result: kept = 1.fraction as an 11-bit integer (the implicit
  // one at bit 10). Adding it to (biased exponent - 1) << 10 puts the
  // implicit one into the exponent field, and a carry out of the fraction
  // (kept == 0x800) moves on to the next exponent by itself; from the top
  // binade that next exponent is the all-ones field of infinity.
  const std::uint32_t code = (static_cast<std::uint32_t>(e + 15 - 1) << 10) + kept;
  return static_cast<std::uint16_t>(sign16 | (code >= 0x7c00u ? 0x7c00u : code));
}

float smallest_effective_update(float w) {
  const std::uint32_t code = fp32_to_fp16_bits(w);  // exact: w is an fp16 value
  const std::uint32_t magnitude = code & 0x7fffu;
  // Adding u > 0 moves w up: away from zero when w >= 0 (and from -0, which
  // equals +0), toward zero when w < 0.
  const bool toward_zero = (code & 0x8000u) != 0 && magnitude != 0;
  // The two neighbours are magnitudes c and c + 1 with c the smaller one;
  // their distance is the spacing at code c: 2^(max(E, 1) - 15 - 10) for
  // exponent field E. For the largest value the "neighbour" is 2^16, where
  // IEEE rounding puts infinity, and the same formula gives its distance.
  const std::uint32_t lower = toward_zero ? magnitude - 1 : magnitude;
  const int exponent_field = static_cast<int>(lower >> 10) > 0 ? static_cast<int>(lower >> 10) : 1;
  const int half_gap_log2 = exponent_field - 25 - 1;  // -25 ... 4
  const float half_gap = float_from_bits(static_cast<std::uint32_t>(half_gap_log2 + 127) << 23);
  // w + half_gap is the midpoint, an exact tie. It goes to the neighbour
  // with an even last bit: the other one when w is odd, w itself when w is
  // even (zero counts as even). In that case the next float above the half
  // gap is the first value that gets past the tie.
  if ((code & 1u) != 0) return half_gap;
  return float_from_bits(bits_of_float(half_gap) + 1u);
}

double flushed_fraction(const float* x, std::size_t n, const mpt::Format& f) {
  if (n == 0) return 0.0;
  // Round-to-nearest gives zero exactly for magnitudes up to half the
  // smallest subnormal 2^(emin - m): below it zero is nearer, and at it the
  // tie between 0 (an even code) and the smallest subnormal (code 1) goes to
  // zero. Computed in double: for fp32 itself the threshold 2^-150 is not
  // a float.
  const double threshold = std::ldexp(1.0, f.spec.emin() - f.spec.mantissa_bits - 1);
  std::size_t flushed = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double magnitude = std::fabs(static_cast<double>(x[i]));
    // NaN fails both comparisons; inf fails the second.
    if (magnitude > 0.0 && magnitude <= threshold) ++flushed;
  }
  return static_cast<double>(flushed) / static_cast<double>(n);
}

// The fix of 1.4: the given body rounded every square and every partial sum
// to fp16. The inputs are fp16, but the arithmetic must not be: a square of
// an activation above 255.98 is beyond fp16's 65504 (inf), one below 2^-12.5
// lands in fp16's subnormals or flushes to 0, and an fp16 running sum stops
// growing once half its spacing exceeds the squares still to come (at 2048
// the spacing is 2). In FP32 all of them fit.
float mean_square(const float* x, std::size_t n) {
  float sum = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float square = x[i] * x[i];  // FP32 product: exact for fp16 inputs (22 significant bits)
    sum += square;                     // FP32 accumulator, in index order
  }
  return n > 0 ? sum / static_cast<float>(n) : 0.0f;
}

}  // namespace mpt::ex01
