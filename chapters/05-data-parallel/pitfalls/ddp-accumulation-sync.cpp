// Chapter 05 — pitfall ddp-accumulation-sync: gradient accumulation that all-reduces every micro-batch
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/amp/grad_scaler.hpp, mpt/dist/ddp.hpp (no_sync), mpt/dist/thread_world.hpp,
// mpt/optim/sgd.hpp; <algorithm>, <cstddef>, <cstdint>, <string>, <vector>.
//
// Accumulating K micro-batches before one optimizer step needs the ranks'
// gradients averaged once, after the last micro-batch. A DDP model reduces
// at the end of every backward unless told otherwise, so a loop that simply
// calls backward K times all-reduces the whole gradient K times: K times the
// messages and the bytes for the same sum (the average of averages is the
// average). PyTorch's no_sync() context (DistributedDataParallel::no_sync()
// here) keeps the first K − 1 backwards local; the K-th reduces the sums
// once. The scaler unscales once, after the last micro-batch, as Chapter 2's
// accumulation-unscale says.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/dist/ddp.hpp"
#include "mpt/dist/thread_world.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch05 {
namespace {
namespace ddp_accumulation_sync {

constexpr int kWorld = 2;
constexpr int kMicro = 4;                // micro-batches per optimizer step
constexpr Eigen::Index kMicroRows = 32;  // rows per micro-batch, all ranks together (16 per rank)
constexpr double kLr = 0.05;

/// One process: K micro-batches of the whole micro-batch each, the loss
/// divided by K, one unscale and step. The masters after it.
std::vector<float> reference() {
  auto net = blobs_mlp();
  SGD opt(net->parameters(), SgdOptions{kLr});
  GradScaler scaler;
  opt.zero_grad();
  for (int k = 0; k < kMicro; ++k)
    (void)shard_backward(*net, blobs_batch(k, kMicroRows), 0, 1, scaler.scale(1.0f / kMicro));
  (void)scaler.step(opt);
  scaler.update();
  return masters(*net);
}

RunResult run(bool use_no_sync, std::string setup) {
  std::vector<std::vector<float>> after(kWorld);
  std::vector<std::int64_t> calls(kWorld), bytes(kWorld);
  double buckets = 0, gradient_bytes = 0;
  dist::ThreadWorld world(kWorld, 10.0);
  world.run([&](dist::Communicator& inner) {
    CountingCommunicator comm(inner);
    const auto r = static_cast<std::size_t>(comm.rank());
    auto net = blobs_mlp();
    dist::DistributedDataParallel ddp(*net, comm);
    if (r == 0) {
      buckets = static_cast<double>(ddp.buckets().size());
      for (const dist::Bucket& b : ddp.buckets()) gradient_bytes += static_cast<double>(b.elements) * 4;
    }
    SGD opt(net->parameters(), SgdOptions{kLr});
    GradScaler scaler;
    opt.zero_grad();
    const auto micro = [&](int k) {
      ddp.before_forward();
      (void)shard_backward(*net, blobs_batch(k, kMicroRows), comm.rank(), comm.size(),
                           scaler.scale(1.0f / kMicro));
      ddp.finish_backward();
    };
    if (use_no_sync) {
      //! [ddp-accumulation-sync-fixed]
      {
        auto local_only = ddp.no_sync();  // the first K − 1 backwards only accumulate
        for (int k = 0; k + 1 < kMicro; ++k) micro(k);
      }
      micro(kMicro - 1);       // the last one all-reduces the sums, once
      (void)scaler.step(opt);  // one unscale, after the last micro-batch
      //! [ddp-accumulation-sync-fixed]
    } else {
      //! [ddp-accumulation-sync-broken]
      for (int k = 0; k < kMicro; ++k) micro(k);  // every backward all-reduces the whole gradient
      (void)scaler.step(opt);
      //! [ddp-accumulation-sync-broken]
    }
    scaler.update();
    after[r] = masters(*net);
    calls[r] = comm.all_reduces;
    bytes[r] = comm.bytes;
  });
  static const std::vector<float> ref = reference();
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"micro_batches", kMicro, "micro-batches per optimizer step"},
      {"buckets", buckets, "DDP's buckets (all-reduces per synchronised backward)"},
      {"all_reduces", static_cast<double>(calls[0]), "all-reduces rank 0 made in the step"},
      {"all_reduce_rounds", static_cast<double>(calls[0]) / buckets,
       "synchronised backwards (all-reduces / buckets)"},
      {"bytes", static_cast<double>(bytes[0]), "bytes rank 0 put into all-reduces"},
      {"gradient_bytes", gradient_bytes, "the whole gradient's bytes in f32 (one round)"},
      {"update_error", max_diff(after[0], ref), "the largest |master − one process's| after the step"},
      {"replicas_differ", bits_differ(after[0], after[1]), "masters whose bits differ between the ranks"},
  };
  out.explanation =
      (use_no_sync ? "Inside no_sync() the first " + std::to_string(kMicro - 1) +
                         " backwards only accumulate: the step makes " + num(out.get("all_reduces")) +
                         " all-reduce of " + num(out.get("bytes")) + " bytes"
                   : "Each of the " + std::to_string(kMicro) +
                         " backwards reduces the whole gradient: the step makes " +
                         num(out.get("all_reduces")) + " all-reduces, " + num(out.get("bytes")) + " bytes") +
      ", and the update is within " + num(out.get("update_error")) +
      " of one process's accumulation: the same sum either way, paid for " +
      num(out.get("all_reduce_rounds")) + " time(s).";
  return out;
}

RunResult broken_run() {
  return run(false,
             "2 ranks, blobs MLP, DDP; 4 micro-batches of 32 rows (16 per rank) accumulated per SGD step, "
             "every backward synchronised; against one process accumulating the same micro-batches");
}

RunResult fixed_run() {
  return run(true, "the same with no_sync() around the first 3 backwards, one unscale at the end");
}

}  // namespace ddp_accumulation_sync
}  // namespace

Pitfall ddp_accumulation_sync_pitfall() {
  using namespace ddp_accumulation_sync;
  return Pitfall{
      "ddp-accumulation-sync",
      5,
      "gradient accumulation under DDP without no_sync(): K all-reduces of the whole gradient per step",
      "DDP all-reduces at the end of every backward, so accumulating K micro-batches with plain backwards "
      "sends the whole gradient K times for the one average the step needs. Wrap the first K − 1 backwards "
      "in no_sync() and unscale once, after the last.",
      broken_run,
      fixed_run,
      {
          check("one all-reduce round per micro-batch",
                [](const RunResult& r) { return r.get("all_reduce_rounds") == r.get("micro_batches"); }),
          check("K times the gradient's bytes",
                [](const RunResult& r) {
                  return r.get("bytes") == r.get("micro_batches") * r.get("gradient_bytes");
                }),
      },
      {
          check("one all-reduce round per optimizer step",
                [](const RunResult& r) { return r.get("all_reduce_rounds") == 1; }),
          check("the gradient's bytes once",
                [](const RunResult& r) { return r.get("bytes") == r.get("gradient_bytes"); }),
      },
      {
          check("the update is one process's within 1e-6 (f32 rounding)",
                [](const RunResult& r) { return r.get("update_error") < 1e-6; }),
          check("the replicas are bit-identical",
                [](const RunResult& r) { return r.get("replicas_differ") == 0; }),
      }};
}

}  // namespace mpt::ch05
