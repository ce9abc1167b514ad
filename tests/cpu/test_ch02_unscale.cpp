// Chapter 02 — loss scaling and FP32 master weights: the fused
// unscale-and-check on the CPU (src/mpt/unscale.*).
// Depends on: mpt/unscale.hpp, mpt/scaler_math.hpp (the per-element function
// that is the reference here), test_support.hpp (bits). Every array version
// — portable, AVX2, single and multi-tensor — must write the bits the
// element loop writes, NaN payloads included, and report the same flag.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "mpt/amp/scaler_math.hpp"
#include "mpt/amp/unscale.hpp"
#include "test_support.hpp"

using namespace mpt;

namespace {

using mpt_test::bits;
using mpt_test::from_bits;

const float kInf = std::numeric_limits<float>::infinity();

/// The reference: the shared per-element function, one element at a time.
bool reference(std::vector<float>& g, float inv_scale) {
  bool found = false;
  for (float& x : g) found |= mpt::unscale_and_check(x, inv_scale);
  return found;
}

/// The implementations under test (AVX2 only where this CPU has it).
std::vector<Implementation> implementations() {
  std::vector<Implementation> v{Implementation::portable, Implementation::automatic};
  if (avx2_available()) v.push_back(Implementation::avx2);
  return v;
}
const char* name_of(Implementation i) {
  switch (i) {
    case Implementation::portable: return "portable";
    case Implementation::avx2: return "avx2";
    case Implementation::automatic: break;
  }
  return "automatic";
}

/// Bit-for-bit comparison with llm.c-style diagnostics: the first few
/// mismatches, then the count.
bool same_bits(const std::vector<float>& want, const std::vector<float>& got, const char* what) {
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
std::vector<float> adversarial(std::size_t n, std::uint32_t seed) {
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
std::vector<float> finite_gradients(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-30, 20);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(d(rng), e(rng));
  return v;
}

// Power of two, not a power of two (one fp32 rounding per element), 1 (no
// write at all), above 1 (the multiply can overflow), 0 and inf.
const float kInvScales[] = {
    0x1p-16f, 1.0f / 3.0f, 1.0f, 0x1p+10f, 0.0f, kInf, static_cast<float>(1.0 / 65536.0 / 3.0)};

}  // namespace

TEST_CASE("fused unscale-and-check: every implementation equals the element loop bit for bit") {
  // Sizes around the vector widths and offsets that misalign the pointer, so
  // the aligned head, the 16-wide body, the 8-wide step and the tail all run.
  std::vector<float> pool = adversarial(4096 + 64, 7);
  for (Implementation impl : implementations())
    for (float inv : kInvScales)
      for (std::size_t offset : {0u, 1u, 3u, 7u})
        for (std::size_t n : {0u, 1u, 5u, 7u, 8u, 9u, 15u, 16u, 17u, 31u, 33u, 100u, 4096u}) {
          CAPTURE(name_of(impl));
          CAPTURE(inv);
          CAPTURE(offset);
          CAPTURE(n);
          std::vector<float> want(pool.begin() + offset, pool.begin() + offset + n);
          std::vector<float> buf(pool);  // the call sees g at pool + offset
          const bool want_found = reference(want, inv);
          const bool got_found = unscale_and_check(buf.data() + offset, n, inv, impl);
          std::vector<float> got(buf.begin() + offset, buf.begin() + offset + n);
          CHECK(got_found == want_found);
          CHECK(same_bits(want, got, name_of(impl)));
          // Nothing outside [offset, offset + n) is touched.
          CHECK(std::memcmp(buf.data(), pool.data(), offset * 4) == 0);
          CHECK(std::memcmp(buf.data() + offset + n, pool.data() + offset + n,
                            (pool.size() - offset - n) * 4) == 0);
        }
}

TEST_CASE("fused unscale-and-check: the flag sees one inf or NaN wherever it sits") {
  for (Implementation impl : implementations())
    for (float bad : {kInf, -kInf, NAN, from_bits(0x7f800001u), from_bits(0xffffffffu)})
      for (std::size_t offset : {0u, 2u})
        for (std::size_t pos = 0; pos < 45; ++pos) {
          CAPTURE(name_of(impl));
          CAPTURE(pos);
          std::vector<float> buf = finite_gradients(48, 3);
          std::vector<float> want(buf.begin() + offset, buf.end());
          want[pos] = buf[offset + pos] = bad;
          reference(want, 0x1p-8f);
          CHECK(unscale_and_check(buf.data() + offset, 45, 0x1p-8f, impl));
          // Every element is unscaled, those after the inf included.
          CHECK(same_bits(std::vector<float>(want.begin(), want.begin() + 45),
                          std::vector<float>(buf.begin() + offset, buf.begin() + offset + 45),
                          name_of(impl)));
          CHECK(any_nonfinite(buf.data() + offset, 45, impl));
        }
}

TEST_CASE("fused unscale-and-check: the extremes of the finite range are not flagged") {
  for (Implementation impl : implementations()) {
    std::vector<float> g = {FLT_MAX, -FLT_MAX, FLT_MIN, FLT_TRUE_MIN, -FLT_TRUE_MIN, 0.0f,
                            -0.0f,   65504.0f, 1e30f,   -1e-40f,      3.0f,          0.5f};
    for (int rep = 0; rep < 3; ++rep) g.insert(g.end(), g.begin(), g.begin() + 12);
    std::vector<float> want = g;
    CHECK_FALSE(reference(want, 0x1p-16f));
    CHECK_FALSE(unscale_and_check(g.data(), g.size(), 0x1p-16f, impl));
    CHECK(same_bits(want, g, name_of(impl)));
    CHECK_FALSE(any_nonfinite(g.data(), g.size(), impl));
    // A scale below 1 (inv_scale 2^10) makes FLT_MAX overflow in the multiply;
    // the flag is about the scaled input, as in PyTorch, so it stays false.
    std::vector<float> h = {FLT_MAX, 1.0f};
    CHECK_FALSE(unscale_and_check(h.data(), h.size(), 0x1p+10f, impl));
    CHECK(h[0] == kInf);
  }
}

TEST_CASE("fused unscale-and-check: inv_scale 1 leaves the data untouched, signalling NaNs too") {
  for (Implementation impl : implementations()) {
    std::vector<float> g = adversarial(77, 11);
    const std::vector<float> before = g;
    CHECK(unscale_and_check(g.data(), g.size(), 1.0f, impl));
    CHECK(same_bits(before, g, name_of(impl)));  // 0x7f800001 is not quieted
    unscale(g.data(), g.size(), 1.0f, impl);
    CHECK(same_bits(before, g, name_of(impl)));
  }
}

TEST_CASE("multi-tensor unscale-and-check: every tensor unscaled, one flag for the list") {
  // Mixed sizes, an empty tensor and a null one, and misaligned starts, all
  // carved out of one flat buffer.
  const std::size_t sizes[] = {1000, 0, 3, 257, 1, 4099, 16, 0, 77};
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  for (Implementation impl : implementations())
    for (float inv : kInvScales)
      for (std::size_t inf_at : {std::size_t{0}, std::size_t{1003}, total - 1, total}) {
        CAPTURE(name_of(impl));
        CAPTURE(inv);
        CAPTURE(inf_at);
        std::vector<float> flat = finite_gradients(total, 5);
        if (inf_at < total) flat[inf_at] = (inf_at % 2) ? -kInf : NAN;
        std::vector<float> want = flat;
        const bool want_found = reference(want, inv);
        TensorList list;
        std::size_t at = 0;
        for (std::size_t s : sizes) {
          list.emplace_back(s ? flat.data() + at : nullptr, s);
          at += s;
        }
        CHECK(unscale_and_check(list, inv, impl) == want_found);
        CHECK(want_found == (inf_at < total));
        CHECK(same_bits(want, flat, name_of(impl)));
      }
}

TEST_CASE("two-pass baseline: same bits and flag as the fused pass for scales >= 1") {
  for (Implementation impl : implementations())
    for (float inv : {0x1p-16f, 1.0f / 3.0f, 1.0f, 0x1p-24f})
      for (std::size_t inf_at : {std::size_t{5}, std::size_t{40000}}) {
        std::vector<float> a = finite_gradients(40000, 9);
        if (inf_at < a.size()) a[inf_at] = kInf;
        std::vector<float> b = a;
        const TensorList la{{a.data(), 12345}, {a.data() + 12345, a.size() - 12345}};
        const TensorList lb{{b.data(), 12345}, {b.data() + 12345, b.size() - 12345}};
        CHECK(unscale_and_check(la, inv, impl) == unscale_then_check(lb, inv, impl));
        CHECK(same_bits(a, b, name_of(impl)));
      }
  // Where they differ, as documented: a scale below 1 whose multiply overflows.
  std::vector<float> g = {FLT_MAX};
  CHECK(unscale_then_check({{g.data(), 1}}, 2.0f));
  g = {FLT_MAX};
  CHECK_FALSE(unscale_and_check({{g.data(), 1}}, 2.0f));
}

TEST_CASE("any_nonfinite: blocks, early exit and tails agree with the element test") {
  std::vector<float> g = finite_gradients(5000, 13);
  for (Implementation impl : implementations()) {
    for (std::size_t n : {0u, 1u, 31u, 32u, 33u, 1023u, 1024u, 1025u, 5000u})
      CHECK_FALSE(any_nonfinite(g.data(), n, impl));
    for (std::size_t pos : {0u, 31u, 32u, 1023u, 1024u, 4990u, 4999u}) {
      std::vector<float> h = g;
      h[pos] = NAN;
      CHECK(any_nonfinite(h.data(), h.size(), impl));
      CHECK_FALSE(any_nonfinite(h.data(), pos, impl));  // stops just before it
    }
  }
}

TEST_CASE("asking for AVX2 where there is none is a clear error") {
  if (avx2_available()) {
    float x = 1.0f;
    CHECK_NOTHROW(unscale_and_check(&x, 1, 0.5f, Implementation::avx2));
  } else {
    float x = 1.0f;
    CHECK_THROWS_AS(unscale_and_check(&x, 1, 0.5f, Implementation::avx2), std::invalid_argument);
  }
}
