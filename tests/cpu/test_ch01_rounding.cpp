// Chapter 01 — rounding float → format: the boundary cases, an independent
// oracle (with and without flush-to-zero), stochastic rounding's
// expectation. The AVX2 path is held to the portable one in
// test_ch01_rounding_avx2.cpp (Skipped on a CPU without AVX2).
// Depends on: mpt/rounding.hpp, mpt/storage.hpp, test_support.hpp (bits),
// rounding_values.hpp (boundary_values, flush_threshold_values).
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "mpt/formats/rounding.hpp"
#include "mpt/formats/storage.hpp"
#include "rounding_values.hpp"
#include "test_support.hpp"

using namespace mpt;

namespace {

using mpt_test::bits;
using mpt_test::boundary_values;
using mpt_test::from_bits;
bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b); }

const Format& F(const char* n) { return format_named(n); }

// An independent RNE/RTZ oracle written with double arithmetic and
// nearbyint/trunc instead of bit manipulation. Flush-to-zero as documented:
// a result (after rounding) below the smallest normal 2^emin becomes ±0.
float oracle(float x, const Format& f, RoundingMode mode, OverflowMode ov,
             SubnormalMode sub = SubnormalMode::keep) {
  if (std::isnan(x)) return std::copysign(NAN, x);
  const Limits l = limits_of(f.spec);
  if (std::isinf(x))
    return ov == OverflowMode::saturate ? std::copysign(static_cast<float>(l.max), x) : (l.has_inf ? x : NAN);
  if (x == 0) return x;
  const double ax = std::fabs(static_cast<double>(x));
  int e;
  std::frexp(ax, &e);  // ax = f * 2^e, f in [0.5, 1): exponent of ax is e - 1
  const int q = std::max(e - 1, l.emin) - f.spec.mantissa_bits;
  const double scaled = std::ldexp(ax, -q);
  const double r = mode == RoundingMode::nearest_even ? std::nearbyint(scaled) : std::trunc(scaled);
  double y = std::ldexp(r, q);
  if (y > l.max) {
    if (ov == OverflowMode::saturate || mode == RoundingMode::toward_zero) y = l.max;
    else y = l.has_inf ? INFINITY : NAN;
  }
  if (sub == SubnormalMode::flush && y < std::ldexp(1.0, l.emin)) y = 0.0;
  return static_cast<float>(std::copysign(y, static_cast<double>(x)));
}

}  // namespace

TEST_CASE("fp16 boundaries: 65504 is the max, 65520 is where inf starts") {
  const Format& h = F("fp16");
  CHECK(round_value(65504.0f, h) == 65504.0f);
  CHECK(round_value(65519.996f, h) == 65504.0f);
  CHECK(std::isinf(round_value(65520.0f, h)));
  CHECK(std::isinf(round_value(65536.0f, h)));  // the usual initial loss scale
  CHECK(round_value(std::ldexp(1.0f, -24), h) == std::ldexp(1.0f, -24));
  CHECK(round_value(std::ldexp(1.0f, -25), h) == 0.0f);  // tie to even (0)
  CHECK(round_value(3 * std::ldexp(1.0f, -26), h) == std::ldexp(1.0f, -24));
  CHECK(round_value(3 * std::ldexp(1.0f, -25), h) == std::ldexp(1.0f, -23));  // tie to even (2)
  CHECK(std::signbit(round_value(-1e-9f, h)));
  CHECK(round_value(1.0f + std::ldexp(1.0f, -11), h) == 1.0f);  // tie, stays even
  CHECK(round_value(1.0f + 3 * std::ldexp(1.0f, -11), h) == 1.0f + std::ldexp(1.0f, -9));
  CHECK(round_value(0.1f, h) == 0.0999755859375f);
}

