// Chapter 07 — FP8 training: E8M0 and MX block scaling, the OCP rule
// (FLOOR) against NVIDIA's round-up (RCEIL), on blocks worked out by hand.
// Depends on: mpt/fp8/quantize.hpp, mpt/fp8/e8m0.hpp, test_support.hpp.
//
// E4M3's largest exponent is emax_elem = 8 (448 = 1.75 × 2^8), E5M2's 15.
// A block's scale is 2^-e (this project's scales multiply), its E8M0 code
// e + 127.
//   FLOOR: e = floor(log2 amax) − emax_elem   (OCP MX v1.0, 6.3; torchao FLOOR)
//   RCEIL: e = ceil(log2(amax / max_norm))   (cuBLAS, Transformer Engine; torchao RCEIL)
// Block [480, 2^-9, 0 × 30] in E4M3:
//   FLOOR: floor(log2 480) = 8, e = 0, scale 1: 480 is beyond 448 (above the
//          tie at 464) and SATURATES to 448; 2^-9 is E4M3's smallest
//          subnormal and stays exact.
//   RCEIL: 480 / 448 = 1.07, ceil(log2) = 1, e = 1, scale 1/2: 480 -> 240 =
//          1.875 × 2^7 = 0 1110 111 = 0x77, exact; but 2^-9 -> 2^-10, halfway
//          to 0: ties to even, FLUSHED.
// Block [63000, 0 × 31] in E5M2:
//   FLOOR: floor(log2 63000) = 15, e = 0: 63000 is above 61440, the tie
//          between 57344 and 2^16: it saturates to 57344 (error −5656).
//   RCEIL: 63000 / 57344 = 1.099, e = 1: 31500 = 1.92 × 2^14 rounds up to
//          2^15: read back 65536 (error +2536), nothing saturates.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "mpt/fp8/e8m0.hpp"
#include "mpt/fp8/quantize.hpp"
#include "test_support.hpp"

namespace {

using mpt::DType;
using mpt::fp8::MxScaleRule;
using mpt_test::bits;

const float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

std::vector<float> block_with(std::vector<float> head) {
  head.resize(mpt::fp8::kMxBlockSize, 0.0f);
  return head;
}

}  // namespace

TEST_CASE("E8M0: 2^(c-127) for c = 0..254, 2^-127 a float subnormal, 0xFF NaN") {
  using namespace mpt::fp8;
  CHECK(e8m0_to_float(127) == 1.0f);
  CHECK(e8m0_to_float(128) == 2.0f);
  CHECK(e8m0_to_float(126) == 0.5f);
  CHECK(bits(e8m0_to_float(0)) == 0x00400000u);  // 2^-127
  CHECK(e8m0_to_float(0) == 0x1p-127f);
  CHECK(bits(e8m0_to_float(254)) == 0x7f000000u);  // 2^127
  CHECK(std::isnan(e8m0_to_float(kE8M0Nan)));
  CHECK(std::isnan(e8m0_reciprocal(kE8M0Nan)));
  CHECK(e8m0_reciprocal(0) == 0x1p127f);
  CHECK(e8m0_reciprocal(254) == 0x1p-127f);
  for (int c = 0; c <= 254; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    INFO("code " << c);
    REQUIRE(e8m0_to_float(code) == std::ldexp(1.0f, c - 127));
    REQUIRE(e8m0_to_float(code) * e8m0_reciprocal(code) == 1.0f);
  }
  CHECK(e8m0_from_exponent(0) == 127);
  CHECK(e8m0_from_exponent(-127) == 0);
  CHECK(e8m0_from_exponent(127) == 254);
  CHECK(e8m0_from_exponent(-300) == 0);  // clamped, never NaN
  CHECK(e8m0_from_exponent(300) == 254);
}

TEST_CASE("E8M0 round up (TE's float_to_e8m0): the smallest power of two >= v, saturating") {
  using mpt::fp8::e8m0_round_up;
  CHECK(e8m0_round_up(1.0f) == 127);
  CHECK(e8m0_round_up(1.5f) == 128);
  CHECK(e8m0_round_up(2.0f) == 128);
  CHECK(e8m0_round_up(0.75f) == 127);
  CHECK(e8m0_round_up(0.5f) == 126);
  CHECK(e8m0_round_up(-1.5f) == 128);  // the sign is ignored
  CHECK(e8m0_round_up(0.0f) == 0);
  CHECK(e8m0_round_up(0x1p-149f) == 0);
  CHECK(e8m0_round_up(0x1p-127f) == 0);
  CHECK(e8m0_round_up(mpt_test::from_bits(0x00400001u)) == 1);  // just above 2^-127
  CHECK(e8m0_round_up(0x1p-126f) == 1);
  CHECK(e8m0_round_up(0x1p127f) == 254);
  CHECK(e8m0_round_up(std::numeric_limits<float>::max()) == 254);  // satfinite: not 2^128
  CHECK(e8m0_round_up(kInf) == 254);
  CHECK(e8m0_round_up(kNan) == 0xFF);
}

