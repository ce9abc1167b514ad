// Chapter 02 — loss scaling and FP32 master weights: the checks of the fused
// unscale-and-check (src/mpt/amp/unscale.*), one function per behaviour,
// run for one implementation at a time. test_ch02_unscale.cpp runs them
// for the portable and the automatic path; test_ch02_unscale_avx2.cpp for
// the AVX2 path, and reports Skipped (exit 77) on a CPU without AVX2.
// Header-only (the CMake glob picks up test_ch*_*.cpp only). Depends on:
// mpt/amp/unscale.hpp, test_support.hpp (bits), doctest.
//
// The expected values are computed here from the definition, not by the
// library's per-element function: x * inv_scale by plain multiplication
// (x left as it is when inv_scale is 1), and the flag from std::isfinite on
// the INPUT, before the multiply (PyTorch's
// _amp_foreach_non_finite_check_and_unscale_). A finite x whose product
// overflows to inf is therefore not an inf found.
#pragma once

#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "mpt/amp/unscale.hpp"
#include "test_support.hpp"

namespace unscale_checks {

using mpt::Implementation;
using mpt::TensorList;
using mpt_test::bits;
using mpt_test::from_bits;

inline const float kInf = std::numeric_limits<float>::infinity();

/// The expected result, written out: the products and whether any input
/// was non-finite.
inline bool expected(std::vector<float>& g, float inv_scale) {
  bool found = false;
  for (float& x : g) {
    if (!std::isfinite(x)) found = true;
    if (inv_scale != 1.0f) x = x * inv_scale;
  }
  return found;
}

inline const char* name_of(Implementation i) {
  switch (i) {
    case Implementation::portable: return "portable";
    case Implementation::avx2: return "avx2";
    case Implementation::automatic: break;
  }
  return "automatic";
}

/// Bit-for-bit comparison with llm.c-style diagnostics: the first few
/// mismatches, then the count.
inline bool same_bits(const std::vector<float>& want, const std::vector<float>& got, const char* what) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (bits(want[i]) == bits(got[i])) continue;
    if (bad++ < 5)
      std::printf("%s: [%zu] want %#010x (%a) got %#010x (%a)\n", what, i, bits(want[i]), want[i],
                  bits(got[i]), got[i]);
  }
  if (bad) std::printf("%s: %zu of %zu differ\n", what, bad, want.size());
  return bad == 0;
}

/// Every kind of float: random bit patterns (so NaNs with payloads, both
/// infinities, subnormals and the whole exponent range occur), plus the
/// hand-picked edges at the front.
inline std::vector<float> adversarial(std::size_t n, std::uint32_t seed) {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          kInf,
                          -kInf,
                          NAN,
                          -NAN,
                          from_bits(0x7f800001u),  // signalling NaN with a payload
                          from_bits(0xffc12345u),  // quiet NaN, negative, with a payload
                          FLT_MAX,
                          -FLT_MAX,
                          FLT_MIN,
                          -FLT_MIN,
                          FLT_TRUE_MIN,
                          -FLT_TRUE_MIN,
                          from_bits(0x007fffffu),
                          65504.0f,
                          65536.0f,
                          1.0f,
                          3.0f,
                          0.1f};
  std::mt19937 rng(seed);
  while (v.size() < n) v.push_back(from_bits(static_cast<std::uint32_t>(rng())));
  v.resize(n);
  return v;
}

/// Finite values only, spread over the range gradients occupy.
inline std::vector<float> finite_gradients(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-30, 20);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(d(rng), e(rng));
  return v;
}

// Power of two, not a power of two (one fp32 rounding per element), 1 (no
// write at all), above 1 (the multiply can overflow), 0 and inf.
inline const float kInvScales[] = {
    0x1p-16f, 1.0f / 3.0f, 1.0f, 0x1p+10f, 0.0f, kInf, static_cast<float>(1.0 / 65536.0 / 3.0)};

/// Sizes around the vector widths and offsets that misalign the pointer, so
/// the aligned head, the 16-wide body, the 8-wide step and the tail all run;
/// nothing outside [offset, offset + n) is touched.
inline void check_against_definition(Implementation impl) {
  const std::vector<float> pool = adversarial(4096 + 64, 7);
  for (float inv : kInvScales)
    for (std::size_t offset : {0u, 1u, 3u, 7u})
      for (std::size_t n : {0u, 1u, 5u, 7u, 8u, 9u, 15u, 16u, 17u, 31u, 33u, 100u, 4096u}) {
        CAPTURE(name_of(impl));
        CAPTURE(inv);
        CAPTURE(offset);
        CAPTURE(n);
        std::vector<float> want(pool.begin() + offset, pool.begin() + offset + n);
        std::vector<float> buf(pool);  // the call sees g at pool + offset
        const bool want_found = expected(want, inv);
        const bool got_found = mpt::unscale_and_check(buf.data() + offset, n, inv, impl);
        std::vector<float> got(buf.begin() + offset, buf.begin() + offset + n);
        CHECK(got_found == want_found);
        CHECK(same_bits(want, got, name_of(impl)));
        CHECK(std::memcmp(buf.data(), pool.data(), offset * 4) == 0);
        CHECK(std::memcmp(buf.data() + offset + n, pool.data() + offset + n,
                          (pool.size() - offset - n) * 4) == 0);
        // The two-pass baseline's first pass writes the same products.
        std::vector<float> two(pool);
        mpt::unscale(two.data() + offset, n, inv, impl);
        CHECK(same_bits(want, std::vector<float>(two.begin() + offset, two.begin() + offset + n),
                        name_of(impl)));
      }
}

