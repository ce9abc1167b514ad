// Chapter 02 — loss scaling and FP32 master weights: mpt::GradScaler against
// torch.amp.GradScaler's semantics, one behaviour per test case.
// Depends on: mpt/grad_scaler.hpp, mpt/parameter.hpp, the GPU test's scale
// update cases (tests/cuda_host/scale_update_cases.hpp). The expected behaviour
// is PyTorch's: torch/amp/grad_scaler.py and the update/unscale kernels in
// aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp (pytorch/pytorch).
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../cuda_host/scale_update_cases.hpp"
#include "mpt/amp/grad_scaler.hpp"

using mpt::GradScaler;
using mpt::OptState;
using mpt::StaticScaler;

namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// An optimizer that counts its steps and changes nothing.
struct CountingOptimizer : mpt::Optimizer {
  explicit CountingOptimizer(std::vector<mpt::Parameter*> ps) : Optimizer(std::move(ps)) {}
  void step() override { ++steps; }
  int steps = 0;
};

// One parameter with the given gradient values, and its optimizer.
struct Model {
  mpt::Parameter p;
  CountingOptimizer opt{{&p}};
  explicit Model(const std::vector<float>& grad = {1.0f, -2.0f, 0.5f}) { set_grad(grad); }
  void set_grad(const std::vector<float>& g) {
    p.grad = mpt::Tensor::from_f32(g.data(), {static_cast<std::int64_t>(g.size())}, mpt::DType::f32);
  }
  float grad(int i) const { return p.grad.value(i); }
};

GradScaler::Options with_interval(std::int32_t interval, float init = 65536.0f) {
  GradScaler::Options o;
  o.growth_interval = interval;
  o.init_scale = init;
  return o;
}

// One training iteration as PyTorch's documentation writes it; `overflow`
// puts an inf into the (scaled) gradient. Returns whether the optimizer stepped.
bool iteration(GradScaler& s, Model& m, bool overflow) {
  const float scaled = s.scale(1.0f);
  m.set_grad({scaled * 0.5f, overflow ? kInf : scaled * 0.25f});
  const bool stepped = s.step(m.opt);
  s.update();
  return stepped;
}

// Everything observable about a scaler's persistent state.
std::string snapshot(const GradScaler& s) {
  return s.state_dict() + " tracker=" + std::to_string(s.growth_tracker()) +
         " scale_bits=" + std::to_string(bits(s.get_scale()));
}

}  // namespace

// ---------------------------------------------------------------------------
// Construction

TEST_CASE("defaults are PyTorch's: init_scale 2^16, growth 2, backoff 0.5, interval 2000, enabled") {
  const GradScaler::Options o;
  CHECK(o.init_scale == 65536.0f);
  CHECK(o.growth_factor == 2.0f);
  CHECK(o.backoff_factor == 0.5f);
  CHECK(o.growth_interval == 2000);
  CHECK(o.enabled);
  const GradScaler s;
  CHECK(s.is_enabled());
  CHECK(s.get_scale() == 65536.0f);  // before any scale(): the initial scale, as PyTorch
  CHECK(s.get_growth_factor() == 2.0f);
  CHECK(s.get_backoff_factor() == 0.5f);
  CHECK(s.get_growth_interval() == 2000);
  CHECK(s.growth_tracker() == 0);
}

TEST_CASE("the growth factor must be > 1 (PyTorch's message)") {
  for (float g : {1.0f, 0.5f, 0.0f, -2.0f, kNaN}) {
    GradScaler::Options o;
    o.growth_factor = g;
    CHECK_THROWS_WITH_AS(GradScaler{o}, doctest::Contains("The growth factor must be > 1.0"),
                         std::invalid_argument);
  }
}

TEST_CASE("the backoff factor must be < 1 (PyTorch's message)") {
  for (float b : {1.0f, 2.0f, kInf, kNaN}) {
    GradScaler::Options o;
    o.backoff_factor = b;
    CHECK_THROWS_WITH_AS(GradScaler{o}, doctest::Contains("The backoff factor must be < 1.0"),
                         std::invalid_argument);
  }
}

TEST_CASE("beyond PyTorch: values it accepts but that cannot work are rejected when enabled") {
  auto rejects = [](GradScaler::Options o, const char* what) {
    CHECK_THROWS_WITH_AS(GradScaler{o}, doctest::Contains(what), std::invalid_argument);
  };
  GradScaler::Options o;
  o.backoff_factor = 0.0f;
  rejects(o, "The backoff factor must be > 0");
  o.backoff_factor = -0.5f;
  rejects(o, "The backoff factor must be > 0");
  o = {};
  o.growth_factor = kInf;
  rejects(o, "The growth factor must be finite");
  o = {};
  o.growth_interval = 0;
  rejects(o, "The growth interval must be >= 1");
  o.growth_interval = -3;
  rejects(o, "The growth interval must be >= 1");
  for (float init : {0.0f, -1.0f, kInf, kNaN}) {
    o = {};
    o.init_scale = init;
    rejects(o, "The initial scale must be finite and > 0");
  }
}

