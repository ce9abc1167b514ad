// Chapter 07 — FP8 training: delayed and current scaling held to sequences
// computed by hand from Transformer Engine's definitions
// (transformer_engine/common/recipe/delayed_scaling.cu, kernel_bulk, and
// recipe_common.cuh, compute_scale_from_amax, at commit
// d0067d0da6cb01811b8072a7d304f0e00344ce2b; src/mpt/fp8/recipes.hpp
// restates them).
// Depends on: mpt/fp8/recipes.hpp, test_support.hpp.
//
// Delayed scaling by hand. E4M3 (max 448), amax_history_len 3, algo max,
// margin 0; one amax per step: 1, 1, 8, 1, 1, 1, 1. The history is written
// [h0, h1, h2]; h0 takes the step's amax, the update takes the max over all
// three and rolls (h0 ← 0, h1 ← h2, h2 ← the step's amax).
//   step 1: scale 1 (the start). h = [1,0,0]: max 1, next 448/1 = 448; h = [0,0,1]
//   step 2: scale 448.           h = [1,0,1]: max 1, next 448;          h = [0,1,1]
//   step 3: scale 448, amax 8: 8 × 448 = 3584 > 448, the spike SATURATES.
//                                h = [8,1,1]: max 8, next 448/8 = 56;   h = [0,1,8]
//   step 4: scale 56.            h = [1,1,8]: max 8, next 56;           h = [0,8,1]
//   step 5: scale 56.            h = [1,8,1]: max 8, next 56;           h = [0,1,1]
//   step 6: scale 56.            h = [1,1,1]: max 1, next 448 — the spike is forgotten
//   step 7: scale 448.
// So the scales: 1, 448, 448, 56, 56, 56, 448: the spike costs three steps
// of a scale 8× too small (amax_history_len of them), and it was itself
// quantized with the old scale.
//   most_recent (the amax is h0, the step's own): 1, 448, 448, 56, 448, 448, 448.
//   margin 1 (scaled max 448 / 2 = 224):          1, 224, 224, 28, 28, 28, 224.
//   E5M2 (max 57344):                             1, 57344, 57344, 7168, 7168, 7168, 57344.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "mpt/fp8/recipes.hpp"
#include "test_support.hpp"

namespace {

using mpt::DType;
using mpt::fp8::AmaxComputeAlgo;
using mpt::fp8::DelayedScalingOptions;
using mpt::fp8::DelayedStep;

const float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kFltMax = std::numeric_limits<float>::max();

DelayedScalingOptions options(std::size_t len, AmaxComputeAlgo algo, int margin = 0) {
  DelayedScalingOptions o;
  o.amax_history_len = len;
  o.algo = algo;
  o.margin = margin;
  return o;
}

std::vector<float> scales_of(const std::vector<DelayedStep>& steps) {
  std::vector<float> s;
  for (const DelayedStep& d : steps) s.push_back(d.scale);
  return s;
}

const std::vector<float> kSpike = {1, 1, 8, 1, 1, 1, 1};

}  // namespace

TEST_CASE("delayed scaling, max over 3 steps: a spike saturates, then holds the scale down for 3 steps") {
  const std::vector<DelayedStep> s =
      mpt::fp8::simulate_delayed(kSpike, DType::e4m3, options(3, AmaxComputeAlgo::max));
  CHECK(scales_of(s) == std::vector<float>{1, 448, 448, 56, 56, 56, 448});
  CHECK(s.back().next_scale == 448.0f);
  std::vector<bool> overflow;
  for (const DelayedStep& d : s) overflow.push_back(d.overflow);
  CHECK(overflow == std::vector<bool>{false, false, true, false, false, false, false});
  std::vector<float> chosen;
  for (const DelayedStep& d : s) chosen.push_back(d.update_amax);
  CHECK(chosen == std::vector<float>{1, 1, 8, 8, 8, 1, 1});
}

