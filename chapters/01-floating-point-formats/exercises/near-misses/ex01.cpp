// Chapter 01 exercises — plausible wrong answers, one classic mistake per
// exercise. Depends on: ex01.hpp, mpt/formats/rounding.hpp (the half fix of
// 1.4 still rounds to fp16). CI requires some points but not full
// marks on every exercise: proof that the tests separate close from right.
#include "ex01.hpp"

#include <cmath>
#include <cstring>

#include "mpt/formats/rounding.hpp"

namespace mpt::ex01 {

// Mistake: ties round away from zero (the "add half and truncate" habit)
// instead of to even. Everything else is right.
std::uint16_t fp32_to_fp16_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t expf = (u >> 23) & 0xffu;
  const std::uint32_t frac = u & 0x7fffffu;
  if (expf == 0xffu) return static_cast<std::uint16_t>(sign | (frac ? 0x7e00u : 0x7c00u));
  const int e = static_cast<int>(expf) - 127;
  if (expf == 0 || e <= -26) return static_cast<std::uint16_t>(sign);
  if (e >= 16) return static_cast<std::uint16_t>(sign | 0x7c00u);
  const std::uint32_t sig = frac | 0x800000u;
  const int drop = 13 + (e < -14 ? -14 - e : 0);
  const std::uint32_t kept = (sig + (1u << (drop - 1))) >> drop;
  if (e < -14) return static_cast<std::uint16_t>(sign | kept);
  const std::uint32_t code = (static_cast<std::uint32_t>(e + 14) << 10) + kept;
  return static_cast<std::uint16_t>(sign | (code >= 0x7c00u ? 0x7c00u : code));
}

// Mistake: uses the spacing above |w| for negative weights too. Right for
// w >= 0, wrong where a negative w is a power of two (the spacing toward
// zero is half as large there).
float smallest_effective_update(float w) {
  const float a = std::fabs(w);
  int e = a > 0.0f ? std::ilogb(a) : -14;
  if (e < -14) e = -14;
  const float half_gap = std::ldexp(1.0f, e - 11);
  const std::uint16_t code = fp32_to_fp16_bits(w);
  if ((code & 1u) != 0) return half_gap;
  return std::nextafter(half_gap, 2 * half_gap);
}

// Mistake: a strict comparison, forgetting that the tie at exactly half the
// smallest subnormal also goes to zero.
double flushed_fraction(const float* x, std::size_t n, const mpt::Format& f) {
  if (n == 0) return 0.0;
  const double threshold = std::ldexp(1.0, f.spec.emin() - f.spec.mantissa_bits - 1);
  std::size_t count = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double m = std::fabs(static_cast<double>(x[i]));
    if (m > 0.0 && m < threshold) ++count;
  }
  return n ? static_cast<double>(count) / static_cast<double>(n) : 0.0;
}

// Mistake: half a fix. The accumulator is FP32 now, so the sum no longer
// stalls, but each square is still rounded to fp16: large activations still
// overflow, tiny ones still flush, and the other squares lose their low bits.
float mean_square(const float* x, std::size_t n) {
  const mpt::Format& fp16 = mpt::format_named("fp16");
  float sum = 0.0f;
  for (std::size_t i = 0; i < n; ++i) sum += mpt::round_value(x[i] * x[i], fp16);
  return n > 0 ? sum / static_cast<float>(n) : 0.0f;
}

}  // namespace mpt::ex01