TEST_CASE("a disabled scaler checks nothing and every call is a pass-through") {
  GradScaler::Options o;
  o.enabled = false;
  o.growth_factor = 0.5f;  // would throw if enabled; PyTorch checks only when enabled
  o.backoff_factor = 3.0f;
  GradScaler s(o);
  CHECK_FALSE(s.is_enabled());
  CHECK(s.get_scale() == 1.0f);
  CHECK(s.scale(3.25f) == 3.25f);
  Model m({kInf, 2.0f});
  s.unscale(m.opt);  // nothing unscaled, nothing recorded
  CHECK(std::isinf(m.grad(0)));
  CHECK(m.grad(1) == 2.0f);
  CHECK(s.stage(m.opt) == OptState::ready);
  CHECK(s.step(m.opt));  // steps even on an inf: nothing is checked
  CHECK(s.step(m.opt));  // and no state machine
  CHECK(m.opt.steps == 2);
  s.update();
  s.update(123.0f);
  CHECK(s.get_scale() == 1.0f);
  CHECK(s.growth_tracker() == 0);
  CHECK(s.state_dict() == "{}");
  s.load_state_dict("not even json");  // a no-op, as in PyTorch
  CHECK(s.get_scale() == 1.0f);
}

// ---------------------------------------------------------------------------
// scale, unscale, step

TEST_CASE("scale(loss) multiplies the FP32 loss by the FP32 scale") {
  GradScaler s;
  CHECK(s.scale(3.0f) == 196608.0f);
  CHECK(s.scale(1e-8f) == 1e-8f * 65536.0f);
  CHECK(std::isinf(s.scale(1e35f)));  // FP32 overflow is the caller's to see
  GradScaler::Options o;
  o.init_scale = 3.0f;
  GradScaler t(o);
  CHECK(bits(t.scale(0.1f)) == bits(0.1f * 3.0f));
}

TEST_CASE("unscale multiplies by the reciprocal taken in double and rounded to float") {
  GradScaler::Options o;
  o.init_scale = 3.0f;
  GradScaler s(o);
  const float inv = static_cast<float>(1.0 / 3.0);  // PyTorch: _scale.double().reciprocal().float()
  std::vector<float> g;
  for (float x = 1.0f; g.size() < 64; x = std::nextafter(x, 2.0f)) g.push_back(x);
  Model m(g);
  s.scale(1.0f);
  s.unscale(m.opt);
  int differ_from_division = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    CHECK(bits(m.grad(static_cast<int>(i))) == bits(g[i] * inv));
    differ_from_division += m.grad(static_cast<int>(i)) != g[i] / 3.0f;
  }
  // A multiply by the rounded reciprocal is not a division: about a third of
  // these gradients end one ulp away from g / 3.
  CHECK(differ_from_division > 0);
  CHECK(s.found_inf(m.opt) == false);
}