TEST_CASE("delayed scaling: the history in TE's layout after each update (the roll order)") {
  mpt::fp8::DelayedScaling state(DType::e4m3, options(3, AmaxComputeAlgo::max));
  CHECK(state.amax_history() == std::vector<float>{0, 0, 0});
  const std::vector<std::vector<float>> expected = {{0, 0, 1}, {0, 1, 1}, {0, 1, 8}, {0, 8, 1}, {0, 1, 1}};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    state.record_amax(kSpike[i]);
    CHECK(state.amax_history()[0] == kSpike[i]);
    state.update();
    INFO("after step " << i + 1);
    CHECK(state.amax_history() == expected[i]);
  }
}

TEST_CASE("delayed scaling: most_recent, margin, E5M2") {
  CHECK(
      scales_of(mpt::fp8::simulate_delayed(kSpike, DType::e4m3, options(3, AmaxComputeAlgo::most_recent))) ==
      std::vector<float>{1, 448, 448, 56, 448, 448, 448});
  CHECK(scales_of(mpt::fp8::simulate_delayed(kSpike, DType::e4m3, options(3, AmaxComputeAlgo::max, 1))) ==
        std::vector<float>{1, 224, 224, 28, 28, 28, 224});
  CHECK(scales_of(mpt::fp8::simulate_delayed(kSpike, DType::e5m2, options(3, AmaxComputeAlgo::max))) ==
        std::vector<float>{1, 57344, 57344, 7168, 7168, 7168, 57344});
  // A history of 1 is most_recent.
  CHECK(scales_of(mpt::fp8::simulate_delayed(kSpike, DType::e4m3, options(1, AmaxComputeAlgo::max))) ==
        std::vector<float>{1, 448, 448, 56, 448, 448, 448});
}

TEST_CASE("delayed scaling: an amax of 0 keeps the scale and (TE's fused update) does not age the history") {
  // len 2, max; amaxes 8, 0, 1.
  //   step 1: scale 1; h = [8,0]: max 8, next 56; h = [0,8]
  //   step 2: scale 56, amax 0: no roll, amax 0, the scale is kept: 56; h = [0,8]
  //   step 3: scale 56; h = [1,8]: max 8, next 56 (the 8 is still remembered)
  // TE's unfused Python update would roll at step 2 (h = [0,0]) and give 448 after step 3.
  const std::vector<DelayedStep> s =
      mpt::fp8::simulate_delayed({8, 0, 1}, DType::e4m3, options(2, AmaxComputeAlgo::max));
  CHECK(scales_of(s) == std::vector<float>{1, 56, 56});
  CHECK(s[1].update_amax == 0.0f);
  CHECK(s.back().next_scale == 56.0f);
  // most_recent; amaxes 4, 0, 2: 1, 112, 112 (kept), then 224.
  const std::vector<DelayedStep> r =
      mpt::fp8::simulate_delayed({4, 0, 2}, DType::e4m3, options(2, AmaxComputeAlgo::most_recent));
  CHECK(scales_of(r) == std::vector<float>{1, 112, 112});
  CHECK(r[1].update_amax == 0.0f);  // the step's own amax, not the one before it
  CHECK(r.back().next_scale == 224.0f);
}

TEST_CASE("delayed scaling: an inf amax keeps the scale for as long as the history holds it") {
  // len 2, max; amaxes 4, inf, 1, 1.
  //   step 1: scale 1; h = [4,0] -> 112; h = [0,4]
  //   step 2: scale 112, amax inf (saturates); h = [inf,4]: max inf, kept 112; h = [0,inf]
  //   step 3: scale 112; h = [1,inf]: max inf, kept 112; h = [0,1]
  //   step 4: scale 112; h = [1,1]: max 1 -> 448
  const std::vector<DelayedStep> s =
      mpt::fp8::simulate_delayed({4, kInf, 1, 1}, DType::e4m3, options(2, AmaxComputeAlgo::max));
  CHECK(scales_of(s) == std::vector<float>{1, 112, 112, 112});
  CHECK(s[1].overflow);
  CHECK(s.back().next_scale == 448.0f);
}

