// Chapter 07 — FP8 training: quantize into the caller's buffers
// (quantize_raw.hpp), the portable loops, against the Fp8Tensor reference
// (quantize_with_scale, quantize_mx) bit for bit; the hand-made cases the
// GPU test (tests/cuda/test_ch07_fp8.cu) also asserts, checked here on the
// CPU reference; bad arguments.
// Depends on: mpt/fp8/quantize_raw.hpp, fp8_raw_checks.hpp, doctest.
#include <doctest/doctest.h>

#include <limits>
#include <stdexcept>
#include <vector>

#include "fp8_raw_checks.hpp"
#include "mpt/fp8/quantize_raw.hpp"

using mpt::DType;
using mpt::fp8::MxScaleRule;

TEST_CASE("quantize_into, portable: quantize_with_scale's codes, amax and counts") {
  fp8_raw::check_per_tensor(fp8_raw::Path::portable);
}

TEST_CASE("quantize_mx_into, portable: quantize_mx's codes, E8M0 codes, block amax and counts") {
  fp8_raw::check_mx(fp8_raw::Path::portable);
}

TEST_CASE("the GPU test's hand-made cases hold for the CPU reference") {
  // tests/cuda/test_ch07_fp8.cu asserts these of the kernels; here of quantize.hpp.
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {448.0f,
                                464.0f,
                                std::nextafter(464.0f, inf),
                                inf,
                                -inf,
                                0x1p-10f,
                                std::numeric_limits<float>::quiet_NaN(),
                                0.0f};
  const mpt::fp8::Fp8Tensor t = mpt::fp8::quantize_with_scale(x.data(), x.size(), DType::e4m3, 1.0f, true);
  CHECK(t.codes == std::vector<std::uint8_t>{0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x00, 0x7F, 0x00});
  CHECK(t.amax[0] == inf);
  CHECK(t.counts.saturated == 3);
  CHECK(t.counts.flushed == 1);
  CHECK(t.counts.nan == 1);
  CHECK(t.counts.overflowed == 0);

  std::vector<float> m(96, 0.0f);
  m[32] = 464.0f;
  m[33] = 1.0f;
  m[64] = 480.0f;
  m[65] = 1.0f;
  const mpt::fp8::Fp8Tensor f = mpt::fp8::quantize_mx(m.data(), 1, 96, DType::e4m3, MxScaleRule::floor, true);
  CHECK(f.e8m0 == std::vector<std::uint8_t>{0, 127, 127});
  CHECK(f.codes[0] == 0);
  CHECK(f.codes[32] == 0x7E);
  CHECK(f.codes[64] == 0x7E);
  CHECK(f.counts.saturated == 1);
  const mpt::fp8::Fp8Tensor r = mpt::fp8::quantize_mx(m.data(), 1, 96, DType::e4m3, MxScaleRule::rceil, true);
  CHECK(r.e8m0 == std::vector<std::uint8_t>{0, 128, 128});
  CHECK(r.counts.saturated == 0);
}

TEST_CASE("quantize_into and quantize_mx_into: bad arguments") {
  std::vector<float> x(4, 1.0f);
  std::vector<std::uint8_t> c(4);
  mpt::fp8::Fp8Counts counts;
  CHECK_THROWS_AS(mpt::fp8::quantize_into(x.data(), 4, DType::e4m3, 0.0f, true, c.data(), counts),
                  std::invalid_argument);
  CHECK_THROWS_AS(mpt::fp8::quantize_into(x.data(), 4, DType::e4m3, std::numeric_limits<float>::infinity(),
                                          true, c.data(), counts),
                  std::invalid_argument);
  CHECK_THROWS_AS(mpt::fp8::quantize_into(x.data(), 4, DType::f16, 1.0f, true, c.data(), counts),
                  std::invalid_argument);
  CHECK_THROWS_AS(mpt::fp8::quantize_mx_into(x.data(), 1, 4, DType::e5m2, static_cast<MxScaleRule>(9), true,
                                             c.data(), c.data(), nullptr, counts),
                  std::invalid_argument);
}
