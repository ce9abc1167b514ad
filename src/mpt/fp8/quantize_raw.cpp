// Chapter 07 — FP8 training: quantize into the caller's buffers, the
// portable loops and the choice of the AVX2 ones.
// Depends on: quantize_raw.hpp, quantize_raw_impl.hpp (the AVX2 primitives), formats/cpu_dispatch.hpp
// (use_avx2), formats/explain.hpp (shortest_decimal, for messages),
// formats/rounding_avx512.hpp (avx512_conversions_available).
#include "mpt/fp8/quantize_raw.hpp"
#include "mpt/fp8/quantize_raw_impl.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "mpt/formats/cpu_dispatch.hpp"
#include "mpt/formats/explain.hpp"
#include "mpt/formats/rounding_avx512.hpp"

namespace mpt::fp8 {
namespace {

void check_scale(float scale) {
  if (!(std::isfinite(scale) && scale > 0.0f))
    throw std::invalid_argument("FP8 quantization: the scale must be finite and > 0, got " +
                                shortest_decimal(scale));
}

constexpr const char* kNoAvx2 =
    "FP8 quantization: Implementation::avx2 asked for, but this CPU or build has no AVX2";

}  // namespace

float quantize_into(const float* x, std::size_t n, DType d, float scale, bool saturate, std::uint8_t* codes,
                    Fp8Counts& counts, Implementation impl) {
  const FormatSpec& f = fp8_spec(d);
  check_scale(scale);
#if defined(MPT_HAVE_AVX2_PATH)
  if (mpt::detail::use_avx2(impl, kNoAvx2))
    return detail::quantize_into_simd(x, n, f, scale, saturate, codes, counts, detail::widest());
#else
  (void)mpt::detail::use_avx2(impl, kNoAvx2);
#endif
  float amax = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const Fp8Element e = quantize_element(x[i], scale, f, saturate);
    codes[i] = e.code;
    counts.add(e.outcome);
    amax = amax_step(amax, x[i]);
  }
  return amax;
}

float amax_vector(const float* x, std::size_t n) {
#if defined(MPT_HAVE_AVX512_PATH)
  if (detail::widest() == detail::SimdWidth::avx512) return detail::amax_avx512(x, n);
#endif
  return amax_of(x, n);
}

void quantize_mx_into(const float* x, std::size_t rows, std::size_t cols, DType d, MxScaleRule rule,
                      bool saturate, std::uint8_t* codes, std::uint8_t* e8m0, float* block_amax,
                      Fp8Counts& counts, Implementation impl) {
  const FormatSpec& f = fp8_spec(d);
  if (rule != MxScaleRule::floor && rule != MxScaleRule::rceil)
    throw std::invalid_argument("MX quantization: unknown scale rule; valid: floor, rceil");
#if defined(MPT_HAVE_AVX2_PATH)
  if (mpt::detail::use_avx2(impl, kNoAvx2)) {
    detail::quantize_mx_into_simd(x, rows, cols, f, rule, saturate, codes, e8m0, block_amax, counts,
                                  detail::widest());
    return;
  }
#else
  (void)mpt::detail::use_avx2(impl, kNoAvx2);
#endif
  const std::size_t per_row = (cols + kMxBlockSize - 1) / kMxBlockSize;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t b = 0; b < per_row; ++b) {
      const std::size_t begin = r * cols + b * kMxBlockSize;
      const std::size_t count = std::min(kMxBlockSize, cols - b * kMxBlockSize);
      const float amax = amax_of(x + begin, count);
      const std::uint8_t code = mx_scale_code(amax, f, rule);
      const float scale = e8m0_reciprocal(code);
      e8m0[r * per_row + b] = code;
      if (block_amax != nullptr) block_amax[r * per_row + b] = amax;
      for (std::size_t i = begin; i < begin + count; ++i) {
        const Fp8Element e = quantize_element(x[i], scale, f, saturate);
        codes[i] = e.code;
        counts.add(e.outcome);
      }
    }
}

