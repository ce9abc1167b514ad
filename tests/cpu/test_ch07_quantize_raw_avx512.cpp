// Chapter 07 — FP8 training: the AVX-512 loops of quantize_raw.hpp
// (src/mpt/fp8/quantize_avx512.cpp, what quantize_into runs on an
// AVX-512 CPU) against the Fp8Tensor reference, bit for
// bit — the portable loops pass the same checks in
// test_ch07_quantize_raw.cpp, so the two paths agree with each other.
// Without AVX-512F it exits 77 (CTest: Skipped).
// Depends on: fp8_raw_checks.hpp, doctest.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "fp8_raw_checks.hpp"

TEST_CASE("quantize_into, AVX-512: quantize_with_scale's codes, amax and counts") {
  fp8_raw::check_per_tensor(fp8_raw::Path::avx512);
}

TEST_CASE("quantize_mx_into, AVX-512: quantize_mx's codes, E8M0 codes, block amax and counts") {
  fp8_raw::check_mx(fp8_raw::Path::avx512);
}

TEST_CASE("quantize_into, AVX-512: a long random tensor equals the portable loop") {
  const std::vector<float> x = fp8_raw::mixed(300007, 9);
  for (mpt::DType d : {mpt::DType::e4m3, mpt::DType::e5m2}) {
    std::vector<std::uint8_t> a(x.size()), b(x.size());
    mpt::fp8::Fp8Counts ca, cb;
    const float amax_a =
        fp8_raw::run_tensor(fp8_raw::Path::avx512, x.data(), x.size(), d, 0.011f, true, a.data(), ca);
    const float amax_b =
        fp8_raw::run_tensor(fp8_raw::Path::portable, x.data(), x.size(), d, 0.011f, true, b.data(), cb);
    CHECK(fp8_raw::bits_of(amax_a) == fp8_raw::bits_of(amax_b));
    CHECK(fp8_raw::differ(b, a, &x, "avx512 vs portable") == 0);
    fp8_raw::same_counts(cb, ca, "avx512 vs portable");
  }
}

int main(int argc, char** argv) {
  if (mpt::fp8::detail::widest() != mpt::fp8::detail::SimdWidth::avx512) {
    std::printf("SKIPPED %s: this CPU or build has no AVX-512F path to compare\n",
                argc > 0 ? argv[0] : "avx512 test");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
