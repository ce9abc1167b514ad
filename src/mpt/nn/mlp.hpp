// Chapter 02 — loss scaling and FP32 master weights: the MLP.
// Depends on: module.hpp (Sequential), linear.hpp, activations.hpp,
// parameter.hpp; the core tier (policy.hpp, context.hpp, random.hpp).
//
// A multilayer perceptron Linear → activation → … → Linear, built as a
// Sequential with named children (fc1, relu1, fc2, ..., fcL). It owns its
// Context: the Policy its ops ask (uniform in MlpConfig::dtype unless a
// policy is given), the count of the casts they make, and the trace when
// one is attached. forward() keeps what backward() needs; backward() takes
// the (possibly loss-scaled) gradient of the logits and adds each weight's
// FP32 gradient into Parameter::grad.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/nn/module.hpp"
#include "mpt/nn/parameter.hpp"

namespace mpt {

/// The nonlinearity between Linear layers.
enum class Activation : std::uint8_t {
  relu,       ///< max(x, 0)
  gelu,       ///< exact GELU with erf (PyTorch's nn.GELU() default)
  gelu_tanh,  ///< tanh-approximated GELU (nn.GELU(approximate='tanh'))
};

/// What an Mlp is built from.
struct MlpConfig {
  std::vector<int> sizes;                              ///< {inputs, hidden..., outputs}; at least 2 entries
  Activation activation = Activation::relu;            ///< between Linear layers
  DType dtype = DType::f32;                            ///< the uniform policy's dtype (Chapter 2's runs)
  MasterWeights master_weights = MasterWeights::fp32;  ///< see MasterWeights
  std::uint64_t seed = 0;                              ///< initialisation
  /// Start the last Linear at zero (weights and bias), so the output starts
  /// at exactly 0 — a common choice for regression heads, and what a set
  /// with tiny targets needs to start at the targets' scale. Default: the
  /// PyTorch initialisation for every layer.
  bool zero_init_output = false;
  /// When set, the policy every op asks instead of UniformPolicy(dtype).
  std::shared_ptr<const Policy> policy;
};

/// Linear layers fc1..fcL (weights "fc{i}.weight" [out, in], biases
/// "fc{i}.bias" [out]), initialised as PyTorch's nn.Linear does (uniform in
/// ±1/√in, from Rng(seed); see MlpConfig::zero_init_output), with the
/// activation (relu{i} or gelu{i}) after every Linear but the last.
class Mlp final : public Sequential {
 public:
  /// Build and initialise; throws std::invalid_argument on fewer than two
  /// sizes or a size below 1.
  explicit Mlp(MlpConfig config);
  Mlp(Mlp&&) = default;             ///< moves keep the parameters' addresses (the layers live on the heap)
  Mlp& operator=(Mlp&&) = default;  ///< moves keep the parameters' addresses

  using Sequential::backward;
  using Sequential::forward;

  /// x [B, inputs] (FP32; each op casts it to the dtype it reads, as
  /// autocast casts a Linear's input) → logits [B, outputs] in the last
  /// op's output dtype. Runs in context(). Keeps what backward() needs; the
  /// returned reference is valid until the next forward().
  const Tensor& forward(const MatrixF& x);

  /// dlogits [B, outputs]: the gradient of the (scaled) loss with respect to
  /// the logits of the last forward(); cast to the logits' dtype if it
  /// arrives in another (autograd casts a gradient to its tensor's dtype).
  /// Adds every weight's gradient into its Parameter::grad (FP32; still
  /// scaled if the loss was). Throws std::logic_error without a preceding
  /// forward(), std::invalid_argument for a wrong shape.
  void backward(const Tensor& dlogits);

  /// After an optimizer step: round each master into the model copy; in
  /// MasterWeights::none mode also write the rounded weights back into the
  /// masters. Returns what changed.
  RefreshStats refresh_model_copies();

  /// Bytes of the activation buffers the last forward() kept for backward
  /// (each Linear's input, each GELU's input, the logits), each buffer once:
  /// what is allocated — half of f32's in f16/bf16.
  std::size_t activation_bytes() const;

  /// The gradients that flowed between layers in the last backward(), each
  /// in its tensor's dtype, from the logits down to fc1's output: dlogits,
  /// then per hidden layer d(activation output) and d(pre-activation).
  /// Kept for inspection — histograms of gradient magnitudes, fractions
  /// flushed to zero; not counted in activation_bytes().
  const std::vector<Tensor>& activation_gradients() const { return output_gradients(); }

  /// The configuration it was built from.
  const MlpConfig& config() const { return config_; }
  /// Number of Linear layers.
  std::size_t num_layers() const { return config_.sizes.size() - 1; }
  /// The Context forward()/backward() run in: its policy, its cast count,
  /// attach a Trace with context().set_trace().
  Context& context() { return ctx_; }
  /// Ask `policy` from now on: the parameters' model copies are remade in
  /// the dtypes it gives them (the masters are unchanged).
  void set_policy(std::shared_ptr<const Policy> policy);

 private:
  MlpConfig config_;
  Context ctx_;
  Tensor logits_;
  bool have_forward_ = false;
};

/// One training step's forward, cross-entropy loss and (unless
/// forward_only) backward of `net` on (x, labels), recorded: a Trace of
/// every op and every cast, in the order they ran, with the net's policy.
/// The gradients are added into the parameters' grads as in any step.
Trace trace_step(Mlp& net, const MatrixF& x, const std::vector<int>& labels, bool forward_only = false);

}  // namespace mpt
