// Chapters 04 onwards — one training run of a chapter's model, step by step:
// its configuration, the model, data, optimizer and scaler built from it,
// and the record of every step. What `mpt train` drives and checkpoints.
// Depends on: checkpoint.hpp (StepRecord,
// RunConfig, Checkpoint), the core tier (dtype.hpp); the .cpp on the nn,
// optim, amp and dist tiers (the models, data sets, SGD/AdamW,
// GradScaler/StaticScaler, DistributedDataParallel, ShardedOptimizer).
//
// The runs are the chapters' recipes, built from the library's pieces:
//
//   mlp + synthetic     Chapter 2's blobs MLP 8-32-32-4 (weights seed 7),
//                       4 Gaussian blobs, 768 training rows, batches of 64
//   mlp + digits        Chapter 2's digits MLP 64-32-32-10 (seed 7), the
//                       1348 training digits, batches of 64
//   cnn + digits        Chapter 3's digits Cnn (conv-bn-relu-pool twice, fc;
//                       seed 3), batches of 64
//   transformer + text  Chapter 4's TinyTransformer (D 64, 4 heads, 2 blocks,
//                       context 64; seed 1) on the licence corpus, 16
//                       windows a step drawn from Rng(seed)
//
// The MLP and the CNN train with SGD (momentum 0.9, lr 0.05) and draw their
// batches from Chapter 2's fixed batch seed (1234); the Transformer trains
// with AdamW (lr 3e-3, no weight decay). --seed sets the initial weights
// (and the Transformer's window draws). One step: forward, the FP32
// cross-entropy, scale(loss), backward from the scale S, scaler.step
// (skipped on an inf/NaN gradient by a dynamic scaler), update(), and the
// refresh of the model copies. Everything is seeded: the same configuration
// gives the same steps, bit for bit, and so does a run restored from a
// checkpoint of it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/train/checkpoint.hpp"

namespace mpt {
class Trace;
}
namespace mpt::dist {
class Communicator;
}

namespace mpt::train {

/// How a run is spread over ranks (Chapter 5). The default is one process.
/// Each rank takes its B/N rows of every batch (the Transformer: its 16/N
/// windows), so that the global batch and its order are the one-process
/// run's and N ranks compare with one process step by step. Under
/// fp8:delayed (Chapter 7) the step's amaxes are all-reduced (max) before
/// the scales' update, so every rank keeps the same FP8 state
/// (fp8_parallel.hpp); current scaling and MX have none to reduce.
struct DataParallel {
  /// The ranks; nullptr: one process, no DistributedDataParallel.
  dist::Communicator* comm = nullptr;
  /// ZeRO-1: each rank keeps and updates its shard of the optimizer state
  /// (dist::ShardedOptimizer), the found-inf flag is all-reduced.
  bool shard_optimizer = false;
  double bucket_mb = 25;          ///< DdpOptions::bucket_cap_mb
  DType comm_dtype = DType::f32;  ///< DdpOptions::comm_dtype (f32, f16, bf16)
  bool fixed_order = false;       ///< DdpOptions::fixed_order
  /// DdpOptions::sync_batch_norm: BatchNorm statistics over the whole batch
  /// across ranks (SyncBatchNorm). Only for a model with BatchNorm (cnn).
  bool sync_bn = false;
};

/// The configuration with every default filled in and every field checked:
/// the model/data pair, the policy (canonical text), the scaler
/// ("dynamic", "static:S" with S the shortest decimal of a finite float > 0,
/// "none"), the optimizer, a finite lr > 0, steps >= 1, every >= 0.
/// \throws std::invalid_argument with one line naming the field, the value
///         and what would be valid.
RunConfig resolve_config(RunConfig config);

/// The canonical policy text of `text` (see RunConfig::policy), checked.
/// \throws std::invalid_argument naming what is wrong and the grammar.
std::string canonical_policy(const std::string& text);

/// What a finished (or stopped) run reports besides its steps.
struct RunSummary {
  std::string metric;        ///< "test accuracy" (mlp, cnn) or "validation loss" (transformer)
  double metric_value = 0;   ///< its value, after the last step
  std::int64_t skipped = 0;  ///< steps the scaler skipped, over the whole history
  float final_scale = 1;     ///< the scale the next step would run with
  float final_loss = 0;      ///< the last step's training loss (NaN before any)
};

/// One run: the model, data, optimizer and scaler of a RunConfig.
class TrainRun {
 public:
  /// Build a fresh run (resolve_config() first; std::invalid_argument as it
  /// throws), data-parallel over `parallel.comm` when set (std::invalid_argument
  /// if the world size does not divide the batch, or for a bad bucket size or
  /// communication dtype). Loads the digits or the licence corpus on first use (a missing
  /// file: DataFileMissing / std::runtime_error saying how to get it).
  explicit TrainRun(const RunConfig& config, const DataParallel& parallel = {});
  ~TrainRun();
  TrainRun(TrainRun&&) noexcept;             ///< moves keep the model's parameters in place
  TrainRun& operator=(TrainRun&&) noexcept;  ///< moves keep the model's parameters in place
  TrainRun(const TrainRun&) = delete;
  TrainRun& operator=(const TrainRun&) = delete;

