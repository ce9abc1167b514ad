// Chapter 05 — pitfall scaler-state-one-rank: the scaler's state restored on rank 0 only
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/amp/grad_scaler.hpp (state_dict, load_state_dict), mpt/dist/ddp.hpp,
// mpt/dist/thread_world.hpp, mpt/optim/sgd.hpp; <algorithm>, <cstddef>,
// <limits>, <string>, <vector>.
//
// A checkpoint is commonly written and read by rank 0 alone ("if rank == 0:
// load"), and the model's weights still reach every rank, because DDP
// broadcasts rank 0's at construction. The GradScaler's state does not: the
// ranks that did not load start again from the initial scale (2^16) and a
// growth tracker of 0. From then on each rank multiplies its loss by its own
// scale; DDP averages gradients scaled differently, and each rank divides
// the average by its own scale: every rank takes a different step, and the
// replicas drift apart. The growth tracker differs too, so the scales grow
// at different iterations and never meet again by themselves. Restoring the
// state on every rank (or broadcasting it) resumes the run exactly.
#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/dist/ddp.hpp"
#include "mpt/dist/thread_world.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch05 {
namespace {
namespace scaler_state_one_rank {

constexpr int kWorld = 4;
constexpr int kBefore = 5;           // steps before the checkpoint
constexpr int kAfter = 6;            // steps after it
constexpr int kOverflowStep = 1;     // an inf in the second step backs the scale off
constexpr Eigen::Index kBatch = 64;  // 16 rows per rank
constexpr double kLr = 0.05;

GradScaler::Options scaler_options() {
  GradScaler::Options o;
  o.growth_interval = 8;  // short, so that the trackers' difference shows within the run
  return o;
}

/// What a run leaves: the masters and the scaler's state (rank 0's).
struct Checkpoint {
  std::vector<float> masters;
  std::string scaler;
};

/// Steps [first, last) of the data-parallel run on every rank: DDP, SGD and a
/// GradScaler each. `restore` (may be empty) is what each rank does with the
/// checkpoint before the first step. Returns each rank's masters at the end;
/// each rank's scale at resume goes to `resumed_scales`, and its scaler's
/// state at the end to `final_states`, when given.
std::vector<std::vector<float>> steps(int first, int last, const Checkpoint* from,
                                      void (*restore)(GradScaler&, const Checkpoint&, int rank),
                                      std::vector<float>* resumed_scales, Checkpoint* save,
                                      std::vector<std::string>* final_states = nullptr) {
  std::vector<std::vector<float>> out(kWorld);
  if (resumed_scales) resumed_scales->assign(kWorld, 0);
  if (final_states) final_states->assign(kWorld, "");
  dist::ThreadWorld world(kWorld, 10.0);
  world.run([&](dist::Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    auto net = blobs_mlp();
    GradScaler scaler(scaler_options());
    if (from) {
      if (comm.rank() == 0) load_masters(*net, from->masters);  // DDP broadcasts rank 0's to the others
      restore(scaler, *from, comm.rank());
    }
    if (resumed_scales) (*resumed_scales)[r] = scaler.get_scale();
    dist::DistributedDataParallel ddp(*net, comm);
    SGD opt(net->parameters(), SgdOptions{kLr});
    for (int s = first; s < last; ++s) {
      opt.zero_grad();
      ddp.before_forward();
      (void)shard_backward(*net, blobs_batch(s, kBatch), comm.rank(), comm.size(), scaler.scale(1.0f));
      ddp.finish_backward();
      if (s == kOverflowStep)
        net->parameters()[2]->grad.f32_data()[5] = std::numeric_limits<float>::infinity();
      (void)scaler.step(opt);
      scaler.update();
      net->refresh_model_copies();
    }
    out[r] = masters(*net);
    if (final_states) (*final_states)[r] = scaler.state_dict();
    if (save && comm.rank() == 0) *save = Checkpoint{out[r], scaler.state_dict()};
  });
  return out;
}

//! [scaler-state-one-rank-broken]
void restore_on_rank0(GradScaler& scaler, const Checkpoint& c, int rank) {
  if (rank == 0) scaler.load_state_dict(c.scaler);  // the other ranks keep 2^16 and a tracker of 0
}
//! [scaler-state-one-rank-broken]

//! [scaler-state-one-rank-fixed]
void restore_everywhere(GradScaler& scaler, const Checkpoint& c, int /*rank*/) {
  scaler.load_state_dict(c.scaler);  // every rank: the same scale and growth tracker
}
//! [scaler-state-one-rank-fixed]

RunResult run(void (*restore)(GradScaler&, const Checkpoint&, int), std::string setup, bool broken) {
  static std::vector<std::string> uninterrupted_states;
  static const std::vector<float> uninterrupted =
      steps(0, kBefore + kAfter, nullptr, nullptr, nullptr, nullptr, &uninterrupted_states)[0];
  static const Checkpoint checkpoint = [] {
    Checkpoint c;
    (void)steps(0, kBefore, nullptr, nullptr, nullptr, &c);
    return c;
  }();
  GradScaler saved(scaler_options());
  saved.load_state_dict(checkpoint.scaler);
  std::vector<float> resumed;
  std::vector<std::string> states;
  const std::vector<std::vector<float>> end =
      steps(kBefore, kBefore + kAfter, &checkpoint, restore, &resumed, nullptr, &states);
  double same_state = 0;  // ranks whose scale and growth tracker end as the uninterrupted run's
  for (const std::string& st : states) same_state += st == uninterrupted_states[0];
  double replicas = 0, spread = 0;
  for (const auto& m : end) {
    replicas = std::max(replicas, bits_differ(m, end[0]));
    spread = std::max(spread, max_diff(m, end[0]));
  }
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"world", kWorld, "ranks"},
      {"checkpoint_scale", saved.get_scale(), "the scale in the checkpoint"},
      {"checkpoint_growth_tracker", static_cast<double>(saved.growth_tracker()), "the growth tracker in it"},
      {"resumed_scale_min", *std::min_element(resumed.begin(), resumed.end()),
       "the smallest scale at resume"},
      {"resumed_scale_max", *std::max_element(resumed.begin(), resumed.end()), "the largest scale at resume"},
      {"ranks_state_as_uninterrupted", same_state,
       "ranks whose scaler state (scale, growth tracker) ends as the uninterrupted run's"},
      {"replicas_differ", replicas, "masters whose bits differ between ranks after the resumed steps"},
      {"replica_spread", spread, "the largest |master on rank r − on rank 0|"},
      {"error_vs_uninterrupted", max_diff(end[0], uninterrupted),
       "rank 0's largest |master − the uninterrupted run's|"},
  };
  out.explanation =
      broken ? "The checkpoint holds scale " + num(out.get("checkpoint_scale")) + " and growth tracker " +
                   num(out.get("checkpoint_growth_tracker")) + "; rank 0 resumes from them, ranks 1–3 from " +
                   num(out.get("resumed_scale_max")) +
                   " and 0. DDP averages gradients scaled by different factors and each rank unscales the "
                   "average by its own: after " +
                   std::to_string(kAfter) + " steps " + num(replicas) +
                   " masters differ between the ranks (by up to " + num(spread) + "), and rank 0 is " +
                   num(out.get("error_vs_uninterrupted")) + " from the run that was never interrupted."
             : "Every rank resumes from scale " + num(out.get("resumed_scale_min")) + " and tracker " +
                   num(out.get("checkpoint_growth_tracker")) + ": the replicas stay bit-identical (" +
                   num(replicas) + " differ) and the resumed run is " +
                   num(out.get("error_vs_uninterrupted")) + " from the uninterrupted one.";
  return out;
}

