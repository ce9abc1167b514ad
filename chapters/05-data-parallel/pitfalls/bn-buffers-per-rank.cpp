// Chapter 05 — pitfall bn-buffers-per-rank: BatchNorm's running estimates kept per rank
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// ../../02-loss-scaling/training.hpp (blobs()), mpt/core/policy.hpp,
// mpt/core/random.hpp, mpt/dist/ddp.hpp, mpt/dist/thread_world.hpp,
// mpt/nn/layers/activations.hpp, mpt/nn/layers/batch_norm.hpp, mpt/nn/layers/linear.hpp,
// mpt/nn/layers/losses.hpp, mpt/optim/sgd.hpp; <algorithm>, <cmath>, <cstddef>,
// <string>, <vector>.
//
// BatchNorm's running mean and variance are buffers, not parameters: no
// gradient carries them and DDP's all-reduce never touches them. Each rank
// folds its own batches' statistics into its own copy, so when the ranks'
// data differ (a shard sorted by class, a per-rank data pipeline), the
// copies drift apart — and eval normalizes with them: the model a job saves
// depends on which rank saves it. PyTorch's DDP broadcasts rank 0's buffers
// before every forward (broadcast_buffers=True, the default; also before an
// eval forward), so every rank holds the same estimates (rank 0's: to
// combine the ranks' statistics themselves, SyncBatchNorm).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "../../02-loss-scaling/training.hpp"
#include "common.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/dist/ddp.hpp"
#include "mpt/dist/thread_world.hpp"
#include "mpt/nn/layers/activations.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/linear.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch05 {
namespace {
namespace bn_buffers_per_rank {

constexpr int kWorld = 2;
constexpr int kSteps = 40;
constexpr Eigen::Index kRows = 32;  // per rank and step
constexpr double kLr = 0.05;

/// bn0 (on the inputs) → fc1 8→32 → bn1 → relu1 → fc2 32→4, seeded.
Model bn_net() {
  Model net("BnMlp", uniform_policy(DType::f32), 8);
  Rng rng(11);
  net.emplace<BatchNorm>("bn0", 8).set_input_grad(false);  // the input is data: no dx
  net.emplace<Linear>("fc1", 8, 32, rng);
  net.emplace<BatchNorm>("bn1", 32);
  net.emplace<ReLU>("relu1");
  net.emplace<Linear>("fc2", 32, 4, rng);
  net.finish();
  return net;
}

/// Rank r's data: the training rows of classes 2r and 2r + 1 (a shard of
/// data sorted by class).
Dataset rank_data(int rank) {
  const Dataset& d = ch02::blobs().train;
  std::vector<Eigen::Index> idx;
  for (Eigen::Index i = 0; i < d.size(); ++i)
    if (d.labels[static_cast<std::size_t>(i)] / 2 == rank) idx.push_back(i);
  return d.rows(idx);
}

/// Every BatchNorm's running mean (or variance) of `net`, concatenated.
std::vector<float> buffers(Model& net, bool variance) {
  std::vector<float> v;
  for (const std::string& path : net.paths())
    if (auto* bn = dynamic_cast<BatchNorm*>(net.find(path))) {
      const Tensor& t = variance ? bn->running_var : bn->running_mean;
      std::vector<float> x(static_cast<std::size_t>(t.numel()));
      t.to_f32(x.data());
      v.insert(v.end(), x.begin(), x.end());
    }
  return v;
}

/// What each rank's replica gives in eval mode on the held-out set.
struct Eval {
  double accuracy = 0, loss = 0;
  std::vector<float> mean, var;
};

RunResult run(bool broadcast, std::string setup) {
  std::vector<Eval> e(kWorld);
  dist::ThreadWorld world(kWorld, 10.0);
  world.run([&](dist::Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    Model net = bn_net();
    const Dataset mine = rank_data(comm.rank());
    Batches batches(mine, kRows, 100 + r);
    dist::DdpOptions o;
    if (!broadcast) {
      //! [bn-buffers-per-rank-broken]
      o.broadcast_buffers = false;  // every rank keeps the running estimates of its own batches
      //! [bn-buffers-per-rank-broken]
    } else {
      //! [bn-buffers-per-rank-fixed]
      o.broadcast_buffers = true;  // the default: rank 0's buffers to every rank before each forward
      //! [bn-buffers-per-rank-fixed]
    }
    dist::DistributedDataParallel ddp(net, comm, o);
    SGD opt(net.parameters(), SgdOptions{kLr});
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      ddp.before_forward();
      (void)shard_backward(net, batches.next(), 0, 1, 1.0f);  // this rank's own batch
      ddp.finish_backward();
      opt.step();
      net.refresh_model_copies();
    }
    ddp.before_forward();  // DDP's eval forward broadcasts the buffers too (with broadcast_buffers)
    net.train(false);
    const Dataset& test = ch02::blobs().test;
    const MatrixF logits = net.forward(test.x).to_matrix();
    double right = 0;
    for (Eigen::Index i = 0; i < logits.rows(); ++i) {
      Eigen::Index best = 0;
      logits.row(i).maxCoeff(&best);
      right += best == test.labels[static_cast<std::size_t>(i)];
    }
    e[r].accuracy = right / static_cast<double>(logits.rows());
    e[r].loss = cross_entropy_loss(net.forward(test.x), test.labels);
    e[r].mean = buffers(net, false);
    e[r].var = buffers(net, true);
  });
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"running_mean_spread", max_diff(e[0].mean, e[1].mean), "the largest |running mean, rank 0 − rank 1|"},
      {"running_var_spread", max_diff(e[0].var, e[1].var), "the largest |running variance, rank 0 − rank 1|"},
      {"eval_accuracy_rank0", e[0].accuracy, "held-out accuracy (eval mode) with rank 0's buffers"},
      {"eval_accuracy_rank1", e[1].accuracy, "the same with rank 1's buffers"},
      {"eval_loss_rank0", e[0].loss, "held-out loss with rank 0's buffers"},
      {"eval_loss_rank1", e[1].loss, "the same with rank 1's buffers"},
  };
  out.explanation =
      broadcast
          ? "Before every forward, and before the eval forward, rank 0's buffers overwrite rank 1's: the "
            "spreads are " +
                num(out.get("running_mean_spread")) + " and " + num(out.get("running_var_spread")) +
                ", and eval gives " + pct(e[0].accuracy) + " (loss " + num(e[0].loss) +
                ") whichever rank saves."
          : "Rank 0 normalizes with the statistics of classes 0 and 1, rank 1 with those of classes 2 and 3: "
            "their running means differ by up to " +
                num(out.get("running_mean_spread")) + " and their variances by up to " +
                num(out.get("running_var_spread")) + ", so the same weights score " + pct(e[0].accuracy) +
                " (loss " + num(e[0].loss) + ") with rank 0's buffers and " + pct(e[1].accuracy) + " (loss " +
                num(e[1].loss) + ") with rank 1's.";
  return out;
}

