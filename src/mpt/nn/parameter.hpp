// Chapter 02 — loss scaling and FP32 master weights.
// Depends on: Eigen, format.hpp.
//
// A trainable parameter as mixed precision keeps it: the FP32 master copy
// the optimizer updates, the low-precision model copy that forward and
// backward read (2 bytes an element for fp16/bf16, really allocated), and
// the FP32 gradient the optimizer and the GradScaler work on.
#pragma once

#include <string>
#include <vector>

#include <Eigen/Core>

#include "mpt/formats/format.hpp"

namespace mpt {

/// Row-major FP32 matrix (4 bytes an element): master weights, gradients.
using MatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// Row-major fp16 matrix (2 bytes an element, Eigen::half).
using MatrixH = Eigen::Matrix<Eigen::half, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// Row-major bf16 matrix (2 bytes an element, Eigen::bfloat16).
using MatrixB = Eigen::Matrix<Eigen::bfloat16, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// One trainable tensor. `master` is the truth; `refresh_model_copy()`
/// rounds it into the model copy after each optimizer step.
struct Parameter {
  std::string name;  ///< e.g. "fc1.weight"
  MatrixF master;    ///< FP32 master weights (what the optimizer updates)
  MatrixF grad;      ///< FP32 gradient (scaled until GradScaler::unscale)
  // The model copy that forward/backward read, in the run's compute format.
  // Exactly one of these is non-empty unless the run is pure FP32 (then
  // forward reads `master` directly).
  MatrixH model_fp16;  ///< 2 bytes an element
  MatrixB model_bf16;  ///< 2 bytes an element
};

/// The optimizer interface the GradScaler drives (PyTorch's optimizer.step()).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Update every parameter's master weights from its grad.
  virtual void step() = 0;
  /// Set every grad to zero.
  void zero_grad() {
    for (Parameter* p : params_) p->grad.setZero();
  }
  /// The parameters this optimizer updates (GradScaler::unscale walks these grads).
  const std::vector<Parameter*>& params() const { return params_; }

 protected:
  /// Subclasses hand over the parameters they update.
  explicit Optimizer(std::vector<Parameter*> params) : params_(std::move(params)) {}
  std::vector<Parameter*> params_;  ///< not owned; the model owns its parameters
};

}  // namespace mpt
