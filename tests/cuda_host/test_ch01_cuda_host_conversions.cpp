// Chapter 01 — floating-point formats and their limits: mpt's rounding
// against two independent implementations, bit for bit.
// Depends on: mpt (rounding.hpp, format.hpp), Eigen (Eigen::half,
// Eigen::bfloat16), and CUDA's headers cuda_fp16.h / cuda_bf16.h / cuda_fp8.h
// used on the host by plain g++ (no GPU, no nvcc). Without those headers the
// program says so and exits 77, which CTest reports as Skipped.
//
// The references:
//   fp16  __float2half_rn          and Eigen::half(float)
//   bf16  __float2bfloat16_rn      and Eigen::bfloat16(float)
//   e4m3  __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)  vs mpt saturate
//         __nv_cvt_float_to_fp8(x, __NV_NOSAT,     __NV_E4M3)  vs mpt infinity
//   e5m2  __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2)  vs mpt saturate
//         __nv_cvt_float_to_fp8(x, __NV_NOSAT,     __NV_E5M2)  vs mpt infinity
//
// NaN: CUDA's host path returns one NaN code with the sign dropped (fp16
// 0x7FFF, bf16 0x7FFF, FP8 0x7F), while mpt returns the canonical quiet NaN
// with the sign kept (fp16 0x7E00/0xFE00, bf16 0x7FC0/0xFFC0, E4M3 0x7F/0xFF,
// E5M2 0x7E/0xFE). Against CUDA a NaN therefore only has to stay a NaN;
// Eigen makes the same choice as mpt, so against Eigen NaNs compare bitwise.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#if defined(MPT_HAVE_CUDA_HEADERS)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <Eigen/Core>
#include <algorithm>
#include <cinttypes>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "mpt/formats/format.hpp"
#include "mpt/formats/rounding.hpp"
#include "sweep_values.hpp"

namespace {

std::uint64_t test_seed() {
  const char* s = std::getenv("MPT_SEED");
  return s ? std::strtoull(s, nullptr, 0) : 20240101u;
}

// Every input the sweep covers, built once: hand-picked boundaries, every
// code and every tie of the four formats (±1 float ulp), random bit
// patterns, and random values spread over each format's range.
const std::vector<float>& sweep_inputs() {
  static const std::vector<float> inputs = [] {
    std::vector<float> v = mpt::test::adversarial_values();
    for (const mpt::FormatSpec& f :
         {mpt::formats::fp16, mpt::formats::bf16, mpt::formats::e4m3, mpt::formats::e5m2}) {
      const std::vector<float> b = mpt::test::code_boundaries(f);
      v.insert(v.end(), b.begin(), b.end());
    }
    // every float from just below fp16's max to past 2^16: the whole
    // overflow neighbourhood, one float ulp (2^-8) apart
    for (float x = 65000.0f; x <= 66000.0f; x = std::nextafter(x, 1e9f)) {
      v.push_back(x);
      v.push_back(-x);
    }
    std::mt19937_64 rng(test_seed());
    mpt::test::append_random_bits(v, 4'000'000, rng);
    for (const mpt::FormatSpec& f :
         {mpt::formats::fp16, mpt::formats::bf16, mpt::formats::e4m3, mpt::formats::e5m2}) {
      mpt::test::append_random_in_range(v, f, 1'000'000, rng);
    }
    return v;
  }();
  return inputs;
}

/// mpt's codes for all inputs through the array API, checked on the way
/// against the one-value API and against round_array (which takes the
/// AVX2/F16C path where the CPU has it), so CUDA checks all three.
std::vector<std::uint32_t> mpt_codes(const mpt::Format& f, mpt::OverflowMode overflow) {
  const std::vector<float>& in = sweep_inputs();
  mpt::RoundingOptions o;
  o.overflow = overflow;
  std::vector<std::uint32_t> codes(in.size());
  mpt::encode_array(in.data(), codes.data(), in.size(), f, o);
  std::vector<float> rounded(in.size());
  mpt::round_array(in.data(), rounded.data(), in.size(), f, o);

  std::size_t bad = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::uint32_t one = mpt::encode_exact(mpt::round_value(in[i], f, o), f.spec);
    const std::uint32_t arr = mpt::encode_exact(rounded[i], f.spec);
    if ((one != codes[i] || arr != codes[i]) && bad++ == 0) {
      std::printf("  %s: mpt's own paths differ at [%zu] x=%a: encode_array %#" PRIx32
                  ", round_value %#" PRIx32 ", round_array %#" PRIx32 "\n",
                  std::string(f.name).c_str(), i, in[i], codes[i], one, arr);
    }
  }
  CHECK_MESSAGE(bad == 0, "encode_array vs round_value vs round_array: ", bad, " mismatches");
  return codes;
}

/// Compare mpt's codes with a reference's, llm.c style: the first few
/// mismatches with index, input, expected (mpt) and got (reference), then
/// the count. With nan_bitwise false, two NaN codes of any sign and payload
/// count as equal.
void compare(const char* what, const mpt::FormatSpec& f, const std::vector<std::uint32_t>& ours,
             const std::vector<std::uint32_t>& theirs, bool nan_bitwise) {
  const std::vector<float>& in = sweep_inputs();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (ours[i] == theirs[i]) continue;
    if (!nan_bitwise && std::isnan(mpt::decode(ours[i], f)) && std::isnan(mpt::decode(theirs[i], f))) {
      continue;
    }
    if (bad++ < 5) {
      std::printf(
          "  %s mismatch at [%zu]: x=%a (%.9g) mpt=%#" PRIx32 " (%.9g) reference=%#" PRIx32 " (%.9g)\n", what,
          i, in[i], in[i], ours[i], mpt::decode(ours[i], f), theirs[i], mpt::decode(theirs[i], f));
    }
  }
  if (bad)
    std::printf("  %s: %zu of %zu inputs differ (seed %" PRIu64 ")\n", what, bad, in.size(), test_seed());
  CHECK_MESSAGE(bad == 0, std::string(what), ": ", bad, " mismatches of ", in.size());
}

