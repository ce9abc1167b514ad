// Chapter 04 — a tiny language model: the declaration of the pitfall
// naive-loss-training (defined in naive-loss-training.cpp).
// Depends on: mpt/core/pitfall.hpp (Pitfall).
#pragma once

#include "mpt/core/pitfall.hpp"

namespace mpt::ch04 {

/// The tiny Transformer trained in fp16 with the naive loss (an fp16 softmax
/// without the max subtracted, then its log) against the library's FP32
/// cross-entropy: the loss turns NaN, every step is skipped, the model stops
/// learning.
Pitfall naive_loss_training_pitfall();

}  // namespace mpt::ch04
