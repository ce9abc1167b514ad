// Chapter 02 — loss scaling and FP32 master weights: the AVX2 loops of the
// fused unscale-and-check (src/mpt/amp/unscale_avx2.cpp) against the
// definition written out in the test, the same checks the portable path
// passes in test_ch02_unscale.cpp. Without AVX2 this program exits 77
// (CTest: Skipped): there is nothing to compare, and nothing passed.
// Depends on: mpt/amp/unscale.hpp, unscale_checks.hpp, avx2_test_main.hpp.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "avx2_test_main.hpp"
#include "mpt/amp/unscale.hpp"
#include "unscale_checks.hpp"

using mpt::Implementation;

TEST_CASE("AVX2 unscale-and-check: x * inv_scale, flagged when x is not finite, bit for bit") {
  unscale_checks::check_against_definition(Implementation::avx2);
}

TEST_CASE("AVX2 unscale-and-check: the flag sees one inf or NaN wherever it sits") {
  unscale_checks::check_flag_positions(Implementation::avx2);
}

TEST_CASE(
    "AVX2 unscale-and-check: finite extremes and finite inputs with infinite products are not flagged") {
  unscale_checks::check_extremes_and_product_overflow(Implementation::avx2);
}

TEST_CASE("AVX2 unscale-and-check: inv_scale 1 leaves the data untouched, signalling NaNs too") {
  unscale_checks::check_inv_one_untouched(Implementation::avx2);
}

TEST_CASE("AVX2 multi-tensor unscale-and-check: every tensor unscaled, one flag for the list") {
  unscale_checks::check_multi_tensor(Implementation::avx2);
}

TEST_CASE("AVX2 two-pass baseline: same bits and flag as the fused pass for scales >= 1") {
  unscale_checks::check_two_pass(Implementation::avx2);
}

TEST_CASE("AVX2 any_nonfinite: blocks, early exit and tails agree with std::isfinite") {
  unscale_checks::check_any_nonfinite(Implementation::avx2);
}

int main(int argc, char** argv) { return mpt_test::avx2_test_main(argc, argv); }
