// Chapter 02 — pitfall update-forgotten: update() forgotten: the next step() is refused
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// ../training.hpp (scaled_backward), mpt/amp/grad_scaler.hpp,
// mpt/nn/models/mlp.hpp, mpt/optim/sgd.hpp; <stdexcept>, <string>, <utility>.
//
// step() marks the optimizer as stepped until update() resets the scaler's
// per-optimizer state; without update() the next iteration's step() throws,
// and the scale never adapts.
#include <stdexcept>
#include <string>
#include <utility>

#include "../training.hpp"
#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch02 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace update_forgotten {

// ---------------------------------------------------------------------------
// The constants and what a run measures.

constexpr int kForgetIterations = 10;

struct ForgetRun {
  double completed = 0, steps = 0, errors = 0, first_error = 0;
  std::string message;
};

/// The outcomes of both runs (defined after the runs).
RunResult forget_outcomes(const ForgetRun& r, const GradScaler& scaler, std::string setup);

// ---------------------------------------------------------------------------
// The broken run (the loop of both runs).

/// The loop of both runs; `call_update` is the fix.
RunResult update_forgotten_run(bool call_update, std::string setup) {
  BlobsRun run(DType::f16, 0.05, 64);
  Mlp& net = run.net;
  SGD& opt = run.opt;
  ForgetRun r;
  GradScaler scaler;
  for (int it = 1; it <= kForgetIterations; ++it) {
    try {
      scaled_backward(net, opt, run.batches, scaler);  // forward, S * loss, backward
      if (!call_update) {
        //! [update-forgotten-broken]
        // The end of every iteration:
        r.steps += scaler.step(opt);  // marks opt as stepped until update()
        // scaler.update() forgotten: the next iteration's step() throws
        //! [update-forgotten-broken]
      } else {
        //! [update-forgotten-fixed]
        // The end of every iteration:
        r.steps += scaler.step(opt);
        scaler.update();  // after step(), every iteration
        //! [update-forgotten-fixed]
      }
      net.refresh_model_copies();
      ++r.completed;
    } catch (const std::logic_error& e) {  // a training script would stop here
      if (r.errors++ == 0) r.first_error = it, r.message = e.what();
      break;
    }
  }
  return forget_outcomes(r, scaler, std::move(setup));
}

RunResult update_forgotten_broken() {
  return update_forgotten_run(false,
                              "fp16 MLP on the blobs with a GradScaler; the loop never calls update()");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult update_forgotten_fixed() {
  return update_forgotten_run(true, "the same loop with scaler.update() after scaler.step()");
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult forget_outcomes(const ForgetRun& r, const GradScaler& scaler, std::string setup) {
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"iterations", kForgetIterations, "iterations the loop was written for"},
      {"iterations_completed", r.completed, "iterations that ran to the end"},
      {"optimizer_steps", r.steps, "optimizer steps taken"},
      {"misuse_errors", r.errors, "std::logic_error thrown by the scaler"},
      {"first_error_iteration", r.first_error, "iteration of the first error (0: none)"},
      {"growth_tracker", static_cast<double>(scaler.growth_tracker()), "clean steps the scaler has counted"},
      {"scale", scaler.get_scale(), "the scale at the end"},
  };
  out.explanation =
      r.errors > 0 ? "iteration " + num(r.first_error) + " stopped with: " + r.message
                   : "update() ended every iteration: the scaler counted " + num(scaler.growth_tracker()) +
                         " clean steps toward the next growth (at 2000), and no call was refused.";
  return out;
}

}  // namespace update_forgotten
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall update_forgotten_pitfall() {
  using namespace update_forgotten;
  return Pitfall{
      "update-forgotten",
      2,
      "update() forgotten: the next step() is refused",
      "step() marks the optimizer as stepped until update() resets it; without update() the next "
      "iteration's step() throws, and the scale never adapts.",
      update_forgotten_broken,
      update_forgotten_fixed,
      {
          check("the scaler refused a call", [](const RunResult& r) { return r.get("misuse_errors") > 0; }),
          check("at iteration 2, the first step() after the missing update()",
                [](const RunResult& r) { return r.get("first_error_iteration") == 2; }),
          check("the message names update() and says where it belongs",
                [](const RunResult& r) {
                  return r.get("misuse_errors") > 0 &&
                         r.explanation.find("call update()") != std::string::npos &&
                         r.explanation.find("after step()") != std::string::npos;
                }),
          check("only the first iteration took an optimizer step",
                [](const RunResult& r) { return r.get("optimizer_steps") == 1; }),
      },
      {
          check("no call was refused", [](const RunResult& r) { return r.get("misuse_errors") == 0; }),
          check("every iteration completed with an optimizer step",
                [](const RunResult& r) {
                  return r.get("iterations_completed") == r.get("iterations") &&
                         r.get("optimizer_steps") == r.get("iterations");
                }),
          check("update() counted every clean step",
                [](const RunResult& r) { return r.get("growth_tracker") == r.get("iterations"); }),
      },
      {}};
}

}  // namespace mpt::ch02
