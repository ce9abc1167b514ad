// Chapters 01 onwards — main() of the CPU test executables that compare the
// AVX2 loops (test_chNN_*_avx2.cpp): on a CPU or build without the AVX2 path
// they print why and exit 77, which CTest reports as Skipped, never as
// Passed. Include after defining DOCTEST_CONFIG_IMPLEMENT.
// Depends on: doctest, mpt/formats/rounding.hpp (avx2_available).
#pragma once

#include <doctest/doctest.h>

#include <cstdio>

#include "mpt/formats/rounding.hpp"

namespace mpt_test {

/// main() for an AVX2 comparison: exit 77 without AVX2, else run doctest.
inline int avx2_test_main(int argc, char** argv) {
  if (!mpt::avx2_available()) {
    std::printf("SKIPPED %s: this CPU or build has no AVX2/F16C/FMA path to compare\n",
                argc > 0 ? argv[0] : "avx2 test");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}

}  // namespace mpt_test
