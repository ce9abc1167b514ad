// Chapter 02 — loss scaling and FP32 master weights: AdamW.
// Depends on: optimizer.hpp; the core tier (dtype.hpp, tensor.hpp: the state
// is stored in its own dtype); Chapter 1's rounding in the .cpp.
//
// AdamW with PyTorch's semantics and defaults (torch.optim.AdamW, the
// single-tensor implementation), updating the FP32 master weights from the
// FP32 gradients. It can also run its arithmetic in fp16 — state, constants
// and every intermediate rounded — to show why Adam's eps = 1e-8 must not
// live in fp16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/optim/optimizer.hpp"

namespace mpt {

/// torch.optim.AdamW's hyperparameters and defaults, plus the precision of
/// the optimizer's own arithmetic.
struct AdamWOptions {
  double lr = 1e-3;            ///< learning rate
  double beta1 = 0.9;          ///< decay of the first moment m
  double beta2 = 0.999;        ///< decay of the second moment v
  double eps = 1e-8;           ///< added to √v̂: keeps the division finite where v̂ is 0
  double weight_decay = 1e-2;  ///< decoupled decay λ: p ← p·(1 − lr·λ) before the Adam step
  /// The dtype of m, v and of every constant and intermediate of the Adam
  /// arithmetic. fp32 is PyTorch's. fp16 is THE PITFALL "Adam's eps = 1e-8
  /// is zero in FP16": eps rounds to 0 (fp16's smallest value is 2^-24 ≈
  /// 6e-8), and v = g² underflows to 0 for |g| below about 2^-12, so the
  /// update m/(√v + eps) divides by zero — inf or NaN weights. The master
  /// weights stay FP32 either way; only the update is computed in this format.
  DType state_dtype = DType::f32;
};

/// AdamW (Loshchilov & Hutter), exactly as torch.optim.AdamW orders it, for
/// step t = 1, 2, … of each parameter p with gradient g:
///
///     p ← p·(1 − lr·λ)
///     m ← m + (1 − β1)·(g − m)                (lerp; = β1·m + (1 − β1)·g)
///     v ← β2·v + (1 − β2)·g²
///     p ← p − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + eps)
///
/// The bias corrections are computed in double, as Python does; the
/// element arithmetic in FP32 (or in state_dtype, rounding every result).
class AdamW : public Optimizer {
 public:
  /// The options type: `AdamW::Options o; o.state_dtype = DType::f16;`.
  using Options = AdamWOptions;
  /// Validates as PyTorch does (std::invalid_argument: "Invalid learning
  /// rate", "Invalid epsilon value", "Invalid beta parameter at index 0",
  /// "Invalid weight_decay value").
  explicit AdamW(std::vector<Parameter*> params, Options options = {});
  /// One update of every parameter's master from its grad.
  void step() override;
  /// The current learning rate (schedules change it between steps).
  double lr() const { return options_.lr; }
  /// Set the learning rate for the following steps; must be >= 0.
  void set_lr(double lr);
  /// The hyperparameters in use.
  const Options& options() const { return options_; }
  /// Steps taken so far (PyTorch's state['step']); a step the GradScaler
  /// skips does not count.
  std::int64_t step_count() const { return t_; }
  /// First moment m of parameter i, widened to FP32 (zeros before the first step).
  MatrixF exp_avg(std::size_t i) const { return m_.at(i).to_matrix(); }
  /// Second moment v of parameter i, widened to FP32 (zeros before the first step).
  MatrixF exp_avg_sq(std::size_t i) const { return v_.at(i).to_matrix(); }
  /// Bytes of optimizer state: m and v, stored in state_dtype.
  std::size_t state_bytes() const;
  /// Continue from saved state: `steps` taken (>= 0) and, per parameter,
  /// m and v flattened (exp_avg(i) and exp_avg_sq(i) of an AdamW over the
  /// same parameters), each with its parameter's number of elements, every
  /// value finite and exactly representable in state_dtype, v >= 0. Checked
  /// before anything is assigned: std::invalid_argument (one line naming the
  /// parameter and what is wrong) otherwise.
  void set_state(std::int64_t steps, const std::vector<MatrixF>& m, const std::vector<MatrixF>& v);

 private:
  Options options_;
  std::int64_t t_ = 0;
  std::vector<Tensor> m_, v_;
};

}  // namespace mpt
