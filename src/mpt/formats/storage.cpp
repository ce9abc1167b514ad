// Chapter 01 — floating-point formats and their limits.
// Depends on: storage.hpp, rounding_impl.hpp. The storage conversions are
// round-then-encode and decode, vectorized where the CPU allows, else element
// by element; both ways give the same bits (tests/cpu/test_ch01_formats.cpp).
#include "mpt/formats/storage.hpp"

#include "mpt/formats/rounding_impl.hpp"

namespace mpt {

namespace {

template <typename T, typename Code>
void encode_to(const float* in, T* out, std::size_t n, const Format& f, const RoundingOptions& o) {
  static_assert(sizeof(T) == sizeof(Code), "storage type must be exactly its code");
  const detail::RoundParams p = detail::params_for(f, o);
  Code* codes = reinterpret_cast<Code*>(out);  // T is a standard-layout wrapper of one Code
#if defined(MPT_HAVE_AVX2_PATH)
  if (avx2_available()) {
    if constexpr (sizeof(Code) == 2) detail::encode16_avx2(in, codes, n, p, 0);
    else detail::encode8_avx2(in, codes, n, p, 0);
    return;
  }
#endif
  for (std::size_t i = 0; i < n; ++i)
    codes[i] = static_cast<Code>(encode_exact(detail::round_one(in[i], p, i), p.spec));
}

// 16-bit codes: F16C (fp16) or a shift (bf16) eight at a time where the CPU
// has them, else decode() per element. Both give decode()'s bits.
template <typename T>
void decode16_from(const T* in, float* out, std::size_t n, const FormatSpec& spec) {
  static_assert(sizeof(T) == sizeof(std::uint16_t), "storage type must be exactly its code");
  const auto* codes = reinterpret_cast<const std::uint16_t*>(in);
#if defined(MPT_HAVE_AVX2_PATH)
  if (avx2_available()) {
    detail::decode16_avx2(codes, out, n, spec);
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
