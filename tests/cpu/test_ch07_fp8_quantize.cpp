// Chapter 07 — FP8 training: the FP8 encode and decode, element by element
// and over arrays, against codes worked out by hand; the counts of what
// saturation and underflow did; agreement with the core Tensor's scale.
// Depends on: mpt/fp8/quantize.hpp (and fp8_math.hpp), mpt/core/tensor.hpp,
// test_support.hpp.
//
// The codes, by hand. E4M3: sign, 4 exponent bits (bias 7), 3 fraction bits;
// exponent 1111 is a normal binade except S.1111.111, NaN; no inf.
//   448 = 1.75 × 2^8    -> 0 1111 110 = 0x7E (the largest), -448 -> 0xFE
//   464 = 1.8125 × 2^8  -> halfway between 448 (fraction 110, even) and the
//                          next step up, 480 (111, the NaN pattern): ties to
//                          even, 448 — in both overflow modes
//   465                 -> above the halfway point: beyond the range; 448
//                          saturating, 0x7F (NaN) without saturation
//   1 = 2^0             -> 0 0111 000 = 0x38
//   2^-6 (min normal)   -> 0 0001 000 = 0x08
//   2^-9 (min subnormal)-> 0 0000 001 = 0x01
//   2^-10               -> halfway between 0 and 2^-9: ties to even, 0 (flushed)
//   3 × 2^-10           -> 1.5 × 2^-9, halfway between codes 1 and 2: code 2 (2^-8)
// E5M2: sign, 5 exponent bits (bias 15), 2 fraction bits, IEEE-like.
//   57344 = 1.75 × 2^15 -> 0 11110 11 = 0x7B (the largest)
//   61440 = 1.875 × 2^15-> halfway between 57344 (fraction 11, odd) and
//                          2^16: ties to even, up to 2^16, beyond the range:
//                          57344 saturating, 0x7C (inf) without
//   61439               -> below halfway: 57344, in range
//   1                   -> 0 01111 00 = 0x3C; NaN -> 0 11111 10 = 0x7E
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "mpt/core/tensor.hpp"
#include "mpt/fp8/quantize.hpp"
#include "test_support.hpp"

namespace {

using mpt::DType;
using mpt::fp8::Fp8Outcome;
using mpt::fp8::quantize_element;
using mpt_test::bits;

const float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

// One element's code and outcome (scale 1 unless given).
void check_element(float x, const mpt::FormatSpec& f, bool saturate, unsigned code, Fp8Outcome outcome,
                   float scale = 1.0f) {
  const mpt::fp8::Fp8Element e = quantize_element(x, scale, f, saturate);
  INFO("x = " << x << ", scale = " << scale << ", saturate = " << saturate);
  CHECK(e.code == code);
  CHECK(static_cast<int>(e.outcome) == static_cast<int>(outcome));
}

}  // namespace

TEST_CASE("E4M3 encode: the hand-worked codes, saturating and not") {
  const mpt::FormatSpec& f = mpt::formats::e4m3;
  for (bool sat : {true, false}) {
    check_element(448.0f, f, sat, 0x7E, Fp8Outcome::in_range);
    check_element(-448.0f, f, sat, 0xFE, Fp8Outcome::in_range);
    check_element(464.0f, f, sat, 0x7E, Fp8Outcome::in_range);  // a tie, to even: 448, no overflow
    check_element(1.0f, f, sat, 0x38, Fp8Outcome::in_range);
    check_element(0x1p-6f, f, sat, 0x08, Fp8Outcome::in_range);
    check_element(0x1p-9f, f, sat, 0x01, Fp8Outcome::in_range);
    check_element(0x1.8p-10f, f, sat, 0x01, Fp8Outcome::in_range);  // above the tie: up to 2^-9
    check_element(0x3p-10f, f, sat, 0x02, Fp8Outcome::in_range);    // 1.5 × 2^-9: tie to even, 2^-8
    check_element(0x1p-10f, f, sat, 0x00, Fp8Outcome::flushed);     // tie to even: 0
    check_element(-0x1p-11f, f, sat, 0x80, Fp8Outcome::flushed);    // -0, and it was not zero
    check_element(0.0f, f, sat, 0x00, Fp8Outcome::in_range);
    check_element(-0.0f, f, sat, 0x80, Fp8Outcome::in_range);  // a zero is not flushed
    check_element(kNan, f, sat, 0x7F, Fp8Outcome::nan);
  }
  // Beyond the range: clamped and counted, or NaN (E4M3 has no inf).
  check_element(465.0f, f, true, 0x7E, Fp8Outcome::saturated);
  check_element(465.0f, f, false, 0x7F, Fp8Outcome::overflowed);
  check_element(480.0f, f, true, 0x7E, Fp8Outcome::saturated);
  check_element(kInf, f, true, 0x7E, Fp8Outcome::saturated);  // pitfall 6: inf becomes 448
  check_element(-kInf, f, true, 0xFE, Fp8Outcome::saturated);
  check_element(kInf, f, false, 0x7F, Fp8Outcome::overflowed);
  check_element(-1e30f, f, false, 0xFF, Fp8Outcome::overflowed);
  // The scale multiplies first: 3.5 × 128 = 448; 4 × 128 = 512 is beyond.
  check_element(3.5f, f, true, 0x7E, Fp8Outcome::in_range, 128.0f);
  check_element(4.0f, f, true, 0x7E, Fp8Outcome::saturated, 128.0f);
  check_element(0x1p-16f, f, true, 0x01, Fp8Outcome::in_range, 128.0f);  // 2^-16 × 2^7 = 2^-9
}

