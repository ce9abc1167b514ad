// Chapter 02 exercises — grader tests for exercise 2.4 (diagnose: gradient
// accumulation under a GradScaler). Depends on: grader.hpp (the reference:
// one iteration on the whole effective batch; CountingOptimizer; the
// micro-batches and the network).
// Four test cases, three points each (a diagnose exercise's): one step on
// the effective batch's gradient, one scaler iteration per call, an overflow
// in any micro-batch skips the whole step, a run of iterations. The given,
// broken body (step and update inside the micro-batch loop) fails every one
// of them; every test uses two micro-batches or more.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex02;
using namespace mpt::ex02::grading;

std::string flag(bool b) { return b ? "true" : "false"; }

// Accumulating K micro-batches sums their gradients, each rounded to the
// weights' dtype, in another order than one backward pass over the whole
// batch: the weight changes agree to well under 1% (measured: 3e-4 in fp16,
// 2e-3 in bf16, 1e-6 in FP32, at most 3e-4 over the 20 iterations of the
// last test, whose losses then agree to 1e-4). Stepping K times, or on one
// micro-batch's gradient, misses by 0.7 and more.
constexpr double kChangeTolerance = 1e-2;
constexpr double kLossTolerance = 1e-3;

bool close_loss(float got, float want) {
  return std::fabs(static_cast<double>(got) - want) <= kLossTolerance * std::fabs(static_cast<double>(want));
}

}  // namespace