RunResult broken_run() {
  return run(
      restore_on_rank0,
      "4 ranks, blobs MLP, DDP, SGD and a GradScaler each (growth_interval 8); 5 steps (an inf in step 2), "
      "checkpoint, 6 more steps with the scaler's state loaded on rank 0 only",
      true);
}

RunResult fixed_run() {
  return run(restore_everywhere, "the same, the scaler's state loaded on every rank", false);
}

}  // namespace scaler_state_one_rank
}  // namespace

Pitfall scaler_state_one_rank_pitfall() {
  using namespace scaler_state_one_rank;
  return Pitfall{
      "scaler-state-one-rank",
      5,
      "the scaler's state restored on rank 0 only: the ranks resume with different scales and drift apart",
      "DDP broadcasts rank 0's weights, not the GradScaler's state: ranks that did not load it resume from "
      "2^16 and a tracker of 0, so each multiplies its loss by a different scale, divides the shared average "
      "by its own, and steps differently. Load (or broadcast) the scaler's state on every rank.",
      broken_run,
      fixed_run,
      {
          check("the ranks resume with different scales",
                [](const RunResult& r) { return r.get("resumed_scale_min") < r.get("resumed_scale_max"); }),
          check("the replicas drift apart", [](const RunResult& r) { return r.get("replicas_differ") > 0; }),
          check("some ranks' scalers end in another state than the uninterrupted run's",
                [](const RunResult& r) { return r.get("ranks_state_as_uninterrupted") < r.get("world"); }),
          check("rank 0 is off the uninterrupted run by more than 1e-6",
                [](const RunResult& r) { return r.get("error_vs_uninterrupted") > 1e-6; }),
      },
      {
          check("every rank resumes from the checkpoint's scale",
                [](const RunResult& r) {
                  return r.get("resumed_scale_min") == r.get("checkpoint_scale") &&
                         r.get("resumed_scale_max") == r.get("checkpoint_scale");
                }),
          check("the replicas stay bit-identical",
                [](const RunResult& r) { return r.get("replicas_differ") == 0; }),
          check("every rank's scaler ends in the uninterrupted run's state",
                [](const RunResult& r) { return r.get("ranks_state_as_uninterrupted") == r.get("world"); }),
          check("the resumed run is the uninterrupted one, bit for bit",
                [](const RunResult& r) { return r.get("error_vs_uninterrupted") == 0; }),
      },
      {}};
}

}  // namespace mpt::ch05
