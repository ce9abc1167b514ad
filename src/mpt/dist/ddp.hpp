// Chapter 05 — loss scaling across ranks: DistributedDataParallel.
// Depends on: communicator.hpp; the nn tier (Model, Parameter, BatchNorm).
//
// PyTorch's DistributedDataParallel, for a Model of this library (see
// torch/nn/parallel/distributed.py and torch/csrc/distributed/c10d/reducer.cpp
// in pytorch/pytorch): at construction rank 0's parameters (and BatchNorm's
// running estimates) are broadcast, so every replica starts equal; each rank
// runs forward and backward on its own shard of the batch; the gradients are
// averaged across ranks by all-reduces of *buckets* — the parameters in
// reverse order (roughly the order backward produces their gradients), cut
// into buckets of bucket_cap_mb — each started, non-blocking, as soon as
// backward has added the last contribution to every gradient in it, so that
// communication overlaps the rest of backward. finish_backward() waits for
// them all; every Parameter::grad then holds the average (the gradients are
// views of their buckets, DdpOptions::gradient_as_bucket_view, so the
// averages are already there; without views they are copied back).
//
// One step on every rank (the scaler and optimizer are each rank's own):
// \code
//   ddp.before_forward();                  // BatchNorm's buffers from rank 0
//   model.forward(shard.x);  ... loss ...  // this rank's B/N rows
//   model.backward(dlogits * S);           // buckets start as gradients become ready
//   ddp.finish_backward();                 // wait; every grad = the average over ranks
//   scaler.step(opt); scaler.update();     // same gradients everywhere: same verdict
// \endcode
//
// A parameter is "ready" when its contributions in this backward reach the
// number counted in the first one (a weight tied into two layers gets two):
// the first iteration learns the counts and reduces every bucket at
// finish_backward(), as PyTorch's static_graph=True learns the graph in its
// first iteration.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mpt/dist/communicator.hpp"
#include "mpt/nn/model.hpp"

namespace mpt::dist {

/// The knobs of DistributedDataParallel, PyTorch's names where it has one.
struct DdpOptions {
  /// Bucket capacity in MiB of the communication dtype (PyTorch's
  /// bucket_cap_mb, default 25). A parameter larger than one bucket gets a
  /// bucket of its own. > 0.
  double bucket_cap_mb = 25;
  /// The first bucket's capacity (the model's last parameters, whose
  /// gradients backward produces first), so that communication starts early:
  /// PyTorch's 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES). > 0; a value above
  /// bucket_cap_mb counts as bucket_cap_mb.
  double first_bucket_cap_mb = 1;
  /// The dtype the gradients travel and are summed in: f32, or f16/bf16 (as
  /// PyTorch's fp16_compress_hook and bf16_compress_hook) — half the bytes,
  /// and a sum that can overflow: see predivide_factor.
  DType comm_dtype = DType::f32;
  /// Each gradient is multiplied by 1/predivide_factor while it is copied
  /// into its bucket (in its bucket, with gradient_as_bucket_view) and by predivide_factor/world after the
  /// all-reduce (apex's gradient_predivide_factor). 0, the default, means the world size: the average is
  /// taken before the sum, as PyTorch's reducer does (it multiplies by 1/world while copying into the
  /// bucket), so the sum of N ranks' gradients never exceeds the largest one — what keeps an f16 sum finite.
  /// 1 sums first and averages after (apex's default). >= 0.
  double predivide_factor = 0;
  /// Keep every gradient as a view of its place in its bucket (PyTorch's
  /// gradient_as_bucket_view), so that backward accumulates straight into
  /// the communication buffer: no copy into the bucket before the
  /// all-reduce and none back after it. The division by predivide_factor
  /// rides on backward's own pass too (Parameter::grad_factor and
  /// grad_carry: accumulate_grad multiplies each contribution, and at a
  /// gradient's first contribution what it held before), where PyTorch
  /// divides the bucket in place, one more pass; a gradient that got no
  /// contribution in a backward (its values written directly) is divided
  /// in place when its bucket starts. So between backward and
  /// finish_backward() a gradient holds its share divided; a value written
  /// into a gradient directly after its first contribution, before
  /// finish_backward(), is not divided (write before backward, or turn this
  /// off). Inside no_sync() the local sums are not divided (as in PyTorch).
  /// f32 communication only (an f16/bf16 bucket holds other bytes than the
  /// f32 gradients: those are copied, and divided while copied). A gradient
  /// that a caller replaced (grad = another tensor, or a write through a
  /// copy of it) is copied back into its place before its bucket is sent.
  /// PyTorch defaults to false because a view changes what code that holds
  /// on to p.grad sees; this library's optimizers and scalers read p.grad
  /// afresh each step, so the default here is true. The destructor gives
  /// every gradient a buffer of its own again (and both factors 1).
  bool gradient_as_bucket_view = true;
  /// Reduce with all_reduce_fixed_order(): the same bits as adding the
  /// ranks' gradients one after another, whatever the engine's algorithm.
  bool fixed_order = false;
  /// Start each bucket's all-reduce during backward (true, as PyTorch), or
  /// all of them in finish_backward() (to measure what the overlap saves).
  bool overlap = true;
  /// Broadcast BatchNorm's running estimates from rank 0 before every
  /// forward (PyTorch's broadcast_buffers, default true).
  bool broadcast_buffers = true;
  /// SyncBatchNorm: every BatchNorm of the model normalizes with the
  /// statistics of the whole batch across ranks (sync_batch_norm.hpp),
  /// installed at construction and removed by the destructor. PyTorch makes
  /// this a model conversion (SyncBatchNorm.convert_sync_batchnorm); default
  /// false, each rank's own statistics, as there.
  bool sync_batch_norm = false;
};

/// One bucket: parameters (indices into model.parameters()) packed into one
/// communication buffer.
struct Bucket {
  std::vector<std::size_t> params;  ///< in reverse parameter order
  std::int64_t elements = 0;        ///< the gradients' elements, all told
};

/// What the last synchronised backward did.
struct DdpStats {
  std::int64_t buckets_started_in_backward = 0;  ///< all-reduces that overlapped backward
  std::int64_t buckets_started_at_finish = 0;    ///< all-reduces started by finish_backward()
  std::int64_t bytes = 0;                        ///< bytes this rank sent into all-reduces
};

/// Data-parallel training of `model` across the ranks of `comm`.
class DistributedDataParallel {
 public:
  /// Broadcast rank 0's masters (and, with broadcast_buffers, BatchNorm's
  /// running estimates), refresh the model copies, cut the buckets and set
  /// the gradient hooks (and, with sync_batch_norm, the BatchNorms'
  /// reductions). model and comm must outlive this object. Throws
  /// std::invalid_argument (one line) for an option out of range.
  DistributedDataParallel(Model& model, Communicator& comm, DdpOptions options = {});
  /// Removes the gradient hooks (and SyncBatchNorm's reductions).
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  /// Before each forward: broadcast the buffers from rank 0 (with
  /// broadcast_buffers), as PyTorch does at the start of forward.
  void before_forward();
  /// After model.backward(): start the buckets not started yet, wait for all,
  /// and set every grad to the average over ranks. Inside no_sync() it does
  /// nothing (the gradients keep accumulating here). Throws
  /// std::logic_error if a parameter got more contributions than the first
  /// backward counted.
  void finish_backward();

