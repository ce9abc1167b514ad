// Chapter 02 exercises — an EXAMPLE of an instructor's hidden test file
// (see INSTRUCTORS.md). Depends on: grader.hpp. Real hidden tests live
// outside the repository, in the folder named by MPT_EX02_HIDDEN_TESTS;
// this one only proves the mechanism for this chapter in CI and is never
// shipped.
#include <vector>

#include "grader.hpp"

using namespace mpt::ex02;
using namespace mpt::ex02::grading;

// A test case counts for the exercise whose suite it is in, with that
// exercise's points per test case (two for 2.1), unless its name ends
// with its own, "[N points]".
TEST_SUITE("exercise-2.1") {
  TEST_CASE("hidden: 2.1 growth_factor 4 near the top: grows once, then stays") {
    ScalerConfig c;
    c.growth_factor = 4.0;
    c.growth_interval = 1;
    ScaleState s{0x1p124f, 0};
    s = student_update(s, false, c);
    CHECK(s.scale == 0x1p126f);
    s = student_update(s, false, c);
    CHECK(s.scale == 0x1p126f);  // 2^128 is not a float
    CHECK(s.tracker == 0);
  }
}  // TEST_SUITE
