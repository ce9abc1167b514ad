// Chapter 01 — floating-point formats and their limits: mpt's rounding
// against CUDA's host-side conversions, bit for bit.
// Depends on: mpt (rounding.hpp, format.hpp), conversion_sweep.hpp (the
// inputs and the comparison, shared with test_ch01_eigen_conversions.cpp,
// which holds mpt to Eigen in every configuration), and CUDA's headers
// cuda_fp16.h / cuda_bf16.h / cuda_fp8.h used on the host by plain g++ (no
// GPU, no nvcc). Without those headers the program says so and exits 77,
// which CTest reports as Skipped.
//
// The references:
//   fp16  __float2half_rn
//   bf16  __float2bfloat16_rn
//   e4m3  __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)  vs mpt saturate
//         __nv_cvt_float_to_fp8(x, __NV_NOSAT,     __NV_E4M3)  vs mpt infinity
//   e5m2  __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2)  vs mpt saturate
//         __nv_cvt_float_to_fp8(x, __NV_NOSAT,     __NV_E5M2)  vs mpt infinity
//
// NaN: CUDA's host path returns one NaN code with the sign dropped (fp16
// 0x7FFF, bf16 0x7FFF, FP8 0x7F), while mpt returns the canonical quiet NaN
// with the sign kept (fp16 0x7E00/0xFE00, bf16 0x7FC0/0xFFC0, E4M3 0x7F/0xFF,
// E5M2 0x7E/0xFE). Against CUDA a NaN therefore only has to stay a NaN.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#if defined(MPT_HAVE_CUDA_HEADERS)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <limits>
#include <vector>

#include "conversion_sweep.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/formats/rounding.hpp"

using mpt::test::bits16;
using mpt::test::compare;
using mpt::test::mpt_codes;
using mpt::test::reference_codes;

TEST_CASE("fp16: mpt == __float2half_rn, bit for bit") {
  const mpt::Format& f = mpt::format_named("fp16");
  const auto ours = mpt_codes(f, mpt::OverflowMode::infinity);
  compare("fp16 vs __float2half_rn", f.spec, ours,
          reference_codes([](float x) { return bits16(__float2half_rn(x)); }), false);
  // The documented NaN difference, pinned so that a change on either side shows.
  CHECK(bits16(__float2half_rn(-std::numeric_limits<float>::quiet_NaN())) == 0x7fff);
  CHECK(mpt::encode_exact(mpt::round_value(-std::numeric_limits<float>::quiet_NaN(), f), f.spec) == 0xfe00);
}

TEST_CASE("bf16: mpt == __float2bfloat16_rn, bit for bit") {
  const mpt::Format& f = mpt::format_named("bf16");
  const auto ours = mpt_codes(f, mpt::OverflowMode::infinity);
  compare("bf16 vs __float2bfloat16_rn", f.spec, ours,
          reference_codes([](float x) { return bits16(__float2bfloat16_rn(x)); }), false);
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
