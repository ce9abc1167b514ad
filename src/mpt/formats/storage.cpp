// Chapter 01 — floating-point formats and their limits.
// Depends on: storage.hpp, rounding_impl.hpp. The storage conversions are
// round-then-encode, vectorized where the CPU allows, else element by element.
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

template <typename T, typename Code>
void decode_from(const T* in, float* out, std::size_t n, const FormatSpec& spec) {
  const Code* codes = reinterpret_cast<const Code*>(in);
  for (std::size_t i = 0; i < n; ++i) out[i] = decode(codes[i], spec);
}

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
void from_fp16(const Eigen::half* in, float* out, std::size_t n) {
  decode_from<Eigen::half, std::uint16_t>(in, out, n, formats::fp16);
}
void from_bf16(const Eigen::bfloat16* in, float* out, std::size_t n) {
  decode_from<Eigen::bfloat16, std::uint16_t>(in, out, n, formats::bf16);
}
void from_e4m3(const Fp8E4M3* in, float* out, std::size_t n) {
  decode_from<Fp8E4M3, std::uint8_t>(in, out, n, formats::e4m3);
}
void from_e5m2(const Fp8E5M2* in, float* out, std::size_t n) {
  decode_from<Fp8E5M2, std::uint8_t>(in, out, n, formats::e5m2);
}

}  // namespace mpt
