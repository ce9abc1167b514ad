// Chapter 02 — loss scaling and FP32 master weights: the MLP.
// Depends on: model.hpp (Model, a Sequential with its Context), linear.hpp,
// activations.hpp, parameter.hpp; the core tier (policy.hpp, context.hpp,
// random.hpp).
//
// A multilayer perceptron Linear → activation → … → Linear, built as a
// Model with named children (fc1, relu1, fc2, ..., fcL). Like every Model it
// owns its Context: the Policy its ops ask (uniform in MlpConfig::dtype unless a
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
#include "mpt/nn/model.hpp"
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
class Mlp final : public Model {
 public:
  /// Build and initialise; throws std::invalid_argument on fewer than two
  /// sizes or a size below 1.
  explicit Mlp(MlpConfig config);
  Mlp(Mlp&&) = default;             ///< moves keep the parameters' addresses (the layers live on the heap)
  Mlp& operator=(Mlp&&) = default;  ///< moves keep the parameters' addresses

  // forward(const MatrixF&) takes x [B, inputs] and returns the logits
  // [B, outputs]; backward(dlogits), refresh_model_copies(),
  // activation_bytes() (each Linear's input, each GELU's input, the logits),
  // activation_gradients() (dlogits, then per hidden layer d(activation
  // output) and d(pre-activation)), context() and set_policy() are Model's.

  /// The configuration it was built from.
  const MlpConfig& config() const { return config_; }
  /// Number of Linear layers.
  std::size_t num_layers() const { return config_.sizes.size() - 1; }

 private:
  MlpConfig config_;
};

// trace_step(), the traced training step of any Model, is declared in model.hpp.

}  // namespace mpt