TEST_CASE("overflow conventions: inf, saturate, and E4M3's NaN") {
  RoundingOptions sat;
  sat.overflow = OverflowMode::saturate;
  RoundingOptions inf;
  inf.overflow = OverflowMode::infinity;
  CHECK(round_value(1e6f, F("fp16"), sat) == 65504.0f);
  CHECK(round_value(-INFINITY, F("fp16"), sat) == -65504.0f);
  CHECK(round_value(1000.0f, F("e4m3")) == 448.0f);  // FP8 default saturates
  CHECK(round_value(463.99f, F("e4m3")) == 448.0f);
  // 464 is the tie between 448 (fraction 110) and 480 (111): even wins
  CHECK(round_value(464.0f, F("e4m3"), inf) == 448.0f);
  CHECK(std::isnan(round_value(464.01f, F("e4m3"), inf)));  // no inf in E4M3
  CHECK(std::isnan(round_value(INFINITY, F("e4m3"), inf)));
  CHECK(std::isinf(round_value(61440.0f, F("e5m2"), inf)));
  CHECK(round_value(61439.0f, F("e5m2"), inf) == 57344.0f);
  CHECK(round_value(1e9f, F("e5m2")) == 57344.0f);
  CHECK(std::isinf(round_value(FLT_MAX, F("bf16"))));  // rounds up past bf16 max
  RoundingOptions rtz;
  rtz.mode = RoundingMode::toward_zero;
  CHECK(round_value(1e6f, F("fp16"), rtz) == 65504.0f);  // IEEE: RTZ never overflows to inf
  CHECK(std::isinf(round_value(INFINITY, F("fp16"), rtz)));
  CHECK(round_value(1.0f + 0.99f * std::ldexp(1.0f, -10), F("fp16"), rtz) == 1.0f);
  CHECK(round_value(-2.9f, F("e4m3"), rtz) == -2.75f);
}

TEST_CASE("flush-to-zero removes results below the smallest normal") {
  RoundingOptions ftz;
  ftz.subnormals = SubnormalMode::flush;
  CHECK(round_value(std::ldexp(1.0f, -20), F("fp16"), ftz) == 0.0f);
  CHECK(std::signbit(round_value(-std::ldexp(1.0f, -20), F("fp16"), ftz)));
  CHECK(round_value(std::ldexp(1.0f, -14), F("fp16"), ftz) == std::ldexp(1.0f, -14));
  CHECK(round_value(std::ldexp(1.0f, -20), F("fp16")) == std::ldexp(1.0f, -20));
}

TEST_CASE("flush-to-zero at the threshold: fp16 values in [2^-15, 2^-14), portable path") {
  // The subnormals just below fp16's smallest normal 2^-14 flush; 2^-14 and
  // what rounds up to it stay. Written out by hand, so a threshold one
  // binade off (or <= for <) fails here without AVX2.
  RoundingOptions ftz;
  ftz.subnormals = SubnormalMode::flush;
  RoundingOptions rtz_ftz = ftz;
  rtz_ftz.mode = RoundingMode::toward_zero;
  const float min_normal = std::ldexp(1.0f, -14);
  const struct {
    float x, rne, rtz;  // the input, its flushed RNE and RTZ results
  } cases[] = {
      {std::ldexp(1.0f, -15), 0.0f, 0.0f},                         // half the smallest normal
      {1.5f * std::ldexp(1.0f, -15), 0.0f, 0.0f},                  // a subnormal in between
      {min_normal - std::ldexp(1.0f, -24), 0.0f, 0.0f},            // the largest subnormal, 0x03ff
      {min_normal - std::ldexp(1.0f, -25), min_normal, 0.0f},      // the tie above it: to even, 2^-14
      {std::nextafter(min_normal, 0.0f), min_normal, 0.0f},        // rounds up to the normal under RNE
      {min_normal, min_normal, min_normal},                        // the smallest normal stays
      {std::nextafter(min_normal, 1.0f), min_normal, min_normal},  // and so does what is just above
  };
  for (const auto& c : cases) {
    CAPTURE(c.x);
    for (float sign : {1.0f, -1.0f}) {
      const float x = sign * c.x;
      CHECK(bits(round_value(x, F("fp16"), ftz)) == bits(sign * c.rne));  // -0 for a negative flush
      CHECK(bits(round_value(x, F("fp16"), rtz_ftz)) == bits(sign * c.rtz));
      float out = 1.0f;
      round_array(&x, &out, 1, F("fp16"), ftz, 0, Implementation::portable);
      CHECK(bits(out) == bits(sign * c.rne));
      // Kept, not flushed, without the option: the input is an fp16 subnormal or rounds to one.
      if (c.rne == 0.0f) CHECK(round_value(x, F("fp16")) != 0.0f);
    }
  }
}