  /// The resolved configuration.
  const RunConfig& config() const;
  /// Steps taken so far (skipped ones included).
  std::int64_t steps_done() const;
  /// Take one step and return (and keep) its record.
  StepRecord step();
  /// The same step with `trace` attached to the model's context: every op
  /// and cast of its forward, loss and backward is recorded there (Chapter 6's
  /// cost model reads it).
  StepRecord step(Trace& trace);
  /// Every parameter's FP32 gradient of the last step, unscaled (the
  /// scaler's step unscales in place; in a data-parallel run the average
  /// over the ranks), concatenated in parameter order. Zeros before any step.
  std::vector<float> gradients() const;
  /// Every step's record, in order.
  const std::vector<StepRecord>& history() const;
  /// Everything a run needs to continue from here, bit for bit. In a
  /// data-parallel run it is collective (a sharded optimizer's state is
  /// gathered from each parameter's owner) and every rank gets the whole
  /// checkpoint, the one-process format: it resumes on any world size.
  Checkpoint checkpoint() const;
  /// Continue from `c`: check_resumable(config(), c.config) first, then
  /// every tensor's name and shape against this model, the step against the
  /// history, the optimizer and scaler state; all is checked before
  /// anything is assigned, so on error the run is unchanged.
  /// \throws std::invalid_argument (one line) on any mismatch.
  void restore(const Checkpoint& c);
  /// The summary after the steps so far (the metric is computed now, in
  /// eval mode for the CNN, without changing the run).
  RunSummary summary();
  /// Chapter 7, delayed scaling: the amaxes this rank recorded in its last
  /// step, before a data-parallel run reduced them (max over the ranks) and
  /// before the update (Fp8Training::pending_amaxes() order: layers in
  /// model order, roles input, weight, grad_output). Empty before the first
  /// step and under any other policy.
  const std::vector<float>& fp8_step_amaxes() const;
  /// FNV-1a 64 of every FP32 master's bytes (little-endian), in parameter order.
  std::uint64_t masters_checksum() const;
  /// Steps this rank's scaler skipped, per rank (every rank's, gathered; one
  /// entry in one process). Collective in a data-parallel run.
  std::vector<std::int64_t> skipped_per_rank();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Throws std::invalid_argument unless a checkpoint made with `saved` can
/// continue a run configured as `wanted`: the model, data, policy, scaler,
/// optimizer, lr and seed must be equal (steps and every may differ). The
/// line names the field and both values.
void check_resumable(const RunConfig& wanted, const RunConfig& saved);

}  // namespace mpt::train
