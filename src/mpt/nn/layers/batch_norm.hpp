// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the BatchNorm layer.
// Depends on: module.hpp, parameter.hpp, welford.hpp (the statistics the
// reduction seam passes); norm_math.hpp (the formulas, in batch_norm.cpp).
//
// torch.nn.BatchNorm1d and BatchNorm2d in one class. The semantics are
// PyTorch's (torch/nn/modules/batchnorm.py, _BatchNorm.forward;
// torch/nn/functional.py, batch_norm and _verify_batch_size;
// aten/src/ATen/native/Normalization.cpp, batch_norm_cpu_update_stats_template):
//
// - Statistics per channel over N (and L, or H·W): M = N·L values each.
// - Training: normalize with the batch mean and the *biased* variance;
//   fold the batch mean and the *unbiased* variance (M2 / (M − 1)) into the
//   running estimates, running = (1 − m)·running + m·batch, with
//   m = momentum, or m = 1/num_batches_tracked after the increment when
//   momentum is nullopt (the cumulative average). num_batches_tracked counts
//   the training forwards.
// - A channel of one value cannot be normalized with batch statistics:
//   refused, as PyTorch's "Expected more than 1 value per channel when
//   training".
// - Eval: normalize with the running estimates; without
//   track_running_stats there are none, and batch statistics are used in
//   eval too (PyTorch's bn_training).
//
// Precision: whatever the policy stores, the statistics are taken from the
// widened input with double sums and rounded once into FP32, and the
// normalization is computed in FP32 (norm_math.hpp); the running estimates and the
// affine parameters' model copies are in Policy::parameter_dtype
// ("batch_norm", path) — what model.half() does to a BatchNorm's buffers —
// and every running update is computed in FP32 and rounded once into that
// dtype.
//
// The statistics-reduction seam (set_statistics_reduction) is what Chapter
// 5's SyncBatchNorm plugs into (mpt/dist/sync_batch_norm.hpp): this tier only
// calls two functions, it knows nothing of ranks. Unset, the layer computes
// exactly what it computed before the seam existed, bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mpt/nn/layers/norm_math.hpp"
#include "mpt/nn/module.hpp"
#include "mpt/nn/parameter.hpp"

namespace mpt {

/// torch.nn.BatchNorm1d / BatchNorm2d over [N, C], [N, C, L] or [N, C, H, W].
class BatchNorm final : public Module {
 public:
  /// PyTorch's constructor arguments, plus one guard.
  struct Options {
    double eps = 1e-5;  ///< added to the variance inside the square root (>= 0)
    std::optional<double> momentum =
        0.1;                          ///< weight of the new batch, in [0, 1]; nullopt: cumulative average
    bool affine = true;               ///< learnable γ (1) and β (0) per channel
    bool track_running_stats = true;  ///< keep running estimates (used in eval)
    /// Leave the running estimates and num_batches_tracked unchanged for a
    /// batch whose mean or variance is not finite in some channel (not in
    /// PyTorch: the fix for folding an overflowed batch into the estimates
    /// during a step the GradScaler skips).
    bool guard_running_update = false;
  };

  /// C = num_features channels with the default options. Throws
  /// std::invalid_argument unless num_features >= 1.
  explicit BatchNorm(int num_features);
  /// With options; throws std::invalid_argument for num_features < 1, an eps
  /// that is negative or not finite, or a momentum outside [0, 1].
  BatchNorm(int num_features, Options options);

  /// "BatchNorm".
  const char* kind() const override { return "BatchNorm"; }
  /// C.
  int num_features() const { return num_features_; }
  /// The options it was made with.
  const Options& options() const { return options_; }

  /// γ [C], FP32 master 1 (empty without affine).
  Parameter weight;
  /// β [C], FP32 master 0 (empty without affine).
  Parameter bias;
  /// The running mean [C], initially 0, in the parameters' model dtype
  /// (empty without track_running_stats).
  Tensor running_mean;
  /// The running (unbiased) variance [C], initially 1, in the parameters'
  /// model dtype (empty without track_running_stats).
  Tensor running_var;
  /// Training forwards folded into the running estimates.
  std::int64_t num_batches_tracked = 0;

