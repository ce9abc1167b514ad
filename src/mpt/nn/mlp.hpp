// Chapter 02 — loss scaling and FP32 master weights.
// Depends on: layers.hpp, gemm.hpp, parameter.hpp, data.hpp (Rng for the
// initialisation).
//
// A multilayer perceptron Linear → act → … → Linear that owns its
// Parameters and its activation buffers, in one run precision. forward()
// keeps what backward() needs, stored in the compute format; backward()
// takes the (possibly loss-scaled) gradient of the logits and adds each
// weight's FP32 gradient into Parameter::grad.
//
// Two weight modes, chosen explicitly: FP32 master weights with a rounded
// model copy (mixed precision as published), or no master at all (the
// pitfall: every update is rounded into the low-precision weights).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mpt/nn/gemm.hpp"
#include "mpt/nn/layers.hpp"
#include "mpt/nn/parameter.hpp"

namespace mpt {

/// The nonlinearity between Linear layers.
enum class Activation : std::uint8_t {
  relu,       ///< max(x, 0)
  gelu,       ///< exact GELU with erf (PyTorch's nn.GELU() default)
  gelu_tanh,  ///< tanh-approximated GELU (nn.GELU(approximate='tanh'))
};

/// Where the weights live between optimizer steps.
enum class MasterWeights : std::uint8_t {
  /// Mixed precision as published: the optimizer updates FP32 masters and
  /// refresh_model_copies() rounds them into the fp16/bf16 copy that
  /// forward and backward read. Updates smaller than the copy's ulp keep
  /// accumulating in the master.
  fp32,
  /// THE PITFALL "fp16 weights without FP32 master weights": the weights
  /// exist only in the run precision. The optimizer's arithmetic still runs
  /// in FP32, but refresh_model_copies() writes the rounded weights back
  /// into Parameter::master, so an update below half an ulp of the weight
  /// is lost for good. Same as fp32 for an fp32 run.
  none,
};

/// What an Mlp is built from.
struct MlpConfig {
  std::vector<int> sizes;                            ///< {inputs, hidden..., outputs}; at least 2 entries
  Activation activation = Activation::relu;          ///< between Linear layers
  Precision precision = Precision::fp32;             ///< activations, their gradients, model copies
  MasterWeights master_weights = MasterWeights::fp32;///< see MasterWeights
  std::uint64_t seed = 0;                            ///< initialisation
  /// Start the last Linear at zero (weights and bias), so the output starts
  /// at exactly 0 — a common choice for regression heads, and what a set
  /// with tiny targets needs to start at the targets' scale. Default: the
  /// PyTorch initialisation for every layer.
  bool zero_init_output = false;
};

/// What one refresh_model_copies() did to the weights forward() reads,
/// compared with what it read before the optimizer step.
struct RefreshStats {
  std::size_t elements = 0;  ///< parameter elements in the model
  std::size_t changed = 0;   ///< elements forward() will now read a new value for
  /// MasterWeights::none only: elements the optimizer moved whose weight
  /// rounded back to its old value — updates lost for good. Always 0 with
  /// FP32 masters, which keep such updates.
  std::size_t lost = 0;
};

/// Linear layers i = 0..L-1 named "fc{i+1}.weight" [out, in] and
/// "fc{i+1}.bias" [1, out], initialised as PyTorch's nn.Linear does
/// (uniform in ±1/√in, from Rng(seed); see MlpConfig::zero_init_output),
/// with the activation after every layer but the last.
class Mlp {
 public:
  /// Build and initialise; throws std::invalid_argument on fewer than two
  /// sizes or a size below 1.
  explicit Mlp(MlpConfig config);
  Mlp(const Mlp&) = delete;             ///< optimizers hold pointers to the parameters
  Mlp& operator=(const Mlp&) = delete;  ///< optimizers hold pointers to the parameters
  Mlp(Mlp&&) = default;                 ///< moves keep the parameters' addresses
  Mlp& operator=(Mlp&&) = default;      ///< moves keep the parameters' addresses

  /// x [B, inputs] (FP32, rounded into the run precision first, as
  /// autocast casts a Linear's input) → logits [B, outputs] stored in the
  /// run precision. Keeps the activations backward() needs; the returned
  /// reference is valid until the next forward().
  const Tensor& forward(const MatrixF& x);

  /// dlogits [B, outputs]: the gradient of the (scaled) loss with respect to
  /// the logits of the last forward(); rounded into the run precision if
  /// it arrives in another (autograd casts a gradient to its tensor's
  /// dtype). Adds every weight's gradient into its Parameter::grad (FP32;
  /// still scaled if the loss was). Throws std::logic_error without a
  /// preceding forward().
  void backward(const Tensor& dlogits);

  /// After an optimizer step: round each master into the model copy; in
  /// MasterWeights::none mode also write the rounded weights back into the
  /// masters. Returns what changed.
  RefreshStats refresh_model_copies();

  /// Bytes of the activation buffers the last forward() kept for backward
  /// (the input, each Linear's input, each GELU's input, the logits):
  /// Tensor::bytes() summed, i.e. what is allocated — half of fp32's in
  /// fp16/bf16.
  std::size_t activation_bytes() const;

  /// The gradients that flowed between layers in the last backward(), in
  /// the run precision, from the logits down to the first hidden layer's
  /// output (dlogits, then per hidden layer d(activation output) and
  /// d(pre-activation)). Kept for inspection — histograms of gradient
  /// magnitudes, fractions flushed to zero; not counted in activation_bytes().
  const std::vector<Tensor>& activation_gradients() const { return act_grads_; }

  /// Every parameter, in order fc1.weight, fc1.bias, fc2.weight, … (the
  /// pointers stay valid for the Mlp's lifetime; hand them to an optimizer).
  std::vector<Parameter*> parameters();
  /// The configuration it was built from.
  const MlpConfig& config() const { return config_; }
  /// Number of Linear layers.
  std::size_t num_layers() const { return params_.size() / 2; }

 private:
  MlpConfig config_;
  std::vector<Parameter> params_;   // weight, bias per layer; never resized after construction
  std::vector<Tensor> inputs_;      // [l]: the input of Linear l (x for l = 0)
  std::vector<Tensor> pre_act_;     // [l]: Linear l's output, kept when the activation needs it
  Tensor logits_;
  std::vector<Tensor> act_grads_;
  std::vector<MatrixF> seen_;       // per parameter: the weights as forward read them (for RefreshStats)
  bool have_forward_ = false;
};

}  // namespace mpt
