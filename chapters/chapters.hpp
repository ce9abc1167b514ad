// All chapters — the registration functions that fill the pitfall registry.
// Depends on: mpt/pitfall.hpp.
//
// Each chapter folder defines one function here (in NN-topic/pitfalls/
// register.cpp); chapters/registry.cpp calls them in chapter order. Registration is explicit because a static
// library drops object files nobody references, taking self-registering statics with them.
#pragma once

#include "mpt/registry/pitfall.hpp"

namespace mpt {

/// Chapter 01 (floating-point formats): overflow, lost updates, stagnating
/// sums, gradient underflow, fp16 against bf16.
void register_chapter01_pitfalls(Registry& registry);

/// Chapter 02 (loss scaling and FP32 master weights): no loss scaling, a
/// static scale that overflows, update() forgotten, clipping before unscale,
/// unscaling during gradient accumulation, fp16 weights without masters, the
/// iterations skipped from the initial scale, Adam's eps in fp16.
void register_chapter02_pitfalls(Registry& registry);

/// Chapter 03 (BatchNorm and LayerNorm with FP32 statistics): the variance
/// as E[x²] − E[x]² in fp16 and its cancellation in FP32, a LayerNorm row
/// accumulated in fp16, running estimates in fp16, eps in fp16, running
/// statistics folded in during a skipped step.
void register_chapter03_pitfalls(Registry& registry);

/// Chapter 04 (numerically stable softmax, cross-entropy and attention): a
/// softmax in fp16 without the max subtraction, the log of a stored softmax,
/// a loss summed in fp16, additive masks in fp16, Q Kᵀ stored before the
/// scale, a softmax with autocast disabled.
void register_chapter04_pitfalls(Registry& registry);

/// Chapter 05 (loss scaling across ranks): an fp16 all-reduce that sums
/// before dividing, a sharded optimizer without a shared found-inf verdict,
/// the scaler's state restored on one rank, gradients summed instead of
/// averaged, accumulation without no_sync(), BatchNorm buffers per rank,
/// ranks that disagree on skipping.
void register_chapter05_pitfalls(Registry& registry);

/// Chapter 6 (06-precision-policies/pitfalls/register.cpp): a policy by name
/// substring, binary_cross_entropy on fp16 probabilities, a sum in a region
/// where autocast is off, the CPU autocast list taken for the CUDA one.
void register_chapter06_pitfalls(Registry& registry);

/// Chapter 7 (07-fp8/pitfalls/register.cpp), the pitfalls of the fp8 tier
/// alone: FP8 without a scale, a spike under delayed scaling, an amax
/// history too long and too short, one outlier under a per-tensor scale,
/// saturation that hides an overflow, E4M3's max (240, 448, 480).
void register_chapter07_pitfalls(Registry& registry);

}  // namespace mpt
