// Chapter 05 — pitfall sharded-found-inf-unsynced: ZeRO-1 with a per-rank found-inf verdict
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/amp/grad_scaler.hpp, mpt/dist/ddp.hpp, mpt/dist/sharded.hpp,
// mpt/dist/thread_world.hpp, mpt/optim/sgd.hpp; <algorithm>, <cmath>, <cstddef>, <limits>,
// <memory>, <string>, <vector>.
//
// ZeRO stage 1 (dist::ShardedOptimizer) gives each parameter one owner; the
// owner alone unscales, checks and updates it, and gather_masters() hands
// the result to every rank. A plain GradScaler checks only the parameters
// its optimizer holds, so an inf in one shard is seen by its owner alone:
// the owner skips its part of the step and halves its scale, the other
// ranks update theirs and keep their scale. The step is half taken, and from
// then on the ranks multiply their losses by different scales, which DDP
// averages as if they were one. dist::ShardedGradScaler all-reduces (max)
// the found-inf flag before any rank steps, as PyTorch's ShardedGradScaler
// does: every rank skips, or none.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/dist/ddp.hpp"
#include "mpt/dist/sharded.hpp"
#include "mpt/dist/thread_world.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch05 {
namespace {
namespace sharded_found_inf_unsynced {

constexpr int kWorld = 4;
constexpr int kSteps = 6;
constexpr int kOverflowStep = 1;     // the second step
constexpr Eigen::Index kBatch = 64;  // 16 rows per rank
constexpr double kLr = 0.05;
constexpr std::size_t kHitParameter = 2;  // fc2.weight, the largest: one rank owns it

/// The overflow: one element of the averaged gradient of fc2.weight is inf,
/// on every rank, as a sample whose scaled gradient overflowed leaves it
/// after the all-reduce.
void overflow(Model& net) {
  net.parameters()[kHitParameter]->grad.f32_data()[5] = std::numeric_limits<float>::infinity();
}

/// What one run measured on every rank.
struct Trace {
  std::vector<float> final_masters;
  std::vector<float> before_overflow, after_overflow;  // rank 0's masters around the overflow step
  bool skipped_overflow = false;
  float scale = 0;
  int owner = -1;
};

/// The same steps in one process on the whole batch (GradScaler, plain SGD):
/// the step with the overflow is skipped in full. Masters at the end.
std::vector<float> reference() {
  auto net = blobs_mlp();
  GradScaler scaler;
  SGD opt(net->parameters(), SgdOptions{kLr});
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    (void)shard_backward(*net, blobs_batch(s, kBatch), 0, 1, scaler.scale(1.0f));
    if (s == kOverflowStep) overflow(*net);
    (void)scaler.step(opt);
    scaler.update();
    net->refresh_model_copies();
  }
  return masters(*net);
}

RunResult run(bool sharded_scaler, std::string setup) {
  std::vector<Trace> t(kWorld);
  dist::ThreadWorld world(kWorld, 10.0);
  world.run([&](dist::Communicator& comm) {
    Trace& mine = t[static_cast<std::size_t>(comm.rank())];
    auto net = blobs_mlp();
    dist::DistributedDataParallel ddp(*net, comm);
    dist::ShardedOptimizer opt(net->parameters(), comm, sgd_shard(kLr));
    mine.owner = opt.owners()[kHitParameter];
    std::unique_ptr<GradScaler> scaler;
    if (sharded_scaler) {
      //! [sharded-found-inf-unsynced-fixed]
      scaler = std::make_unique<dist::ShardedGradScaler>(comm);  // found-inf all-reduced (max): one verdict
      //! [sharded-found-inf-unsynced-fixed]
    } else {
      //! [sharded-found-inf-unsynced-broken]
      scaler = std::make_unique<GradScaler>();  // checks only the shard this rank's optimizer owns
      //! [sharded-found-inf-unsynced-broken]
    }
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      ddp.before_forward();
      (void)shard_backward(*net, blobs_batch(s, kBatch), comm.rank(), comm.size(), scaler->scale(1.0f));
      ddp.finish_backward();
      if (s == kOverflowStep) {
        overflow(*net);
        mine.before_overflow = masters(*net);
      }
      const bool stepped = scaler->step(opt);  // the owned parameters only
      scaler->update();
      opt.gather_masters();  // every rank, every step: the owners' masters to all
      net->refresh_model_copies();
      if (s == kOverflowStep) {
        mine.skipped_overflow = !stepped;
        mine.after_overflow = masters(*net);
      }
    }
    mine.final_masters = masters(*net);
    mine.scale = scaler->get_scale();
  });
  double skipped = 0, lo = std::numeric_limits<double>::infinity(), hi = 0, replicas = 0;
  for (const Trace& r : t) {
    skipped += r.skipped_overflow;
    lo = std::min(lo, static_cast<double>(r.scale));
    hi = std::max(hi, static_cast<double>(r.scale));
    replicas = std::max(replicas, bits_differ(r.final_masters, t[0].final_masters));
  }
  static const std::vector<float> ref = reference();
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"world", kWorld, "ranks"},
      {"inf_owner", static_cast<double>(t[0].owner), "the rank that owns fc2.weight, where the inf is"},
      {"ranks_skipped", skipped, "ranks whose scaler skipped the step with the inf"},
      {"elements_updated_in_inf_step", bits_differ(t[0].before_overflow, t[0].after_overflow),
       "masters that changed in the step with the inf (after gather_masters)"},
      {"scale_min", lo, "the smallest scale of the ranks at the end"},
      {"scale_max", hi, "the largest scale of the ranks at the end"},
      {"master_error_vs_reference", max_diff(t[0].final_masters, ref),
       "the largest |master − one process's| after " + std::to_string(kSteps) + " steps"},
      {"elements_off_reference", 0, "masters more than 1e-5 from one process's"},
      {"replicas_differ", replicas, "masters whose bits differ between ranks at the end"},
  };
  double off = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) off += std::fabs(t[0].final_masters[i] - ref[i]) > 1e-5;
  out.outcomes[7].value = off;
  const double updated = out.get("elements_updated_in_inf_step");
  out.explanation =
      sharded_scaler
          ? "Rank " + num(out.get("inf_owner")) +
                "'s inf is all-reduced into every rank's verdict: " + num(skipped) + " of " +
                std::to_string(kWorld) + " ranks skip, " + num(updated) +
                " masters change in that step, and every scale ends at " + num(hi) +
                "; the masters are within " + num(out.get("master_error_vs_reference")) +
                " of one process's run, which skips the step in full."
          : "Only rank " + num(out.get("inf_owner")) +
                " holds fc2.weight, so only its scaler sees the inf: " + num(skipped) +
                " rank skips, the others update their shards (" + num(updated) +
                " masters change in a step that should have been skipped) and keep their scale, so the "
                "scales "
                "end " +
                num(lo) + " and " + num(hi) +
                ". gather_masters keeps the replicas equal, but equal to a wrong model: " + num(off) +
                " masters are more than 1e-5 from one process's run (up to " +
                num(out.get("master_error_vs_reference")) + ").";
  return out;
}