template <class Fn>
std::vector<std::uint32_t> reference_codes(Fn&& fn) {
  const std::vector<float>& in = sweep_inputs();
  std::vector<std::uint32_t> out(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = fn(in[i]);
  return out;
}

template <class T>
std::uint16_t bits16(const T& h) {
  static_assert(sizeof(T) == 2, "a 16-bit format");
  std::uint16_t u;
  std::memcpy(&u, &h, sizeof u);
  return u;
}

}  // namespace

TEST_CASE("the sweep covers every fp16 and bf16 code and the tie points") {
  const std::vector<float>& in = sweep_inputs();
  MESSAGE("sweep: ", in.size(), " inputs, seed ", test_seed(),
          "; mpt round_array path: ", mpt::avx2_available() ? "avx2" : "portable");
  CHECK(in.size() > 8'000'000);
  // The boundary values the brief names are in there, both signs.
  for (float x : {65504.0f, std::nextafter(65520.0f, 0.0f), 65520.0f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 448.0f,
                  464.0f, 480.0f, 57344.0f, 61440.0f}) {
    CHECK(std::find(in.begin(), in.end(), x) != in.end());
    CHECK(std::find(in.begin(), in.end(), -x) != in.end());
  }
}

TEST_CASE("fp16: mpt == __float2half_rn == Eigen::half, bit for bit") {
  const mpt::Format& f = mpt::format_named("fp16");
  const auto ours = mpt_codes(f, mpt::OverflowMode::infinity);
  compare("fp16 vs __float2half_rn", f.spec, ours,
          reference_codes([](float x) { return bits16(__float2half_rn(x)); }), false);
  compare("fp16 vs Eigen::half", f.spec, ours,
          reference_codes([](float x) { return bits16(Eigen::half(x)); }), true);
  // The documented NaN difference, pinned so that a change on either side shows.
  CHECK(bits16(__float2half_rn(-std::numeric_limits<float>::quiet_NaN())) == 0x7fff);
  CHECK(mpt::encode_exact(mpt::round_value(-std::numeric_limits<float>::quiet_NaN(), f), f.spec) == 0xfe00);
}

TEST_CASE("bf16: mpt == __float2bfloat16_rn == Eigen::bfloat16, bit for bit") {
  const mpt::Format& f = mpt::format_named("bf16");
  const auto ours = mpt_codes(f, mpt::OverflowMode::infinity);
  compare("bf16 vs __float2bfloat16_rn", f.spec, ours,
          reference_codes([](float x) { return bits16(__float2bfloat16_rn(x)); }), false);
  compare("bf16 vs Eigen::bfloat16", f.spec, ours,
          reference_codes([](float x) { return bits16(Eigen::bfloat16(x)); }), true);
}

TEST_CASE("e4m3: mpt == __nv_cvt_float_to_fp8(E4M3), saturating and not") {
  const mpt::Format& f = mpt::format_named("e4m3");
  compare("e4m3 saturate vs __NV_SATFINITE", f.spec, mpt_codes(f, mpt::OverflowMode::saturate),
          reference_codes([](float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }),
          false);
  compare("e4m3 infinity vs __NV_NOSAT", f.spec, mpt_codes(f, mpt::OverflowMode::infinity),
          reference_codes([](float x) { return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3); }), false);
}

TEST_CASE("e5m2: mpt == __nv_cvt_float_to_fp8(E5M2), saturating and not") {
  const mpt::Format& f = mpt::format_named("e5m2");
  compare("e5m2 saturate vs __NV_SATFINITE", f.spec, mpt_codes(f, mpt::OverflowMode::saturate),
          reference_codes([](float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2); }),
          false);
  compare("e5m2 infinity vs __NV_NOSAT", f.spec, mpt_codes(f, mpt::OverflowMode::infinity),
          reference_codes([](float x) { return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2); }), false);
}

TEST_CASE("decoding every code agrees with CUDA's host conversions back to float") {
  // The other direction is exact, so values (and inf signs) compare with ==.
  auto same = [](float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; };
  std::size_t bad = 0;
  for (std::uint32_t c = 0; c < 0x10000u; ++c) {
    __half_raw hr;
    hr.x = static_cast<unsigned short>(c);
    __nv_bfloat16_raw br;
    br.x = static_cast<unsigned short>(c);
    if (!same(mpt::decode(c, mpt::formats::fp16), __half2float(__half(hr)))) ++bad;
    if (!same(mpt::decode(c, mpt::formats::bf16), __bfloat162float(__nv_bfloat16(br)))) ++bad;
  }
  for (std::uint32_t c = 0; c < 0x100u; ++c) {
    const auto code = static_cast<__nv_fp8_storage_t>(c);
    if (!same(mpt::decode(c, mpt::formats::e4m3),
              __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)))))
      ++bad;
    if (!same(mpt::decode(c, mpt::formats::e5m2),
              __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E5M2)))))
      ++bad;
  }
  CHECK(bad == 0);
}

#endif  // MPT_HAVE_CUDA_HEADERS

int main(int argc, char** argv) {
#if !defined(MPT_HAVE_CUDA_HEADERS)
  std::printf(
      "SKIPPED %s: CUDA's cuda_fp16.h/cuda_bf16.h/cuda_fp8.h were not found at configure "
      "time (MPT_CUDA_INCLUDE_DIR)\n",
      argc > 0 ? argv[0] : "test");
  return 77;
#else
  doctest::Context context(argc, argv);
  return context.run();
#endif
}
