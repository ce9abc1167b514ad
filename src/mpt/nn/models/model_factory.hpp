// Chapters 04 onwards — the chapters' models by name (Chapter 2's MLP,
// Chapter 3's digits CNN, Chapter 4's tiny Transformer): the one place `mpt
// trace`, `mpt train` and `mpt policy show` build a model from.
// Depends on: model.hpp (Model), mlp.hpp (Activation), the core tier
// (Policy, DType). Later chapters add their models here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/nn/model.hpp"
#include "mpt/nn/models/mlp.hpp"

namespace mpt {

/// Which model, and what its constructor needs.
struct ModelSpec {
  std::string name = "mlp";                      ///< one of model_names()
  std::shared_ptr<const Policy> policy;          ///< what every op asks; nullptr: UniformPolicy(dtype)
  DType dtype = DType::f32;                      ///< the uniform policy's dtype when policy is nullptr
  std::uint64_t seed = 1;                        ///< the initialisation's seed
  std::vector<int> mlp_sizes{8, 32, 32, 4};      ///< mlp: {inputs, hidden..., outputs}
  Activation mlp_activation = Activation::relu;  ///< mlp: between its Linear layers
  int vocab_size = 0;                            ///< transformer: V, or 0 for TransformerConfig's default
};

/// The names make_model() knows, in chapter order: "mlp" (Chapter 2's
/// Mlp), "cnn" (Chapter 3's digits Cnn), "transformer" (Chapter 4's
/// TinyTransformer).
const std::vector<std::string>& model_names();

/// The model `spec` names, initialised from its seed. Throws
/// std::invalid_argument for an unknown name (naming the valid ones) and
/// whatever the model's constructor throws for a bad configuration.
std::unique_ptr<Model> make_model(const ModelSpec& spec);

}  // namespace mpt
