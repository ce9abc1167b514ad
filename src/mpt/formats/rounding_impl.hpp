// Chapter 01 — private to src/mpt: the array kernels behind rounding.hpp.
// Depends on: round_element.hpp. rounding.cpp holds the portable loops,
// rounding_avx2.cpp the AVX2/F16C versions that must give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mpt/formats/rounding.hpp"

namespace mpt::detail {

/// Everything one rounding call needs, with the overflow default resolved.
struct RoundParams {
  FormatSpec spec;           ///< the target format's descriptor
  RoundingMode mode;         ///< rounding direction
  OverflowMode overflow;     ///< resolved: the caller's choice or the format's default
  SubnormalMode subnormals;  ///< keep or flush subnormal results
  std::uint64_t seed;        ///< stochastic rounding only
};

/// Resolve a call's options against the format's conventions.
inline RoundParams params_for(const Format& f, const RoundingOptions& o) {
  return {f.spec, o.mode, o.overflow.value_or(f.default_overflow), o.subnormals, o.seed};
}

/// True for IEEE-default parameters that the hardware fast paths cover.
inline bool is_ieee_default(const RoundParams& p) {
  return p.mode == RoundingMode::nearest_even && p.overflow == OverflowMode::infinity &&
         p.subnormals == SubnormalMode::keep;
}

/// Round element `index` of an array: round_to_format with the random bits
/// of (seed, index) in stochastic mode. The portable loops call this.
inline float round_one(float x, const RoundParams& p, std::uint64_t index) {
  const std::uint32_t bits = p.mode == RoundingMode::stochastic ? sr_random_bits(p.seed, index) : 0u;
  return round_to_format(x, p.spec, p.mode, p.overflow, p.subnormals, bits);
}

#if defined(MPT_HAVE_AVX2_PATH)
// Each processes n elements; element i uses index first + i.
/// AVX2 version of the round_array loop: the same bits as round_one.
void round_avx2(const float* in, float* out, std::size_t n, const RoundParams& p, std::uint64_t first);
/// AVX2 round-and-encode to a 16-bit format (fp16, bf16): codes in uint16.
void encode16_avx2(const float* in, std::uint16_t* out, std::size_t n, const RoundParams& p,
                   std::uint64_t first);
/// AVX2 round-and-encode to an 8-bit format (e4m3, e5m2): codes in uint8.
void encode8_avx2(const float* in, std::uint8_t* out, std::size_t n, const RoundParams& p,
                  std::uint64_t first);
/// AVX2/F16C decode of fp16 or bf16 codes (other 16-bit specs: the portable
/// loop): the same bits as decode(), NaN canonicalised as it does.
void decode16_avx2(const std::uint16_t* in, float* out, std::size_t n, const FormatSpec& spec);
#endif

}  // namespace mpt::detail
