// Chapter 02 — loss scaling and FP32 master weights: the GradScaler.
// Depends on: the optim tier (optimizer.hpp: Parameter, Optimizer); the .cpp also on
// scaler_math.hpp (the update rule shared with the CUDA kernels), unscale.hpp
// (the fused unscale-and-check over a list of gradients, built on
// scaler_math.hpp's per-element function) and nlohmann_json (state_dict).
//
// mpt::GradScaler follows torch.amp.GradScaler (torch/amp/grad_scaler.py in
// pytorch/pytorch) call for call: its defaults, its checks, its update rule
// (aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp and
// aten/src/ATen/native/cuda/AmpKernels.cu), its per-optimizer state machine,
// its misuse errors and its state_dict keys. Where this file deliberately
// differs, the declaration says so under "Differs from PyTorch".
// mpt::StaticScaler is the constant scale that PyTorch does not have.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "mpt/optim/optimizer.hpp"

namespace mpt {

/// Where one optimizer is within the current iteration (PyTorch's OptState).
/// update() puts every optimizer back to `ready`.
enum class OptState {
  ready,     ///< nothing done since the last update() (PyTorch's READY)
  unscaled,  ///< its gradients were unscaled and checked (PyTorch's UNSCALED)
  stepped,   ///< step() ran for it, whether or not optimizer.step() was skipped (STEPPED)
};

/// The name PyTorch prints for a stage: "READY", "UNSCALED", "STEPPED".
const char* opt_state_name(OptState s);

namespace detail {
/// One optimizer's record for the current iteration, kept by the scalers.
struct OptimizerRecord {
  OptState stage = OptState::ready;  ///< where this optimizer is
  /// Whether its gradients held a non-finite value; empty until an inf check
  /// ran, and still empty after one if the optimizer has no parameters
  /// (PyTorch's empty found_inf_per_device).
  std::optional<bool> found_inf;
};
}  // namespace detail

/// Dynamic loss scaling with the semantics of torch.amp.GradScaler.
///
/// One iteration, exactly as in PyTorch:
/// \code
///   float scaled = scaler.scale(loss);   // backward from the scaled loss
///   scaler.unscale(optimizer);           // optional: to clip or inspect grads
///   scaler.step(optimizer);              // skipped if a grad is inf/NaN
///   scaler.update();                     // after step(), every iteration
/// \endcode
///
/// The scale is an FP32 number (2^16 = 65536 is not even an FP16 value); the
/// growth tracker is an int32, as PyTorch's tensors are. Per-optimizer state
/// is keyed by the optimizer's address, as PyTorch keys it by id(optimizer):
/// an optimizer destroyed and another created at the same address within one
/// iteration would share a record.
///
/// Differs from PyTorch, besides the checks listed at the constructor: the
/// getters of a disabled scaler return the options it was given (PyTorch's
/// raise AttributeError), and there are no set_growth_factor() & co.: a
/// growth interval lowered below the running tracker would never be reached
/// (PyTorch compares with ==); load_state_dict() changes them, checked.
class GradScaler {
 public:
  /// The constructor's arguments, with PyTorch's names and defaults.
  struct Options {
    float init_scale = 65536.0f;          ///< 2^16, the first scale
    double growth_factor = 2.0;           ///< scale *= this after growth_interval clean steps
    double backoff_factor = 0.5;          ///< scale *= this after a step with inf/NaN
    std::int32_t growth_interval = 2000;  ///< clean steps in a row before the scale grows
    bool enabled = true;                  ///< false: every call is a pass-through
  };

  /// A scaler with PyTorch's defaults (2^16, 2.0, 0.5, 2000, enabled).
  GradScaler();

  /// A scaler with the given options. When enabled, throws
  /// std::invalid_argument with PyTorch's wording ("The growth factor must be
  /// > 1.0", "The backoff factor must be < 1.0") when a factor is out of
  /// range; a disabled scaler checks nothing, as in PyTorch.
  ///
  /// Differs from PyTorch: it also rejects what PyTorch accepts but cannot
  /// work — a non-finite or non-positive init_scale, a backoff_factor <= 0
  /// (the first overflow would zero the scale), a non-finite growth_factor
  /// and a growth_interval < 1 (the scale could never grow) — so that every
  /// state a scaler can start from is one load_state_dict() accepts.
  explicit GradScaler(const Options& options);

