// Chapter 01 — floating-point formats and their limits.
// Depends on: format_spec.hpp only. Host-and-device: kernels/ call these
// exact functions, so the CPU tests cover the code the GPU runs.
//
// One element of "round a float to a format", written so that it has no
// data-dependent branches (the AVX2 path in rounding.cpp is this function,
// lane by lane, and must give identical bits).
//
// The idea: a finite float is sig * 2^(E - 150) with a 24-bit integer
// significand `sig`. The target format keeps its quantum 2^q, where
// q = max(e, emin) - mantissa_bits. Rounding drops the low `shift` bits of
// sig; the kept integer r times 2^q is the answer. Overflow and subnormal
// flushing are applied to that answer afterwards.
#pragma once

#include <cstdint>
#include <cstring>

#include "mpt/formats/format_spec.hpp"

namespace mpt {

/// Rounding direction for finite values.
enum class RoundingMode : std::uint8_t {
  nearest_even,  ///< IEEE 754 default: nearest, ties to even
  toward_zero,   ///< truncate the dropped bits
  stochastic,    ///< round up with probability (dropped part)/(quantum), 32 random bits
};

/// What happens to a value whose rounded magnitude exceeds the format's max.
enum class OverflowMode : std::uint8_t {
  /// IEEE: inf (or NaN for a format without inf, like CUDA's __NV_NOSAT);
  /// round-toward-zero of a finite value gives ±max, as IEEE 754 requires.
  infinity,
  /// clamp to ±max; inputs that are ±inf become ±max too (FP8 convention,
  /// CUDA's __NV_SATFINITE). NaN stays NaN.
  saturate,
};

/// Whether results that would be subnormal in the target are kept.
enum class SubnormalMode : std::uint8_t {
  keep,   ///< gradual underflow, as IEEE
  flush,  ///< results below min normal become ±0 (flush-to-zero on output)
};

namespace detail {

/// The bit pattern of a float (memcpy on the host, an intrinsic on the device).
MPT_HD inline std::uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

/// The float with bit pattern u; the inverse of bits_of.
MPT_HD inline float float_of(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

/// 2^q as a float for -149 <= q <= 127 (subnormal powers included).
MPT_HD inline float pow2f(int q) {
  return q >= -126 ? float_of(static_cast<std::uint32_t>(q + 127) << 23) : float_of(1u << (q + 149));
}

/// A 32-bit mix of (seed, index): the random bits of stochastic rounding.
/// Counter-based, so the result for element i does not depend on how the
/// array was split into chunks, threads or CUDA blocks. The finaliser is the
/// "fmix32" step of MurmurHash3 (public domain, Austin Appleby), applied to a
/// Weyl-sequence counter.
MPT_HD inline std::uint32_t sr_random_bits(std::uint64_t seed, std::uint64_t index) {
  std::uint32_t h = static_cast<std::uint32_t>(seed) ^ static_cast<std::uint32_t>(seed >> 32) * 0x85ebca6bu;
  h ^= static_cast<std::uint32_t>(index) * 0x9e3779b9u;
  h ^= static_cast<std::uint32_t>(index >> 32) * 0x7f4a7c15u;
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

}  // namespace detail

/// The format's largest finite value, as a float (exact: all stock formats
/// are subsets of fp32).
MPT_HD inline float format_max(const FormatSpec& f) {
  return static_cast<float>(f.max_significand()) * detail::pow2f(f.emax() - f.mantissa_bits);
}

/// Round one float to format `f`; the result is a float holding a value of
/// `f` (or ±inf/NaN). `random_bits` is only read in stochastic mode.
///
/// NaN in gives a quiet NaN out with the input's sign and no payload.
MPT_HD inline float round_to_format(float x, const FormatSpec& f, RoundingMode mode, OverflowMode overflow,
                                    SubnormalMode subnormals, std::uint32_t random_bits = 0) {
  const std::uint32_t u = detail::bits_of(x);
  const std::uint32_t sign = u & 0x80000000u;
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return detail::float_of(sign | 0x7fc00000u);  // NaN

  // x = sig * 2^(E - 150); float subnormals have E = 0 but scale like E = 1.
  const int biased = static_cast<int>(a >> 23);
  const int e_eff = biased > 0 ? biased : 1;
  const std::uint32_t sig = (a & 0x7fffffu) | (biased > 0 ? 0x800000u : 0u);
  const int emin_biased = f.emin() + 127;
  const int below = emin_biased > e_eff ? emin_biased - e_eff : 0;
  const int shift = 23 - f.mantissa_bits + below;  // >= 0 for every format here
  const int q = e_eff - 150 + shift;               // the quantum is 2^q

  std::uint32_t r;
  if (mode == RoundingMode::stochastic) {
    // Add `shift` random bits below the kept ones, then truncate: the carry
    // rounds up with probability dropped / 2^shift (resolution 2^-32). When
    // the quantum is 2^32 times the value's unit or more (tiny inputs), the
    // only possible results are 0 and one quantum: up iff rnd < sig / 2^(shift-32).
    if (shift == 0) {
      r = sig;
    } else if (shift < 32) {
      r = (sig + (random_bits >> (32 - shift))) >> shift;
    } else {
      const int k = shift - 32 > 31 ? 31 : shift - 32;
      r = random_bits < (sig >> k) ? 1u : 0u;
    }
  } else {
    // A shift of 25 already drops all 24 bits below the rounding point.
    const int s = shift > 25 ? 25 : shift;
    const std::uint32_t kept = sig >> s;
    if (mode == RoundingMode::nearest_even && s > 0) {
      const std::uint32_t dropped = sig & ((1u << s) - 1u);
      const std::uint32_t half = 1u << (s - 1);
      r = kept + ((dropped > half || (dropped == half && (kept & 1u))) ? 1u : 0u);
    } else {
      r = kept;
    }
  }

  // r <= 2^24 and 2^q a power of two: the product is exact (or overflows
  // fp32 to inf, which is beyond every format's max anyway).
  float y = static_cast<float>(r) * detail::pow2f(q < -149 ? -149 : q);
  if (q < -149) y = 0.0f;  // unreachable for the stock formats; kept for custom specs

  const float maxv = format_max(f);
  if (y > maxv) {
    const bool is_inf_input = a == 0x7f800000u;
    if (overflow == OverflowMode::saturate || (mode == RoundingMode::toward_zero && !is_inf_input)) {
      y = maxv;
    } else {
      y = f.has_inf() ? detail::float_of(0x7f800000u) : detail::float_of(0x7fc00000u);
    }
  }
  if (subnormals == SubnormalMode::flush && y < detail::pow2f(f.emin())) y = 0.0f;
  return detail::float_of(detail::bits_of(y) | sign);
}

/// Encode a value that is already representable in `f` (the output of
/// round_to_format) as the format's bit pattern, right-aligned in 32 bits.
/// NaN encodes as the canonical quiet NaN: exponent all ones with the top
/// fraction bit set (E4M3: S.1111.111), sign kept.
MPT_HD inline std::uint32_t encode_exact(float v, const FormatSpec& f) {
  const std::uint32_t u = detail::bits_of(v);
  const int m = f.mantissa_bits;
  const std::uint32_t sign_out = (u >> 31) << (f.exponent_bits + m);
  const std::uint32_t a = u & 0x7fffffffu;
  const std::uint32_t exp_all_ones = (1u << f.exponent_bits) - 1u;
  if (a > 0x7f800000u) {
    const std::uint32_t frac = f.has_inf() ? (1u << (m - 1)) : (1u << m) - 1u;
    return sign_out | (exp_all_ones << m) | frac;
  }
  if (a == 0x7f800000u) return sign_out | (exp_all_ones << m);
  if (a == 0) return sign_out;
  const int e = static_cast<int>(a >> 23) - 127;  // v is normal in fp32 unless f is fp32/tf32
  if (e < f.emin() || (a >> 23) == 0) {
    // subnormal in f: the fraction field is v / 2^(emin - m), an exact integer
    const float scaled = detail::float_of(a) / detail::pow2f(f.emin() - m);
    return sign_out | static_cast<std::uint32_t>(scaled);
  }
  const std::uint32_t frac = (a & 0x7fffffu) >> (23 - m);
  return sign_out | (static_cast<std::uint32_t>(e + f.bias) << m) | frac;
}

/// Decode a bit pattern of `f` to the float it represents.
MPT_HD inline float decode(std::uint32_t code, const FormatSpec& f) {
  const int m = f.mantissa_bits;
  const std::uint32_t frac = code & ((1u << m) - 1u);
  const std::uint32_t expf = (code >> m) & ((1u << f.exponent_bits) - 1u);
  const bool negative = (code >> (f.exponent_bits + m)) & 1u;
  const std::uint32_t exp_all_ones = (1u << f.exponent_bits) - 1u;
  float v;
  if (f.has_inf() && expf == exp_all_ones) {
    v = frac == 0 ? detail::float_of(0x7f800000u) : detail::float_of(0x7fc00000u);
  } else if (!f.has_inf() && expf == exp_all_ones && frac == (1u << m) - 1u) {
    v = detail::float_of(0x7fc00000u);
  } else if (expf == 0) {
    v = static_cast<float>(frac) * detail::pow2f(f.emin() - m);
  } else {
    v = static_cast<float>(frac | (1u << m)) * detail::pow2f(static_cast<int>(expf) - f.bias - m);
  }
  // The sign is set with a bit operation, not by negating: negating a NaN
  // need not keep (or set) its sign bit on every device, and the tests compare
  // NaNs bit for bit. v is never negative here, so OR-ing the bit is -v.
  return detail::float_of(detail::bits_of(v) | (negative ? 0x80000000u : 0u));
}

}  // namespace mpt