TEST_CASE("E5M2 encode: the hand-worked codes; overflow to inf without saturation") {
  const mpt::FormatSpec& f = mpt::formats::e5m2;
  for (bool sat : {true, false}) {
    check_element(57344.0f, f, sat, 0x7B, Fp8Outcome::in_range);
    check_element(61439.0f, f, sat, 0x7B, Fp8Outcome::in_range);
    check_element(1.0f, f, sat, 0x3C, Fp8Outcome::in_range);
    check_element(0x1p-16f, f, sat, 0x01, Fp8Outcome::in_range);  // min subnormal
    check_element(0x1p-17f, f, sat, 0x00, Fp8Outcome::flushed);
    check_element(kNan, f, sat, 0x7E, Fp8Outcome::nan);
  }
  // 61440 is a tie that rounds up, to 2^16: beyond the range (E4M3's tie at 464 rounds down).
  check_element(61440.0f, f, true, 0x7B, Fp8Outcome::saturated);
  check_element(61440.0f, f, false, 0x7C, Fp8Outcome::overflowed);
  check_element(kInf, f, true, 0x7B, Fp8Outcome::saturated);
  check_element(-kInf, f, false, 0xFC, Fp8Outcome::overflowed);
}

TEST_CASE("decode: code times the reciprocal scale; NaN and inf codes stay what they are") {
  const mpt::FormatSpec& e4 = mpt::formats::e4m3;
  CHECK(mpt::fp8::dequantize_element(0x7E, 1.0f / 128.0f, e4) == 3.5f);
  CHECK(mpt::fp8::dequantize_element(0x01, 1.0f, e4) == 0x1p-9f);
  CHECK(std::isnan(mpt::fp8::dequantize_element(0x7F, 1.0f, e4)));
  CHECK(std::isnan(mpt::fp8::dequantize_element(0xFF, 0.5f, e4)));
  CHECK(mpt::fp8::dequantize_element(0x7C, 1.0f, mpt::formats::e5m2) == kInf);
  CHECK(mpt::fp8::dequantize_element(0xFB, 2.0f, mpt::formats::e5m2) == -114688.0f);
}

TEST_CASE("amax: the largest magnitude, NaN ignored as fmaxf does, inf kept") {
  const std::vector<float> a = {1.0f, -3.0f, kNan, 2.0f};
  CHECK(mpt::fp8::amax_of(a.data(), a.size()) == 3.0f);
  const std::vector<float> b = {kNan, -kInf, 1.0f};
  CHECK(mpt::fp8::amax_of(b.data(), b.size()) == kInf);
  const std::vector<float> c = {kNan};
  CHECK(bits(mpt::fp8::amax_of(c.data(), c.size())) == 0u);
  const std::vector<float> d = {-0.0f, -0.0f};
  CHECK(bits(mpt::fp8::amax_of(d.data(), d.size())) == 0u);  // +0: |−0|
  CHECK(mpt::fp8::amax_of(nullptr, 0) == 0.0f);
}