  /// The batch mean [C], f32, of the last forward that normalized with batch
  /// statistics (empty before one).
  const Tensor& mean() const { return batch_mean_; }
  /// 1/√(biased batch variance + eps) [C], f32, of that forward.
  const Tensor& invstd() const { return batch_invstd_; }
  /// Whether the last training forward left the running estimates alone
  /// because guard_running_update saw a non-finite batch statistic.
  bool running_update_skipped() const { return skipped_; }

  /// See set_statistics_reduction(): this rank's per-channel statistics
  /// (C entries: count, and mean and M2 in double) in, the merged statistics
  /// of every rank's batch out (same size, every count the global number of
  /// values per channel).
  using StatisticsReduction = std::function<void(std::vector<norm_math::Statistics>& stats)>;
  /// See set_statistics_reduction(): [Σdy (C), Σdy·x̂ (C)] over this rank's
  /// values in, the sums over every rank's values out.
  using GradientSumsReduction = std::function<void(std::vector<float>& sums)>;
  /// The seam for SyncBatchNorm (Chapter 5). When set, a training-mode
  /// forward takes this rank's statistics (norm_math::statistics on x
  /// widened), hands them to `statistics`, and normalizes with what it
  /// returns — the global mean and biased variance — and folds the unbiased
  /// variance over the *global* count into running_var (as PyTorch's
  /// SyncBatchNorm, torch.batch_norm_gather_stats_with_counts). The
  /// one-value-per-channel refusal then applies to the global count. The
  /// backward of such a forward, when dx is wanted, hands the two
  /// per-channel sums dx needs to `gradient_sums` and computes dx from the
  /// global sums and count; dγ and dβ stay this rank's own sums (DDP
  /// averages them with the other gradients). Both are called in the same
  /// order on every rank, so they may be collectives. Eval mode never calls
  /// them. Unset (the default, or after clear_statistics_reduction()), nothing
  /// changes. Throws std::invalid_argument if exactly one of them is empty.
  void set_statistics_reduction(StatisticsReduction statistics, GradientSumsReduction gradient_sums);
  /// Back to this rank's own statistics.
  void clear_statistics_reduction();
  /// Whether a reduction is set.
  bool has_statistics_reduction() const { return static_cast<bool>(reduce_statistics_); }

  /// {weight, bias}, or none without affine.
  std::vector<Parameter*> parameters() override;
  /// γ's and β's model copies and the running estimates in
  /// Policy::parameter_dtype("batch_norm", path()); the running estimates are
  /// rounded from their current values (widened exactly when going up).
  void apply_policy(const Policy& policy) override;
  /// What backward reads: the input as forward read it, and the mean and
  /// invstd it normalized with (f32 [C]).
  std::vector<const Tensor*> saved() const override { return {&x_, &used_mean_, &used_invstd_}; }
  /// Names the parameters "<path>.weight" and "<path>.bias".
  void set_path(std::string path) override;

 protected:
  /// x in the policy's input dtype, statistics and normalization in f32, y
  /// in the policy's output dtype; running update in training.
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  /// dx (in the dtype x was read in), and dγ = Σ dy·x̂, dβ = Σ dy summed in
  /// FP32, rounded into the parameters' model dtype and added into their grad.
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  std::string who() const;
  void update_running(const std::vector<float>& mean, const std::vector<float>& unbiased_var);

  int num_features_;
  Options options_;
  Tensor x_;                          // the input as forward read it
  Tensor used_mean_, used_invstd_;    // what the last forward normalized with
  Tensor batch_mean_, batch_invstd_;  // the last batch statistics
  bool used_batch_stats_ = true;
  bool skipped_ = false;
  bool synced_ = false;          // the last forward's statistics came through the reduction
  std::int64_t used_count_ = 0;  // values per channel they cover (global when synced_)
  StatisticsReduction reduce_statistics_;
  GradientSumsReduction reduce_gradient_sums_;
  OpPrecision op_{};
};

}  // namespace mpt