TEST_CASE("delayed scaling: a tiny amax gives FLT_MAX, not inf") {
  const std::vector<DelayedStep> s =
      mpt::fp8::simulate_delayed({0x1p-149f}, DType::e4m3, options(4, AmaxComputeAlgo::max));
  CHECK(s[0].next_scale == kFltMax);
}

TEST_CASE("delayed scaling: quantize uses the state's scale and records the larger of two amaxes") {
  mpt::fp8::DelayedScaling state(DType::e4m3, options(4, AmaxComputeAlgo::max));
  const std::vector<float> a = {1.0f, -2.0f};
  const std::vector<float> b = {3.0f};
  const mpt::fp8::Fp8Tensor qa = state.quantize(a.data(), a.size());
  CHECK(qa.scales == std::vector<float>{1.0f});
  CHECK(qa.amax == std::vector<float>{2.0f});
  state.quantize(b.data(), b.size());
  state.record_amax(kNan);  // ignored, as fmaxf ignores it
  CHECK(state.amax_history()[0] == 3.0f);
  state.update();
  CHECK(state.scale() == 448.0f / 3.0f);
  const mpt::fp8::Fp8Tensor qb = state.quantize(b.data(), b.size());
  CHECK(qb.scales == std::vector<float>{448.0f / 3.0f});
}

