// Chapter 05 — loss scaling across ranks: what the pitfalls share, and their registry entries
// Depends on: ../../02-loss-scaling/pitfalls/common.hpp (check, num, pct,
// within; Chapter 2's blobs through its training.hpp), mpt/registry/pitfall.hpp,
// mpt/dist/communicator.hpp (Communicator), mpt/nn/data/data.hpp (Dataset),
// mpt/nn/model.hpp (Model), mpt/nn/models/mlp.hpp (Mlp), mpt/optim/optimizer.hpp;
// <chrono>, <cstdint>, <functional>, <memory>, <vector>.
//
// One file per pitfall, pitfalls/<id>.cpp: its broken run, its fixed run,
// their outcomes and its checks, ending with the function that returns its
// registry entry (declared here, called by pitfalls/register.cpp). What more
// than one pitfall uses is here and in common.cpp.
//
// Every multi-rank run is a mpt::dist::ThreadWorld: N ranks as threads of
// this process, each with its own replica of Chapter 2's blobs MLP (8-32-32-4,
// weights seed 7) or of a small MLP with BatchNorm, collectives computed in
// rank order, so every run is deterministic, needs no mpiexec and takes a
// fraction of a second. Each rank trains on its shard of the batch
// (dist::shard_rows), as DistributedDataParallel's users do. The
// `//! [id-broken]` / `//! [id-fixed]` markers in each pitfall's file delimit
// the code the chapter text shows.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "../../02-loss-scaling/pitfalls/common.hpp"
#include "mpt/dist/communicator.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/model.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/optimizer.hpp"
#include "mpt/registry/pitfall.hpp"

namespace mpt::ch05 {

// ---------------------------------------------------------------------------
// Small tools shared by the runs.

using ch02::check;
using ch02::num;
using ch02::pct;
using ch02::within;

/// Chapter 2's blobs classifier 8-32-32-4, FP32, weights seed 7: every
/// rank builds the same one (DDP broadcasts rank 0's anyway).
std::unique_ptr<Mlp> blobs_mlp();
/// Batch number `index` (0-based) of `rows` rows of the blobs' training set,
/// from a fixed shuffle: every rank draws the same batch and takes its shard.
Dataset blobs_batch(int index, Eigen::Index rows);

/// Rank `rank`'s shard of `batch` (world ranks): forward, the mean
/// cross-entropy over its rows, backward from `scale` (added into the grads).
/// Returns the shard's loss.
float shard_backward(Model& net, const Dataset& batch, int rank, int world, float scale);

/// Every FP32 master of `net`, concatenated in parameter order.
std::vector<float> masters(Model& net);
/// Every FP32 grad of `net`, concatenated in parameter order.
std::vector<float> grads(Model& net);
/// Load `values` (as masters() returns them) into the masters and refresh
/// the model copies.
void load_masters(Model& net, const std::vector<float>& values);

/// The largest |v| of the finite values.
double max_abs_finite(const std::vector<float>& v);
/// How many values are inf or NaN.
double nonfinite(const std::vector<float>& v);
/// The largest |a − b| (sizes must match).
double max_diff(const std::vector<float>& a, const std::vector<float>& b);
/// ‖a − b‖₂ (sizes must match).
double norm_diff(const std::vector<float>& a, const std::vector<float>& b);
/// How many elements differ in their bits.
double bits_differ(const std::vector<float>& a, const std::vector<float>& b);

/// What ShardedOptimizer builds on each rank: plain SGD (no momentum, so no
/// state) with learning rate `lr` over the parameters the rank owns.
std::function<std::unique_ptr<Optimizer>(std::vector<Parameter*>)> sgd_shard(double lr);

/// Seconds since `start`.
double seconds_since(std::chrono::steady_clock::time_point start);

/// A communicator that forwards to another and counts what passes: the
/// all-reduces made (blocking or started) and their bytes.
class CountingCommunicator final : public dist::Communicator {
 public:
  /// Forwards every call to `inner`, which must outlive it.
  explicit CountingCommunicator(dist::Communicator& inner) : inner_(&inner) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend() const override { return inner_->backend(); }
  void all_reduce(void* data, std::int64_t count, DType dtype, dist::ReduceOp op) override;
  std::unique_ptr<dist::PendingAllReduce> start_all_reduce(void* data, std::int64_t count, DType dtype,
                                                           dist::ReduceOp op) override;
  void broadcast(void* data, std::size_t bytes, int root) override { inner_->broadcast(data, bytes, root); }
  void all_gather(const void* send, void* recv, std::size_t bytes) override {
    inner_->all_gather(send, recv, bytes);
  }
  void barrier() override { inner_->barrier(); }

  std::int64_t all_reduces = 0;  ///< all-reduce calls (each bucket is one)
  std::int64_t bytes = 0;        ///< bytes this rank put into them

 private:
  dist::Communicator* inner_;
};

// ---------------------------------------------------------------------------
// The chapter's registry entries, one per pitfalls/<id>.cpp, in the order
// pitfalls/register.cpp registers them.

/// fp16-allreduce-overflow: gradients summed in fp16 across ranks overflow
/// although every rank's are finite; pre-dividing by the world keeps the sum finite.
Pitfall fp16_allreduce_overflow_pitfall();
/// sharded-found-inf-unsynced: ZeRO-1 with a plain GradScaler: only the
/// owner of an inf skips and backs off, the others step.
Pitfall sharded_found_inf_unsynced_pitfall();
/// scaler-state-one-rank: the scaler's state restored on rank 0 only: the
/// ranks resume with different scales.
Pitfall scaler_state_one_rank_pitfall();
/// loss-summed-across-ranks: gradients summed instead of averaged: the
/// update grows with the world size.
Pitfall loss_summed_across_ranks_pitfall();
/// ddp-accumulation-sync: accumulation without no_sync(): an all-reduce per
/// micro-batch.
Pitfall ddp_accumulation_sync_pitfall();
/// bn-buffers-per-rank: BatchNorm's running estimates drift apart per rank
/// without broadcast_buffers.
Pitfall bn_buffers_per_rank_pitfall();
/// ranks-disagree-on-skip: a rank that skips also skips a collective; the
/// job ends with a message naming the rank and the call.
Pitfall ranks_disagree_on_skip_pitfall();

}  // namespace mpt::ch05