TEST_CASE("unscale multiplies by float(1/double(S)) at scales across the whole FP32 range") {
  // The expected gradient is computed here, from its definition: g times
  // the reciprocal of the scale taken in double and rounded to float
  // (PyTorch: _scale.double().reciprocal().float()), one FP32 multiply. The
  // scales: one random significand in every binade from 2^-126 to 2^127,
  // and more in the top two binades, where the reciprocal is subnormal. The
  // gradients: random significands over a wide range, and values whose
  // unscaled result is subnormal, 0 or inf.
  // What this catches: unscaling by division (g / S), forming g * (1/S) in
  // double and rounding once, or a reciprocal that loses the subnormal
  // range. What no test can catch: a reciprocal taken in FP32, 1.0f / S,
  // which under IEEE division gives the same float for every S (the double
  // quotient's 53 bits make the second rounding innocuous); PyTorch takes
  // the detour for fast-math builds, where FP32 division is approximate.
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint32_t> significand(0, (1u << 23) - 1);
  auto random_in_binade = [&](int e) {
    return std::ldexp(1.0f + std::ldexp(float(significand(rng)), -23), e);
  };
  std::vector<float> scales;
  for (int e = -126; e <= 127; ++e) scales.push_back(random_in_binade(e));
  for (int i = 0; i < 64; ++i) scales.push_back(random_in_binade(126 + i % 2));
  scales.push_back(3.0f);
  scales.push_back(0.1f);
  std::vector<float> grads = {1.0f,     -1.0f,   3.0f,         0.1f, 65504.0f, FLT_MAX,
                              -FLT_MAX, FLT_MIN, FLT_TRUE_MIN, 0.0f, -0.0f};
  for (int i = 0; i < 53; ++i) grads.push_back((i % 2 ? -1.0f : 1.0f) * random_in_binade(i * 5 - 140));
  std::int64_t compared = 0, differ_from_division = 0, differ_from_one_rounding = 0, subnormal_inverses = 0;
  for (float scale : scales) {
    CAPTURE(scale);
    GradScaler::Options o;
    o.init_scale = scale;
    GradScaler s(o);
    Model m(grads);
    s.scale(1.0f);
    s.unscale(m.opt);
    CHECK(s.found_inf(m.opt) == false);  // every input is finite, whatever the products are
    const float inv = static_cast<float>(1.0 / static_cast<double>(scale));
    subnormal_inverses += std::fpclassify(inv) == FP_SUBNORMAL;
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const float want = grads[i] * inv;
      const float got = m.grad(static_cast<int>(i));
      if (bits(got) != bits(want)) {
        FAIL_CHECK("g=" << grads[i] << " scale=" << scale << ": got " << got << " want " << want);
        break;
      }
      ++compared;
      differ_from_division +=
          bits(want) != bits(static_cast<float>(static_cast<double>(grads[i]) / static_cast<double>(scale)));
      differ_from_one_rounding +=
          bits(want) !=
          bits(static_cast<float>(static_cast<double>(grads[i]) * (1.0 / static_cast<double>(scale))));
    }
  }
  CHECK(compared == static_cast<std::int64_t>(scales.size() * grads.size()));
  // The cases can tell the rule from its look-alikes.
  CHECK(subnormal_inverses >= 64);
  CHECK(differ_from_division > 100);
  CHECK(differ_from_one_rounding > 100);
}

TEST_CASE("finiteness is judged on the scaled values, before the multiply") {
  // A scale below 1 makes inv_scale > 1: a finite scaled gradient can become
  // inf *after* the multiply, and PyTorch does not count it (checked before).
  GradScaler::Options o;
  o.init_scale = std::ldexp(1.0f, -10);
  GradScaler s(o);
  Model m({std::ldexp(1.0f, 120), 1.0f});
  s.scale(1.0f);
  CHECK(s.step(m.opt));          // not skipped...
  CHECK(std::isinf(m.grad(0)));  // ...although the unscaled gradient is inf
  CHECK(m.grad(1) == 1024.0f);
  CHECK(s.found_inf(m.opt) == false);
}

TEST_CASE("every element is unscaled, also after an inf; NaN and -inf count as non-finite") {
  for (float bad : {kInf, -kInf, kNaN}) {
    GradScaler s;
    Model m({2.0f, bad, 65536.0f, -131072.0f});
    s.scale(1.0f);
    s.unscale(m.opt);
    CHECK(s.found_inf(m.opt) == true);
    CHECK(m.grad(0) == 2.0f / 65536.0f);
    CHECK(m.grad(2) == 1.0f);
    CHECK(m.grad(3) == -2.0f);
  }
}

TEST_CASE("step skips optimizer.step() when a gradient is non-finite, and says so") {
  GradScaler s;
  Model m;
  CHECK(iteration(s, m, /*overflow=*/false));
  CHECK(m.opt.steps == 1);
  CHECK_FALSE(iteration(s, m, /*overflow=*/true));
  CHECK(m.opt.steps == 1);
  CHECK(iteration(s, m, /*overflow=*/false));
  CHECK(m.opt.steps == 2);
}

TEST_CASE("step unscales unless unscale() already did, so gradients are unscaled once") {
  GradScaler s;
  Model a({65536.0f}), b({65536.0f});
  s.scale(1.0f);
  s.unscale(a.opt);  // explicit, e.g. to clip
  CHECK(s.stage(a.opt) == OptState::unscaled);
  CHECK(a.grad(0) == 1.0f);
  CHECK(s.step(a.opt));
  CHECK(a.grad(0) == 1.0f);  // not unscaled a second time
  CHECK(s.step(b.opt));      // implicit unscale
  CHECK(b.grad(0) == 1.0f);
  CHECK(s.stage(a.opt) == OptState::stepped);
  CHECK(s.stage(b.opt) == OptState::stepped);
  s.update();
  CHECK(s.stage(a.opt) == OptState::ready);
  CHECK(s.stage(b.opt) == OptState::ready);
  CHECK(std::string(mpt::opt_state_name(OptState::unscaled)) == "UNSCALED");
}