TEST_CASE("delayed scaling refuses what TE's recipe could not hold, with one line naming the range") {
  CHECK_THROWS_WITH_AS(mpt::fp8::DelayedScaling(DType::e4m3, options(0, AmaxComputeAlgo::max)),
                       doctest::Contains("amax_history_len = 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(mpt::fp8::DelayedScaling(DType::e4m3, options(2, AmaxComputeAlgo::max, -1)),
                       doctest::Contains("from 0 to 24"), std::invalid_argument);
  CHECK_THROWS_AS(mpt::fp8::DelayedScaling{DType::bf16}, std::invalid_argument);
  CHECK_THROWS_WITH_AS(mpt::fp8::simulate_delayed({1, -2}, DType::e4m3, options(2, AmaxComputeAlgo::max)),
                       doctest::Contains("step 2"), std::invalid_argument);
  CHECK_THROWS_AS(mpt::fp8::simulate_delayed({kNan}, DType::e4m3, options(2, AmaxComputeAlgo::max)),
                  std::invalid_argument);
  CHECK(mpt::fp8::amax_compute_algo_named("most_recent") == AmaxComputeAlgo::most_recent);
  CHECK_THROWS_WITH_AS(mpt::fp8::amax_compute_algo_named("mean"),
                       doctest::Contains("valid: max, most_recent"), std::invalid_argument);
}

TEST_CASE("recipe formats: HYBRID is E4M3 forward and E5M2 backward") {
  using mpt::fp8::Fp8Format;
  using mpt::fp8::Pass;
  CHECK(mpt::fp8::fp8_dtype_for(Fp8Format::hybrid, Pass::forward) == DType::e4m3);
  CHECK(mpt::fp8::fp8_dtype_for(Fp8Format::hybrid, Pass::backward) == DType::e5m2);
  CHECK(mpt::fp8::fp8_dtype_for(Fp8Format::e4m3, Pass::backward) == DType::e4m3);
}

// Current scaling by hand (E4M3, max 448):
//   [1, -2, 3.5]: amax 3.5, scale 448 / 3.5 = 128; 1 × 128 = 2^7 -> 0 1110 000
//   = 0x70, -2 × 128 = -2^8 -> 1 1111 000 = 0xF8, 3.5 × 128 = 448 -> 0x7E.
//   amax 3, power of two: 448 / 3 = 149.33 = 1.17 × 2^7, mantissa cleared: 128.
//   amax 0.25, epsilon 0.5: the amax is raised to 0.5: 896 (not 1792).
//   margin 2: 448 / 4 / 3.5 = 32.   E5M2, amax 3.5: 57344 / 3.5 = 16384.
TEST_CASE("current scaling: the tensor's own amax, the epsilon floor, powers of two rounded down") {
  using mpt::fp8::CurrentScalingOptions;
  const std::vector<float> x = {1.0f, -2.0f, 3.5f};
  const mpt::fp8::Fp8Tensor q = mpt::fp8::quantize_current(x.data(), x.size(), DType::e4m3);
  CHECK(q.scales == std::vector<float>{128.0f});
  CHECK(q.amax == std::vector<float>{3.5f});
  CHECK(q.codes == std::vector<std::uint8_t>{0x70, 0xF8, 0x7E});
  CHECK(mpt::fp8::dequantize(q) == x);

  CurrentScalingOptions pow2;
  pow2.power_2_scale = true;
  CHECK(mpt::fp8::current_scale(3.0f, DType::e4m3) == 448.0f / 3.0f);
  CHECK(mpt::fp8::current_scale(3.0f, DType::e4m3, pow2) == 128.0f);
  CHECK(mpt::fp8::current_scale(3.5f, DType::e4m3, pow2) == 128.0f);  // already a power of two
  const float three = 3.0f;
  CHECK(mpt::fp8::quantize_current(&three, 1, DType::e4m3).codes[0] == 0x7E);        // 448
  CHECK(mpt::fp8::quantize_current(&three, 1, DType::e4m3, pow2).codes[0] == 0x7C);  // 384 = 1.5 × 2^8

  CurrentScalingOptions eps;
  eps.amax_epsilon = 0.5f;
  CHECK(mpt::fp8::current_scale(0.25f, DType::e4m3) == 1792.0f);
  CHECK(mpt::fp8::current_scale(0.25f, DType::e4m3, eps) == 896.0f);
  CHECK(mpt::fp8::current_scale(0.0f, DType::e4m3, eps) == 896.0f);  // the floor applies to 0 too

  CurrentScalingOptions margin;
  margin.margin = 2;
  CHECK(mpt::fp8::current_scale(3.5f, DType::e4m3, margin) == 32.0f);
  CHECK(mpt::fp8::current_scale(3.5f, DType::e5m2) == 16384.0f);
}

TEST_CASE("current scaling: no usable amax gives scale 1; a tiny one FLT_MAX (2^127 as a power of two)") {
  mpt::fp8::CurrentScalingOptions pow2;
  pow2.power_2_scale = true;
  CHECK(mpt::fp8::current_scale(0.0f, DType::e4m3) == 1.0f);
  CHECK(mpt::fp8::current_scale(kInf, DType::e4m3) == 1.0f);
  CHECK(mpt::fp8::current_scale(kNan, DType::e4m3) == 1.0f);
  CHECK(mpt::fp8::current_scale(0x1p-149f, DType::e4m3) == kFltMax);
  CHECK(mpt::fp8::current_scale(0x1p-149f, DType::e4m3, pow2) == 0x1p127f);
  // A tensor holding an inf: scale 1, and the inf saturates to 448 — counted.
  const std::vector<float> x = {kInf, 1.0f};
  const mpt::fp8::Fp8Tensor q = mpt::fp8::quantize_current(x.data(), x.size(), DType::e4m3);
  CHECK(q.scales == std::vector<float>{1.0f});
  CHECK(q.counts.saturated == 1);
  mpt::fp8::CurrentScalingOptions bad;
  bad.amax_epsilon = -1.0f;
  CHECK_THROWS_WITH_AS(mpt::fp8::current_scale(1.0f, DType::e4m3, bad), doctest::Contains("amax_epsilon"),
                       std::invalid_argument);
}
