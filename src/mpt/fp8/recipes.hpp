// Chapter 07 — FP8 training: the scaling recipes, with Transformer Engine's
// semantics — delayed scaling (an amax history), current scaling (this
// tensor's own amax) — and the FP8 formats a recipe uses per pass.
// Depends on: quantize.hpp (and through it fp8_math.hpp, core/dtype.hpp).
//
// Transformer Engine (NVIDIA/TransformerEngine) at commit
// d0067d0da6cb01811b8072a7d304f0e00344ce2b:
//  - transformer_engine/common/recipe/__init__.py: DelayedScaling (margin,
//    fp8_format, amax_history_len, amax_compute_algo), Float8CurrentScaling
//    (QParams power_2_scale, amax_epsilon), MXFP8BlockScaling, Format
//    (E4M3, E5M2, HYBRID: E4M3 forward, E5M2 backward).
//  - transformer_engine/common/recipe/delayed_scaling.cu: the update.
//    PyTorch's default path is the fused kernel_bulk (called through
//    fused_amax_and_scale_update_after_reduction by
//    transformer_engine/pytorch/quantization.py, reduce_and_update_fp8_tensors),
//    and that is the one reproduced here; its differences from the
//    unfused Python path (NVTE_UNFUSED_FP8_UPDATE=1) are listed at
//    DelayedScaling::update().
//  - transformer_engine/common/recipe/recipe_common.cuh:
//    compute_scale_from_amax (current scaling).
// TE's scales multiply, as this project's do, so nothing is inverted here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mpt/fp8/quantize.hpp"

namespace mpt::fp8 {

/// Transformer Engine's recipe formats (TE's Format; pure E5M2 training is
/// refused by its recipes, and so it has no entry here).
enum class Fp8Format : std::uint8_t {
  e4m3,    ///< every FP8 tensor in E4M3
  hybrid,  ///< forward tensors (activations, weights) in E4M3, backward (gradients) in E5M2
};
/// Which pass a tensor belongs to.
enum class Pass : std::uint8_t {
  forward,   ///< activations and weights
  backward,  ///< gradients
};
/// The dtype a recipe format stores a tensor of `pass` in.
DType fp8_dtype_for(Fp8Format format, Pass pass);

/// How delayed scaling picks the amax from its history (TE's amax_compute_algo).
enum class AmaxComputeAlgo : std::uint8_t {
  max,          ///< the largest amax of the last amax_history_len steps
  most_recent,  ///< the amax of the step just finished
};
/// "max" or "most_recent".
std::string_view amax_compute_algo_name(AmaxComputeAlgo a);
/// Parse "max" | "most_recent"; std::invalid_argument naming both otherwise.
AmaxComputeAlgo amax_compute_algo_named(std::string_view name);

/// The largest margin accepted: with it, even an amax of FLT_MAX gives a
/// scale above zero (fp8_max × 2^-24 / FLT_MAX ≥ 2^-149).
inline constexpr int kMaxMargin = 24;
/// The largest amax_history_len accepted (TE's default is 1024).
inline constexpr std::size_t kMaxAmaxHistoryLen = 1u << 20;

/// TE's DelayedScaling fields that shape the scale (TE's defaults).
struct DelayedScalingOptions {
  int margin = 0;                               ///< scale = fp8_max / amax / 2^margin; 0..kMaxMargin
  std::size_t amax_history_len = 1024;          ///< steps the history remembers; 1..kMaxAmaxHistoryLen
  AmaxComputeAlgo algo = AmaxComputeAlgo::max;  ///< how the amax is taken from the history
};

/// Delayed scaling for one tensor (one TE quantizer): the scale a step
/// quantizes with comes from the amaxes of earlier steps. The scale starts at
/// 1 and the history at zeros (TE's initial fp8_meta). Each step: quantize
/// with scale(), record the tensor's amax (record_amax, or quantize() does
/// both), then update() once — TE updates after the forward (or backward)
/// pass, for every tensor at once.
class DelayedScaling {
 public:
  /// A fresh state for tensors in `dtype` (e4m3 or e5m2). std::invalid_argument,
  /// naming the field and its range, for a margin or history length out of range
  /// or a dtype that is not FP8.
  DelayedScaling(DType dtype, const DelayedScalingOptions& options = {});

  /// The scale the next quantization multiplies by.
  float scale() const noexcept { return scale_; }
  /// The history in TE's layout (amax_history[:, i] of one tensor): entry 0
  /// is the slot the current step's amax is recorded into (zero after an
  /// update), entry len−1 the previous step's amax, entry 1 the oldest.
  const std::vector<float>& amax_history() const noexcept { return history_; }
  /// The amax the last update() chose (0 before the first).
  float last_update_amax() const noexcept { return last_amax_; }
  /// The dtype its tensors are stored in.
  DType dtype() const noexcept { return dtype_; }
  /// Its options.
  const DelayedScalingOptions& options() const noexcept { return options_; }