TEST_CASE("per-optimizer records: one optimizer's overflow backs off the shared scale") {
  GradScaler s(with_interval(3));
  Model clean({1.0f}), bad({kInf});
  s.scale(1.0f);
  CHECK(s.step(clean.opt));
  CHECK_FALSE(s.step(bad.opt));
  CHECK(s.found_inf(clean.opt) == false);
  CHECK(s.found_inf(bad.opt) == true);
  s.update();
  CHECK(s.get_scale() == 32768.0f);
  CHECK(s.growth_tracker() == 0);
  CHECK_FALSE(s.found_inf(clean.opt).has_value());  // cleared by update()
}

TEST_CASE("an unscale() without step() still records the inf check update() uses") {
  GradScaler s;
  Model m({kInf});
  s.scale(1.0f);
  s.unscale(m.opt);
  s.update();  // no step(): PyTorch accepts it and uses the recorded found_inf
  CHECK(s.get_scale() == 32768.0f);
  CHECK(m.opt.steps == 0);
}

// ---------------------------------------------------------------------------
// The update rule

TEST_CASE("update: backoff on overflow resets the tracker; growth after growth_interval clean steps") {
  GradScaler s(with_interval(3, 1024.0f));
  Model m;
  const std::vector<std::pair<bool, std::pair<float, int>>> expected = {
      {false, {1024.0f, 1}}, {false, {1024.0f, 2}}, {false, {2048.0f, 0}},  // grows on the 3rd
      {false, {2048.0f, 1}}, {true, {1024.0f, 0}},                          // backoff resets
      {false, {1024.0f, 1}}, {false, {1024.0f, 2}}, {true, {512.0f, 0}},    // reset just before growth
      {false, {512.0f, 1}},  {false, {512.0f, 2}},  {false, {1024.0f, 0}},
  };
  int k = 0;
  for (const auto& e : expected) {
    CAPTURE(++k);
    CHECK(iteration(s, m, e.first) == !e.first);
    CHECK(s.get_scale() == e.second.first);
    CHECK(s.growth_tracker() == e.second.second);
  }
}

TEST_CASE("growth only when the grown scale is finite in FP32; the tracker resets either way") {
  const float big = 1.5f * std::ldexp(1.0f, 127);  // 1.5 * 2^127: doubling it is inf
  GradScaler s(with_interval(2, big));
  Model m;
  for (int round = 0; round < 3; ++round) {
    iteration(s, m, false);
    CHECK(s.growth_tracker() == 1);
    iteration(s, m, false);  // the growth step: 3 * 2^127 would overflow
    CHECK(s.get_scale() == big);
    CHECK(std::isfinite(s.get_scale()));
    CHECK(s.growth_tracker() == 0);
  }
  GradScaler t(with_interval(1, std::ldexp(1.0f, 126)));
  iteration(t, m, false);
  CHECK(t.get_scale() == std::ldexp(1.0f, 127));  // still finite: grows
  iteration(t, m, false);
  CHECK(t.get_scale() == std::ldexp(1.0f, 127));  // 2^128 is not: stays
}

TEST_CASE("no floor: consecutive overflows drive the scale from 2^16 to exactly 0") {
  GradScaler s;
  Model m;
  // 2^16 halves to 2^-126 (min normal) after 142 steps, to 2^-149 (min
  // subnormal) after 165, and the 166th gives 2^-150, a tie that rounds to
  // even: 0.
  const int expected = 16 + 149 + 1;
  int steps = 0;
  while (s.get_scale() != 0.0f && steps < 1000) {
    iteration(s, m, true);
    ++steps;
    if (steps == 142) CHECK(s.get_scale() == std::ldexp(1.0f, -126));
    if (steps == 165) CHECK(s.get_scale() == std::ldexp(1.0f, -149));
  }
  CHECK(steps == expected);
  CHECK(s.get_scale() == 0.0f);
  iteration(s, m, true);  // 0 * 0.5 = 0
  CHECK(s.get_scale() == 0.0f);
}

TEST_CASE("at scale 0 the loss is 0, unscale turns the zero gradients into NaN, and nothing skips") {
  // What a scale of 0 does under PyTorch's rules: inv_scale = 1/0 = inf, the
  // scaled gradients (0) are finite so found_inf stays 0, and 0 * inf = NaN
  // reaches the optimizer. Why a collapsed scale is not harmless.
  GradScaler s(with_interval(2000, std::ldexp(1.0f, -149)));
  Model m;
  iteration(s, m, true);
  REQUIRE(s.get_scale() == 0.0f);
  const float scaled = s.scale(5.0f);
  CHECK(scaled == 0.0f);
  m.set_grad({scaled, scaled});
  CHECK(s.step(m.opt));  // stepped
  CHECK(std::isnan(m.grad(0)));
  CHECK(std::isnan(m.grad(1)));
  s.update();
  CHECK(s.get_scale() == 0.0f);  // growth from 0 is 0
}

