// Chapter 01 — floating-point formats and their limits.
// Depends on: format_spec.hpp, round_element.hpp. Host-and-device: the CPU
// range report (range_report.hpp) and the CUDA reduction (kernels/
// range_report.cu) classify every element with these exact functions, so the
// two reports agree count for count.
#pragma once

#include <cstdint>

#include "mpt/formats/format_spec.hpp"
#include "mpt/formats/round_element.hpp"

namespace mpt {

/// What happens to one fp32 value when it is stored in a format with
/// round-to-nearest-even, gradual underflow and IEEE overflow. Every input
/// falls in exactly one class; classify() tests them in this order:
///
///  1. nonfinite        the input is ±inf or NaN (nothing to round)
///  2. zero             the input is ±0
///  3. overflow         the RNE result exceeds the format's max: ±inf for an
///                      IEEE format, NaN for E4M3. A saturating cast would
///                      silently give ±max for these, so they are counted
///                      here whatever overflow mode the caller later uses.
///  4. flushed_to_zero  nonzero input whose RNE result is ±0 (|x| at or below
///                      half the smallest subnormal)
///  5. subnormal_result the RNE result is a nonzero subnormal of the format,
///                      exact or not (it has fewer than p significant bits)
///  6. exact            the RNE result equals the input
///  7. rounded          everything else: a normal result that differs from x
///
/// The enumerators are numbered so that they index RangeCounts::by_class.
enum class RangeClass : std::uint8_t {
  zero = 0,
  exact = 1,
  rounded = 2,
  subnormal_result = 3,
  flushed_to_zero = 4,
  overflow = 5,
  nonfinite = 6,
};
/// Number of RangeClass values (the size of RangeCounts::by_class).
inline constexpr int kRangeClassCount = 7;

/// Short lower-case name of a class, for tables and test messages.
MPT_HD constexpr const char* range_class_name(RangeClass c) {
  switch (c) {
    case RangeClass::zero: return "zero";
    case RangeClass::exact: return "exact";
    case RangeClass::rounded: return "rounded";
    case RangeClass::subnormal_result: return "subnormal_result";
    case RangeClass::flushed_to_zero: return "flushed_to_zero";
    case RangeClass::overflow: return "overflow";
    case RangeClass::nonfinite: return "nonfinite";
  }
  return "?";
}

/// Classify one value for format f (see RangeClass for the exact rules).
/// The rounding is always RNE with OverflowMode::infinity and
/// SubnormalMode::keep: the class describes where x sits relative to the
/// format's range, not what a particular cast then does with it.
MPT_HD inline RangeClass classify(float x, const FormatSpec& f) {
  const std::uint32_t a = detail::bits_of(x) & 0x7fffffffu;
  if (a >= 0x7f800000u) return RangeClass::nonfinite;
  if (a == 0) return RangeClass::zero;
  const float y =
      round_to_format(x, f, RoundingMode::nearest_even, OverflowMode::infinity, SubnormalMode::keep);
  const std::uint32_t b = detail::bits_of(y) & 0x7fffffffu;
  if (b >= 0x7f800000u) return RangeClass::overflow;  // inf, or NaN for a format without inf
  if (b == 0) return RangeClass::flushed_to_zero;
  if (detail::float_of(b) < detail::pow2f(f.emin())) return RangeClass::subnormal_result;
  return y == x ? RangeClass::exact : RangeClass::rounded;
}

/// The log2-magnitude histogram's binning: bin k holds the finite nonzero
/// inputs with floor(log2 |x|) == k. Every finite nonzero float has
/// -149 <= k <= 127 (2^-149 is the smallest fp32 subnormal, FLT_MAX < 2^128),
/// so nothing is clamped. Zeros, infinities and NaNs are in no bin; they are
/// counted by class instead.
inline constexpr int kLog2BinMin = -149;
/// The highest log2 bin: FLT_MAX < 2^128.
inline constexpr int kLog2BinMax = 127;
/// Number of log2 bins, 277 (the size of RangeCounts::log2_hist).
inline constexpr int kLog2BinCount = kLog2BinMax - kLog2BinMin + 1;  // 277
/// What log2_bin returns for a value that has no bin (±0, ±inf, NaN).
inline constexpr int kLog2BinNone = kLog2BinMin - 1;

/// floor(log2 |x|) for finite nonzero x, read exactly from the bits (no
/// libm, so host and device agree); kLog2BinNone otherwise.
MPT_HD inline int log2_bin(float x) {
  const std::uint32_t a = detail::bits_of(x) & 0x7fffffffu;
  if (a == 0 || a >= 0x7f800000u) return kLog2BinNone;
  const int biased = static_cast<int>(a >> 23);
  if (biased > 0) return biased - 127;
    // An fp32 subnormal is a * 2^-149; its leading bit gives the exponent.
#if defined(__CUDA_ARCH__)
  const int msb = 31 - __clz(static_cast<int>(a));
#else
  const int msb = 31 - __builtin_clz(a);
#endif
  return kLog2BinMin + msb;
}

/// Counts of a whole array: one entry per RangeClass and one per log2 bin
/// (index log2_bin(x) - kLog2BinMin). Plain arrays so that a kernel can fill
/// it and the CPU report can compare with it field by field.
struct RangeCounts {
  std::uint64_t by_class[kRangeClassCount] = {};  ///< elements per RangeClass, indexed by its value
  std::uint64_t log2_hist[kLog2BinCount] = {};    ///< elements per log2 bin k, at index k - kLog2BinMin

  /// Elements of class c.
  MPT_HD std::uint64_t count(RangeClass c) const { return by_class[static_cast<int>(c)]; }
  /// Elements of the input array this report covers.
  MPT_HD std::uint64_t total() const {
    std::uint64_t t = 0;
    for (int i = 0; i < kRangeClassCount; ++i) t += by_class[i];
    return t;
  }
  /// Add one element (the serial reference of the GPU reduction).
  MPT_HD void add(float x, const FormatSpec& f) {
    ++by_class[static_cast<int>(classify(x, f))];
    const int k = log2_bin(x);
    if (k != kLog2BinNone) ++log2_hist[k - kLog2BinMin];
  }
};

/// Equal when every class count and every histogram bin agree.
MPT_HD inline bool operator==(const RangeCounts& a, const RangeCounts& b) {
  for (int i = 0; i < kRangeClassCount; ++i)
    if (a.by_class[i] != b.by_class[i]) return false;
  for (int i = 0; i < kLog2BinCount; ++i)
    if (a.log2_hist[i] != b.log2_hist[i]) return false;
  return true;
}
/// Not operator==.
MPT_HD inline bool operator!=(const RangeCounts& a, const RangeCounts& b) { return !(a == b); }

}  // namespace mpt
