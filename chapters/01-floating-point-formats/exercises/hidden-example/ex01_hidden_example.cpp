// Chapter 01 exercises — an EXAMPLE of an instructor's hidden test file
// (see INSTRUCTORS.md). Depends on: grader.hpp. Real hidden tests live
// outside the repository, in the folder named by MPT_EX01_HIDDEN_TESTS;
// this one only proves the mechanism in CI and is never shipped.
#include <cstdint>
#include <random>
#include <vector>

#include "grader.hpp"

using namespace mpt::ex01;
using namespace mpt::ex01::grading;

// A test case counts for the exercise whose suite it is in, with that
// exercise's points per test case (two for 1.2 and 1.3), unless its name
// ends with its own, "[N points]".
TEST_SUITE("exercise-1.2") {
  TEST_CASE("hidden: 1.2 learning-rate-sized updates on weights near 2048") {
    // The spacing doubles at 2048; check the weights on both sides.
    for (std::uint32_t code = 0x67f0u; code <= 0x6810u; ++code) {
      const float w = fp16_value(code);
      const float u = smallest_effective_update(w);
      CHECK(update_changes(w, u));
      CHECK_FALSE(update_changes(w, std::nextafter(u, 0.0f)));
    }
  }
}  // TEST_SUITE

TEST_SUITE("exercise-1.3") {
  TEST_CASE("hidden: 1.3 bf16 keeps gradients that fp16 flushes") {
    std::mt19937 rng(7u);
    std::vector<float> g(4096);
    // magnitudes 2^-40 ... 2^-20: many flush in fp16, none in bf16
    for (float& v : g)
      v = std::ldexp(1.0f + static_cast<float>(rng() % 1024u) / 1024.0f, -40 + static_cast<int>(rng() % 20u));
    const double fp16_fraction = flushed_fraction(g.data(), g.size(), mpt::format_named("fp16"));
    const double bf16_fraction = flushed_fraction(g.data(), g.size(), mpt::format_named("bf16"));
    CHECK(fp16_fraction > 0.5);
    CHECK(bf16_fraction == 0.0);
  }
}  // TEST_SUITE