TEST_CASE("factors that are not FP32 values: the scale is float(double(scale) * factor) after every update") {
  // PyTorch's update rule (torch.amp.GradScaler.update, the
  // _amp_update_scale_ kernels), written out here with the factors as
  // doubles: on an inf, scale = float(double(scale) * backoff) and the
  // tracker resets; otherwise the tracker counts, and on reaching the
  // interval scale = float(double(scale) * growth) if that is finite, and
  // the tracker resets. 0.3, 1.1 and 1.7 are not FP32 values, so a product
  // taken in float (the factor rounded to float first) gives other bits
  // within a few steps: checked below for every configuration. The
  // configurations: the GPU test's cases (tests/cuda_host/scale_update_cases.hpp)
  // and four more.
  using Config = mpt::test::ScaleUpdateCase;
  std::vector<Config> configs = mpt::test::scale_update_cases();
  configs.push_back({"growth 1.1, backoff 0.3, interval 2", 1000.0f, 1.1, 0.3, 2});
  configs.push_back({"growth 1.1, backoff 0.3, interval 3", 0.1f * 65536.0f, 1.1, 0.3, 3});
  configs.push_back({"growth 1.7, backoff 0.3, interval 1", 65536.0f, 1.7, 0.3, 1});
  configs.push_back({"growth 1.7 up to FP32's top", 0x1p+120f, 1.7, 0.3, 1});
  auto rule = [](float& scale, std::int32_t& tracker, bool found_inf, const Config& c, bool in_float) {
    const double growth = in_float ? static_cast<float>(c.growth) : c.growth;
    const double backoff = in_float ? static_cast<float>(c.backoff) : c.backoff;
    if (found_inf) {
      scale = static_cast<float>(static_cast<double>(scale) * backoff);
      tracker = 0;
    } else if (++tracker == c.interval) {
      const float grown = static_cast<float>(static_cast<double>(scale) * growth);
      if (std::isfinite(grown)) scale = grown;
      tracker = 0;
    }
  };
  // Hand-written patterns, then the seeded ones of the GPU test's cases.
  std::vector<std::vector<bool>> patterns = {
      {true, true, true, false, false, false, false, true, false, false, false, false},
      std::vector<bool>(60, false),
      {false, true, false, false, true, true, false, false, false, true, false, false, false, false, false},
  };
  std::mt19937 rng(3);
  for (int p = 0; p < 4; ++p) {
    std::vector<bool> f;
    for (int k = 0; k < 300; ++k) f.push_back(rng() % 4 == 0);
    patterns.push_back(f);
  }
  for (const Config& c : configs) {
    std::vector<std::vector<bool>> all = patterns;
    all.push_back(mpt::test::scale_update_flags(c, 20240101ull));
    int telling_patterns = 0;
    for (const auto& flags : all) {
      const std::string name = c.name;
      const std::size_t steps = flags.size();
      CAPTURE(name);
      CAPTURE(steps);
      GradScaler::Options o;
      o.init_scale = c.init;
      o.growth_factor = c.growth;
      o.backoff_factor = c.backoff;
      o.growth_interval = c.interval;
      GradScaler s(o);
      Model m;
      float want = c.init, in_float = c.init;
      std::int32_t tracker = 0, tracker_f = 0;
      int k = 0, first_float_difference = -1;
      for (bool overflow : flags) {
        CHECK(iteration(s, m, overflow) == !overflow);
        rule(want, tracker, overflow, c, false);
        rule(in_float, tracker_f, overflow, c, true);
        if (first_float_difference < 0 && bits(want) != bits(in_float)) first_float_difference = k;
        if (bits(s.get_scale()) != bits(want) || s.growth_tracker() != tracker) {
          FAIL_CHECK("step " << k << ": scale " << s.get_scale() << " tracker " << s.growth_tracker()
                             << ", want " << want << " tracker " << tracker);
          break;
        }
        ++k;
      }
      telling_patterns += first_float_difference >= 0;
    }
    // A configuration with a non-FP32 factor has a pattern that tells a
    // product in double from one in float.
    const bool fp32_factors =
        static_cast<float>(c.growth) == c.growth && static_cast<float>(c.backoff) == c.backoff;
    const std::string name = c.name;
    CAPTURE(name);
    CHECK((telling_patterns > 0) == !fp32_factors);
  }
}

