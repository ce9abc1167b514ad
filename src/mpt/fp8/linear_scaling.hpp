// Chapter 07 — FP8 training: the scaling state of each Linear under a recipe
// (Transformer Engine's per-module quantizers: input, weight, grad_output),
// attached to a model's Linear layers for the policy fp8:RECIPE.
// Depends on: recipes.hpp (DelayedScaling, current scaling, HYBRID), gemm.hpp
// (the FP8 GEMM), nn/layers/linear.hpp (the LinearFp8 seam it implements),
// nn/module.hpp (visit), core/fp8_policy.hpp (the recipe of a policy).
//
// Per Linear, one scale per tensor role, the format HYBRID (E4M3 for the
// input and the weight, E5M2 for the output gradient), or MX block scales:
//  - delayed: a DelayedScaling per role (TE's defaults: margin 0, history
//    1024, max). Each quantization uses the role's scale and records the
//    tensor's amax; Fp8Training::update(), after every step's backward,
//    updates every state once, as TE's fused update does after each pass.
//  - current: each tensor quantized with the scale of its own amax
//    (current_scale: TE's Float8CurrentScaling, power_2_scale off, epsilon 0).
//  - mx-floor, mx-rceil: TE's MXFP8BlockScaling — every tensor E4M3 (its
//    default format: block scales need no E5M2 range), one E8M0 scale per
//    block of 32 along the reduction dimension of each GEMM, by OCP's FLOOR
//    or NVIDIA's RCEIL rule. Each GEMM needs its operands blocked along its
//    own k, so forward quantizes x and W twice, along rows (for y = x·Wᵀ)
//    and along columns (xᵀ for dW, Wᵀ for dx), as TE's MXFP8 tensors keep a
//    rowwise and a columnwise copy; backward quantizes dy along rows (dx)
//    and columns (dyᵀ for dW). fp8_gemm_mx runs them.
// The states are a run's state: a checkpoint stores each delayed state's
// history and scale (train/run.cpp), and a resume without them would start
// from scale 1 and an empty history — another run.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mpt/fp8/recipes.hpp"
#include "mpt/nn/layers/linear.hpp"
#include "mpt/nn/module.hpp"

namespace mpt::fp8 {

/// The recipes of fp8:RECIPE.
enum class LinearRecipe : std::uint8_t {
  delayed,   ///< DelayedScaling per role
  current,   ///< Float8CurrentScaling: each tensor's own amax
  mx_floor,  ///< MXFP8 block scales, OCP's FLOOR rule
  mx_rceil,  ///< MXFP8 block scales, NVIDIA's RCEIL rule (TE's)
};
/// "delayed" | "current" | "mx-floor" | "mx-rceil"; std::invalid_argument naming them otherwise.
LinearRecipe linear_recipe_named(std::string_view name);

/// A Linear's recipe and its options (TE's defaults).
struct Fp8LinearOptions {
  LinearRecipe recipe = LinearRecipe::delayed;  ///< how scales are chosen
  Fp8Format format = Fp8Format::hybrid;         ///< E4M3 forward; HYBRID's E5M2 for grad_output
  DelayedScalingOptions delayed;                ///< delayed's margin, history, algo
  CurrentScalingOptions current;                ///< current's options
};

/// One Linear's FP8 state and GEMMs (the LinearFp8 seam).
class Fp8LinearScaling final : public LinearFp8 {
 public:
  /// Fresh states (scale 1, zero histories).
  explicit Fp8LinearScaling(const Fp8LinearOptions& options);
  /// e4m3 for input and weight; grad_output e5m2 under HYBRID (per-tensor
  /// recipes), e4m3 under E4M3 and MX.
  DType dtype(Fp8Role role) const;
  /// dtype(Fp8Role::input).
  DType forward_dtype() const override { return dtype(Fp8Role::input); }
  /// See LinearFp8::forward.
  Forward forward(const Tensor& x, const Tensor& w, const Tensor& bias, DType out) override;
  /// See LinearFp8::backward.
  Backward backward(const Tensor& dy, bool need_dx, DType dx_dtype) override;
  /// Per-tensor: x and W in FP8; MX: the codes of their columnwise copies.
  std::vector<const Tensor*> saved() const override;
  /// x's values (as read) quantized with the role's per-tensor scale,
  /// saturating (std::logic_error under MX).
  Tensor quantize(const Tensor& x, Fp8Role role);
  /// Delayed: every role's DelayedScaling::update(); otherwise nothing.
  void update();
  /// The recipe's options.
  const Fp8LinearOptions& options() const { return options_; }
  /// Whether the recipe scales per block (MX).
  bool block_scaled() const;
  /// The role's delayed state (std::logic_error under any other recipe).
  DelayedScaling& state(Fp8Role role);
  /// The per-tensor scale the role's last quantization used (1 before the first; MX: 1).
  float last_scale(Fp8Role role) const { return last_scale_[static_cast<std::size_t>(role)]; }
  /// What happened to the role's values, summed over every quantization.
  const Fp8Counts& counts(Fp8Role role) const { return counts_[static_cast<std::size_t>(role)]; }

