// Chapter 02 — loss scaling and FP32 master weights: the scale-update
// sequences of the GPU test (tests/cuda_host/scale_update_cases.hpp) on the
// CPU, to give that test teeth without a GPU.
// Depends on: mpt/amp/scaler_math.hpp (update_scale), mpt/amp/grad_scaler.hpp,
// mpt/nn/parameter.hpp, tests/cuda_host/scale_update_cases.hpp.
//
// tests/cuda/test_ch02_scaler.cu compares the device's scale, step for step
// and bit for bit, with mpt::update_scale run with the cases' double factors.
// Two facts make that comparison mean something:
//  1. that reference is the CPU GradScaler's own sequence (checked here by
//     driving a GradScaler through the same overflows; the GradScaler in
//     turn is held to PyTorch's rule written out independently, in
//     test_ch02_grad_scaler.cpp, on these same cases), and
//  2. with factors rounded to float — what a float somewhere between the
//     API and mpt::update_scale would do — the sequence is different for
//     every case whose factors are not FP32 values (0.3, 1.7), within the
//     steps that do not depend on the seed. So a float API fails the GPU
//     test; the cases with FP32 factors alone could not tell.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "../cuda_host/scale_update_cases.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/amp/scaler_math.hpp"
#include "mpt/nn/parameter.hpp"

namespace {

using mpt::test::ScaleUpdateCase;
using mpt::test::ScaleUpdateStep;

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

double as_float(double x) { return static_cast<double>(static_cast<float>(x)); }

// An optimizer that changes nothing; the scaler only needs its gradients.
struct NullOptimizer : mpt::Optimizer {
  explicit NullOptimizer(std::vector<mpt::Parameter*> ps) : Optimizer(std::move(ps)) {}
  void step() override {}
};

// The GradScaler's scale and tracker after each step, an inf put into the
// (scaled) gradient on the steps flags marks.
std::vector<ScaleUpdateStep> grad_scaler_sequence(const ScaleUpdateCase& c, const std::vector<bool>& flags) {
  mpt::GradScaler::Options o;
  o.init_scale = c.init;
  o.growth_factor = c.growth;
  o.backoff_factor = c.backoff;
  o.growth_interval = c.interval;
  mpt::GradScaler scaler(o);
  mpt::Parameter p("p", mpt::Tensor(mpt::DType::f32, {1, 2}));
  NullOptimizer opt({&p});
  std::vector<ScaleUpdateStep> out;
  for (bool overflow : flags) {
    const float scaled = scaler.scale(1.0f);
    p.grad.f32()(0, 0) = scaled * 0.5f;
    p.grad.f32()(0, 1) = overflow ? std::numeric_limits<float>::infinity() : scaled * 0.25f;
    scaler.step(opt);
    scaler.update();
    out.push_back({scaler.get_scale(), scaler.growth_tracker()});
  }
  return out;
}

// The first step at which two sequences differ (in scale bits or tracker), or -1.
int first_difference(const std::vector<ScaleUpdateStep>& a, const std::vector<ScaleUpdateStep>& b) {
  for (std::size_t s = 0; s < a.size() && s < b.size(); ++s)
    if (bits(a[s].scale) != bits(b[s].scale) || a[s].tracker != b[s].tracker) return static_cast<int>(s);
  return a.size() == b.size() ? -1 : static_cast<int>(std::min(a.size(), b.size()));
}

bool fp32_factors(const ScaleUpdateCase& c) {
  return as_float(c.growth) == c.growth && as_float(c.backoff) == c.backoff;
}

}  // namespace

TEST_CASE("the GPU test's reference is the CPU GradScaler's sequence, bit for bit") {
  for (const ScaleUpdateCase& c : mpt::test::scale_update_cases()) {
    CAPTURE(c.name);
    for (std::uint64_t seed : {20240101ull, 1ull, 12345ull}) {
      const std::vector<bool> flags = mpt::test::scale_update_flags(c, seed);
      CHECK(first_difference(grad_scaler_sequence(c, flags),
                             mpt::test::scale_update_sequence(c, flags, c.growth, c.backoff)) == -1);
    }
  }
}

TEST_CASE("the reference reaches the extremes the GPU test asserts: 2^127 at most, and 0") {
  for (const ScaleUpdateCase& c : mpt::test::scale_update_cases()) {
    CAPTURE(c.name);
    const std::vector<ScaleUpdateStep> ref = mpt::test::scale_update_sequence(
        c, mpt::test::scale_update_flags(c, 20240101ull), c.growth, c.backoff);
    float most = 0.0f;
    for (const ScaleUpdateStep& s : ref) most = std::max(most, s.scale);
    if (c.init >= 0x1p+126f) CHECK(most == 0x1p+127f);  // grows to 2^127, never to inf
    if (c.init < 1.0f) CHECK(ref[199].scale == 0.0f);   // no floor: driven to 0
  }
}

TEST_CASE("factors rounded to float change the sequence of every case whose factors are not FP32") {
  int sensitive = 0;
  for (const ScaleUpdateCase& c : mpt::test::scale_update_cases()) {
    CAPTURE(c.name);
    // The steps every seed shares: the GPU test runs them whatever MPT_SEED is.
    std::vector<bool> flags = mpt::test::scale_update_flags(c, 0);
    flags.resize(mpt::test::kFixedSteps);
    const std::vector<ScaleUpdateStep> with_doubles =
        mpt::test::scale_update_sequence(c, flags, c.growth, c.backoff);
    const std::vector<ScaleUpdateStep> with_floats =
        mpt::test::scale_update_sequence(c, flags, as_float(c.growth), as_float(c.backoff));
    const int at = first_difference(with_doubles, with_floats);
    if (fp32_factors(c)) {
      CHECK(at == -1);  // nothing to round: such a case cannot tell float from double
      continue;
    }
    ++sensitive;
    CHECK(at >= 0);
    if (as_float(c.backoff) != c.backoff) {
      // Steps 0..19 all back off: the third backoff is the first that differs.
      INFO("step 2: double ", with_doubles[2].scale, " float ", with_floats[2].scale);
      CHECK(at == 2);
    } else {
      // Backoff 0.5 is exact; from 2^-20 the scale grows by 1.7 every clean
      // step (interval 1) from step 20 on: the fifth growth differs.
      CHECK(at == 24);
    }
  }
  CHECK(sensitive == 3);
}

TEST_CASE("backoff 0.3: the scale from 1000 after three backoffs, double against float factor") {
  // The numbers behind the case above, written out: 1000 * 0.3 * 0.3 * 0.3
  // with each product formed in double and rounded to float.
  float d = 1000.0f, f = 1000.0f;
  std::int32_t td = 0, tf = 0;
  for (int i = 0; i < 3; ++i) {
    mpt::update_scale(d, td, true, 2.0, 0.3, 2000);
    mpt::update_scale(f, tf, true, 2.0, static_cast<float>(0.3), 2000);
    if (i < 2) CHECK(bits(d) == bits(f));
  }
  CHECK(bits(d) != bits(f));
  CHECK(bits(d) ==
        bits(static_cast<float>(static_cast<float>(static_cast<float>(1000.0 * 0.3) * 0.3) * 0.3)));
}
