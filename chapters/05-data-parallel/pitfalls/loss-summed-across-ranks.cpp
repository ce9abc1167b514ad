// Chapter 05 — pitfall loss-summed-across-ranks: gradients summed, not averaged, across ranks
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/amp/grad_scaler.hpp, mpt/dist/ddp.hpp, mpt/dist/thread_world.hpp,
// mpt/optim/sgd.hpp; <array>, <cstddef>, <optional>, <string>, <vector>.
//
// Each rank's loss is the mean over its own B/N rows; the batch's loss is the
// mean of the ranks' losses, so its gradient is the *average* of theirs.
// Summing them instead (a hand-written all-reduce with SUM, or the loss
// summed across ranks before backward) gives N times the gradient: the
// update grows with the world size, as if the learning rate had been
// multiplied by N, and the loss-scaled gradient is N times as close to fp16's
// 65504. DDP averages (it divides by the world size), and so matches one
// process on the whole batch at any N.
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/dist/ddp.hpp"
#include "mpt/dist/thread_world.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch05 {
namespace {
namespace loss_summed_across_ranks {

constexpr Eigen::Index kBatch = 64;
constexpr double kLr = 0.05;
constexpr double kFp16Max = 65504;
constexpr std::array<int, 3> kWorlds = {1, 2, 4};

/// One step of the blobs MLP on N ranks: masters after it (rank 0's) and the
/// largest |scaled gradient| after the reduction.
struct Step {
  std::vector<float> after;
  double largest_scaled = 0;
};

Step one_step(int n, bool summed) {
  const Dataset batch = blobs_batch(0, kBatch);
  Step out;
  dist::ThreadWorld world(n, 10.0);
  world.run([&](dist::Communicator& comm) {
    auto net = blobs_mlp();  // the same weights on every rank (seed 7)
    std::optional<dist::DistributedDataParallel> ddp;
    if (!summed) ddp.emplace(*net, comm);
    SGD opt(net->parameters(), SgdOptions{kLr});
    GradScaler scaler;
    opt.zero_grad();
    if (ddp) ddp->before_forward();
    (void)shard_backward(*net, batch, comm.rank(), comm.size(), scaler.scale(1.0f));
    if (summed) {
      //! [loss-summed-across-ranks-broken]
      for (Parameter* p : net->parameters())  // a hand-written reduction: the sum over ranks, not the mean
        comm.all_reduce(p->grad.f32_data(), p->grad.numel(), DType::f32, dist::ReduceOp::sum);
      //! [loss-summed-across-ranks-broken]
    } else {
      //! [loss-summed-across-ranks-fixed]
      ddp->finish_backward();  // every grad = the average over the ranks
      //! [loss-summed-across-ranks-fixed]
    }
    if (comm.rank() == 0) out.largest_scaled = max_abs_finite(grads(*net));
    (void)scaler.step(opt);
    scaler.update();
    if (comm.rank() == 0) out.after = masters(*net);
  });
  return out;
}

RunResult run(bool summed, std::string setup) {
  static const std::vector<float> before = masters(*blobs_mlp());
  static const Step whole = one_step(1, false);
  const double reference = norm_diff(whole.after, before);
  RunResult out;
  out.setup = std::move(setup);
  std::vector<double> ratio, largest;
  for (const int n : kWorlds) {
    const Step s = one_step(n, summed);
    ratio.push_back(norm_diff(s.after, before) / reference);
    largest.push_back(s.largest_scaled);
  }
  out.outcomes = {
      {"update_ratio_n1", ratio[0], "‖update‖ at N = 1 over one process's on the whole batch"},
      {"update_ratio_n2", ratio[1], "the same at N = 2"},
      {"update_ratio_n4", ratio[2], "the same at N = 4"},
      {"largest_scaled_grad_n1", largest[0], "the largest |scaled gradient| (scale 2^16) at N = 1"},
      {"largest_scaled_grad_n4", largest[2], "the same at N = 4"},
      {"headroom_n1", kFp16Max / largest[0], "65504 over it at N = 1: the factor left before fp16 overflows"},
      {"headroom_n4", kFp16Max / largest[2], "the same at N = 4"},
  };
  out.explanation =
      (summed ? "Summed across ranks, the gradient is N times the batch's: the update is " + num(ratio[1]) +
                    "× one process's at N = 2 and " + num(ratio[2]) +
                    "× at N = 4, and the headroom below 65504 of "
                    "the scaled gradient shrinks from " +
                    num(kFp16Max / largest[0]) + "× to " + num(kFp16Max / largest[2]) +
                    "× — as if the learning rate had been multiplied by N."
              : "Averaged (DDP divides by the world size), the update is " + num(ratio[1]) + "× and " +
                    num(ratio[2]) +
                    "× one process's at N = 2 and 4 (the sums' order differs: f32 rounding), and "
                    "the headroom stays " +
                    num(kFp16Max / largest[2]) + "× at N = 4.");
  return out;
}

RunResult broken_run() {
  return run(
      true,
      "the blobs MLP, one SGD step on a batch of 64 rows split over N = 1, 2, 4 ranks (GradScaler, 2^16), "
      "the ranks' gradients summed; against one process on the whole batch");
}

RunResult fixed_run() { return run(false, "the same, the gradients averaged (DDP's default)"); }

}  // namespace loss_summed_across_ranks
}  // namespace

Pitfall loss_summed_across_ranks_pitfall() {
  using namespace loss_summed_across_ranks;
  return Pitfall{
      "loss-summed-across-ranks",
      5,
      "the loss (and so the gradient) summed across ranks instead of averaged: the update grows with N",
      "Each rank's loss is the mean over its B/N rows, and the batch's gradient is the average of the "
      "ranks': "
      "summing them gives N times that gradient, an update N times too large and a scaled gradient N times "
      "closer to 65504. Average (DDP divides by the world size).",
      broken_run,
      fixed_run,
      {
          check("the update is 2× at N = 2 and 4× at N = 4 (within 1%)",
                [](const RunResult& r) {
                  return within(r.get("update_ratio_n2"), 2, 0.01) &&
                         within(r.get("update_ratio_n4"), 4, 0.01);
                }),
          check("the headroom below 65504 shrinks about 4× from N = 1 to N = 4",
                [](const RunResult& r) {
                  return within(r.get("headroom_n1") / r.get("headroom_n4"), 4, 0.01);
                }),
      },
      {
          check("the update is one process's at N = 2 and 4 (within 1e-4)",
                [](const RunResult& r) {
                  return within(r.get("update_ratio_n2"), 1, 1e-4) &&
                         within(r.get("update_ratio_n4"), 1, 1e-4);
                }),
          check("the headroom is the same at N = 1 and N = 4 (within 1%)",
                [](const RunResult& r) {
                  return within(r.get("headroom_n1") / r.get("headroom_n4"), 1, 0.01);
                }),
      },
      {
          check("at N = 1 the run is one process's",
                [](const RunResult& r) { return within(r.get("update_ratio_n1"), 1, 1e-6); }),
      }};
}

}  // namespace mpt::ch05
