// Chapter 05 — pitfall ranks-disagree-on-skip: a rank that skips its step skips a collective too
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/amp/grad_scaler.hpp, mpt/dist/ddp.hpp, mpt/dist/sharded.hpp,
// mpt/dist/thread_world.hpp; <algorithm>, <chrono>, <cstddef>, <exception>,
// <limits>, <memory>, <string>, <vector>.
//
// Every collective must be made by every rank, in the same order. Code that
// makes one only after a real step ("if the step ran, gather the new
// masters") is correct as long as every rank reaches the same verdict; with
// a per-rank GradScaler under ZeRO-1 only the owner of an inf skips, and it
// goes on to the next step's all-reduce while the others wait in the
// broadcast it never makes. Under MPI that is a hang, or a crash once the
// collectives' sizes disagree (tests/mpi/faults.sh, case `disagree`, runs
// it under mpiexec); dist::ThreadWorld checks every call against the other
// ranks' and ends the job at once, naming both calls. One shared verdict
// (dist::ShardedGradScaler) makes every rank take the same branch: the job
// completes.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/dist/ddp.hpp"
#include "mpt/dist/sharded.hpp"
#include "mpt/dist/thread_world.hpp"

namespace mpt::ch05 {
namespace {
namespace ranks_disagree_on_skip {

constexpr int kWorld = 4;
constexpr int kSteps = 6;
constexpr int kOverflowStep = 1;
constexpr Eigen::Index kBatch = 64;
constexpr double kLr = 0.05;
constexpr double kTimeout = 5;  // seconds a collective waits for the other ranks

RunResult run(bool shared_verdict, std::string setup) {
  std::vector<int> completed(kWorld, 0), skipped(kWorld, 0);
  dist::ThreadWorld world(kWorld, kTimeout);
  std::string message;
  const auto start = std::chrono::steady_clock::now();
  try {
    world.run([&](dist::Communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      auto net = blobs_mlp();
      dist::DistributedDataParallel ddp(*net, comm);
      dist::ShardedOptimizer opt(net->parameters(), comm, sgd_shard(kLr));
      std::unique_ptr<GradScaler> scaler;
      if (shared_verdict) {
        //! [ranks-disagree-on-skip-fixed]
        scaler = std::make_unique<dist::ShardedGradScaler>(comm);  // one verdict: every rank skips, or none
        //! [ranks-disagree-on-skip-fixed]
      } else {
        scaler = std::make_unique<GradScaler>();
      }
      for (int s = 0; s < kSteps; ++s) {
        opt.zero_grad();
        ddp.before_forward();
        (void)shard_backward(*net, blobs_batch(s, kBatch), comm.rank(), comm.size(), scaler->scale(1.0f));
        ddp.finish_backward();
        if (s == kOverflowStep)  // an inf in fc2.weight's averaged gradient, which one rank owns
          net->parameters()[2]->grad.f32_data()[5] = std::numeric_limits<float>::infinity();
        //! [ranks-disagree-on-skip-broken]
        const bool stepped = scaler->step(opt);  // a per-rank GradScaler: this rank's verdict
        scaler->update();
        if (stepped) opt.gather_masters();  // a rank that skipped makes no broadcast: the others wait in it
        //! [ranks-disagree-on-skip-broken]
        net->refresh_model_copies();
        skipped[r] += !stepped;
        completed[r] = s + 1;
      }
    });
  } catch (const std::exception& e) {
    message = e.what();
  }
  const double seconds = seconds_since(start);
  double skipped_ranks = 0;
  for (const int k : skipped) skipped_ranks += k > 0;
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"world", kWorld, "ranks"},
      {"steps", kSteps, "steps the job runs"},
      {"ranks_that_skipped", skipped_ranks, "ranks that skipped the step with the inf"},
      {"ended_with_error", message.empty() ? 0.0 : 1.0, "the job ended with an error (1) or completed (0)"},
      {"steps_completed", static_cast<double>(*std::min_element(completed.begin(), completed.end())),
       "steps every rank completed"},
      {"timeout_s", kTimeout, "the limit a collective waits for the other ranks"},
      {"ended_within_1s", seconds < 1 ? 1.0 : 0.0,
       "the job ended (or completed) within a second (1), well below it"},
  };
  out.explanation =
      message.empty()
          ? "The found-inf flag is all-reduced: " + num(skipped_ranks) + " of " + std::to_string(kWorld) +
                " ranks skip the step with the inf, so every rank leaves out the same broadcasts, and all " +
                num(out.get("steps_completed")) + " steps complete."
          : "Only the owner of the inf skips (" + num(skipped_ranks) +
                " rank); it leaves out gather_masters' broadcasts and goes on to the next step's all-reduce, "
                "while the others wait in the broadcast. ThreadWorld compares the calls and ends the job at "
                "once, long before the " +
                num(kTimeout) + " s timeout, after " + num(out.get("steps_completed")) +
                " complete step(s): \"" + message + "\"";
  return out;
}

RunResult broken_run() {
  return run(
      false,
      "4 ranks, blobs MLP, DDP + ZeRO-1, a plain GradScaler per rank; gather_masters() only after a step "
      "that ran; an inf in one rank's shard in step 2");
}

RunResult fixed_run() {
  return run(true, "the same code with ShardedGradScaler: one verdict, so every rank makes the same calls");
}

}  // namespace ranks_disagree_on_skip
}  // namespace

Pitfall ranks_disagree_on_skip_pitfall() {
  using namespace ranks_disagree_on_skip;
  return Pitfall{
      "ranks-disagree-on-skip",
      5,
      "ranks that disagree on skipping make different collectives: a hang under MPI, a named error here",
      "A rank that skips its step on its own verdict also skips what follows a step (gather_masters' "
      "broadcasts) and makes the next step's all-reduce while the others wait in the broadcast: the ranks' "
      "collectives no longer match. Share one verdict (ShardedGradScaler) so that every rank makes the same "
      "calls — and let the backend end a mismatch with a message naming the ranks and calls.",
      broken_run,
      fixed_run,
      {
          check("the job ends with an error",
                [](const RunResult& r) { return r.get("ended_with_error") == 1; }),
          check("it stops before the last step",
                [](const RunResult& r) { return r.get("steps_completed") < r.get("steps"); }),
      },
      {
          check("the job completes every step",
                [](const RunResult& r) {
                  return r.get("ended_with_error") == 0 && r.get("steps_completed") == r.get("steps");
                }),
          check("every rank skips the step with the inf",
                [](const RunResult& r) { return r.get("ranks_that_skipped") == r.get("world"); }),
      },
      {
          check("it never hangs: the job ends within a second, far below the timeout",
                [](const RunResult& r) { return r.get("ended_within_1s") == 1; }),
      }};
}

}  // namespace mpt::ch05