RunResult broken_run() {
  return run(
      false,
      "2 ranks, an MLP with BatchNorm on the blobs, each rank's data one half of the set sorted by class; "
      "40 DDP steps with broadcast_buffers off, then eval on the held-out set with each rank's replica");
}

RunResult fixed_run() { return run(true, "the same with broadcast_buffers on (DDP's default)"); }

}  // namespace bn_buffers_per_rank
}  // namespace

Pitfall bn_buffers_per_rank_pitfall() {
  using namespace bn_buffers_per_rank;
  return Pitfall{
      "bn-buffers-per-rank",
      5,
      "BatchNorm's running estimates without broadcast_buffers: each rank's drift apart, eval depends on who "
      "saves",
      "BatchNorm's running mean and variance are buffers, not gradients: DDP's all-reduce never averages "
      "them, "
      "so each rank folds in its own batches' statistics and, on data that differ between ranks, the copies "
      "drift apart — and eval normalizes with whichever rank's copy was saved. Broadcast rank 0's buffers "
      "before each forward (broadcast_buffers, DDP's default), or use SyncBatchNorm.",
      broken_run,
      fixed_run,
      {
          check("the ranks' running means differ by more than 0.1",
                [](const RunResult& r) { return r.get("running_mean_spread") > 0.1; }),
          check("the eval loss depends on the rank whose buffers are saved (by more than 10%)",
                [](const RunResult& r) {
                  return !within(r.get("eval_loss_rank1"), r.get("eval_loss_rank0"), 0.1);
                }),
      },
      {
          check("identical running means and variances on every rank",
                [](const RunResult& r) {
                  return r.get("running_mean_spread") == 0 && r.get("running_var_spread") == 0;
                }),
          check("the same eval accuracy and loss whichever rank saves",
                [](const RunResult& r) {
                  return r.get("eval_accuracy_rank0") == r.get("eval_accuracy_rank1") &&
                         r.get("eval_loss_rank0") == r.get("eval_loss_rank1");
                }),
      },
      {}};
}

}  // namespace mpt::ch05
