// Chapter 05 — exercises: grader tests for exercise 5.2 (the found-inf flag of a sharded scaler).
// Depends on: grader.hpp; the amp tier's GradScaler (its found-inf seam) and
// the optim tier's SGD for the seam's test cases.
// The verdict must be the same on every rank, and true as soon as any rank
// holds an inf or a NaN, wherever it is: only the last rank's +inf, only
// rank 0's NaN, a −inf beside a rank with no gradients at all. Then the seam
// in a GradScaler: a step skipped everywhere or nowhere, one scale.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "grader.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/optim/sgd.hpp"

namespace {

using namespace mpt::ex05;
using namespace mpt::ex05::grading;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Finite gradients of either sign, different on every rank.
std::vector<std::vector<float>> finite_gradients() {
  const auto r = static_cast<float>(world().rank());
  return {{0.5f + r, -2.0f, 1e-30f}, {65504.0f * (1.0f + r), -3.0e38f}, {}, {0.0f, -0.0f}};
}

// Every rank's verdict, checked to be `expected` on every rank.
void expect_verdict(const std::vector<std::vector<float>>& grads, bool expected, const char* situation) {
  bool verdict = !expected;
  on_every_rank([&] { verdict = found_inf_across(world(), grads); });
  const std::string what = std::string(situation) + ": expected " + (expected ? "true" : "false") +
                           " on every rank; rank 0 got " + (verdict ? "true" : "false") +
                           " (the table shows rank 0's view)";
  CHECK_MESSAGE(everyone(verdict == expected), what);
}

struct SeamRun {
  bool stepped = false;
  float scale = 0.0f;
  std::vector<float> masters;
};

// One iteration of a GradScaler with the seam: a small MLP, SGD, backward
// left out (the gradients are set); an inf in the last rank's first
// gradient when `overflow`.
SeamRun seam_iteration(bool overflow) {
  mpt::MlpConfig c;
  c.sizes = {3, 4, 2};
  c.seed = 11;
  mpt::Mlp net(c);
  mpt::SGD sgd(net.parameters(), mpt::SgdOptions{0.1, 0.0});
  mpt::GradScaler scaler;
  on_every_rank([&] { scaler.set_found_inf_reduction(found_inf_seam(world())); });
  const float s = scaler.scale(1.0f);
  for (mpt::Parameter* p : net.parameters())
    for (std::int64_t i = 0; i < p->grad.numel(); ++i) p->grad.f32_data()[i] = 0.25f * s;
  if (overflow && world().rank() == world().size() - 1) net.parameters()[0]->grad.f32_data()[0] = kInf;
  SeamRun run;
  on_every_rank([&] {
    run.stepped = scaler.step(sgd);
    scaler.update();
  });
  run.scale = scaler.get_scale();
  run.masters = masters_of(net);
  return run;
}

}  // namespace

TEST_SUITE("exercise-5.2") {
  TEST_CASE("5.2 no inf or NaN on any rank: false on every rank") {
    expect_verdict(finite_gradients(), false, "finite gradients everywhere (up to 3e38)");
  }

  TEST_CASE("5.2 +inf in the last rank's gradients only: true on every rank") {
    auto g = finite_gradients();
    if (world().rank() == world().size() - 1) g[1][1] = kInf;
    expect_verdict(g, true, "+inf on the last rank only");
  }

  TEST_CASE("5.2 NaN in rank 0's gradients only: true on every rank (NaN wins too) [17 points]") {
    auto g = finite_gradients();
    if (world().rank() == 0) g[0][2] = std::numeric_limits<float>::quiet_NaN();
    expect_verdict(g, true, "NaN on rank 0 only");
  }

  TEST_CASE("5.2 -inf on rank 0, no gradients at all on the last rank: it joins, true everywhere [1 point]") {
    std::vector<std::vector<float>> g;
    if (world().rank() != world().size() - 1) g = finite_gradients();
    if (world().rank() == 0 && !g.empty()) g[3][1] = -kInf;
    expect_verdict(g, world().size() > 1 || !g.empty(), "-inf on rank 0, an empty list on the last rank");
  }

  TEST_CASE("5.2 the seam in a GradScaler: one rank's inf skips the step on every rank, one scale") {
    const SeamRun run = seam_iteration(true);
    const bool ok = !run.stepped && run.scale == 32768.0f;
    CHECK_MESSAGE(everyone(ok),
                  "expected the step skipped and the scale backed off to 32768 on every rank; "
                  "rank 0: "
                      << std::string(run.stepped ? "stepped" : "skipped") << ", scale " << run.scale);
    CHECK_MESSAGE(everyone(same_on_every_rank(run.masters)), "the ranks' weights differ after the iteration");
  }

  TEST_CASE("5.2 the seam when no rank overflows: every rank steps, the scale stays [1 point]") {
    const SeamRun run = seam_iteration(false);
    CHECK_MESSAGE(everyone(run.stepped && run.scale == 65536.0f),
                  "expected a step and the scale 65536 on every rank; rank 0: "
                      << std::string(run.stepped ? "stepped" : "skipped") << ", scale " << run.scale);
  }
}  // TEST_SUITE