/// One inf or NaN wherever it sits is seen, and every element is unscaled,
/// those after it included.
inline void check_flag_positions(Implementation impl) {
  for (float bad : {kInf, -kInf, NAN, from_bits(0x7f800001u), from_bits(0xffffffffu)})
    for (std::size_t offset : {0u, 2u})
      for (std::size_t pos = 0; pos < 45; ++pos) {
        CAPTURE(name_of(impl));
        CAPTURE(pos);
        std::vector<float> buf = finite_gradients(48, 3);
        std::vector<float> want(buf.begin() + offset, buf.begin() + offset + 45);
        want[pos] = buf[offset + pos] = bad;
        CHECK(expected(want, 0x1p-8f));
        CHECK(mpt::unscale_and_check(buf.data() + offset, 45, 0x1p-8f, impl));
        CHECK(same_bits(want, std::vector<float>(buf.begin() + offset, buf.begin() + offset + 45),
                        name_of(impl)));
        CHECK(mpt::any_nonfinite(buf.data() + offset, 45, impl));
      }
}

/// The extremes of the finite range are not flagged; and a finite input
/// whose product overflows (a scale below 1: inv_scale > 1) is unscaled to
/// inf without being flagged, as in PyTorch.
inline void check_extremes_and_product_overflow(Implementation impl) {
  CAPTURE(name_of(impl));
  std::vector<float> g = {FLT_MAX, -FLT_MAX, FLT_MIN, FLT_TRUE_MIN, -FLT_TRUE_MIN, 0.0f,
                          -0.0f,   65504.0f, 1e30f,   -1e-40f,      3.0f,          0.5f};
  for (int rep = 0; rep < 3; ++rep) g.insert(g.end(), g.begin(), g.begin() + 12);
  std::vector<float> want = g;
  CHECK_FALSE(expected(want, 0x1p-16f));
  CHECK_FALSE(mpt::unscale_and_check(g.data(), g.size(), 0x1p-16f, impl));
  CHECK(same_bits(want, g, name_of(impl)));
  CHECK_FALSE(mpt::any_nonfinite(g.data(), g.size(), impl));

  // Finite inputs whose products all overflow, at every length and
  // alignment up to 40: the masked head, the 16-wide body, the 8-wide step
  // and the masked tail each judge the inputs, not the infinite products.
  for (std::size_t offset = 0; offset < 8; ++offset)
    for (std::size_t n = 1; n <= 40; ++n) {
      CAPTURE(offset);
      CAPTURE(n);
      std::vector<float> big(48);
      for (std::size_t i = 0; i < big.size(); ++i)
        big[i] = (i % 3 ? -1.0f : 1.0f) * std::ldexp(1.0f + 0.125f * float(i % 8), 118 + int(i % 10));
      std::vector<float> want(big.begin() + offset, big.begin() + offset + n);
      CHECK_FALSE(expected(want, 0x1p+10f));
      for (float x : want) REQUIRE(std::isinf(x));
      CHECK_FALSE(mpt::unscale_and_check(big.data() + offset, n, 0x1p+10f, impl));
      CHECK(
          same_bits(want, std::vector<float>(big.begin() + offset, big.begin() + offset + n), name_of(impl)));
    }

  // Finite inputs, some of whose products overflow, among ordinary ones.
  std::vector<float> h = finite_gradients(53, 17);
  for (std::size_t i = 0; i < h.size(); i += 4)
    h[i] = (i % 8 ? -1.0f : 1.0f) * std::ldexp(1.5f, 118 + int(i % 10));
  h[1] = FLT_MAX;
  std::size_t infinite_products = 0;
  for (float x : h) {
    REQUIRE(std::isfinite(x));
    infinite_products += std::isinf(x * 0x1p+10f);
  }
  CHECK(infinite_products >= 8);  // the case is there
  std::vector<float> want_h = h;
  CHECK_FALSE(expected(want_h, 0x1p+10f));
  CHECK_FALSE(mpt::unscale_and_check(h.data(), h.size(), 0x1p+10f, impl));
  CHECK(same_bits(want_h, h, name_of(impl)));
  CHECK(h[1] == kInf);
  // The two-pass baseline judges the unscaled values, so it does see an inf.
  std::vector<float> two = finite_gradients(53, 17);
  two[1] = FLT_MAX;
  CHECK(mpt::unscale_then_check({{two.data(), two.size()}}, 0x1p+10f, impl));
}