TEST_CASE("backoff 0.3, growth 1.1, interval 2 from 1000: the scales written out") {
  // Computed by hand (in Python: each product in double, rounded to float
  // with struct.pack('f', ...)). Taken in float, the third backoff would
  // already give 0x1.b00002p+4 (27.000002), not 27.
  GradScaler::Options o;
  o.init_scale = 1000.0f;
  o.growth_factor = 1.1;
  o.backoff_factor = 0.3;
  o.growth_interval = 2;
  GradScaler s(o);
  Model m;
  const struct {
    bool overflow;
    float scale;
    std::int32_t tracker;
  } expected[] = {
      {true, 300.0f, 0},          {true, 90.0f, 0},           {true, 27.0f, 0},
      {false, 27.0f, 1},          {false, 0x1.db3334p+4f, 0}, {false, 0x1.db3334p+4f, 1},
      {false, 0x1.055c2ap+5f, 0}, {true, 0x1.39a1ccp+3f, 0},  {false, 0x1.39a1ccp+3f, 1},
      {false, 0x1.58fec6p+3f, 0}, {false, 0x1.58fec6p+3f, 1}, {false, 0x1.7b7ea6p+3f, 0},
  };
  int k = 0;
  for (const auto& e : expected) {
    CAPTURE(++k);
    iteration(s, m, e.overflow);
    CHECK(bits(s.get_scale()) == bits(e.scale));
    CHECK(s.growth_tracker() == e.tracker);
  }
}

TEST_CASE("update(new_scale) sets the scale, leaves the tracker, needs no inf check") {
  GradScaler s(with_interval(10));
  Model m;
  iteration(s, m, false);
  iteration(s, m, false);
  REQUIRE(s.growth_tracker() == 2);
  s.scale(1.0f);
  s.unscale(m.opt);
  s.update(1000.0f);
  CHECK(s.get_scale() == 1000.0f);
  CHECK(s.growth_tracker() == 2);  // PyTorch fills _scale only
  CHECK(s.stage(m.opt) == OptState::ready);
  s.update(0.1f);  // no check needed at all, not even a step
  CHECK(s.get_scale() == 0.1f);
  iteration(s, m, false);
  CHECK(s.growth_tracker() == 3);  // the count goes on
}

// ---------------------------------------------------------------------------
// The state machine and its errors

TEST_CASE("misuse: unscale twice before update") {
  GradScaler s;
  Model m({65536.0f});
  s.scale(1.0f);
  s.unscale(m.opt);
  CHECK_THROWS_WITH_AS(
      s.unscale(m.opt),
      doctest::Contains("unscale() has already been called on this optimizer since the last update()"),
      std::logic_error);
  CHECK(m.grad(0) == 1.0f);  // the failed call unscaled nothing
}

TEST_CASE("misuse: unscale after step") {
  GradScaler s;
  Model m;
  s.scale(1.0f);
  s.step(m.opt);
  CHECK_THROWS_WITH_AS(s.unscale(m.opt), doctest::Contains("unscale() is being called after step()"),
                       std::logic_error);
}

TEST_CASE("misuse: step twice before update (update() forgotten)") {
  GradScaler s;
  Model m;
  iteration(s, m, false);
  s.scale(1.0f);
  s.step(m.opt);
  // The next iteration without update(): the error says what to do.
  s.scale(1.0f);
  CHECK_THROWS_WITH_AS(s.step(m.opt),
                       doctest::Contains("step() has already been called since the last update(); "
                                         "call update()"),
                       std::logic_error);
  CHECK(m.opt.steps == 2);
}

TEST_CASE("misuse: update with no recorded inf check") {
  GradScaler s;
  s.scale(1.0f);
  CHECK_THROWS_WITH_AS(s.update(), doctest::Contains("No inf checks were recorded prior to update"),
                       std::logic_error);
  Model m;
  iteration(s, m, false);
  CHECK_THROWS_WITH_AS(s.update(), doctest::Contains("No inf checks were recorded prior to update"),
                       std::logic_error);  // the previous update() consumed the checks
  CHECK(s.growth_tracker() == 1);          // and the failed one changed nothing
}

TEST_CASE("misuse: unscale, step or update before any scale()") {
  GradScaler s;
  Model m;
  CHECK_THROWS_WITH_AS(s.unscale(m.opt), doctest::Contains("before any scale()"), std::logic_error);
  CHECK_THROWS_WITH_AS(s.step(m.opt), doctest::Contains("scaler.scale(loss)"), std::logic_error);
  CHECK_THROWS_WITH_AS(s.update(), doctest::Contains("before any scale()"), std::logic_error);
  CHECK_THROWS_AS(s.update(8.0f), std::logic_error);
  CHECK(m.opt.steps == 0);
}

TEST_CASE("misuse: step with an optimizer that has no parameters records no inf check") {
  GradScaler s;
  CountingOptimizer empty({});
  s.scale(1.0f);
  CHECK_THROWS_WITH_AS(s.step(empty), doctest::Contains("No inf checks were recorded for this optimizer"),
                       std::logic_error);
  CHECK(empty.steps == 0);
  CHECK_FALSE(s.found_inf(empty).has_value());
  CHECK_THROWS_AS(s.update(), std::logic_error);  // nothing recorded
}

