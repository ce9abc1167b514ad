// Chapter 05 — exercises: an EXAMPLE of an instructor's hidden test file (see INSTRUCTORS.md).
// Depends on: grader.hpp. Real hidden tests live outside the repository, in
// the folder named by MPT_EX05_HIDDEN_TESTS; this one only proves the
// mechanism for this chapter in CI and is never shipped. Like every test of
// this grader it runs on every rank, and every rank must reach its checks.
#include <vector>

#include "grader.hpp"

using namespace mpt::ex05;
using namespace mpt::ex05::grading;

// A test case counts for the exercise whose suite it is in, with that
// exercise's points per test case (two for 5.1), unless its name ends with
// its own, "[N points]".
TEST_SUITE("exercise-5.1") {
  TEST_CASE("hidden: 5.1 equal gradients on every rank average to themselves") {
    std::vector<std::vector<float>> g{{0.75f, -3.0f}, {}, {1024.0f}};
    on_every_rank([&] { average_gradients(world(), g, mpt::DType::f32, 0); });
    const bool ok = g.size() == 3 && g[0] == std::vector<float>{0.75f, -3.0f} && g[1].empty() &&
                    g[2] == std::vector<float>{1024.0f};
    CHECK(everyone(ok));
  }
}  // TEST_SUITE