/// inv_scale 1 leaves the data untouched: not even rewritten, so a
/// signalling NaN stays signalling (a multiply by 1 would quiet it).
inline void check_inv_one_untouched(Implementation impl) {
  std::vector<float> g = adversarial(77, 11);
  const std::vector<float> before = g;
  CHECK(mpt::unscale_and_check(g.data(), g.size(), 1.0f, impl));
  CHECK(same_bits(before, g, name_of(impl)));
  CHECK(bits(g[6]) == 0x7f800001u);
  mpt::unscale(g.data(), g.size(), 1.0f, impl);
  CHECK(same_bits(before, g, name_of(impl)));
}

/// The multi-tensor version: every tensor unscaled, one flag for the list;
/// mixed sizes, an empty tensor and a null one, misaligned starts, carved
/// out of one flat buffer.
inline void check_multi_tensor(Implementation impl) {
  const std::size_t sizes[] = {1000, 0, 3, 257, 1, 4099, 16, 0, 77};
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  for (float inv : kInvScales)
    for (std::size_t inf_at : {std::size_t{0}, std::size_t{1003}, total - 1, total}) {
      CAPTURE(name_of(impl));
      CAPTURE(inv);
      CAPTURE(inf_at);
      std::vector<float> flat = finite_gradients(total, 5);
      if (inf_at < total) flat[inf_at] = (inf_at % 2) ? -kInf : NAN;
      std::vector<float> want = flat;
      const bool want_found = expected(want, inv);
      TensorList list;
      std::size_t at = 0;
      for (std::size_t s : sizes) {
        list.emplace_back(s ? flat.data() + at : nullptr, s);
        at += s;
      }
      CHECK(want_found == (inf_at < total));
      CHECK(mpt::unscale_and_check(list, inv, impl) == want_found);
      CHECK(same_bits(want, flat, name_of(impl)));
    }
}

/// The two-pass baseline: for scales >= 1 the same bits and flag as the
/// fused pass, and both as the definition.
inline void check_two_pass(Implementation impl) {
  for (float inv : {0x1p-16f, 1.0f / 3.0f, 1.0f, 0x1p-24f})
    for (std::size_t inf_at : {std::size_t{5}, std::size_t{40000}}) {
      CAPTURE(name_of(impl));
      CAPTURE(inv);
      CAPTURE(inf_at);
      std::vector<float> a = finite_gradients(40000, 9);
      if (inf_at < a.size()) a[inf_at] = kInf;
      std::vector<float> b = a, want = a;
      const bool want_found = expected(want, inv);
      const TensorList la{{a.data(), 12345}, {a.data() + 12345, a.size() - 12345}};
      const TensorList lb{{b.data(), 12345}, {b.data() + 12345, b.size() - 12345}};
      CHECK(mpt::unscale_and_check(la, inv, impl) == want_found);
      CHECK(mpt::unscale_then_check(lb, inv, impl) == want_found);
      CHECK(same_bits(want, a, name_of(impl)));
      CHECK(same_bits(want, b, name_of(impl)));
    }
}

/// any_nonfinite: blocks, early exit and tails agree with std::isfinite.
inline void check_any_nonfinite(Implementation impl) {
  CAPTURE(name_of(impl));
  std::vector<float> g = finite_gradients(5000, 13);
  for (std::size_t n : {0u, 1u, 31u, 32u, 33u, 1023u, 1024u, 1025u, 5000u})
    CHECK_FALSE(mpt::any_nonfinite(g.data(), n, impl));
  for (std::size_t pos : {0u, 31u, 32u, 1023u, 1024u, 4990u, 4999u})
    for (float bad : {NAN, kInf, -kInf}) {
      std::vector<float> h = g;
      h[pos] = bad;
      CHECK(mpt::any_nonfinite(h.data(), h.size(), impl));
      CHECK_FALSE(mpt::any_nonfinite(h.data(), pos, impl));  // stops just before it
    }
  // The largest finite magnitudes are finite; the smallest non-finite are not.
  for (float edge : {FLT_MAX, -FLT_MAX}) {
    std::vector<float> h = g;
    h[77] = edge;
    CHECK_FALSE(mpt::any_nonfinite(h.data(), h.size(), impl));
  }
  std::vector<float> h = g;
  h[4999] = from_bits(0x7f800001u);
  CHECK(mpt::any_nonfinite(h.data(), h.size(), impl));
}

}  // namespace unscale_checks
