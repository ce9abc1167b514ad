// Chapter 07 — FP8 training: the AVX2 loops of quantize_raw.hpp
// (src/mpt/fp8/quantize_avx2.cpp, called by name: on an AVX-512 CPU
// quantize_into runs the wider ones) against the Fp8Tensor reference, bit for
// bit — the portable loops pass the same checks in
// test_ch07_quantize_raw.cpp, so the two paths agree with each other.
// Without AVX2 it exits 77 (CTest: Skipped).
// Depends on: fp8_raw_checks.hpp, avx2_test_main.hpp, doctest.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "avx2_test_main.hpp"
#include "fp8_raw_checks.hpp"

TEST_CASE("quantize_into, AVX2: quantize_with_scale's codes, amax and counts") {
  fp8_raw::check_per_tensor(fp8_raw::Path::avx2);
}

TEST_CASE("quantize_mx_into, AVX2: quantize_mx's codes, E8M0 codes, block amax and counts") {
  fp8_raw::check_mx(fp8_raw::Path::avx2);
}

TEST_CASE("quantize_into, AVX2: a long random tensor equals the portable loop") {
  const std::vector<float> x = fp8_raw::mixed(300007, 9);
  for (mpt::DType d : {mpt::DType::e4m3, mpt::DType::e5m2}) {
    std::vector<std::uint8_t> a(x.size()), b(x.size());
    mpt::fp8::Fp8Counts ca, cb;
    const float amax_a =
        fp8_raw::run_tensor(fp8_raw::Path::avx2, x.data(), x.size(), d, 0.011f, true, a.data(), ca);
    const float amax_b =
        fp8_raw::run_tensor(fp8_raw::Path::portable, x.data(), x.size(), d, 0.011f, true, b.data(), cb);
    CHECK(fp8_raw::bits_of(amax_a) == fp8_raw::bits_of(amax_b));
    CHECK(fp8_raw::differ(b, a, &x, "avx2 vs portable") == 0);
    fp8_raw::same_counts(cb, ca, "avx2 vs portable");
  }
}

int main(int argc, char** argv) { return mpt_test::avx2_test_main(argc, argv); }
