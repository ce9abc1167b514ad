// Chapter 01 — floating-point formats and their limits: the AVX-512 fast
// paths of the fp16/bf16 conversions (src/mpt/formats/rounding_avx512.cpp)
// give the portable functions' bits: every one of the 65536 codes decoded,
// and boundary, random and special fp32 values (NaN payloads, infinities,
// the halfway points, subnormals of both formats) encoded with IEEE RNE; and
// the storage calls that use them agree with the portable loops at every
// length (the 16-wide loop and its tail). Without AVX-512F this program
// exits 77 (CTest: Skipped): there is nothing to compare.
// Depends on: mpt/formats/rounding_avx512.hpp, round_element.hpp,
// format_spec.hpp, storage.hpp, rounding_values.hpp, test_support.hpp.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "mpt/formats/format_spec.hpp"
#include "mpt/formats/round_element.hpp"
#include "mpt/formats/rounding_avx512.hpp"
#include "mpt/formats/storage.hpp"
#include "rounding_values.hpp"
#include "test_support.hpp"

using namespace mpt;
using mpt_test::bits;
using mpt_test::from_bits;

namespace {

std::uint32_t scalar_code(float x, const FormatSpec& spec) {
  return encode_exact(round_to_format(x, spec, RoundingMode::nearest_even, OverflowMode::infinity,
                                      SubnormalMode::keep, 0u),
                      spec);
}

std::vector<float> encode_inputs() {
  std::vector<float> xs = mpt_test::boundary_values();
  std::mt19937 gen(512);
  for (int i = 0; i < 100000; ++i) xs.push_back(from_bits(gen()));
  for (int i = 0; i < 100000; ++i)
    xs.push_back(std::ldexp(static_cast<float>(gen()) / 4294967296.0f, static_cast<int>(gen() % 60) - 40));
  // Every fp16 code's value, and the fp32 values just around each halfway
  // point between neighbouring fp16 values (ties to even, and one ulp off).
  for (std::uint32_t c = 0; c < 0x7c00; ++c) {
    const float lo = decode(c, formats::fp16), hi = decode(c + 1, formats::fp16);
    const float mid = lo + (hi - lo) / 2;
    for (const float v : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      xs.push_back(v);
      xs.push_back(-v);
    }
  }
  // NaNs with payloads, quiet and signalling, of both signs.
  for (const std::uint32_t u : {0x7fc00000u, 0x7fc00001u, 0x7f800001u, 0x7fbfffffu, 0xffc12345u, 0xff800001u})
    xs.push_back(from_bits(u));
  return xs;
}

}  // namespace

TEST_CASE("AVX-512 decode gives decode()'s bits for every fp16 and bf16 code") {
  std::vector<std::uint16_t> codes(65536);
  for (std::uint32_t c = 0; c < 65536; ++c) codes[c] = static_cast<std::uint16_t>(c);
  for (const bool bf16 : {false, true}) {
    const FormatSpec& spec = bf16 ? formats::bf16 : formats::fp16;
    std::vector<float> out(codes.size(), -1.0f);
    REQUIRE(detail::decode16_avx512(codes.data(), out.data(), codes.size(), bf16) == codes.size());
    std::size_t bad = 0;
    for (std::uint32_t c = 0; c < 65536; ++c) bad += bits(out[c]) != bits(decode(c, spec));
    CAPTURE(bf16);
    CHECK(bad == 0);
  }
}

TEST_CASE("AVX-512 encode gives encode_exact(round)'s bits: boundaries, halfway points, NaN payloads") {
  const std::vector<float> xs = encode_inputs();
  for (const bool bf16 : {false, true}) {
    const FormatSpec& spec = bf16 ? formats::bf16 : formats::fp16;
    std::vector<std::uint16_t> out(xs.size(), 0xdead);
    const std::size_t done = detail::encode16_avx512(xs.data(), out.data(), xs.size(), bf16);
    REQUIRE(done == xs.size() / 16 * 16);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < done; ++i)
      if (out[i] != scalar_code(xs[i], spec) && bad++ < 3)
        MESSAGE((bf16 ? "bf16" : "fp16") << ": x=0x" << std::hex << bits(xs[i]) << " avx512 0x" << out[i]
                                         << " scalar 0x" << scalar_code(xs[i], spec) << std::dec);
    CAPTURE(bf16);
    CHECK(bad == 0);
  }
}

TEST_CASE("to_fp16/to_bf16 and from_* agree with the scalar functions at every length near 16") {
  const std::vector<float> xs = encode_inputs();
  for (std::size_t n = 0; n <= 40; ++n) {
    std::vector<Eigen::half> h(n);
    std::vector<Eigen::bfloat16> b(n);
    to_fp16(xs.data(), h.data(), n);
    to_bf16(xs.data(), b.data(), n);
    std::vector<float> hf(n), bfl(n);
    from_fp16(h.data(), hf.data(), n);
    from_bf16(b.data(), bfl.data(), n);
    for (std::size_t i = 0; i < n; ++i) {
      CHECK(Eigen::numext::bit_cast<std::uint16_t>(h[i]) == scalar_code(xs[i], formats::fp16));
      CHECK(Eigen::numext::bit_cast<std::uint16_t>(b[i]) == scalar_code(xs[i], formats::bf16));
      CHECK(bits(hf[i]) == bits(decode(scalar_code(xs[i], formats::fp16), formats::fp16)));
      CHECK(bits(bfl[i]) == bits(decode(scalar_code(xs[i], formats::bf16), formats::bf16)));
    }
  }
}

int main(int argc, char** argv) {
  if (!detail::avx512_conversions_available()) {
    std::printf("SKIPPED %s: this CPU or build has no AVX-512F conversions to compare\n",
                argc > 0 ? argv[0] : "avx512 test");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