// ---------------------------------------------------------------------------
// state_dict / load_state_dict

TEST_CASE("state_dict has PyTorch's five keys in PyTorch's order") {
  GradScaler s;
  CHECK(
      s.state_dict() ==
      R"({"scale":65536.0,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":2000,"_growth_tracker":0})");
}

TEST_CASE("state_dict round trip: a fresh scaler continues exactly where the saved one was") {
  GradScaler::Options o;
  o.init_scale = 0.1f * 65536.0f;  // not a power of two: exercises exact float round trip
  o.growth_factor = 1.1f;
  o.backoff_factor = 0.3f;
  o.growth_interval = 4;
  GradScaler a(o);
  Model ma;
  for (bool overflow : {false, true, false, false, false, false, false, true, false, false})
    iteration(a, ma, overflow);
  const std::string saved = a.state_dict();

  GradScaler b(with_interval(77, 3.0f));
  b.load_state_dict(saved);
  CHECK(b.state_dict() == saved);
  CHECK(bits(b.get_scale()) == bits(a.get_scale()));
  CHECK(b.get_growth_factor() == 1.1f);
  CHECK(b.get_backoff_factor() == 0.3f);
  CHECK(b.get_growth_interval() == 4);
  CHECK(b.growth_tracker() == a.growth_tracker());
  Model mb;
  for (bool overflow : {false, false, false, true, false, false, false, false, false}) {
    iteration(a, ma, overflow);
    iteration(b, mb, overflow);
    CHECK(bits(a.get_scale()) == bits(b.get_scale()));
    CHECK(a.growth_tracker() == b.growth_tracker());
  }
}

TEST_CASE("load_state_dict before the first scale() sets the scale get_scale() reports") {
  GradScaler s;
  s.load_state_dict(
      R"({"scale":1024,"growth_factor":2,"backoff_factor":0.5,"growth_interval":10,"_growth_tracker":3})");
  CHECK(s.get_scale() == 1024.0f);  // integers are fine for the float fields
  CHECK(s.growth_tracker() == 3);
  Model m;
  CHECK_THROWS_AS(s.step(m.opt), std::logic_error);  // still needs a scale() first, as PyTorch
  CHECK(s.scale(1.0f) == 1024.0f);
}

TEST_CASE("load_state_dict: an empty state (from a disabled scaler) is an error") {
  GradScaler::Options off;
  off.enabled = false;
  const std::string empty = GradScaler(off).state_dict();
  REQUIRE(empty == "{}");
  GradScaler s;
  CHECK_THROWS_WITH_AS(s.load_state_dict(empty),
                       doctest::Contains("The source state dict is empty, possibly because it was "
                                         "saved from a disabled instance of GradScaler"),
                       std::invalid_argument);
}