TEST_CASE(
    "MX E4M3: FLOOR saturates the block's largest value where RCEIL keeps it and flushes the smallest") {
  const std::vector<float> x = block_with({480.0f, 0x1p-9f});
  const mpt::fp8::Fp8Tensor fl =
      mpt::fp8::quantize_mx(x.data(), 1, x.size(), DType::e4m3, MxScaleRule::floor);
  CHECK(fl.e8m0 == std::vector<std::uint8_t>{127});
  CHECK(fl.scales == std::vector<float>{1.0f});
  CHECK(fl.amax == std::vector<float>{480.0f});
  CHECK(fl.codes[0] == 0x7E);
  CHECK(fl.codes[1] == 0x01);
  CHECK(fl.counts.saturated == 1);
  CHECK(fl.counts.flushed == 0);
  const std::vector<float> fl_back = mpt::fp8::dequantize(fl);
  CHECK(fl_back[0] == 448.0f);
  CHECK(fl_back[1] == 0x1p-9f);

  const mpt::fp8::Fp8Tensor rc =
      mpt::fp8::quantize_mx(x.data(), 1, x.size(), DType::e4m3, MxScaleRule::rceil);
  CHECK(rc.e8m0 == std::vector<std::uint8_t>{128});
  CHECK(rc.scales == std::vector<float>{0.5f});
  CHECK(rc.codes[0] == 0x77);
  CHECK(rc.codes[1] == 0x00);
  CHECK(rc.counts.saturated == 0);
  CHECK(rc.counts.flushed == 1);
  const std::vector<float> rc_back = mpt::fp8::dequantize(rc);
  CHECK(rc_back[0] == 480.0f);
  CHECK(rc_back[1] == 0.0f);
}

TEST_CASE("MX E5M2: FLOOR saturates 63000 to 57344, RCEIL rounds it up to 65536") {
  const std::vector<float> x = block_with({63000.0f});
  const mpt::fp8::Fp8Tensor fl =
      mpt::fp8::quantize_mx(x.data(), 1, x.size(), DType::e5m2, MxScaleRule::floor);
  CHECK(fl.e8m0 == std::vector<std::uint8_t>{127});
  CHECK(fl.counts.saturated == 1);
  CHECK(mpt::fp8::dequantize(fl)[0] == 57344.0f);
  const mpt::fp8::Fp8Tensor rc =
      mpt::fp8::quantize_mx(x.data(), 1, x.size(), DType::e5m2, MxScaleRule::rceil);
  CHECK(rc.e8m0 == std::vector<std::uint8_t>{128});
  CHECK(rc.counts.saturated == 0);
  CHECK(mpt::fp8::dequantize(rc)[0] == 65536.0f);
  // amax 1: FLOOR 0 − 15 = −15; RCEIL ceil(log2(1 / 57344)) = ceil(−15.8) = −15.
  const float one = 1.0f;
  CHECK(mpt::fp8::mx_scale_code(one, mpt::formats::e5m2, MxScaleRule::floor) == 112);
  CHECK(mpt::fp8::mx_scale_code(one, mpt::formats::e5m2, MxScaleRule::rceil) == 112);
}

TEST_CASE("MX: zero blocks, exact powers, inf and NaN") {
  using mpt::fp8::mx_scale_code;
  const mpt::FormatSpec& e4 = mpt::formats::e4m3;
  // 448 × 2^k: both rules give e = k (RCEIL: 448 × fp32(1/448) is exactly 1).
  for (int k = -20; k <= 20; ++k) {
    INFO("k = " << k);
    CHECK(mx_scale_code(std::ldexp(448.0f, k), e4, MxScaleRule::floor) == 127 + k);
    CHECK(mx_scale_code(std::ldexp(448.0f, k), e4, MxScaleRule::rceil) == 127 + k);
  }
  // An all-zero block: scale 2^127 (code 0), every code 0, nothing counted.
  const std::vector<float> zeros(mpt::fp8::kMxBlockSize, 0.0f);
  for (MxScaleRule r : {MxScaleRule::floor, MxScaleRule::rceil}) {
    const mpt::fp8::Fp8Tensor z = mpt::fp8::quantize_mx(zeros.data(), 1, zeros.size(), DType::e4m3, r);
    CHECK(z.e8m0 == std::vector<std::uint8_t>{0});
    CHECK(z.scales == std::vector<float>{0x1p127f});
    CHECK(z.codes == std::vector<std::uint8_t>(zeros.size(), 0));
    CHECK(mpt::fp8::dequantize(z) == zeros);
  }
  // An inf amax: FLOOR reads its exponent field as 2^128 (e = 120), RCEIL saturates at 2^127.
  CHECK(mx_scale_code(kInf, e4, MxScaleRule::floor) == 127 + 120);
  CHECK(mx_scale_code(kInf, e4, MxScaleRule::rceil) == 254);
  CHECK(mx_scale_code(kNan, e4, MxScaleRule::floor) == 0xFF);
  CHECK(mx_scale_code(kNan, e4, MxScaleRule::rceil) == 0xFF);
  // A NaN in a block does not reach the amax (fmaxf): the block is scaled by its other values.
  const std::vector<float> x = block_with({kNan, 2.0f});
  const mpt::fp8::Fp8Tensor q = mpt::fp8::quantize_mx(x.data(), 1, x.size(), DType::e4m3, MxScaleRule::floor);
  CHECK(q.amax == std::vector<float>{2.0f});
  CHECK(q.e8m0 == std::vector<std::uint8_t>{127 - 7});  // floor(log2 2) − 8 = −7
  CHECK(q.counts.nan == 1);
  CHECK(q.codes[0] == 0x7F);
}

