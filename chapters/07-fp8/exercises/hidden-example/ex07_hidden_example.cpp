// Chapter 07 — exercises: an EXAMPLE of an instructor's hidden test file (see INSTRUCTORS.md).
// Depends on: grader.hpp. Real hidden tests live outside the repository, in
// the folder named by MPT_EX07_HIDDEN_TESTS; this one only proves the
// mechanism for this chapter in CI and is never shipped.
#include <vector>

#include "grader.hpp"

using namespace mpt::ex07;
using namespace mpt::ex07::grading;

// A test case counts for the exercise whose suite it is in, with that
// exercise's points per test case (two for 7.2), unless its name ends with
// its own, "[N points]".
TEST_SUITE("exercise-7.2") {
  TEST_CASE("hidden: 7.2 an amax of 448 is 2^8 x 1.75: FLOOR says 2^0, and so does RCEIL") {
    CHECK(e8m0_scale(448.0f, mpt::DType::e4m3, MxScaleRule::floor) == 127);
    CHECK(e8m0_scale(448.0f, mpt::DType::e4m3, MxScaleRule::rceil) == 127);
    CHECK(e8m0_scale(449.0f, mpt::DType::e4m3, MxScaleRule::rceil) == 128);
  }
}  // TEST_SUITE
