// Chapter 01 — the derived limits, pinned, and the exhaustive
// decode/encode round trip of every 16-bit and 8-bit code.
// Depends on: mpt/format.hpp, mpt/round_element.hpp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "mpt/formats/format.hpp"
#include "mpt/formats/rounding.hpp"

using namespace mpt;

TEST_CASE("limits derived from the descriptors match the published values") {
  const Limits h = limits_of(formats::fp16);
  CHECK(h.max == 65504.0);
  CHECK(h.min_normal == std::ldexp(1.0, -14));
  CHECK(h.min_subnormal == std::ldexp(1.0, -24));
  CHECK(h.epsilon == std::ldexp(1.0, -10));
  CHECK(h.unit_roundoff == std::ldexp(1.0, -11));
  CHECK(h.emin == -14);
  CHECK(h.emax == 15);
  CHECK(h.precision == 11);
  CHECK(h.finite_codes == 63488);  // 2 * 31 * 1024
  CHECK(h.storage_bytes == 2);

  const Limits b = limits_of(formats::bf16);
  CHECK(b.max == doctest::Approx(3.3895313892515355e38).epsilon(1e-15));
  CHECK(b.max == std::ldexp(255.0, 120));  // (2 - 2^-7) * 2^127
  CHECK(b.epsilon == std::ldexp(1.0, -7));
  CHECK(b.min_normal == std::ldexp(1.0, -126));
  CHECK(b.min_subnormal == std::ldexp(1.0, -133));

  const Limits e4 = limits_of(formats::e4m3);
  CHECK(e4.max == 448.0);
  CHECK_FALSE(e4.has_inf);
  CHECK(e4.min_normal == std::ldexp(1.0, -6));
  CHECK(e4.min_subnormal == std::ldexp(1.0, -9));
  CHECK(e4.finite_codes == 254);  // all but the two NaN codes

  const Limits e5 = limits_of(formats::e5m2);
  CHECK(e5.max == 57344.0);
  CHECK(e5.has_inf);
  CHECK(e5.min_subnormal == std::ldexp(1.0, -16));
  CHECK(e5.finite_codes == 2 * 31 * 4);

  const Limits f = limits_of(formats::fp32);
  CHECK(f.max == static_cast<double>(3.4028234663852886e38));
  CHECK(f.epsilon == std::ldexp(1.0, -23));
  CHECK(f.min_subnormal == std::ldexp(1.0, -149));

  const Limits t = limits_of(formats::tf32);
  CHECK(t.epsilon == std::ldexp(1.0, -10));
  CHECK(t.max == std::ldexp(2047.0, 117));  // (2 - 2^-10) * 2^127
  CHECK(t.storage_bytes == 4);
}

TEST_CASE("format lookup names the valid choices") {
  CHECK(format_named("fp16").spec.mantissa_bits == 10);
  CHECK(find_format("fp17") == nullptr);
  try {
    (void)format_named("fp17");
    FAIL("expected an error");
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    CHECK(msg.find("fp17") != std::string::npos);
    CHECK(msg.find("fp32, tf32, bf16, fp16, e4m3, e5m2") != std::string::npos);
  }
}

namespace {

bool is_nan_code(std::uint32_t c, const FormatSpec& f) {
  const std::uint32_t m = (1u << f.mantissa_bits) - 1u;
  const std::uint32_t e = (c >> f.mantissa_bits) & ((1u << f.exponent_bits) - 1u);
  const std::uint32_t ones = (1u << f.exponent_bits) - 1u;
  return f.has_inf() ? (e == ones && (c & m) != 0) : (e == ones && (c & m) == m);
}

// Every code decodes to a float that rounds back (RNE, no saturation) to
// itself; NaN codes all become the canonical quiet NaN with their sign.
void check_every_code(const char* name, const FormatSpec& f) {
  CAPTURE(name);
  const std::uint32_t n = 1u << f.storage_bits;
  const std::uint32_t sign_bit = 1u << (f.storage_bits - 1);
  std::uint32_t nan_codes = 0, mismatches = 0;
  for (std::uint32_t c = 0; c < n; ++c) {
    const float v = decode(c, f);
    const float r =
        round_to_format(v, f, RoundingMode::nearest_even, OverflowMode::infinity, SubnormalMode::keep);
    const std::uint32_t back = encode_exact(r, f);
    if (is_nan_code(c, f)) {
      ++nan_codes;
      const std::uint32_t canonical =
          (c & sign_bit) | (((1u << f.exponent_bits) - 1u) << f.mantissa_bits) |
          (f.has_inf() ? 1u << (f.mantissa_bits - 1) : (1u << f.mantissa_bits) - 1u);
      if (!std::isnan(v) || back != canonical) ++mismatches;
    } else if (back != c || std::isnan(v)) {
      if (mismatches++ < 5) MESSAGE("code " << c << " -> " << v << " -> " << back);
    }
  }
  CHECK(mismatches == 0);
  const Limits l = limits_of(f);
  CHECK(n - nan_codes - (f.has_inf() ? 2u : 0u) == l.finite_codes);
}

}  // namespace

TEST_CASE("every fp16, bf16, e4m3 and e5m2 code survives decode then encode") {
  check_every_code("fp16", formats::fp16);
  check_every_code("bf16", formats::bf16);
  check_every_code("e4m3", formats::e4m3);
  check_every_code("e5m2", formats::e5m2);
}

TEST_CASE("decoded codes are ordered: the largest finite code is the max") {
  CHECK(decode(0x7bff, formats::fp16) == 65504.0f);
  CHECK(std::isinf(decode(0x7c00, formats::fp16)));
  CHECK(decode(0x0001, formats::fp16) == std::ldexp(1.0f, -24));
  CHECK(decode(0x7e, formats::e4m3) == 448.0f);
  CHECK(std::isnan(decode(0x7f, formats::e4m3)));
  CHECK(decode(0x78, formats::e4m3) == 256.0f);  // all-ones exponent is finite in E4M3
  CHECK(decode(0x7b, formats::e5m2) == 57344.0f);
  CHECK(std::isinf(decode(0x7c, formats::e5m2)));
  CHECK(decode(0x7f7f, formats::bf16) == static_cast<float>(std::ldexp(255.0, 120)));
}