TEST_CASE("MX over the full range of one binade: what each rule does to a block's largest value") {
  // For amax = m × 2^k with m running over [1, 2): FLOOR maps the amax into
  // [256, 512) (E4M3), so it lies beyond 448 for m above 1.75 and saturates
  // for m above 1.8125 (the tie at 464 rounds to 448); RCEIL maps it to at
  // most 448, never saturating, and its scale is FLOOR's or half of it.
  const mpt::FormatSpec& f = mpt::formats::e4m3;
  int floor_saturated = 0, rceil_saturated = 0, rceil_halved = 0;
  for (int i = 0; i < 4096; ++i) {
    const float amax = std::ldexp(1.0f + static_cast<float>(i) / 4096.0f, 5);
    const std::uint8_t cf = mpt::fp8::mx_scale_code(amax, f, MxScaleRule::floor);
    const std::uint8_t cr = mpt::fp8::mx_scale_code(amax, f, MxScaleRule::rceil);
    REQUIRE((cr == cf || cr == cf + 1));
    rceil_halved += cr == cf + 1 ? 1 : 0;
    const float scaled_floor = amax * mpt::fp8::e8m0_reciprocal(cf);
    REQUIRE(scaled_floor >= 256.0f);
    REQUIRE(scaled_floor < 512.0f);
    REQUIRE(amax * mpt::fp8::e8m0_reciprocal(cr) <= 448.0f);
    const auto o = [&](std::uint8_t c) {
      return mpt::fp8::quantize_element(amax, mpt::fp8::e8m0_reciprocal(c), f, true).outcome;
    };
    floor_saturated += o(cf) == mpt::fp8::Fp8Outcome::saturated ? 1 : 0;
    rceil_saturated += o(cr) == mpt::fp8::Fp8Outcome::saturated ? 1 : 0;
  }
  // m in (1.8125, 2): 4096 × (2 − 1.8125) − 1 = 767 points; m in (1.75, 2) halves RCEIL's scale: 1023.
  CHECK(floor_saturated == 767);
  CHECK(rceil_saturated == 0);
  CHECK(rceil_halved == 1023);
}

TEST_CASE("MX layout: blocks of 32 along each row, the last one shorter") {
  // 2 rows × 40 columns: blocks [0, 32) and [32, 40) per row.
  std::vector<float> x(80, 0.0f);
  x[0] = 1.0f;          // row 0, block 0: amax 1 -> e = 0 − 8 = −8
  x[35] = 64.0f;        // row 0, block 1: amax 64 -> e = 6 − 8 = −2
  x[40 + 31] = 1e-3f;   // row 1, block 0: floor(log2 0.001) = −10 -> e = −18
  x[40 + 39] = 300.0f;  // row 1, block 1: amax 300 -> e = 0
  const mpt::fp8::Fp8Tensor q = mpt::fp8::quantize_mx(x.data(), 2, 40, DType::e4m3, MxScaleRule::floor);
  CHECK(q.blocks_per_row() == 2);
  CHECK(q.e8m0 == std::vector<std::uint8_t>{127 - 8, 127 - 2, 127 - 18, 127});
  CHECK(q.amax == std::vector<float>{1.0f, 64.0f, 1e-3f, 300.0f});
  CHECK(q.scale_index(31) == 0);
  CHECK(q.scale_index(32) == 1);
  CHECK(q.scale_index(40) == 2);
  CHECK(q.scale_index(79) == 3);
  const std::vector<float> back = mpt::fp8::dequantize(q);
  CHECK(back[0] == 1.0f);
  CHECK(back[35] == 64.0f);
  CHECK(back[79] == 288.0f);  // 300 -> E4M3 1.125 × 2^8 (spacing 32 there)
  CHECK_THROWS_AS(mpt::fp8::quantize_mx(x.data(), 2, 40, DType::e4m3, MxScaleRule::floor, true, 0),
                  std::invalid_argument);
}