  /// The loss multiplied by the current scale (PyTorch: scale(outputs)), in
  /// FP32. Backpropagate from this value. The first call starts the scale,
  /// as PyTorch lazily creates its scale tensor on the first scale(); a
  /// disabled scaler returns the loss unchanged.
  float scale(float loss);

  /// Unscale the gradients of `optimizer` in place (PyTorch's unscale_):
  /// each is multiplied by inv_scale = float(1 / double(scale)) — the
  /// reciprocal taken in double, then rounded to float, as PyTorch does —
  /// and checked for inf/NaN *before* the multiply (mpt::unscale_and_check).
  /// Call it once per iteration, after all gradients are accumulated, when
  /// you need unscaled gradients before step() (for clipping).
  /// \throws std::logic_error if unscale() already ran for this optimizer
  ///         since the last update(), if step() already ran, or if scale()
  ///         was never called.
  void unscale(Optimizer& optimizer);

  /// Unscale (unless unscale() already did this iteration), then call
  /// optimizer.step() only if no gradient was inf/NaN.
  /// \return true if optimizer.step() ran, false if it was skipped. A
  ///         disabled scaler always calls optimizer.step() and returns true.
  /// \throws std::logic_error if step() already ran for this optimizer since
  ///         the last update(), if the optimizer has no parameters (no inf
  ///         check recorded), or if scale() was never called.
  bool step(Optimizer& optimizer);

  /// End the iteration: back off (scale *= backoff_factor, tracker = 0) if
  /// any optimizer stepped or unscaled this iteration found inf/NaN,
  /// otherwise count the clean step and grow the scale (if the grown scale
  /// is finite in FP32) when the count reaches growth_interval. No floor:
  /// enough overflows in a row drive the scale to 0. Then every optimizer is
  /// back to OptState::ready. Uses mpt::update_scale.
  /// \throws std::logic_error "No inf checks were recorded prior to
  ///         update()" if no optimizer was unscaled or stepped since the last
  ///         update(), or if scale() was never called.
  void update();

  /// End the iteration with a scale chosen by the caller: the scale becomes
  /// `new_scale` (not checked, as in PyTorch), the growth tracker keeps its
  /// value, no inf check is needed, and every optimizer is back to
  /// OptState::ready.
  /// \throws std::logic_error if scale() was never called.
  void update(float new_scale);

  /// The current scale; 1.0 when disabled; the initial scale before the
  /// first scale() call.
  float get_scale() const;
  /// The growth factor the scaler was built with (or loaded).
  double get_growth_factor() const { return options_.growth_factor; }
  /// The backoff factor the scaler was built with (or loaded).
  double get_backoff_factor() const { return options_.backoff_factor; }
  /// The growth interval the scaler was built with (or loaded).
  std::int32_t get_growth_interval() const { return options_.growth_interval; }
  /// Clean steps counted since the last growth or backoff (PyTorch's
  /// _growth_tracker); 0 when disabled.
  std::int32_t growth_tracker() const;
  /// False for a pass-through scaler.
  bool is_enabled() const { return options_.enabled; }

  /// What a process found, in, and what it records, out: see
  /// set_found_inf_reduction().
  using FoundInfReduction = std::function<bool(bool found_inf_here)>;
  /// The one seam for data parallelism (Chapter 5): called right after the
  /// local unscale-and-check of each optimizer, with what this process found
  /// (false when the optimizer has no gradients here — a rank whose shard is
  /// empty still joins), and what it returns is recorded as the verdict that
  /// step() and update() act on. Unset (the default), the local verdict is
  /// recorded, as in PyTorch's GradScaler. mpt::dist::ShardedGradScaler sets
  /// an all-reduce (max) across ranks, as PyTorch's ShardedGradScaler does.
  void set_found_inf_reduction(FoundInfReduction reduction) { reduction_ = std::move(reduction); }

  /// Where `optimizer` is in the current iteration (ready if never seen).
  OptState stage(const Optimizer& optimizer) const;
  /// What the inf check of `optimizer` found this iteration: empty if no
  /// check ran since the last update() (or the optimizer has no parameters).
  std::optional<bool> found_inf(const Optimizer& optimizer) const;