  /// While the returned guard lives, backward only accumulates gradients on
  /// this rank (no communication): PyTorch's no_sync() for gradient
  /// accumulation. The first backward after it synchronises the sums.
  class NoSync {
   public:
    /// From now on, `ddp`'s backward only accumulates (no_sync()).
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(&ddp) { ddp_->set_sync(false); }
    /// The next backward synchronises again.
    ~NoSync() { ddp_->set_sync(true); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel* ddp_;
  };
  /// See NoSync.
  NoSync no_sync() { return NoSync(*this); }

  /// The buckets, in the order they are reduced.
  const std::vector<Bucket>& buckets() const { return buckets_; }
  /// The last synchronised backward's counts.
  const DdpStats& stats() const { return stats_; }
  /// The options, with predivide_factor 0 resolved to the world size.
  const DdpOptions& options() const { return options_; }
  /// The communicator.
  Communicator& comm() { return *comm_; }

 private:
  struct BucketState;
  void on_grad(std::size_t k);
  void start(std::size_t bucket, bool in_backward);  // in_backward: non-blocking
  void broadcast_buffers();
  void set_sync(bool on);                            // no_sync() off (false) and on again
  float pre_factor() const;                          // 1 / predivide_factor
  void set_grad_factors(float factor, float carry);  // every parameter's grad_factor, grad_carry
  void copy_in(std::size_t bucket, float pre);       // the gradients into the bucket, scaled (no views)
  void bring_home(std::size_t k);                    // grad k back into its place in its bucket (views)

  Model* model_;
  Communicator* comm_;
  DdpOptions options_;
  std::vector<Parameter*> params_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // per parameter
  bool views_ = false;                  // gradient_as_bucket_view with f32 communication
  std::vector<float*> home_;            // per parameter, with views: its place in its bucket
  std::vector<int> expected_, seen_;    // contributions per parameter
  bool learned_ = false, sync_ = true;
  std::vector<std::unique_ptr<BucketState>> state_;
  std::size_t next_bucket_ = 0;  // buckets start in order, as PyTorch's
  DdpStats stats_, current_;     // the last synchronised backward's; this one's
};

/// The rows [rank·B/N, (rank+1)·B/N) of a batch of B rows: this rank's
/// shard. Throws std::invalid_argument unless N divides B.
std::pair<std::int64_t, std::int64_t> shard_rows(std::int64_t batch, int rank, int world);

}  // namespace mpt::dist
