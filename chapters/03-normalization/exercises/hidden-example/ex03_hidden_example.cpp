// Chapter 03 — exercises: an EXAMPLE of an instructor's hidden test file (see INSTRUCTORS.md).
// Depends on: grader.hpp. Real hidden tests live outside the repository, in
// the folder named by MPT_EX03_HIDDEN_TESTS; this one only proves the
// mechanism for this chapter in CI and is never shipped.
#include "grader.hpp"

using namespace mpt::ex03;
using namespace mpt::ex03::grading;

// A test case counts for the exercise whose suite it is in, with that
// exercise's points per test case (two for 3.1), unless its name ends with
// its own, "[N points]".
TEST_SUITE("exercise-3.1") {
  TEST_CASE("hidden: 3.1 merging is symmetric: the union of b and a is the union of a and b") {
    const Stats a{6, 2.5f, 17.5f}, b{4, 10.0f, 5.0f};  // {0..5} and {8.5, 9.5, 10.5, 11.5}
    const Stats ab = merge_statistics(a, b), ba = merge_statistics(b, a);
    CHECK(ab.count == 10);
    CHECK(ba.count == 10);
    CHECK(ab.mean == doctest::Approx(5.5).epsilon(1e-6));
    CHECK(ba.mean == doctest::Approx(5.5).epsilon(1e-6));
    CHECK(ab.m2 == doctest::Approx(157.5).epsilon(1e-6));  // 17.5 + 5 + 7.5² · 6 · 4 / 10
    CHECK(ba.m2 == doctest::Approx(157.5).epsilon(1e-6));
  }
}  // TEST_SUITE
