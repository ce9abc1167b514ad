// Chapter 01 — rounding float → format: the AVX2 path (rounding_avx2.cpp)
// held to the portable loop bit for bit, in every format and mode, the
// flush-to-zero threshold included. The portable loop is held to an
// independent oracle in test_ch01_rounding.cpp. Without AVX2 this program
// exits 77 (CTest: Skipped): there is nothing to compare, and nothing passed.
// Depends on: mpt/rounding.hpp, rounding_values.hpp (boundary_values),
// test_support.hpp (bits), avx2_test_main.hpp.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "avx2_test_main.hpp"
#include "mpt/formats/rounding.hpp"
#include "rounding_values.hpp"
#include "test_support.hpp"

using namespace mpt;
using mpt_test::bits;
using mpt_test::boundary_values;
using mpt_test::from_bits;

TEST_CASE("the AVX2 path gives the same bits as the portable loop") {
  std::vector<float> xs = boundary_values();
  std::mt19937 gen(99);
  for (int i = 0; i < 200000; ++i) xs.push_back(from_bits(gen()));
  for (int i = 0; i < 200000; ++i)
    xs.push_back(std::ldexp(static_cast<float>(gen()) / 4294967296.0f, static_cast<int>(gen() % 60) - 40));
  xs.push_back(1.0f);  // make the length odd so the tail path runs
  for (const Format& f : all_formats())
    for (RoundingMode mode :
         {RoundingMode::nearest_even, RoundingMode::toward_zero, RoundingMode::stochastic})
      for (OverflowMode ov : {OverflowMode::infinity, OverflowMode::saturate})
        for (SubnormalMode sub : {SubnormalMode::keep, SubnormalMode::flush}) {
          RoundingOptions o{mode, ov, sub, 42};
          std::vector<float> a(xs.size()), b(xs.size());
          round_array(xs.data(), a.data(), xs.size(), f, o, 0, Implementation::portable);
          round_array(xs.data(), b.data(), xs.size(), f, o, 0, Implementation::avx2);
          std::size_t bad = 0;
          for (std::size_t i = 0; i < xs.size(); ++i)
            if (bits(a[i]) != bits(b[i]) && bad++ < 3)
              MESSAGE(f.name << " mode " << int(mode) << " ov " << int(ov) << " sub " << int(sub) << ": x=0x"
                             << std::hex << bits(xs[i]) << " portable 0x" << bits(a[i]) << " avx2 0x"
                             << bits(b[i]) << std::dec);
          CHECK(bad == 0);
        }
}

TEST_CASE(
    "the AVX2 path with an index range straddling 2^32 (its scalar lanes) agrees with the portable loop") {
  RoundingOptions sr;
  sr.mode = RoundingMode::stochastic;
  sr.seed = 3;
  const std::uint64_t base = (1ull << 32) - 5;
  std::vector<float> v(16, 1.001f), a(16), b(16);
  round_array(v.data(), a.data(), 16, format_named("fp16"), sr, base, Implementation::portable);
  round_array(v.data(), b.data(), 16, format_named("fp16"), sr, base, Implementation::avx2);
  for (std::size_t i = 0; i < 16; ++i) CHECK(bits(a[i]) == bits(b[i]));
}

int main(int argc, char** argv) { return mpt_test::avx2_test_main(argc, argv); }