  /// The state as a JSON object with PyTorch's keys, in PyTorch's order:
  /// {"scale", "growth_factor", "backoff_factor", "growth_interval",
  /// "_growth_tracker"}; "{}" when disabled (as PyTorch returns {}). Numbers
  /// are written so that they read back to the same FP32 / int32 values.
  /// Save it after update(): per-optimizer records are not part of it.
  std::string state_dict() const;

  /// Restore a state written by state_dict(). Everything is checked before
  /// anything is assigned, so on error the scaler is unchanged. A disabled
  /// scaler ignores the call (as in PyTorch). Unknown extra keys are ignored.
  /// \throws std::invalid_argument (one line) for text that is not a JSON
  ///         object; for "{}" (PyTorch: "The source state dict is empty,
  ///         possibly because it was saved from a disabled instance of
  ///         GradScaler."); for a missing key; for a wrong type (numbers for
  ///         the scale and factors, integers for the interval and tracker);
  ///         for a scale that is not finite and > 0 in FP32; for factors or
  ///         an interval the constructor would reject; and for a growth
  ///         tracker outside [0, growth_interval).
  void load_state_dict(const std::string& json);

 private:
  void require_started(const char* call) const;
  Options options_;
  float scale_;
  std::int32_t growth_tracker_ = 0;
  bool started_ = false;  // scale() was called once (PyTorch: _scale is not None)
  std::map<const Optimizer*, detail::OptimizerRecord> per_optimizer_;
  FoundInfReduction reduction_;
};

/// Static (constant) loss scaling: one fixed scale for the whole run, as in
/// Micikevicius et al. 2018 and apex's static loss scale. PyTorch has no
/// such class; it is a separate class here (not a GradScaler option) so that
/// GradScaler stays exactly PyTorch's.
///
/// It has GradScaler's scale/unscale/step/update interface and the same
/// per-optimizer state machine and misuse errors, but update() never changes
/// the scale and needs no inf check. Unscaling still checks for inf/NaN
/// (found_inf() tells); whether step() then skips optimizer.step() is a
/// choice: NVIDIA apex's static loss scale does not skip, so an overflow
/// reaches the weights (the failure this class exists to show by default);
/// Megatron-LM's constant scaler does skip, as Micikevicius et al. (§3.2)
/// suggest.
class StaticScaler {
 public:
  /// A constant `scale` (finite and > 0, else std::invalid_argument). With
  /// `skip_nonfinite_steps`, step() skips optimizer.step() on inf/NaN like
  /// GradScaler; without (the default), it always steps.
  explicit StaticScaler(float scale, bool skip_nonfinite_steps = false);

  /// The loss multiplied by the constant scale, in FP32.
  float scale(float loss) const;
  /// Unscale and check the gradients of `optimizer`, as GradScaler::unscale
  /// does (same inverse scale, same errors except the scale() requirement).
  void unscale(Optimizer& optimizer);
  /// Unscale if not yet done, then call optimizer.step() — unless a
  /// gradient was inf/NaN and skip_nonfinite_steps is set.
  /// \return whether optimizer.step() ran.
  /// \throws std::logic_error if step() already ran for this optimizer since
  ///         the last update(), or unscale() errors.
  bool step(Optimizer& optimizer);
  /// End the iteration: every optimizer back to OptState::ready. The scale
  /// does not change.
  void update();

  /// The constant scale.
  float get_scale() const { return scale_; }
  /// Whether step() skips optimizer.step() when a gradient is inf/NaN.
  bool skips_nonfinite_steps() const { return skip_nonfinite_steps_; }
  /// Where `optimizer` is in the current iteration (ready if never seen).
  OptState stage(const Optimizer& optimizer) const;
  /// What the inf check of `optimizer` found this iteration, if one ran.
  std::optional<bool> found_inf(const Optimizer& optimizer) const;

 private:
  float scale_;
  bool skip_nonfinite_steps_;
  std::map<const Optimizer*, detail::OptimizerRecord> per_optimizer_;
};

}  // namespace mpt