TEST_CASE("RNE and RTZ agree with an independent double-precision oracle, subnormals kept or flushed") {
  std::vector<float> xs = boundary_values();  // flush_threshold_values() of every format included
  std::mt19937 gen(12345);
  for (int i = 0; i < 300000; ++i) xs.push_back(from_bits(gen()));
  for (std::uint64_t u = 0; u < (1ull << 32); u += 65521)
    xs.push_back(from_bits(static_cast<std::uint32_t>(u)));
  for (const Format& f : all_formats()) {
    for (RoundingMode mode : {RoundingMode::nearest_even, RoundingMode::toward_zero}) {
      for (OverflowMode ov : {OverflowMode::infinity, OverflowMode::saturate})
        for (SubnormalMode sub : {SubnormalMode::keep, SubnormalMode::flush}) {
          CAPTURE(f.name);
          CAPTURE(static_cast<int>(mode));
          CAPTURE(static_cast<int>(ov));
          CAPTURE(static_cast<int>(sub));
          RoundingOptions o;
          o.mode = mode;
          o.overflow = ov;
          o.subnormals = sub;
          std::size_t bad = 0;
          for (float x : xs) {
            const float got = round_value(x, f, o), want = oracle(x, f, mode, ov, sub);
            if (!same(got, want) && bad++ < 3)
              MESSAGE(f.name << ": x=" << x << " (0x" << std::hex << bits(x) << std::dec << ") got " << got
                             << " want " << want);
          }
          CHECK(bad == 0);
          // The portable array loop gives the same bits.
          std::vector<float> arr(xs.size());
          round_array(xs.data(), arr.data(), xs.size(), f, o, 0, Implementation::portable);
          std::size_t arr_bad = 0;
          for (std::size_t i = 0; i < xs.size(); ++i)
            arr_bad += !same(arr[i], oracle(xs[i], f, mode, ov, sub));
          CHECK(arr_bad == 0);
        }
    }
  }
}

TEST_CASE("stochastic rounding is unbiased, reproducible, and exact on representable values") {
  const Format& h = F("fp16");
  RoundingOptions sr;
  sr.mode = RoundingMode::stochastic;
  sr.seed = 7;
  // 1 + 0.25 ulp: rounds up with probability 1/4.
  const float x = 1.0f + 0.25f * std::ldexp(1.0f, -10);
  const std::size_t n = 1 << 16;
  std::vector<float> in(n, x), out(n), again(n);
  round_array(in.data(), out.data(), n, h, sr);
  round_array(in.data(), again.data(), n, h, sr);
  CHECK(out == again);
  std::size_t up = 0;
  for (float y : out) {
    REQUIRE((y == 1.0f || y == 1.0f + std::ldexp(1.0f, -10)));
    up += y > 1.0f;
  }
  const double p = static_cast<double>(up) / n;
  CHECK(p == doctest::Approx(0.25).epsilon(0.04));  // 4 sigma is ~0.0068 absolute
  // a different seed gives different draws
  sr.seed = 8;
  round_array(in.data(), again.data(), n, h, sr);
  CHECK(out != again);
  // values already in the format never move
  for (float v : {1.0f, 65504.0f, std::ldexp(1.0f, -24), -3.5f})
    for (std::uint64_t i = 0; i < 100; ++i) CHECK(round_value(v, h, sr, i) == v);
  // far below the smallest subnormal, SR still rounds up with the right odds
  const float tiny = std::ldexp(1.0f, -30);  // 2^-6 of fp16's min subnormal
  std::size_t nonzero = 0;
  for (std::uint64_t i = 0; i < n; ++i) nonzero += round_value(tiny, h, sr, i) != 0.0f;
  CHECK(static_cast<double>(nonzero) / n == doctest::Approx(1.0 / 64).epsilon(0.15));
}

TEST_CASE("chunked calls agree with one call (stochastic indices are global)") {
  RoundingOptions sr;
  sr.mode = RoundingMode::stochastic;
  sr.seed = 3;
  std::vector<float> xs(1001);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = 1.0f + static_cast<float>(i) * 1e-5f;
  std::vector<float> whole(xs.size()), parts(xs.size());
  round_array(xs.data(), whole.data(), xs.size(), F("bf16"), sr);
  round_array(xs.data(), parts.data(), 333, F("bf16"), sr, 0);
  round_array(xs.data() + 333, parts.data() + 333, xs.size() - 333, F("bf16"), sr, 333);
  CHECK(whole == parts);
  // an index range straddling 2^32: element i draws with index base + i, as
  // round_value does (the AVX2 file checks its scalar lanes against this loop)
  const std::uint64_t base = (1ull << 32) - 5;
  std::vector<float> v(16, 1.001f), a(16);
  round_array(v.data(), a.data(), 16, F("fp16"), sr, base, Implementation::portable);
  for (std::size_t i = 0; i < 16; ++i) {
    CHECK(bits(a[i]) == bits(round_value(v[i], F("fp16"), sr, base + i)));
    CHECK((a[i] == 1.0f + 0x1p-10f || a[i] == 1.0f + 0x1p-9f));  // the two fp16 neighbours of 1.001
  }
}

