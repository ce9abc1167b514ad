// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the digits CNN.
// Depends on: cnn.hpp, conv.hpp, batch_norm.hpp, pooling.hpp, activations.hpp,
// linear.hpp; the core tier (random.hpp).
#include "mpt/nn/models/cnn.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "mpt/core/random.hpp"
#include "mpt/nn/layers/activations.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/conv.hpp"
#include "mpt/nn/layers/linear.hpp"
#include "mpt/nn/layers/pooling.hpp"

namespace mpt {

namespace {

constexpr Eigen::Index kImage = 8;  // the digits are 8×8

const CnnConfig& checked(const CnnConfig& c) {
  if (c.channels1 < 1 || c.channels2 < 1 || c.classes < 1)
    throw std::invalid_argument("Cnn: channels1, channels2 and classes must be >= 1, got " +
                                std::to_string(c.channels1) + ", " + std::to_string(c.channels2) + ", " +
                                std::to_string(c.classes));
  return c;
}

}  // namespace

Cnn::Cnn(CnnConfig config)
    : Model("Cnn", checked(config).policy ? config.policy : uniform_policy(config.dtype), kImage * kImage),
      config_(std::move(config)) {
  Rng rng(config_.seed);
  const Conv2dOptions conv{1, 1, !config_.batch_norm};
  emplace<Unflatten>("unflatten", Shape{1, kImage, kImage});
  int in = 1, side = static_cast<int>(kImage);
  const int channels[2] = {config_.channels1, config_.channels2};
  for (int l = 0; l < 2; ++l) {
    const std::string i = std::to_string(l + 1);
    Conv2d& c = emplace<Conv2d>("conv" + i, in, channels[l], 3, rng, conv);
    if (l == 0) c.set_input_grad(false);  // the input is data: no dx
    if (config_.batch_norm) emplace<BatchNorm>("bn" + i, channels[l]);
    emplace<ReLU>("relu" + i);
    emplace<MaxPool2d>("pool" + i, 2);
    in = channels[l];
    side /= 2;
  }
  emplace<Flatten>("flatten");
  emplace<Linear>("fc", in * side * side, config_.classes, rng);
  finish();
}

}  // namespace mpt
