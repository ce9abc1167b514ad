// Chapter 02 — loss scaling and FP32 master weights: the fused
// unscale-and-check on the CPU (src/mpt/amp/unscale.*), portable and
// automatic paths, against the definition written out in the test.
// Depends on: mpt/amp/unscale.hpp, unscale_checks.hpp (the checks, with the
// expected values computed as x * inv_scale and std::isfinite(x)). The
// AVX2 path runs the same checks in test_ch02_unscale_avx2.cpp, which
// reports Skipped on a CPU without AVX2.
#include <doctest/doctest.h>

#include <stdexcept>

#include "mpt/amp/unscale.hpp"
#include "unscale_checks.hpp"

using mpt::Implementation;

namespace {
// The portable loop, and whatever the automatic choice runs on this CPU.
const Implementation kImplementations[] = {Implementation::portable, Implementation::automatic};
}  // namespace

TEST_CASE("fused unscale-and-check: x * inv_scale, flagged when x is not finite, bit for bit") {
  for (Implementation impl : kImplementations) unscale_checks::check_against_definition(impl);
}

TEST_CASE("fused unscale-and-check: the flag sees one inf or NaN wherever it sits") {
  for (Implementation impl : kImplementations) unscale_checks::check_flag_positions(impl);
}

TEST_CASE(
    "fused unscale-and-check: finite extremes and finite inputs with infinite products are not flagged") {
  for (Implementation impl : kImplementations) unscale_checks::check_extremes_and_product_overflow(impl);
}

TEST_CASE("fused unscale-and-check: inv_scale 1 leaves the data untouched, signalling NaNs too") {
  for (Implementation impl : kImplementations) unscale_checks::check_inv_one_untouched(impl);
}

TEST_CASE("multi-tensor unscale-and-check: every tensor unscaled, one flag for the list") {
  for (Implementation impl : kImplementations) unscale_checks::check_multi_tensor(impl);
}

TEST_CASE("two-pass baseline: same bits and flag as the fused pass for scales >= 1") {
  for (Implementation impl : kImplementations) unscale_checks::check_two_pass(impl);
}

TEST_CASE("any_nonfinite: blocks, early exit and tails agree with std::isfinite") {
  for (Implementation impl : kImplementations) unscale_checks::check_any_nonfinite(impl);
}

TEST_CASE("asking for AVX2 where there is none is a clear error") {
  float x = 1.0f;
  if (mpt::avx2_available()) {
    CHECK_NOTHROW(mpt::unscale_and_check(&x, 1, 0.5f, Implementation::avx2));
    CHECK(x == 0.5f);
  } else {
    CHECK_THROWS_AS(mpt::unscale_and_check(&x, 1, 0.5f, Implementation::avx2), std::invalid_argument);
    CHECK(x == 1.0f);
  }
}
