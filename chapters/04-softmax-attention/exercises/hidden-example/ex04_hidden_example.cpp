// Chapter 04 — exercises: an EXAMPLE of an instructor's hidden test file (see INSTRUCTORS.md).
// Depends on: grader.hpp. Real hidden tests live outside the repository, in
// the folder named by MPT_EX04_HIDDEN_TESTS; this one only proves the
// mechanism for this chapter in CI and is never shipped.
#include <cmath>

#include "grader.hpp"

using namespace mpt::ex04;
using namespace mpt::ex04::grading;

// A test case counts for the exercise whose suite it is in, with that
// exercise's points per test case (two for 4.1), unless its name ends with
// its own, "[N points]".
TEST_SUITE("exercise-4.1") {
  TEST_CASE("hidden: 4.1 shifting every logit by c shifts the log-sum-exp by c") {
    const float row[] = {0.5f, -1.0f, 2.0f, 0.0f};
    const float shifted[] = {1000.5f, 999.0f, 1002.0f, 1000.0f};  // each + 1000, exactly
    const float a = stable_log_sum_exp(row, 4), b = stable_log_sum_exp(shifted, 4);
    CHECK(a == doctest::Approx(2.34234958).epsilon(1e-6));  // 2 + log(1 + e^-1.5 + e^-3 + e^-2)
    CHECK(b - 1000.0f == doctest::Approx(a).epsilon(1e-4));
  }
}  // TEST_SUITE
