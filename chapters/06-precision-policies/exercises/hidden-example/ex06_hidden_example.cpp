// Chapter 06 — exercises: an EXAMPLE of an instructor's hidden test file (see INSTRUCTORS.md).
// Depends on: grader.hpp. Real hidden tests live outside the repository, in
// the folder named by MPT_EX06_HIDDEN_TESTS; this one only proves the
// mechanism for this chapter in CI and is never shipped.
#include <string>
#include <vector>

#include "grader.hpp"

using namespace mpt::ex06;
using namespace mpt::ex06::grading;

// A test case counts for the exercise whose suite it is in, with that
// exercise's points per test case (two for 6.1), unless its name ends with
// its own, "[N points]".
TEST_SUITE("exercise-6.1") {
  TEST_CASE("hidden: 6.1 a rule for conv1 leaves conv10 and conv1x alone") {
    const LayerPolicy p = parse_layer_policy("bf16+conv1=f32");
    CHECK(layer_dtype(p, "conv1") == mpt::DType::f32);
    CHECK(layer_dtype(p, "conv1.bn") == mpt::DType::f32);
    CHECK(layer_dtype(p, "conv10") == mpt::DType::bf16);
    CHECK(layer_dtype(p, "conv1x") == mpt::DType::bf16);
  }
}  // TEST_SUITE