RunResult broken_run() {
  return run(
      false,
      "4 ranks, blobs MLP, DDP + ZeRO-1 (ShardedOptimizer, SGD), a plain GradScaler per rank; 6 steps, "
      "in step 2 one element of fc2.weight's averaged gradient is inf");
}

RunResult fixed_run() {
  return run(true, "the same with ShardedGradScaler (the found-inf flag all-reduced, max)");
}

}  // namespace sharded_found_inf_unsynced
}  // namespace

Pitfall sharded_found_inf_unsynced_pitfall() {
  using namespace sharded_found_inf_unsynced;
  return Pitfall{
      "sharded-found-inf-unsynced",
      5,
      "ZeRO-1 with a plain GradScaler: only the owner of an inf skips, the other ranks step",
      "A sharded optimizer's GradScaler checks only the parameters its rank owns, so an inf is seen by its "
      "owner alone: the owner skips and halves its scale, the others step and keep theirs — a half-taken "
      "step, and ranks scaling their losses differently from then on. All-reduce the found-inf flag (max) "
      "before stepping: ShardedGradScaler, as PyTorch's.",
      broken_run,
      fixed_run,
      {
          check("only some ranks skip the step with the inf",
                [](const RunResult& r) {
                  return r.get("ranks_skipped") > 0 && r.get("ranks_skipped") < r.get("world");
                }),
          check("the ranks end with different scales",
                [](const RunResult& r) { return r.get("scale_min") < r.get("scale_max"); }),
          check("masters change in the step that should be skipped",
                [](const RunResult& r) { return r.get("elements_updated_in_inf_step") > 0; }),
      },
      {
          check("every rank skips the step with the inf",
                [](const RunResult& r) { return r.get("ranks_skipped") == r.get("world"); }),
          check("one scale on every rank",
                [](const RunResult& r) { return r.get("scale_min") == r.get("scale_max"); }),
          check("the masters match one process's run within 1e-5",
                [](const RunResult& r) { return r.get("elements_off_reference") == 0; }),
      },
      {
          check("gather_masters leaves the replicas bit-identical",
                [](const RunResult& r) { return r.get("replicas_differ") == 0; }),
      }};
}

}  // namespace mpt::ch05
