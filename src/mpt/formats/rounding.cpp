// Chapter 01 — floating-point formats and their limits.
// Depends on: rounding.hpp, rounding_impl.hpp, cpu_dispatch.hpp,
// rounding_avx512.hpp. The portable
// loops are the reference; the AVX2 path is used only when the CPU has AVX2
// and F16C.
#include "mpt/formats/rounding.hpp"

#include <stdexcept>

#if defined(MPT_HAVE_AVX2_PATH)
#include <cpuid.h>
#endif

#include "mpt/formats/cpu_dispatch.hpp"
#include "mpt/formats/rounding_avx512.hpp"
#include "mpt/formats/rounding_impl.hpp"

namespace mpt {

using detail::params_for;

namespace {

/// detail::use_avx2 with this file's message for an unavailable AVX2 path.
bool use_avx2(Implementation impl) {
  return detail::use_avx2(impl, "the AVX2 rounding path is not available on this CPU/build");
}

}  // namespace

bool avx2_available() {
#if defined(MPT_HAVE_AVX2_PATH)
  // F16C is read from cpuid leaf 1 (ECX bit 29) directly: not every
  // compiler's __builtin_cpu_supports knows its name.
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return ok;
#else
  return false;
#endif
}

#if defined(MPT_HAVE_AVX512_PATH)
bool detail::avx512_conversions_available() {
  // libgcc's __builtin_cpu_supports("avx512f") also asks XGETBV whether the
  // operating system saves the zmm and mask registers.
  static const bool ok = avx2_available() && __builtin_cpu_supports("avx512f");
  return ok;
}
#else
// Built without the AVX-512 loops: none available, none done (so that their
// test links everywhere, and skips).
bool detail::avx512_conversions_available() { return false; }
std::size_t detail::decode16_avx512(const std::uint16_t*, float*, std::size_t, bool) { return 0; }
std::size_t detail::encode16_avx512(const float*, std::uint16_t*, std::size_t, bool) { return 0; }
#endif

float round_value(float x, const Format& f, const RoundingOptions& o, std::uint64_t index) {
  return detail::round_one(x, params_for(f, o), index);
}

void round_array(const float* in, float* out, std::size_t n, const Format& f, const RoundingOptions& o,
                 std::uint64_t first_index, Implementation impl) {
  const detail::RoundParams p = params_for(f, o);
#if defined(MPT_HAVE_AVX2_PATH)
  if (use_avx2(impl)) {
    detail::round_avx2(in, out, n, p, first_index);
    return;
  }
#else
  (void)use_avx2(impl);
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = detail::round_one(in[i], p, first_index + i);
}

void encode_array(const float* in, std::uint32_t* codes, std::size_t n, const Format& f,
                  const RoundingOptions& o, std::uint64_t first_index) {
  const detail::RoundParams p = params_for(f, o);
  for (std::size_t i = 0; i < n; ++i)
    codes[i] = encode_exact(detail::round_one(in[i], p, first_index + i), p.spec);
}

RoundingMode rounding_mode_named(std::string_view name) {
  if (name == "rne") return RoundingMode::nearest_even;
  if (name == "rtz") return RoundingMode::toward_zero;
  if (name == "sr") return RoundingMode::stochastic;
  throw std::invalid_argument("unknown rounding mode '" + std::string(name) + "'; valid modes: rne, rtz, sr");
}

std::string_view rounding_mode_name(RoundingMode m) {
  switch (m) {
    case RoundingMode::nearest_even: return "rne";
    case RoundingMode::toward_zero: return "rtz";
    case RoundingMode::stochastic: return "sr";
  }
  return "?";
}

}  // namespace mpt