TEST_CASE("load_state_dict: every bad state is one clear line and leaves the scaler unchanged") {
  const std::string good_keys =
      R"("growth_factor":2.0,"backoff_factor":0.5,"growth_interval":100,"_growth_tracker":7)";
  auto with = [&](const std::string& scale) { return "{\"scale\":" + scale + "," + good_keys + "}"; };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "not valid JSON"},
      {"{\"scale\": 1", "not valid JSON"},
      {"[1, 2]", "expected a JSON object"},
      {"3.5", "expected a JSON object"},
      {"{}", "The source state dict is empty"},
      {R"({"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":100,"_growth_tracker":7})",
       "missing key 'scale'"},
      {R"({"scale":8.0,"backoff_factor":0.5,"growth_interval":100,"_growth_tracker":7})",
       "missing key 'growth_factor'"},
      {R"({"scale":8.0,"growth_factor":2.0,"growth_interval":100,"_growth_tracker":7})",
       "missing key 'backoff_factor'"},
      {R"({"scale":8.0,"growth_factor":2.0,"backoff_factor":0.5,"_growth_tracker":7})",
       "missing key 'growth_interval'"},
      {R"({"scale":8.0,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":100})",
       "missing key '_growth_tracker'"},
      {with("\"65536\""), "'scale' must be a number, got string"},
      {with("null"), "'scale' must be a number, got null"},
      {with("true"), "'scale' must be a number, got boolean"},
      {R"({"scale":8.0,"growth_factor":[2],"backoff_factor":0.5,"growth_interval":100,"_growth_tracker":7})",
       "'growth_factor' must be a number, got array"},
      {R"({"scale":8.0,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":100.5,"_growth_tracker":7})",
       "'growth_interval' must be an integer, got the non-integer 100.5"},
      {R"({"scale":8.0,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":100,"_growth_tracker":"7"})",
       "'_growth_tracker' must be an integer, got string"},
      {R"({"scale":8.0,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":2147483648,"_growth_tracker":7})",
       "does not fit in an int32"},
      {with("1e39"), "'scale' must be finite and > 0 in FP32, got 1e+39 (inf in FP32)"},
      {with("0"), "'scale' must be finite and > 0"},
      {with("-1024.0"), "'scale' must be finite and > 0"},
      {with("1e-50"), "(0 in FP32)"},
      {R"({"scale":8.0,"growth_factor":1.0,"backoff_factor":0.5,"growth_interval":100,"_growth_tracker":7})",
       "The growth factor must be > 1.0"},
      {R"({"scale":8.0,"growth_factor":2.0,"backoff_factor":1.5,"growth_interval":100,"_growth_tracker":7})",
       "The backoff factor must be < 1.0"},
      {R"({"scale":8.0,"growth_factor":2.0,"backoff_factor":0,"growth_interval":100,"_growth_tracker":7})",
       "The backoff factor must be > 0"},
      {R"({"scale":8.0,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":0,"_growth_tracker":0})",
       "The growth interval must be >= 1"},
      {R"({"scale":8.0,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":100,"_growth_tracker":-1})",
       "'_growth_tracker' must be in [0, growth_interval)"},
      {R"({"scale":8.0,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":100,"_growth_tracker":100})",
       "'_growth_tracker' must be in [0, growth_interval) = [0, 100), got 100"},
  };
  GradScaler s(with_interval(5, 512.0f));
  Model m;
  iteration(s, m, false);
  iteration(s, m, false);
  const std::string before = snapshot(s);
  for (const auto& c : cases) {
    CAPTURE(c.first);
    try {
      s.load_state_dict(c.first);
      FAIL("no error for a bad state");
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      CHECK_MESSAGE(what.find(c.second) != std::string::npos, what);
      CHECK(what.rfind("GradScaler::load_state_dict: ", 0) == 0);
      CHECK(what.find('\n') == std::string::npos);
    }
    CHECK(snapshot(s) == before);
  }
  s.load_state_dict(with("8.0"));  // and the same shape with good values loads
  CHECK(s.get_scale() == 8.0f);
  CHECK(s.growth_tracker() == 7);
  CHECK(s.get_growth_interval() == 100);
}

TEST_CASE("load_state_dict ignores unknown keys, as PyTorch reads only its own") {
  GradScaler s;
  s.load_state_dict(
      R"({"scale":4.0,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":9,"_growth_tracker":1,"note":"x"})");
  CHECK(s.get_scale() == 4.0f);
}

// ---------------------------------------------------------------------------
// StaticScaler

TEST_CASE("StaticScaler: the scale never changes, and by default an overflow is not skipped") {
  StaticScaler s(1024.0f);
  CHECK(s.get_scale() == 1024.0f);
  CHECK_FALSE(s.skips_nonfinite_steps());
  Model m({2048.0f, kInf});
  CHECK(s.scale(2.0f) == 2048.0f);
  CHECK(s.step(m.opt));  // no skip (apex's static loss scale): the inf goes to the optimizer
  CHECK(m.opt.steps == 1);
  CHECK(s.found_inf(m.opt) == true);
  CHECK(m.grad(0) == 2.0f);
  s.update();
  CHECK(s.get_scale() == 1024.0f);
  s.update();  // no inf check needed
  CHECK(s.get_scale() == 1024.0f);
}

TEST_CASE("StaticScaler: with skip_nonfinite_steps it skips like GradScaler but keeps its scale") {
  StaticScaler s(1024.0f, /*skip_nonfinite_steps=*/true);
  Model m({kNaN});
  CHECK_FALSE(s.step(m.opt));
  CHECK(m.opt.steps == 0);
  s.update();
  CHECK(s.get_scale() == 1024.0f);
}

TEST_CASE("StaticScaler: the same state machine and misuse errors") {
  StaticScaler s(8.0f);
  Model m({8.0f});
  s.unscale(m.opt);
  CHECK(m.grad(0) == 1.0f);
  CHECK_THROWS_WITH_AS(s.unscale(m.opt), doctest::Contains("StaticScaler::unscale() has already been called"),
                       std::logic_error);
  s.step(m.opt);
  CHECK_THROWS_WITH_AS(s.unscale(m.opt), doctest::Contains("after step()"), std::logic_error);
  CHECK_THROWS_WITH_AS(s.step(m.opt), doctest::Contains("step() has already been called"), std::logic_error);
  s.update();
  CHECK(s.stage(m.opt) == OptState::ready);
  for (float bad : {0.0f, -1.0f, kInf, kNaN})
    CHECK_THROWS_WITH_AS(StaticScaler{bad}, doctest::Contains("the scale must be finite and > 0"),
                         std::invalid_argument);
}
