// Chapter 02 — loss scaling and FP32 master weights: SGD.
// Depends on: optimizer.hpp.
//
// SGD with momentum, with torch.optim.SGD's semantics and defaults (the
// single-tensor implementation), updating the FP32 master weights from the
// FP32 gradients.
#pragma once

#include <cstddef>
#include <vector>

#include "mpt/core/tensor.hpp"
#include "mpt/optim/optimizer.hpp"

namespace mpt {

/// torch.optim.SGD's hyperparameters and defaults (PyTorch ≥ 2.2: lr 1e-3).
struct SgdOptions {
  double lr = 1e-3;           ///< learning rate
  double momentum = 0.0;      ///< μ; 0 disables the momentum buffer
  double dampening = 0.0;     ///< τ: the buffer adds (1 − τ)·g after the first step
  double weight_decay = 0.0;  ///< L2 penalty λ, added to the gradient (coupled)
  bool nesterov = false;      ///< Nesterov momentum: needs μ > 0 and τ = 0
};

/// SGD, as torch.optim.SGD computes it for each parameter p with gradient g:
///
///     g ← g + λ·p                      (if λ ≠ 0)
///     b ← g on the first step, else μ·b + (1 − τ)·g   (if μ ≠ 0)
///     g ← g + μ·b if nesterov, else b                 (if μ ≠ 0)
///     p ← p − lr·g
///
/// in FP32 on the master weights. The momentum buffer is FP32.
class SGD : public Optimizer {
 public:
  /// The options type, spelled as PyTorch users look for it.
  using Options = SgdOptions;
  /// Validates as PyTorch does (std::invalid_argument: "Invalid learning
  /// rate: -1", "Nesterov momentum requires a momentum and zero dampening", …).
  explicit SGD(std::vector<Parameter*> params, Options options = {});
  /// One update of every parameter's master from its grad.
  void step() override;
  /// The current learning rate (schedules change it between steps).
  double lr() const { return options_.lr; }
  /// Set the learning rate for the following steps; must be >= 0.
  void set_lr(double lr);
  /// The hyperparameters in use.
  const Options& options() const { return options_; }
  /// Bytes of optimizer state (the momentum buffers, once created).
  std::size_t state_bytes() const;
  /// The momentum buffers, one per parameter, each its values flattened
  /// (1 × numel); empty before the first step or without momentum.
  const std::vector<MatrixF>& momentum_buffers() const { return momentum_; }
  /// Continue from saved buffers (momentum_buffers() of an SGD over the
  /// same parameters): empty, or one per parameter with its number of
  /// elements (any shape; kept flattened). Checked before anything is
  /// assigned: std::invalid_argument naming the parameter otherwise, and for
  /// buffers given to an SGD without momentum.
  void set_momentum_buffers(std::vector<MatrixF> buffers);

 private:
  Options options_;
  std::vector<MatrixF> momentum_;  // empty until the first step with μ ≠ 0
};

}  // namespace mpt