TEST_CASE("quantize an array: every fate counted (pitfall 6: saturation hides overflow)") {
  const std::vector<float> x = {448.0f, 465.0f, kInf, -kInf, kNan, 0x1p-10f, 0.0f, 1.0f};
  const mpt::fp8::Fp8Tensor sat = mpt::fp8::quantize_with_scale(x.data(), x.size(), DType::e4m3, 1.0f, true);
  CHECK(sat.codes == std::vector<std::uint8_t>{0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x00, 0x00, 0x38});
  CHECK(sat.counts.saturated == 3);
  CHECK(sat.counts.overflowed == 0);
  CHECK(sat.counts.nan == 1);
  CHECK(sat.counts.flushed == 1);
  CHECK(sat.amax == std::vector<float>{kInf});
  CHECK(sat.scales == std::vector<float>{1.0f});
  // Read back, the three overflowing values look like an ordinary 448:
  // only the count says they were not.
  const std::vector<float> back = mpt::fp8::dequantize(sat);
  CHECK(back[1] == 448.0f);
  CHECK(back[2] == 448.0f);
  CHECK(back[3] == -448.0f);
  CHECK(std::isnan(back[4]));

  const mpt::fp8::Fp8Tensor raw = mpt::fp8::quantize_with_scale(x.data(), x.size(), DType::e4m3, 1.0f, false);
  CHECK(raw.codes == std::vector<std::uint8_t>{0x7E, 0x7F, 0x7F, 0xFF, 0x7F, 0x00, 0x00, 0x38});
  CHECK(raw.counts.saturated == 0);
  CHECK(raw.counts.overflowed == 3);
  CHECK(raw.counts.nan == 1);
}

TEST_CASE("quantize_with_scale refuses a scale that is not finite and > 0, and a dtype that is not FP8") {
  const float x = 1.0f;
  for (float s : {0.0f, -1.0f, kInf, kNan})
    CHECK_THROWS_AS(mpt::fp8::quantize_with_scale(&x, 1, DType::e4m3, s), std::invalid_argument);
  CHECK_THROWS_WITH_AS(mpt::fp8::quantize_with_scale(&x, 1, DType::f16, 1.0f),
                       doctest::Contains("valid: e4m3, e5m2"), std::invalid_argument);
}

TEST_CASE("the per-tensor encode is the core Tensor's scale, bit for bit") {
  // Tensor::from_f32_scaled rounds x × scale through the formats tier's
  // storage path (saturating for FP8); quantize_with_scale through
  // quantize_element. Same codes, and the same values read back.
  std::vector<float> x;
  for (int i = -200; i <= 200; ++i)
    x.push_back(static_cast<float>(i) * 0.37f + 0.001f * static_cast<float>(i % 7));
  x.push_back(1e6f);
  x.push_back(-kInf);
  x.push_back(1e-12f);
  for (DType d : {DType::e4m3, DType::e5m2}) {
    for (float scale : {1.0f, 3.0f, 0.1f, 448.0f / 74.0f}) {
      INFO("dtype " << mpt::dtype_name(d) << ", scale " << scale);
      const mpt::fp8::Fp8Tensor q = mpt::fp8::quantize_with_scale(x.data(), x.size(), d, scale);
      const mpt::Tensor t =
          mpt::Tensor::from_f32_scaled(x.data(), {static_cast<std::int64_t>(x.size())}, d, scale);
      const auto* codes = reinterpret_cast<const std::uint8_t*>(
          d == DType::e4m3 ? static_cast<const void*>(t.data<mpt::Fp8E4M3>())
                           : static_cast<const void*>(t.data<mpt::Fp8E5M2>()));
      std::vector<float> read(x.size());
      t.to_f32(read.data());
      const std::vector<float> back = mpt::fp8::dequantize(q);
      bool same_codes = true, same_values = true;
      for (std::size_t i = 0; i < x.size(); ++i) {
        same_codes = same_codes && codes[i] == q.codes[i];
        same_values = same_values && bits(read[i]) == bits(back[i]);
      }
      CHECK(same_codes);
      CHECK(same_values);
    }
  }
}