TEST_CASE("storage types hold exactly the rounded values in their real sizes") {
  std::vector<float> xs = boundary_values();
  std::mt19937 gen(5);
  for (int i = 0; i < 100000; ++i) xs.push_back(from_bits(gen()));
  const std::size_t n = xs.size();
  std::vector<Eigen::half> h(n);
  std::vector<Eigen::bfloat16> b(n);
  std::vector<Fp8E4M3> e4(n);
  std::vector<Fp8E5M2> e5(n);
  to_fp16(xs.data(), h.data(), n);
  to_bf16(xs.data(), b.data(), n);
  to_e4m3(xs.data(), e4.data(), n);
  to_e5m2(xs.data(), e5.data(), n);
  std::vector<float> back(n);
  struct Case {
    const char* name;
    std::function<void()> decode;
  };
  std::size_t bad = 0;
  auto compare = [&](const char* name) {
    for (std::size_t i = 0; i < n; ++i) {
      const float want = round_value(xs[i], F(name));
      if (!same(back[i], want) && bad++ < 3)
        MESSAGE(name << ": x=" << xs[i] << " stored " << back[i] << " want " << want);
    }
  };
  from_fp16(h.data(), back.data(), n);
  compare("fp16");
  from_bf16(b.data(), back.data(), n);
  compare("bf16");
  from_e4m3(e4.data(), back.data(), n);
  compare("e4m3");
  from_e5m2(e5.data(), back.data(), n);
  compare("e5m2");
  CHECK(bad == 0);
  // Eigen agrees on fp16 and bf16 (NaN payloads aside)
  std::size_t eigen_bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(xs[i])) continue;
    eigen_bad += Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(xs[i])) !=
                 Eigen::numext::bit_cast<std::uint16_t>(h[i]);
    eigen_bad += Eigen::numext::bit_cast<std::uint16_t>(Eigen::bfloat16(xs[i])) !=
                 Eigen::numext::bit_cast<std::uint16_t>(b[i]);
  }
  CHECK(eigen_bad == 0);
}

TEST_CASE("the array decoders give decode()'s bits for every code, NaN canonicalised") {
  // from_fp16/from_bf16 run F16C or a shift eight at a time where the CPU has
  // them, from_e4m3/from_e5m2 a table: each must equal the scalar decode() on
  // every code, at every offset (the vector loop's tail is scalar).
  std::vector<std::uint16_t> codes16(1u << 16);
  for (std::uint32_t c = 0; c < codes16.size(); ++c) codes16[c] = static_cast<std::uint16_t>(c);
  std::vector<float> out(codes16.size() + 8);
  std::size_t bad = 0;
  for (std::size_t offset : {0, 1, 5}) {
    const std::size_t n = codes16.size() - offset;
    from_fp16(reinterpret_cast<const Eigen::half*>(codes16.data() + offset), out.data(), n);
    for (std::size_t i = 0; i < n; ++i)
      bad += bits(out[i]) != bits(decode(codes16[offset + i], formats::fp16));
    from_bf16(reinterpret_cast<const Eigen::bfloat16*>(codes16.data() + offset), out.data(), n);
    for (std::size_t i = 0; i < n; ++i)
      bad += bits(out[i]) != bits(decode(codes16[offset + i], formats::bf16));
  }
  std::vector<std::uint8_t> codes8(256);
  for (std::uint32_t c = 0; c < 256; ++c) codes8[c] = static_cast<std::uint8_t>(c);
  from_e4m3(reinterpret_cast<const Fp8E4M3*>(codes8.data()), out.data(), 256);
  for (std::uint32_t c = 0; c < 256; ++c) bad += bits(out[c]) != bits(decode(c, formats::e4m3));
  from_e5m2(reinterpret_cast<const Fp8E5M2*>(codes8.data()), out.data(), 256);
  for (std::uint32_t c = 0; c < 256; ++c) bad += bits(out[c]) != bits(decode(c, formats::e5m2));
  CHECK(bad == 0);
  // NaN codes decode to the quiet NaN 0x7fc00000 with their sign, payload
  // dropped, in the vector loop too (eight at once).
  std::vector<std::uint16_t> snan(8, 0xfd01);  // a negative fp16 NaN with a payload
  from_fp16(reinterpret_cast<const Eigen::half*>(snan.data()), out.data(), 8);
  CHECK(bits(out[3]) == 0xffc00000u);
}
