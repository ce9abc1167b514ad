// Chapter 01 exercises — trivial stub "return a constant", each constant a
// plausible one: a grader that gave it full marks for any exercise would be
// broken. Depends on: ex01.hpp. CI requires a score below full marks on
// every exercise.
#include "ex01.hpp"

namespace mpt::ex01 {

// The code of 1.0, the most common fp16 value in a freshly initialised net.
std::uint16_t fp32_to_fp16_bits(float) { return 0x3c00; }

// epsilon/2 = 2^-11, the half gap at 1.0: the textbook answer for w = 1
// (but not quite right even there).
float smallest_effective_update(float) { return 0x1p-11f; }

double flushed_fraction(const float*, std::size_t, const mpt::Format&) { return 0.5; }

// 1: the mean square of activations a normalisation layer has just normalised.
float mean_square(const float*, std::size_t) { return 1.0f; }

}  // namespace mpt::ex01
