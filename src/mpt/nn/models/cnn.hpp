// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: a small CNN for
// the 8×8 handwritten digits, with or without BatchNorm.
// Depends on: model.hpp (Model), conv.hpp, batch_norm.hpp, pooling.hpp,
// activations.hpp, linear.hpp; the core tier (policy.hpp, random.hpp).
//
// unflatten [B, 64] → [B, 1, 8, 8]
// conv1 3×3, padding 1 → bn1 → relu1 → pool1 2×2     [B, c1, 4, 4]
// conv2 3×3, padding 1 → bn2 → relu2 → pool2 2×2     [B, c2, 2, 2]
// flatten → fc                                        [B, classes]
// Without BatchNorm the convolutions keep their bias; with it they drop it
// (BatchNorm's β replaces it, as in torchvision's ResNets).
#pragma once

#include <cstdint>
#include <memory>

#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/nn/model.hpp"

namespace mpt {

/// What a Cnn is built from.
struct CnnConfig {
  int channels1 = 8;                     ///< conv1's output channels
  int channels2 = 16;                    ///< conv2's output channels
  int classes = 10;                      ///< fc's outputs
  bool batch_norm = true;                ///< bn1 and bn2 after the convolutions
  DType dtype = DType::f32;              ///< the uniform policy's dtype
  std::shared_ptr<const Policy> policy;  ///< when set, asked instead of UniformPolicy(dtype)
  std::uint64_t seed = 0;                ///< initialisation (PyTorch's, layer by layer, in order)
};

/// The digits CNN (see the file comment); forward() takes x [B, 64] (FP32
/// pixels, row by row) and returns the logits [B, classes].
class Cnn final : public Model {
 public:
  /// Build and initialise; throws std::invalid_argument for a channel or
  /// class count below 1.
  explicit Cnn(CnnConfig config);
  Cnn(Cnn&&) = default;             ///< moves keep the parameters' addresses
  Cnn& operator=(Cnn&&) = default;  ///< moves keep the parameters' addresses
  /// The configuration it was built from.
  const CnnConfig& config() const { return config_; }

 private:
  CnnConfig config_;
};

}  // namespace mpt
