// Chapter 01 — floating-point formats and their limits.
// Depends on: storage.hpp, rounding_impl.hpp, rounding_avx512.hpp. The storage conversions are
// round-then-encode and decode, vectorized where the CPU allows (AVX-512 for
// fp16/bf16 with IEEE rounding, AVX2), else element by element; every way
// gives the same bits (tests/cpu/test_ch01_formats.cpp,
// test_ch01_formats_avx512.cpp).
#include "mpt/formats/storage.hpp"

#include "mpt/formats/rounding_impl.hpp"
#if defined(MPT_HAVE_AVX512_PATH)
#include "mpt/formats/rounding_avx512.hpp"
#endif

namespace mpt {

namespace {

#if defined(MPT_HAVE_AVX512_PATH)
// fp16 (5 exponent bits, 10 fraction) or bf16 (8, 7): the formats the
// AVX-512 loops convert, as the AVX2 loops' fast paths tell them apart.
bool wide16_fast(const FormatSpec& spec) {
  return (spec.exponent_bits == 5 && spec.mantissa_bits == 10) ||
         (spec.exponent_bits == 8 && spec.mantissa_bits == 7);
}
#endif

template <typename T, typename Code>
void encode_to(const float* in, T* out, std::size_t n, const Format& f, const RoundingOptions& o) {
  static_assert(sizeof(T) == sizeof(Code), "storage type must be exactly its code");
  const detail::RoundParams p = detail::params_for(f, o);
  Code* codes = reinterpret_cast<Code*>(out);  // T is a standard-layout wrapper of one Code
#if defined(MPT_HAVE_AVX2_PATH)
  if (avx2_available()) {
    std::size_t done = 0;
#if defined(MPT_HAVE_AVX512_PATH)
    if constexpr (sizeof(Code) == 2)
      if (detail::avx512_conversions_available() && detail::is_ieee_default(p) && wide16_fast(p.spec))
        done = detail::encode16_avx512(in, codes, n, p.spec.exponent_bits == 8);
#endif
    if constexpr (sizeof(Code) == 2) detail::encode16_avx2(in + done, codes + done, n - done, p, done);
    else detail::encode8_avx2(in, codes, n, p, 0);
    return;
  }
#endif
  for (std::size_t i = 0; i < n; ++i)
    codes[i] = static_cast<Code>(encode_exact(detail::round_one(in[i], p, i), p.spec));
}

// 16-bit codes: F16C (fp16) or a shift (bf16) sixteen at a time (AVX-512)
// or eight (AVX2) where the CPU has them, else decode() per element. All
// give decode()'s bits.
template <typename T>
void decode16_from(const T* in, float* out, std::size_t n, const FormatSpec& spec) {
  static_assert(sizeof(T) == sizeof(std::uint16_t), "storage type must be exactly its code");
  const auto* codes = reinterpret_cast<const std::uint16_t*>(in);
#if defined(MPT_HAVE_AVX2_PATH)
  if (avx2_available()) {
    std::size_t done = 0;
#if defined(MPT_HAVE_AVX512_PATH)
    if (detail::avx512_conversions_available() && wide16_fast(spec))
      done = detail::decode16_avx512(codes, out, n, spec.exponent_bits == 8);
#endif
    detail::decode16_avx2(codes + done, out + done, n - done, spec);
    return;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = decode(codes[i], spec);
}

// 8-bit codes: a 256-entry table filled by decode() once per format.
template <typename T>
void decode8_from(const T* in, float* out, std::size_t n, const float (&table)[256]) {
  static_assert(sizeof(T) == sizeof(std::uint8_t), "storage type must be exactly its code");
  const auto* codes = reinterpret_cast<const std::uint8_t*>(in);
  for (std::size_t i = 0; i < n; ++i) out[i] = table[codes[i]];
}

struct Fp8Table {
  float values[256];
  explicit Fp8Table(const FormatSpec& spec) {
    for (std::uint32_t c = 0; c < 256; ++c) values[c] = decode(c, spec);
  }
};

}  // namespace

void to_fp16(const float* in, Eigen::half* out, std::size_t n, const RoundingOptions& o) {
  encode_to<Eigen::half, std::uint16_t>(in, out, n, format_named("fp16"), o);
}
void to_bf16(const float* in, Eigen::bfloat16* out, std::size_t n, const RoundingOptions& o) {
  encode_to<Eigen::bfloat16, std::uint16_t>(in, out, n, format_named("bf16"), o);
}
void to_e4m3(const float* in, Fp8E4M3* out, std::size_t n, const RoundingOptions& o) {
  encode_to<Fp8E4M3, std::uint8_t>(in, out, n, format_named("e4m3"), o);
}
void to_e5m2(const float* in, Fp8E5M2* out, std::size_t n, const RoundingOptions& o) {
  encode_to<Fp8E5M2, std::uint8_t>(in, out, n, format_named("e5m2"), o);
}

// Decoding is exact: every code of these formats is an fp32 value.
void from_fp16(const Eigen::half* in, float* out, std::size_t n) { decode16_from(in, out, n, formats::fp16); }
void from_bf16(const Eigen::bfloat16* in, float* out, std::size_t n) {
  decode16_from(in, out, n, formats::bf16);
}
void from_e4m3(const Fp8E4M3* in, float* out, std::size_t n) {
  static const Fp8Table table(formats::e4m3);
  decode8_from(in, out, n, table.values);
}
void from_e5m2(const Fp8E5M2* in, float* out, std::size_t n) {
  static const Fp8Table table(formats::e5m2);
  decode8_from(in, out, n, table.values);
}

}  // namespace mpt
