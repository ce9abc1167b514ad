// All chapters — the registration functions that fill the pitfall registry.
// Depends on: mpt/pitfall.hpp.
//
// Each chapter folder defines one function here; chapters/registry.cpp calls
// them in chapter order. Registration is explicit because a static library
// drops object files nobody references, taking self-registering statics
// with them.
#pragma once

#include "mpt/pitfall.hpp"

namespace mpt {

/// Chapter 01 (floating-point formats): overflow, lost updates, stagnating
/// sums, gradient underflow, fp16 against bf16.
void register_chapter01_pitfalls(Registry& registry);

}  // namespace mpt