#if defined(MPT_HAVE_AVX2_PATH)
namespace detail {
namespace {

// Values per call of the per-tensor AVX2 loop: its lane counters are
// 32-bit, and each lane counts one value in 8.
constexpr std::size_t kChunk = std::size_t{1} << 26;

Fp8Encode encode_params(const FormatSpec& f, bool saturate) {
  Fp8Encode k{};
  k.mantissa_bits = f.mantissa_bits;
  k.min_normal = mpt::detail::bits_of(mpt::detail::pow2f(f.emin()));
  k.subnormal_magic = mpt::detail::pow2f(f.emin() - f.mantissa_bits + 23);
  k.rebias = static_cast<std::uint32_t>(127 - f.bias) << f.mantissa_bits;
  k.max_code = encode_exact(format_max(f), f);
  // Beyond max without saturation: round_to_format's NaN (E4M3) or inf (E5M2).
  k.overflow_code =
      encode_exact(round_to_format(mpt::detail::float_of(0x7f800000u), f, RoundingMode::nearest_even,
                                   OverflowMode::infinity, SubnormalMode::keep),
                   f);
  k.nan_code = encode_exact(mpt::detail::float_of(0x7fc00000u), f);
  k.saturate = saturate;
  k.emax = f.emax();
  k.max_norm_rcp = static_cast<float>(1.0 / static_cast<double>(format_max(f)));  // as mx_scale_code
  return k;
}

void add(Fp8Counts& counts, const RawCounts& c, bool saturate) {
  (saturate ? counts.saturated : counts.overflowed) += c.beyond;
  counts.nan += c.nan;
  counts.flushed += c.flushed;
}

}  // namespace

SimdWidth widest() {
#if defined(MPT_HAVE_AVX512_PATH)
  return mpt::detail::avx512_conversions_available() ? SimdWidth::avx512 : SimdWidth::avx2;
#else
  return SimdWidth::avx2;
#endif
}

float quantize_into_simd(const float* x, std::size_t n, const FormatSpec& f, float scale, bool saturate,
                         std::uint8_t* codes, Fp8Counts& counts, SimdWidth w) {
  const Fp8Encode k = encode_params(f, saturate);
  RawCounts c;
  float amax = 0.0f;
  for (std::size_t i = 0; i < n; i += kChunk) {
    const std::size_t m = std::min(kChunk, n - i);
    const float a = w == SimdWidth::avx512 ? quantize_tensor_avx512(x + i, m, scale, codes + i, k, c)
                                           : quantize_tensor_avx2(x + i, m, scale, codes + i, k, c);
    amax = amax_step(amax, a);
  }
  add(counts, c, saturate);
  return amax;
}

void quantize_mx_into_simd(const float* x, std::size_t rows, std::size_t cols, const FormatSpec& f,
                           MxScaleRule rule, bool saturate, std::uint8_t* codes, std::uint8_t* e8m0,
                           float* block_amax, Fp8Counts& counts, SimdWidth w) {
  const Fp8Encode k = encode_params(f, saturate);
  const std::size_t per_row = (cols + kMxBlockSize - 1) / kMxBlockSize;
  RawCounts c;
  if (w == SimdWidth::avx512) {
    quantize_mx_avx512(x, rows, cols, rule == MxScaleRule::floor, codes, e8m0, block_amax, k, c);
  } else {
    for (std::size_t r = 0; r < rows; ++r)
      quantize_mx_row_avx2(x + r * cols, cols, rule == MxScaleRule::floor, codes + r * cols,
                           e8m0 + r * per_row, block_amax != nullptr ? block_amax + r * per_row : nullptr, k,
                           c);
  }
  add(counts, c, saturate);
}

#if !defined(MPT_HAVE_AVX512_PATH)
// Built without the AVX-512 loops: widest() never picks them; these keep
// their test linking everywhere (it skips).
float quantize_tensor_avx512(const float* x, std::size_t n, float scale, std::uint8_t* codes,
                             const Fp8Encode& k, RawCounts& c) {
  return quantize_tensor_avx2(x, n, scale, codes, k, c);
}
void quantize_mx_avx512(const float* x, std::size_t rows, std::size_t cols, bool floor_rule,
                        std::uint8_t* codes, std::uint8_t* e8m0, float* block_amax, const Fp8Encode& k,
                        RawCounts& c) {
  const std::size_t per_row = (cols + 31) / 32;
  for (std::size_t r = 0; r < rows; ++r)
    quantize_mx_row_avx2(x + r * cols, cols, floor_rule, codes + r * cols, e8m0 + r * per_row,
                         block_amax != nullptr ? block_amax + r * per_row : nullptr, k, c);
}
#endif

}  // namespace detail
#else
namespace detail {
// Built without the vector loops: quantize_into never calls these; their
// tests link everywhere and skip.
SimdWidth widest() { return SimdWidth::avx2; }
float quantize_into_simd(const float*, std::size_t, const FormatSpec&, float, bool, std::uint8_t*, Fp8Counts&,
                         SimdWidth) {
  throw std::logic_error("FP8 quantization: this build has no vector loops");
}
void quantize_mx_into_simd(const float*, std::size_t, std::size_t, const FormatSpec&, MxScaleRule, bool,
                           std::uint8_t*, std::uint8_t*, float*, Fp8Counts&, SimdWidth) {
  throw std::logic_error("FP8 quantization: this build has no vector loops");
}
}  // namespace detail
#endif

}  // namespace mpt::fp8