 private:
  Fp8Tensor quantize_blocks(const std::vector<float>& v, std::int64_t rows, std::int64_t cols, Fp8Role role);

  Fp8LinearOptions options_;
  std::vector<DelayedScaling> states_;  // delayed: input, weight, grad_output
  std::array<float, 3> last_scale_{1.0f, 1.0f, 1.0f};
  std::array<Fp8Counts, 3> counts_{};
  // What forward keeps for backward: per-tensor, x and W in FP8; MX, the
  // columnwise copies xᵀ and Wᵀ (and their codes as Tensors, for saved()).
  Tensor x8_, w8_;
  Fp8Tensor xt_, wt_;
  Tensor xt_codes_, wt_codes_;               // Tensor::borrowing views of xt_'s and wt_'s codes
  std::vector<std::uint8_t> codes_scratch_;  // quantize()'s codes, read for their counts only
};

/// The roles, in checkpoint order.
inline constexpr std::array<Fp8Role, 3> kFp8Roles = {Fp8Role::input, Fp8Role::weight, Fp8Role::grad_output};

/// Every Linear of a model with its FP8 state: what a training run updates
/// after each step and saves in its checkpoints.
class Fp8Training {
 public:
  /// Attach a fresh Fp8LinearScaling to every Linear of `model` (in visit()
  /// order). std::invalid_argument when the model has no Linear.
  Fp8Training(Module& model, const Fp8LinearOptions& options);
  /// After each step: every layer's update().
  void update();
  /// Delayed: every state's pending_amax() — the amaxes recorded this step,
  /// before update() — layers in visit() order, roles in kFp8Roles order
  /// (3 × layers() entries); empty under any other recipe (no state). What
  /// a data-parallel run reduces across its ranks (train/fp8_parallel.hpp).
  std::vector<float> pending_amaxes() const;
  /// Write pending_amaxes() back, in the same order (each state's
  /// set_pending_amax). std::invalid_argument (one line) for a count other
  /// than pending_amaxes().size(), or an amax that is NaN or negative; all
  /// is checked before anything changes.
  void set_pending_amaxes(const std::vector<float>& amaxes);
  /// One layer: its path and its state.
  struct Layer {
    std::string path;                       ///< the Linear's path ("fc1", "block0.attn.q")
    std::shared_ptr<Fp8LinearScaling> fp8;  ///< its state (also held by the Linear)
  };
  /// The layers, in visit() order.
  const std::vector<Layer>& layers() const { return layers_; }
  /// The recipe's options.
  const Fp8LinearOptions& options() const { return options_; }

 private:
  Fp8LinearOptions options_;
  std::vector<Layer> layers_;
};

/// For a canonical policy text whose base is fp8:RECIPE[:OPTIONS]: the
/// Fp8Training of `model` under RECIPE with the text's options (TE's
/// defaults for the rest); null for any other policy.
std::unique_ptr<Fp8Training> attach_fp8(Module& model, const std::string& canonical_policy);

}  // namespace mpt::fp8
