// Chapter 02 — loss scaling and FP32 master weights: the Optimizer interface.
// Depends on: the nn tier (parameter.hpp).
//
// What the GradScaler drives (PyTorch's optimizer.step()): an optimizer
// holds pointers to the parameters it updates — the model owns them — and
// updates their FP32 masters from their FP32 gradients.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mpt/nn/parameter.hpp"

namespace mpt {

/// The optimizer interface.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Update every parameter's master weights from its grad.
  virtual void step() = 0;
  /// Set every grad to zero (virtual: Chapter 5's sharded optimizer steps a
  /// shard but zeroes every gradient the model accumulates into).
  virtual void zero_grad() {
    for (Parameter* p : params_) p->grad.fill_zero();
  }
  /// The parameters this optimizer updates (GradScaler::unscale walks these grads).
  const std::vector<Parameter*>& params() const { return params_; }

 protected:
  /// Subclasses hand over the parameters they update.
  explicit Optimizer(std::vector<Parameter*> params) : params_(std::move(params)) {}
  /// Throws std::invalid_argument unless p's grad has its master's shape.
  static void check_grad_shape(const Parameter& p);
  std::vector<Parameter*> params_;  ///< not owned; the model owns its parameters
};

namespace detail {
/// A hyperparameter as PyTorch's messages print it (Python's repr; the
/// shortest %g-style text is close enough).
std::string option_text(double v);
/// Throws std::invalid_argument(message) unless ok: the optimizers' checks.
void require_option(bool ok, const std::string& message);
}  // namespace detail

}  // namespace mpt
