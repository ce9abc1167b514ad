// Chapter 01 — floating-point formats and their limits: the bit-level explainer.
// Depends on: mpt/explain.hpp, mpt/rounding.hpp, mpt/range_classify.hpp.
//
// Pinned examples (65504 and 0.1 in fp16, the FP8 edges), then properties
// checked over every code of the 16- and 8-bit formats: neighbours are the
// adjacent values, the ulp is the gap above, and explain() agrees with the
// rounding library and with classify().
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mpt/formats/explain.hpp"
#include "mpt/formats/range_classify.hpp"
#include "mpt/formats/rounding.hpp"

namespace {

const mpt::Format& fmt(const char* name) { return mpt::format_named(name); }
const double inf = std::numeric_limits<double>::infinity();

}  // namespace

TEST_SUITE("ch01 explain") {
  TEST_CASE("65504 in fp16: the largest finite value, with inf above it") {
    const mpt::Explanation e = mpt::explain(65504.0, fmt("fp16"));
    CHECK(e.stored == 65504.0f);
    CHECK(e.sign_field == "0");
    CHECK(e.exponent_field == "11110");
    CHECK(e.mantissa_field == "1111111111");
    CHECK(e.code == 0x7bffu);
    CHECK(e.code_hex == "0x7bff");
    CHECK(e.code_bits == 16);
    CHECK(e.biased_exponent == 30);
    CHECK(e.exponent == 15);
    CHECK(e.kind == mpt::ValueKind::normal);
    CHECK(e.significand_binary == "1.1111111111");
    CHECK(e.stored_exact == "65504");
    CHECK(e.stored_shortest == "65504");
    CHECK(e.abs_error == 0.0);
    CHECK(e.rel_error == 0.0);
    CHECK(e.ulp == 32.0);
    CHECK(e.outcome == mpt::RangeClass::exact);
    REQUIRE(e.next_below);
    REQUIRE(e.next_above);
    CHECK(*e.next_below == 65472.0f);
    CHECK(std::isinf(*e.next_above));
    CHECK(*e.next_above > 0);

    const std::string text = mpt::render_text(e);
    CHECK(text.find("0 11110 1111111111") != std::string::npos);
    CHECK(text.find("0x7bff") != std::string::npos);
    CHECK(text.find("65472") != std::string::npos);
  }

  TEST_CASE("0.1 in fp16: exact stored value, error and ulp") {
    const mpt::Explanation e = mpt::explain(0.1, fmt("fp16"));
    // 0.1 lies in [2^-4, 2^-3): the quantum there is 2^-4 * 2^-10 = 2^-14,
    // and 1638 * 2^-14 is the nearest multiple.
    CHECK(e.stored_exact == "0.0999755859375");
    CHECK(e.stored == 1638.0f * std::ldexp(1.0f, -14));
    CHECK(e.stored_shortest == "0.099975586");
    CHECK(e.input_exact == "0.1000000000000000055511151231257827021181583404541015625");
    CHECK(e.sign_field == "0");
    CHECK(e.exponent_field == "01011");
    CHECK(e.mantissa_field == "1001100110");
    CHECK(e.code_hex == "0x2e66");
    CHECK(e.exponent == -4);
    CHECK(e.ulp == std::ldexp(1.0, -14));
    CHECK(e.abs_error_is_exact);
    CHECK(e.abs_error == 0.0999755859375 - 0.1);
    CHECK(e.abs_error_exact == "-0.0000244140625000055511151231257827021181583404541015625");
    CHECK(std::fabs(e.rel_error) <= std::ldexp(1.0, -11));  // unit roundoff of fp16
    CHECK(std::fabs(e.error_ulps) <= 0.5);
    CHECK(e.outcome == mpt::RangeClass::rounded);
    REQUIRE(e.next_below);
    REQUIRE(e.next_above);
    CHECK(*e.next_below == 1637.0f * std::ldexp(1.0f, -14));
    CHECK(*e.next_above == 1639.0f * std::ldexp(1.0f, -14));
  }

  TEST_CASE("overflow: 65520 and beyond become inf in fp16, saturate in e4m3") {
    const mpt::Explanation e = mpt::explain(65520.0, fmt("fp16"));
    CHECK(std::isinf(e.stored));
    CHECK(e.code_hex == "0x7c00");
    CHECK(e.kind == mpt::ValueKind::infinity);
    CHECK(e.outcome == mpt::RangeClass::overflow);
    CHECK(std::isnan(e.ulp));
    CHECK(*e.next_below == 65504.0f);
    CHECK_FALSE(e.next_above);

    CHECK(mpt::explain(65519.996, fmt("fp16")).stored == 65504.0f);

    const mpt::Explanation s = mpt::explain(1000.0, fmt("e4m3"));
    CHECK(s.stored == 448.0f);  // e4m3's convention: saturate
    CHECK(s.code_hex == "0x7e");
    CHECK(s.outcome == mpt::RangeClass::overflow);
    CHECK(s.abs_error == 448.0 - 1000.0);
    CHECK(s.note.find("saturated") != std::string::npos);

    const mpt::Explanation i = mpt::explain(inf, fmt("e4m3"));
    CHECK(i.stored == 448.0f);
    CHECK(i.outcome == mpt::RangeClass::nonfinite);
  }

  TEST_CASE("the input is rounded once, not through fp32 first") {
    // 65520 - 2^-30 is below the fp16 overflow threshold 65520 and rounds to
    // 65504; rounded to fp32 first it would become 65520 and then inf.
    const mpt::Explanation e = mpt::explain(65520.0 - std::ldexp(1.0, -30), fmt("fp16"));
    CHECK(e.stored == 65504.0f);
    CHECK(e.outcome == mpt::RangeClass::rounded);
    // 1 + 2^-11 is a tie (to even: 1); a hair above it must round up, though
    // fp32 alone would have cut the hair off and made it a tie again.
    CHECK(mpt::explain(1.0 + std::ldexp(1.0, -11), fmt("fp16")).stored == 1.0f);
    CHECK(mpt::explain(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), fmt("fp16")).stored ==
          1.0f + std::ldexp(1.0f, -10));
    CHECK(mpt::explain(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40), fmt("bf16")).stored ==
          1.0f + std::ldexp(1.0f, -7));
    // fp32 itself: the plain cast is the single rounding.
    CHECK(mpt::explain(0.1, fmt("fp32")).stored == 0.1f);
    CHECK(mpt::explain(0.1, fmt("fp32")).stored_exact == "0.100000001490116119384765625");
  }

  TEST_CASE("subnormals and zeros in fp16") {
    const mpt::Explanation s = mpt::explain(std::ldexp(1.0, -24), fmt("fp16"));
    CHECK(s.kind == mpt::ValueKind::subnormal);
    CHECK(s.exponent_field == "00000");
    CHECK(s.mantissa_field == "0000000001");
    CHECK(s.exponent == -14);
    CHECK(s.significand_binary == "0.0000000001");
    CHECK(s.stored_exact == "0.000000059604644775390625");
    CHECK(s.ulp == std::ldexp(1.0, -24));
    CHECK(s.outcome == mpt::RangeClass::subnormal_result);
    CHECK(*s.next_below == 0.0f);
    CHECK(*s.next_above == std::ldexp(1.0f, -23));

    // 3 * 2^-26 = 0.75 * 2^-24 rounds up to 2^-24; 2^-25 is a tie and goes to 0 (even).
    CHECK(mpt::explain(3 * std::ldexp(1.0, -26), fmt("fp16")).stored == std::ldexp(1.0f, -24));
    const mpt::Explanation half = mpt::explain(std::ldexp(1.0, -25), fmt("fp16"));
    CHECK(half.stored == 0.0f);
    CHECK(half.outcome == mpt::RangeClass::flushed_to_zero);
    CHECK(half.rel_error == -1.0);
    CHECK(mpt::explain(std::ldexp(1.0, -25) * (1 + 1e-9), fmt("fp16")).stored == std::ldexp(1.0f, -24));

    const mpt::Explanation pz = mpt::explain(0.0, fmt("fp16"));
    CHECK(pz.kind == mpt::ValueKind::zero);
    CHECK(pz.outcome == mpt::RangeClass::zero);
    CHECK(*pz.next_below == -std::ldexp(1.0f, -24));
    CHECK(*pz.next_above == std::ldexp(1.0f, -24));
    const mpt::Explanation nz = mpt::explain(-0.0, fmt("fp16"));
    CHECK(nz.code_hex == "0x8000");
    CHECK(nz.stored_exact == "-0");
    CHECK(*nz.next_below == -std::ldexp(1.0f, -24));
    CHECK(*nz.next_above == std::ldexp(1.0f, -24));

    // Just above -min_subnormal sits -0.
    const mpt::Explanation m = mpt::explain(-std::ldexp(1.0, -24), fmt("fp16"));
    REQUIRE(m.next_above);
    CHECK(*m.next_above == 0.0f);
    CHECK(std::signbit(*m.next_above));
  }

  TEST_CASE("edges: ±max, inf and NaN") {
    const mpt::Explanation nmax = mpt::explain(-65504.0, fmt("fp16"));
    CHECK(std::isinf(*nmax.next_below));
    CHECK(*nmax.next_below < 0);
    CHECK(*nmax.next_above == -65472.0f);

    const mpt::Explanation e4 = mpt::explain(448.0, fmt("e4m3"));
    CHECK(e4.code_hex == "0x7e");
    CHECK(e4.exponent_field == "1111");  // E4M3 uses the all-ones exponent for numbers
    CHECK(e4.mantissa_field == "110");
    CHECK(*e4.next_below == 416.0f);
    CHECK_FALSE(e4.next_above);  // no inf: nothing above max
    CHECK_FALSE(mpt::explain(-448.0, fmt("e4m3")).next_below);

    const mpt::Explanation e5 = mpt::explain(57344.0, fmt("e5m2"));
    CHECK(e5.code_hex == "0x7b");
    CHECK(std::isinf(*e5.next_above));

    const mpt::Explanation pinf = mpt::explain(inf, fmt("fp16"));
    CHECK(pinf.kind == mpt::ValueKind::infinity);
    CHECK(pinf.abs_error == 0.0);
    CHECK(*pinf.next_below == 65504.0f);
    CHECK_FALSE(pinf.next_above);

    const mpt::Explanation nan16 = mpt::explain(std::nan(""), fmt("fp16"));
    CHECK(nan16.kind == mpt::ValueKind::nan);
    CHECK(nan16.code_hex == "0x7e00");
    CHECK_FALSE(nan16.next_below);
    CHECK_FALSE(nan16.next_above);
    CHECK(mpt::explain(std::nan(""), fmt("e4m3")).code_hex == "0x7f");
    CHECK_FALSE(mpt::render_text(nan16).empty());
  }

  TEST_CASE("tf32 and fp32 field layouts") {
    const mpt::Explanation t = mpt::explain(1.0, fmt("tf32"));
    CHECK(t.code_bits == 19);
    CHECK(t.code_hex == "0x1fc00");
    CHECK(t.exponent_field == "01111111");
    CHECK(t.mantissa_field == std::string(10, '0'));
    const mpt::Explanation f = mpt::explain(-2.0, fmt("fp32"));
    CHECK(f.code_hex == "0xc0000000");
    CHECK(f.mantissa_field.size() == 23);
  }

  TEST_CASE("exact_decimal prints binary fractions exactly") {
    CHECK(mpt::exact_decimal(0.5) == "0.5");
    CHECK(mpt::exact_decimal(-0.0) == "-0");
    CHECK(mpt::exact_decimal(0.0) == "0");
    CHECK(mpt::exact_decimal(65504.0) == "65504");
    CHECK(mpt::exact_decimal(-3.25) == "-3.25");
    CHECK(mpt::exact_decimal(0.1) == "0.1000000000000000055511151231257827021181583404541015625");
    CHECK(mpt::exact_decimal(std::ldexp(1.0, -149)) ==
          "0." + std::string(44, '0') +
              "1401298464324817070923729583289916131280261941876515771757068283889791082685860601486638188362"
              "12158203125");
    const std::string big = mpt::exact_decimal(std::numeric_limits<double>::max());
    CHECK(big.size() == 309);
    CHECK(big.rfind("1797693134862315708145274237317043567980", 0) == 0);
    CHECK(big.substr(big.size() - 7) == "4858368");  // ...026184124858368
    CHECK(mpt::exact_decimal(inf) == "inf");
    CHECK(mpt::exact_decimal(-inf) == "-inf");
    CHECK(mpt::exact_decimal(std::nan("")) == "nan");

    // An exact expansion reads back as the very same double, for all scales.
    std::mt19937_64 rng(7);
    for (int i = 0; i < 2000; ++i) {
      std::uint64_t bits = rng();
      double x;
      std::memcpy(&x, &bits, sizeof x);
      if (!std::isfinite(x)) continue;
      const std::string s = mpt::exact_decimal(x);
      CHECK_MESSAGE(std::strtod(s.c_str(), nullptr) == x, s);
    }
  }

  TEST_CASE("shortest decimals round-trip and are short") {
    CHECK(mpt::shortest_decimal(0.1f) == "0.1");
    CHECK(mpt::shortest_decimal(65504.0f) == "65504");
    CHECK(mpt::shortest_decimal(std::ldexp(1.0f, -24)) == "5.9604645e-08");
    CHECK(mpt::shortest_decimal(0.1) == "0.1");
    CHECK(mpt::power_of_two_or_decimal(std::ldexp(1.0, -14)) == "2^-14");
    CHECK(mpt::power_of_two_or_decimal(-0.25) == "-2^-2");
    CHECK(mpt::power_of_two_or_decimal(65504.0) == "65504");
  }

  TEST_CASE("every code of the 16- and 8-bit formats: neighbours, ulp, fields") {
    for (const char* name : {"fp16", "bf16", "e4m3", "e5m2"}) {
      const std::string format_name = name;
      CAPTURE(format_name);
      const mpt::Format& f = fmt(name);
      const int bits = 1 + f.spec.exponent_bits + f.spec.mantissa_bits;
      // Every non-NaN value of the format, in order (±0 as one value).
      std::vector<float> values;
      for (std::uint32_t c = 0; c < (1u << bits); ++c) {
        const float v = mpt::decode(c, f.spec);
        if (!std::isnan(v)) values.push_back(v);
      }
      std::sort(values.begin(), values.end());
      values.erase(std::unique(values.begin(), values.end()), values.end());

      int failures = 0;
      for (std::uint32_t c = 0; c < (1u << bits) && failures < 10; ++c) {
        const float v = mpt::decode(c, f.spec);
        const mpt::Explanation e = mpt::explain(v, f);
        bool ok = true;
        if (std::isinf(v) && f.default_overflow == mpt::OverflowMode::saturate) {
          // e5m2 has inf codes, but its default cast saturates them to ±max.
          ok = std::fabs(e.stored) == mpt::format_max(f.spec) && std::signbit(e.stored) == std::signbit(v);
        } else if (std::isnan(v)) {
          ok = e.kind == mpt::ValueKind::nan && !e.next_below && !e.next_above;
        } else {
          ok = ok && e.code == c && e.stored_exact == mpt::exact_decimal(static_cast<double>(v));
          ok = ok && e.sign_field + e.exponent_field + e.mantissa_field == [&] {
            std::string s;
            for (int b = bits - 1; b >= 0; --b) s += ((c >> b) & 1u) ? '1' : '0';
            return s;
          }();
          const auto it = std::lower_bound(values.begin(), values.end(), v);
          const bool has_below = it != values.begin();
          const bool has_above = it + 1 != values.end();
          ok = ok && has_below == static_cast<bool>(e.next_below) &&
               has_above == static_cast<bool>(e.next_above);
          if (ok && has_below) ok = *e.next_below == *(it - 1);
          if (ok && has_above) ok = *e.next_above == *(it + 1);
          // The ulp is the gap to the next larger magnitude.
          if (ok && std::isfinite(v) && v >= 0 && e.next_above && std::isfinite(*e.next_above))
            ok = static_cast<double>(*e.next_above) - v == e.ulp;
          ok = ok && e.abs_error == 0 && e.outcome == mpt::classify(v, f.spec);
        }
        if (!ok) {
          ++failures;
          FAIL_CHECK("code " << c << " value " << v << ":\n" << mpt::render_text(e));
        }
      }
      CHECK(failures == 0);
    }
  }

  TEST_CASE("explain agrees with round_value and classify on random floats") {
    std::mt19937 rng(2024);
    std::uniform_int_distribution<std::uint32_t> any;
    std::uniform_real_distribution<float> exponent(-40.0f, 20.0f);
    for (const mpt::Format& f : mpt::all_formats()) {
      const std::string format_name(f.name);
      CAPTURE(format_name);
      int failures = 0;
      for (int i = 0; i < 20000 && failures < 10; ++i) {
        float x;
        if (i % 2) {
          const std::uint32_t u = any(rng);
          std::memcpy(&x, &u, sizeof x);
        } else {
          x = std::exp2(exponent(rng)) * (any(rng) & 1u ? -1.0f : 1.0f);
        }
        const mpt::Explanation e = mpt::explain(x, f);
        const float r = mpt::round_value(x, f);
        std::uint32_t ur, us;
        std::memcpy(&ur, &r, sizeof r);
        std::memcpy(&us, &e.stored, sizeof us);
        const bool same = (std::isnan(r) && std::isnan(e.stored)) || ur == us;
        if (!same || e.outcome != mpt::classify(x, f.spec) ||
            (e.outcome != mpt::RangeClass::overflow && std::isfinite(e.stored) &&
             std::fabs(e.error_ulps) > 0.5)) {
          ++failures;
          FAIL_CHECK("x = " << mpt::shortest_decimal(x) << ": round_value " << r << "\n"
                            << mpt::render_text(e));
        }
      }
    }
  }

}  // TEST_SUITE
