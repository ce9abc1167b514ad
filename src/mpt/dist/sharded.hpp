// Chapter 05 — loss scaling across ranks: a ZeRO-style sharded optimizer
// and the scaler it needs.
// Depends on: communicator.hpp; the optim tier (Optimizer), the amp tier
// (GradScaler).
//
// ShardedOptimizer is stage 1 of ZeRO (Rajbhandari et al., 2020) as
// PyTorch's ZeroRedundancyOptimizer (torch/distributed/optim/
// zero_redundancy_optimizer.py) does it: every rank holds the full model and
// the full averaged gradients (DistributedDataParallel), but each parameter
// is *owned* by one rank, and only its owner keeps its optimizer state
// (momentum; Adam's two moments) and updates its FP32 master. Its params()
// are the owned ones — so a GradScaler unscales and checks only this rank's
// shard. gather_masters() then gives every rank the owners' updated masters.
//
// That is where the scaler needs the ranks: an inf in one shard is seen
// only by its owner. Without a shared verdict the owner skips its step and
// backs its scale off while the others step and keep theirs; from then on
// the ranks scale their losses differently (pitfall
// "sharded-found-inf-unsynced"). ShardedGradScaler is GradScaler with one
// thing added through GradScaler's seam: the found-inf flag is all-reduced
// (max) across ranks right after the local unscale, before any rank steps —
// as PyTorch's ShardedGradScaler (torch/distributed/fsdp/sharded_grad_scaler.py).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "mpt/amp/grad_scaler.hpp"
#include "mpt/dist/communicator.hpp"
#include "mpt/optim/optimizer.hpp"

namespace mpt::dist {

/// Which rank owns each of `sizes` (elements per parameter), in their order:
/// ZeroRedundancyOptimizer's greedy partition — the parameters by size,
/// largest first (ties in model order), each to the rank with the fewest
/// elements so far (the lowest rank on a tie).
std::vector<int> partition_parameters(const std::vector<std::int64_t>& sizes, int world);

/// ZeRO stage 1 over `all` parameters (every rank passes the same list).
class ShardedOptimizer final : public Optimizer {
 public:
  /// Builds the local optimizer with `make` over the parameters this rank
  /// owns (partition_parameters). comm must outlive it.
  ShardedOptimizer(const std::vector<Parameter*>& all, Communicator& comm,
                   const std::function<std::unique_ptr<Optimizer>(std::vector<Parameter*>)>& make);
  /// Update the owned masters (the local optimizer's step).
  void step() override;
  /// Zero every parameter's grad, owned or not: backward accumulates into
  /// all of them (and DDP averages all of them).
  void zero_grad() override;
  /// Every parameter's master from its owner to every rank (one broadcast
  /// per parameter). Call it every iteration, after scaler.step(), whether
  /// or not the step was skipped: every rank must make the same calls.
  void gather_masters();
  /// The owner of every parameter, in `all`'s order.
  const std::vector<int>& owners() const { return owners_; }
  /// The local optimizer (its state is this rank's shard).
  Optimizer& local() { return *local_; }

 private:
  ShardedOptimizer(const std::vector<Parameter*>& all, Communicator& comm,
                   const std::function<std::unique_ptr<Optimizer>(std::vector<Parameter*>)>& make,
                   std::vector<int> owners);
  std::vector<Parameter*> all_;
  Communicator* comm_;
  std::vector<int> owners_;
  std::unique_ptr<Optimizer> local_;
};

/// GradScaler whose found-inf verdict is the maximum over the ranks of `comm`
/// (which must outlive it): every rank skips, or none does.
class ShardedGradScaler final : public GradScaler {
 public:
  /// A GradScaler with `options` and the all-reduced verdict.
  ShardedGradScaler(Communicator& comm, const Options& options);
  /// PyTorch's defaults.
  explicit ShardedGradScaler(Communicator& comm);
};

/// What ShardedGradScaler installs: a found-inf reduction that all-reduces
/// the flag (max, as f32 0/1) over `comm`.
GradScaler::FoundInfReduction found_inf_across(Communicator& comm);

}  // namespace mpt::dist
