// Chapters 02 onwards — a trainable network: a Sequential that owns the
// Context its ops run in. Chapter 2's Mlp and Chapter 3's Cnn are models, and
// a chapter may assemble its own from any layers (emplace, then finish()).
// Depends on: module.hpp (Sequential), parameter.hpp (MasterWeights,
// RefreshStats); the core tier (context.hpp, policy.hpp, tensor.hpp).
//
// A Model owns its Context: the Policy its ops ask, the count of the casts
// they make, and the trace when one is attached. forward() hands the FP32
// batch to the first layer (each op casts it to the dtype it reads, as
// autocast casts a layer's input) and keeps what backward() needs;
// backward() takes the (possibly loss-scaled) gradient of the output and adds
// each parameter's FP32 gradient into Parameter::grad.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/nn/module.hpp"
#include "mpt/nn/parameter.hpp"

namespace mpt {

/// A Sequential with its own Context. Build it by adding children, then call
/// finish() (or set_policy()) once: that gives every parameter its model copy.
class Model : public Sequential {
 public:
  /// An empty model named `name` in its messages ("Mlp", "Cnn") whose ops
  /// will ask `policy` (nullptr: uniform f32). `inputs` is the number of
  /// features a row of forward()'s batch must have (0: any);
  /// `master_weights` as for Parameter::refresh.
  Model(std::string name, std::shared_ptr<const Policy> policy, Eigen::Index inputs = 0,
        MasterWeights master_weights = MasterWeights::fp32);
  Model(Model&&) = default;  ///< moves keep the parameters' addresses (the layers live on the heap)
  Model& operator=(Model&&) = default;  ///< moves keep the parameters' addresses

  using Sequential::backward;
  using Sequential::forward;

  /// Give every parameter its model copy under the model's policy and keep
  /// the gradients between layers (activation_gradients()); call once, after
  /// the last add().
  void finish();
  /// x [B, inputs] (FP32) → the last layer's output, in its op's output
  /// dtype. Runs in context(). The returned reference is valid until the next
  /// forward(). Throws std::invalid_argument for a wrong number of columns.
  const Tensor& forward(const MatrixF& x);
  /// dout: the gradient of the (scaled) loss with respect to the output of
  /// the last forward(), cast to the output's dtype if it arrives in another.
  /// Throws std::logic_error without a preceding forward(),
  /// std::invalid_argument for a wrong shape.
  void backward(const Tensor& dout);
  /// After an optimizer step: round each master into its model copy (in
  /// MasterWeights::none mode also write the rounded weights back into the
  /// masters). Returns what changed.
  RefreshStats refresh_model_copies();
  /// Bytes of the buffers the last forward() kept for backward, and its
  /// output, each buffer once: what is allocated.
  std::size_t activation_bytes() const;
  /// The gradients that flowed between layers in the last backward(), each
  /// in its tensor's dtype, from the last layer's output down to the first
  /// layer's. Kept for inspection; not counted in activation_bytes().
  const std::vector<Tensor>& activation_gradients() const { return output_gradients(); }
  /// The Context forward()/backward() run in: its policy, its cast count;
  /// attach a Trace with context().set_trace().
  Context& context() { return ctx_; }
  /// Ask `policy` from now on: the parameters' model copies are remade in the
  /// dtypes it gives them (the masters are unchanged, except in
  /// MasterWeights::none mode, where the weights are the rounded copy).
  void set_policy(std::shared_ptr<const Policy> policy);
  /// See the constructor.
  MasterWeights master_weights() const { return master_weights_; }
  /// Chapter 6: keep FP32 masters or not from now on (a preset without
  /// master weights: apex O3, jmp with params in f16). Switching to none
  /// makes the weights the rounded copy, as the constructor would have.
  void set_master_weights(MasterWeights m);

 private:
  std::string name_;
  Context ctx_;
  Eigen::Index inputs_ = 0;
  MasterWeights master_weights_ = MasterWeights::fp32;
  Tensor out_;
  bool have_forward_ = false;
};

/// One training step's forward, cross-entropy loss and (unless
/// forward_only) backward of `net` on (x, labels), recorded: a Trace of
/// every op and every cast, in the order they ran, with the net's policy.
/// The gradients are added into the parameters' grads as in any step.
Trace trace_step(Model& net, const MatrixF& x, const std::vector<int>& labels, bool forward_only = false);

}  // namespace mpt