TEST_SUITE("exercise-2.4") {
  TEST_CASE("2.4 four micro-batches, one SGD step: the weights move as one step on the whole batch") {
    Mismatches m;
    for (mpt::DType dtype : {mpt::DType::f16, mpt::DType::bf16, mpt::DType::f32}) {
      const std::string what = "a " + std::string(mpt::dtype_name(dtype)) +
                               " network, 4 micro-batches of 16, SGD lr 0.1, a fresh GradScaler";
      const std::vector<mpt::Dataset> parts = micro_batches(240u, 4, 16);
      mpt::Mlp net = accumulation_net(dtype, 11);
      mpt::Mlp ref = accumulation_net(dtype, 11);
      mpt::SgdOptions o;
      o.lr = 0.1;
      mpt::SGD sgd(net.parameters(), o);
      mpt::SGD ref_sgd(ref.parameters(), o);
      CountingOptimizer opt(sgd);
      mpt::GradScaler scaler, ref_scaler;
      const std::vector<mpt::MatrixF> before = masters_of(net);
      const AccumulationResult got = accumulate_and_step(net, opt, scaler, parts);
      const AccumulationResult want = reference_iteration(ref, ref_sgd, ref_scaler, parts);
      m.checked();
      const double error = change_error(before, masters_of(net), masters_of(ref));
      std::string problem;
      if (opt.steps != 1)
        problem = "the optimizer stepped " + std::to_string(opt.steps) + " times, expected once";
      else if (got.stepped != want.stepped)
        problem = "stepped = " + flag(got.stepped) + ", expected " + flag(want.stepped);
      else if (!(error <= kChangeTolerance))
        problem = "the weights' change is " + describe(error) +
                  " (relative) away from one step on the whole batch's gradient";
      else if (!close_loss(got.loss, want.loss))
        problem = "loss " + describe(got.loss) + ", expected the mean of the micro-batches' losses, " +
                  describe(want.loss);
      else if (!copies_refreshed(net))
        problem = "the model copies are not the masters rounded (refresh_model_copies after the step)";
      if (!problem.empty() && m.wrong()) m.detail(what + ": " + problem);
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE(
      "2.4 the scaler ends one iteration per call: the growth tracker counts calls, not micro-batches") {
    Mismatches m;
    mpt::GradScaler::Options o;
    o.init_scale = 1024.0f;
    o.growth_interval = 3;
    mpt::GradScaler scaler(o);
    mpt::Mlp net = accumulation_net(mpt::DType::f16, 12);
    mpt::SgdOptions so;
    so.lr = 0.05;
    mpt::SGD sgd(net.parameters(), so);
    CountingOptimizer opt(sgd);
    float want_scale = o.init_scale;
    std::int32_t want_tracker = 0;
    for (int call = 1; call <= 7; ++call) {
      m.checked();
      const AccumulationResult got = accumulate_and_step(net, opt, scaler, micro_batches(300u + call, 2, 8));
      mpt::update_scale(want_scale, want_tracker, false, o.growth_factor, o.backoff_factor,
                        o.growth_interval);
      if (got.stepped && scaler.get_scale() == want_scale && scaler.growth_tracker() == want_tracker &&
          opt.steps == call)
        continue;
      if (m.wrong())
        m.detail(
            "GradScaler(init_scale=1024, growth_interval=3), 2 micro-batches a call, no overflow: after "
            "call " +
            std::to_string(call) + " the scale is " + describe(scaler.get_scale()) + " and the tracker " +
            std::to_string(scaler.growth_tracker()) + " (" + std::to_string(opt.steps) +
            " optimizer steps, stepped = " + flag(got.stepped) + "); expected " + describe(want_scale) +
            ", tracker " + std::to_string(want_tracker) + ", " + std::to_string(call) + " steps");
      break;  // after a first difference the states differ for ever
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.4 an overflow in any micro-batch skips the whole step and backs the scale off once") {
    Mismatches m;
    for (int bad : {0, 1, 2}) {
      m.checked();
      // Targets of 1e5 in one micro-batch: S * dloss overflows fp16 in backward.
      const std::vector<mpt::Dataset> parts = micro_batches(400u, 3, 16, bad, 1e5f);
      mpt::Mlp net = accumulation_net(mpt::DType::f16, 13);
      mpt::SGD sgd(net.parameters());
      CountingOptimizer opt(sgd);
      mpt::GradScaler scaler;
      const std::vector<mpt::MatrixF> before = masters_of(net);
      const AccumulationResult got = accumulate_and_step(net, opt, scaler, parts);
      const std::vector<mpt::MatrixF> after = masters_of(net);
      bool unchanged = true;
      for (std::size_t i = 0; i < before.size(); ++i)
        unchanged = unchanged && (before[i].array() == after[i].array()).all();
      std::string problem;
      if (got.stepped || opt.steps != 0)
        problem = "the optimizer stepped " + std::to_string(opt.steps) +
                  " times (stepped = " + flag(got.stepped) + "), expected no step at all";
      else if (!unchanged) problem = "the master weights changed";
      else if (scaler.get_scale() != 32768.0f || scaler.growth_tracker() != 0)
        problem = "the scale is " + describe(scaler.get_scale()) + ", tracker " +
                  std::to_string(scaler.growth_tracker()) + "; expected one backoff, 32768, tracker 0";
      if (!problem.empty() && m.wrong())
        m.detail("an fp16 network, 3 micro-batches, micro-batch " + std::to_string(bad) +
                 " overflows (targets of 1e5): " + problem);
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.4 twenty iterations with momentum follow the whole-batch run") {
    Mismatches m;
    mpt::Mlp net = accumulation_net(mpt::DType::f16, 14);
    mpt::Mlp ref = accumulation_net(mpt::DType::f16, 14);
    mpt::SgdOptions o;
    o.lr = 0.05;
    o.momentum = 0.9;
    mpt::SGD sgd(net.parameters(), o);
    mpt::SGD ref_sgd(ref.parameters(), o);
    CountingOptimizer opt(sgd);
    mpt::GradScaler scaler, ref_scaler;
    const std::vector<mpt::MatrixF> start = masters_of(net);
    for (int it = 1; it <= 20; ++it) {
      m.checked();
      const std::vector<mpt::Dataset> parts = micro_batches(500u + it, 4, 8);
      const AccumulationResult got = accumulate_and_step(net, opt, scaler, parts);
      const AccumulationResult want = reference_iteration(ref, ref_sgd, ref_scaler, parts);
      const double error = change_error(start, masters_of(net), masters_of(ref));
      std::string problem;
      if (opt.steps != it)
        problem = std::to_string(opt.steps) + " optimizer steps so far, expected " + std::to_string(it);
      else if (!(error <= kChangeTolerance))
        problem = "the weights moved " + describe(error) + " (relative) away from the whole-batch run";
      else if (!close_loss(got.loss, want.loss))
        problem = "loss " + describe(got.loss) + ", the whole-batch run's " + describe(want.loss);
      else if (scaler.get_scale() != ref_scaler.get_scale() ||
               scaler.growth_tracker() != ref_scaler.growth_tracker())
        problem = "the scaler is at " + describe(scaler.get_scale()) + ", tracker " +
                  std::to_string(scaler.growth_tracker()) + "; the whole-batch run's at " +
                  describe(ref_scaler.get_scale()) + ", tracker " +
                  std::to_string(ref_scaler.growth_tracker());
      if (problem.empty()) continue;
      if (m.wrong())
        m.detail("an fp16 network, 4 micro-batches of 8 an iteration, SGD lr 0.05 momentum 0.9, iteration " +
                 std::to_string(it) + ": " + problem);
      break;
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

}  // TEST_SUITE