  /// Record an amax of this step: history[0] = fmaxf(history[0], |amax|),
  /// as TE's cast kernels max their amax into the slot (NaN ignored), so two
  /// quantizations before one update keep the larger amax.
  void record_amax(float amax);
  /// The amax recorded this step so far (history[0]; 0 after an update).
  /// Never NaN: record_amax ignores NaN.
  float pending_amax() const noexcept { return history_[0]; }
  /// Replace the amax recorded this step (history[0]) — what a data-parallel
  /// run writes back after reducing every rank's pending_amax() with max
  /// (train/fp8_parallel.hpp), as Transformer Engine's reduce_amax does
  /// before the update. std::invalid_argument (one line) for a NaN or
  /// negative amax; nothing changes then.
  void set_pending_amax(float amax);
  /// Quantize x[0..n) with scale() and record its amax; the returned
  /// tensor's amax is that of x (not the one the scale came from).
  Fp8Tensor quantize(const float* x, std::size_t n, bool saturate = true);

  /// The update after a step, as TE's fused kernel_bulk (delayed_scaling.cu)
  /// does it. Let a = history[0], the step's amax:
  ///  - a ≠ 0: the history rolls by one (torch.roll(history, −1): entry i
  ///    takes entry i+1, the last entry takes a, entry 0 — which held the
  ///    oldest amax — is cleared), and the amax is, for `max`, the largest
  ///    of the history before the roll (fmaxf: the last len steps, NaN
  ///    ignored), for `most_recent`, a;
  ///  - a = 0 (the tensor did not take part): no roll, and the amax is 0.
  /// Then scale = delayed_scale_from_amax(amax, scale, fp8_max × 2^-margin):
  /// an amax of 0, inf or NaN keeps the previous scale; a quotient that
  /// overflows becomes FLT_MAX.
  /// TE's unfused Python update differs in two ways: it rolls on a zero
  /// amax too (so a step without the tensor ages its history), and its
  /// torch.max propagates a NaN where fmaxf ignores it.
  void update();

  /// Chapter 7's checkpoints: take a saved state back — the scale and the
  /// history (amax_history() as it was saved). std::invalid_argument, one
  /// line, for a history of another length than amax_history_len, an entry
  /// that is negative or NaN, or a scale that is not finite and > 0; nothing
  /// changes then.
  void restore(float scale, const std::vector<float>& history);

 private:
  DType dtype_;
  DelayedScalingOptions options_;
  float scaled_max_;
  float scale_ = 1.0f;
  float last_amax_ = 0.0f;
  std::vector<float> history_;
};

/// One step of a delayed-scaling run (simulate_delayed).
struct DelayedStep {
  float amax;         ///< the step's amax, as given
  float scale;        ///< the scale the step quantized with
  bool overflow;      ///< the step's amax × scale lies beyond the format's max: its largest values saturated
  float update_amax;  ///< the amax the update after the step chose
  float next_scale;   ///< the scale after that update (the next step's)
};

/// Delayed scaling played over one amax per step: each step quantizes with
/// the current scale (the first with 1), records its amax and updates.
/// overflow is quantize_element(amax, scale)'s verdict on the step's
/// largest value. std::invalid_argument for a negative or NaN amax (an amax
/// is ≥ 0; TE's fmaxf-based amax never yields NaN), or the constructor's.
std::vector<DelayedStep> simulate_delayed(const std::vector<float>& amaxes, DType dtype,
                                          const DelayedScalingOptions& options);

/// TE's Float8CurrentScaling quantization parameters (QParams) and one
/// addition of this project: a margin, as delayed scaling's (TE's current
/// scaling has none: margin 0 is TE's behaviour).
struct CurrentScalingOptions {
  bool power_2_scale = false;  ///< round the scale down to a power of two
  float amax_epsilon = 0.0f;   ///< floor of the amax (≥ 0)
  int margin = 0;              ///< aim the amax at fp8_max / 2^margin; 0..kMaxMargin
};

/// The current-scaling scale for an amax (current_scale_from_amax with the
/// options). std::invalid_argument for an epsilon that is negative or not
/// finite, or a margin out of range.
float current_scale(float amax, DType dtype, const CurrentScalingOptions& options = {});

/// x[0..n) quantized with the scale of its own amax (current scaling).
Fp8Tensor quantize_current(const float* x, std::size_t n, DType dtype,
                           const CurrentScalingOptions& options = {}, bool saturate = true);

}  // namespace mpt::fp8
