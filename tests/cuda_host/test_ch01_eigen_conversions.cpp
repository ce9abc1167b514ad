// Chapter 01 — floating-point formats and their limits: mpt's rounding to
// fp16 and bf16 against Eigen's (Eigen::half, Eigen::bfloat16), bit for bit
// on the same sweep of inputs the CUDA comparison uses, NaNs included
// (Eigen, like mpt, keeps the sign and returns the canonical quiet NaN).
// Eigen is always there, so this runs in every configuration; CUDA's host
// conversions are the second reference, in
// test_ch01_cuda_host_conversions.cpp, where CUDA's headers are found.
// Depends on: mpt (rounding.hpp, format.hpp), Eigen, conversion_sweep.hpp.
#include <doctest/doctest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <vector>

#include "conversion_sweep.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/formats/rounding.hpp"

using mpt::test::bits16;
using mpt::test::compare;
using mpt::test::mpt_codes;
using mpt::test::reference_codes;
using mpt::test::sweep_inputs;
using mpt::test::test_seed;

TEST_CASE("the sweep covers every fp16 and bf16 code and the tie points") {
  const std::vector<float>& in = sweep_inputs();
  MESSAGE("sweep: ", in.size(), " inputs, seed ", test_seed(),
          "; mpt round_array path: ", mpt::avx2_available() ? "avx2" : "portable");
  CHECK(in.size() > 8'000'000);
  // The boundary values the brief names are in there, both signs.
  for (float x : {65504.0f, std::nextafter(65520.0f, 0.0f), 65520.0f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 448.0f,
                  464.0f, 480.0f, 57344.0f, 61440.0f}) {
    CHECK(std::find(in.begin(), in.end(), x) != in.end());
    CHECK(std::find(in.begin(), in.end(), -x) != in.end());
  }
}

TEST_CASE("fp16: mpt == Eigen::half, bit for bit") {
  const mpt::Format& f = mpt::format_named("fp16");
  compare("fp16 vs Eigen::half", f.spec, mpt_codes(f, mpt::OverflowMode::infinity),
          reference_codes([](float x) { return bits16(Eigen::half(x)); }), true);
}

TEST_CASE("bf16: mpt == Eigen::bfloat16, bit for bit") {
  const mpt::Format& f = mpt::format_named("bf16");
  compare("bf16 vs Eigen::bfloat16", f.spec, mpt_codes(f, mpt::OverflowMode::infinity),
          reference_codes([](float x) { return bits16(Eigen::bfloat16(x)); }), true);
}
