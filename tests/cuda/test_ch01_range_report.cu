// Chapter 01 — floating-point formats and their limits: the GPU range report
// (kernels/formats/range_report.cu) against the host, count for count.
// Depends on: mpt (range_report.hpp: the CPU reference; range_classify.hpp),
// mpt::kernels,
// tests/cuda_host/sweep_values.hpp, gpu_test_support.hpp.
// Without a usable GPU it prints why and exits 77 (CTest: Skipped).
#define DOCTEST_CONFIG_IMPLEMENT
#include "gpu_test_support.hpp"

#include <random>

#include "mpt/formats/format.hpp"
#include "mpt/formats/range_classify.hpp"
#include "mpt/formats/range_report.hpp"
#include "sweep_values.hpp"

namespace {

using mpt::cuda::KernelVersion;
using mpt::test::version_name;

mpt::RangeCounts host_counts(const float* x, std::size_t n, const mpt::FormatSpec& f) {
  mpt::RangeCounts c;
  for (std::size_t i = 0; i < n; ++i) c.add(x[i], f);
  return c;
}

/// Compare two reports field by field; print the first few differences.
std::size_t report_differences(const char* what, const mpt::RangeCounts& want, const mpt::RangeCounts& got) {
  std::size_t bad = 0;
  for (int c = 0; c < mpt::kRangeClassCount; ++c) {
    if (want.by_class[c] == got.by_class[c]) continue;
    if (bad++ < 5) {
      std::printf("%s: class %s expected %" PRIu64 " got %" PRIu64 "\n", what,
                  mpt::range_class_name(static_cast<mpt::RangeClass>(c)), want.by_class[c], got.by_class[c]);
    }
  }
  for (int k = 0; k < mpt::kLog2BinCount; ++k) {
    if (want.log2_hist[k] == got.log2_hist[k]) continue;
    if (bad++ < 5) {
      std::printf("%s: log2 bin %d expected %" PRIu64 " got %" PRIu64 "\n", what, k + mpt::kLog2BinMin,
                  want.log2_hist[k], got.log2_hist[k]);
    }
  }
  if (bad) std::printf("%s: %zu fields differ\n", what, bad);
  return bad;
}

void check_all_formats(const std::vector<float>& in) {
  mpt::test::DeviceArray<float> d_x(in);
  for (const mpt::Format& f : mpt::all_formats()) {
    // offset 1: an unaligned pointer, the vectorized kernel's scalar path
    for (std::size_t offset : {0u, 1u}) {
      const std::size_t n = in.size() - offset;
      // The CPU report of src/mpt is the reference; it must in turn equal
      // the plain serial loop over RangeCounts::add.
      const mpt::RangeCounts want = mpt::range_report(in.data() + offset, n, f).counts;
      CHECK(want == host_counts(in.data() + offset, n, f.spec));
      for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized}) {
        const mpt::RangeCounts got = mpt::cuda::range_counts(d_x.get() + offset, n, f.spec, v);
        const std::string what = std::string(f.name) + " " + version_name(v) + " offset " +
                                 std::to_string(offset) + " n " + std::to_string(n);
        CHECK_MESSAGE(report_differences(what.c_str(), want, got) == 0, what);
        CHECK(got.total() == n);
      }
    }
  }
}

}  // namespace

TEST_CASE("range report on the GPU == mpt::range_report on the host, every format") {
  check_all_formats(mpt::test::mixed_inputs(65536 + 13, mpt::test::test_seed()));
}

TEST_CASE("range report: many blocks (grid-stride loop, per-block flush)") {
  check_all_formats(mpt::test::mixed_inputs((1u << 22) + 3, mpt::test::test_seed() + 1));
}

TEST_CASE("range report: tiny inputs (n < 4, only the tail) and n == 0") {
  const std::vector<float> in = {65520.0f, -0x1p-25f, 1.0f};
  mpt::test::DeviceArray<float> d_x(in);
  for (std::size_t n = 0; n <= in.size(); ++n) {
    for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized}) {
      const mpt::RangeCounts got = mpt::cuda::range_counts(d_x.get(), n, mpt::formats::fp16, v);
      CHECK(got == host_counts(in.data(), n, mpt::formats::fp16));
    }
  }
}

TEST_CASE("range report: hand-counted fp16 example") {
  // Counts written out by hand from the rules in range_classify.hpp, so this
  // does not only compare the classifier with itself.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {
      65520.0f,                        // overflow (the tie rounds to even: inf)     bin 15
      -1e6f,                           // overflow                                    bin 19
      65504.0f,                        // exact (fp16 max)                            bin 15
      std::nextafter(65520.0f, 0.0f),  // rounded down to 65504                       bin 15
      0x1p-25f,                        // flushed_to_zero (tie with 0 goes to 0)      bin -25
      0x1.8p-25f,                      // subnormal_result (rounds to 2^-24)          bin -25
      0x1p-24f,                        // subnormal_result, although exact            bin -24
      0x1p-14f,                        // exact (min normal)                          bin -14
      1.0f + 0x1p-11f,                 // rounded (tie, to even: 1)                   bin 0
      0.0f,
      -0.0f,  // zero
      inf,
      nan,  // nonfinite
  };
  mpt::test::DeviceArray<float> d_x(in);
  for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized}) {
    const mpt::RangeCounts got = mpt::cuda::range_counts(d_x.get(), in.size(), mpt::formats::fp16, v);
    CAPTURE(version_name(v));
    CHECK(got.count(mpt::RangeClass::overflow) == 2);
    CHECK(got.count(mpt::RangeClass::exact) == 2);
    CHECK(got.count(mpt::RangeClass::rounded) == 2);
    CHECK(got.count(mpt::RangeClass::flushed_to_zero) == 1);
    CHECK(got.count(mpt::RangeClass::subnormal_result) == 2);
    CHECK(got.count(mpt::RangeClass::zero) == 2);
    CHECK(got.count(mpt::RangeClass::nonfinite) == 2);
    auto bin = [&got](int k) { return got.log2_hist[k - mpt::kLog2BinMin]; };
    CHECK(bin(15) == 3);
    CHECK(bin(19) == 1);
    CHECK(bin(-25) == 2);
    CHECK(bin(-24) == 1);
    CHECK(bin(-14) == 1);
    CHECK(bin(0) == 1);
    std::uint64_t binned = 0;
    for (std::uint64_t c : got.log2_hist) binned += c;
    CHECK(binned == 9);  // zeros, inf and NaN have no bin
  }
}

TEST_CASE("range_counts_into: counters on the device accumulate until cleared") {
  // What the benchmark times: the counting kernel into counters that live
  // on the device for the whole run, with no allocation or copy per call.
  const std::vector<float> a = mpt::test::mixed_inputs(4099, mpt::test::test_seed() + 2);
  const std::vector<float> b = mpt::test::mixed_inputs(517, mpt::test::test_seed() + 3);
  mpt::test::DeviceArray<float> d_a(a), d_b(b);
  for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized}) {
    mpt::cuda::DeviceRangeCounts counters;
    CHECK(counters.download() == mpt::RangeCounts{});  // zero from the start
    mpt::cuda::range_counts_into(d_a.get(), a.size(), mpt::formats::bf16, counters, v);
    mpt::cuda::range_counts_into(d_b.get(), b.size(), mpt::formats::bf16, counters, v);
    mpt::RangeCounts want = host_counts(a.data(), a.size(), mpt::formats::bf16);
    const mpt::RangeCounts wb = host_counts(b.data(), b.size(), mpt::formats::bf16);
    for (int i = 0; i < mpt::kRangeClassCount; ++i) want.by_class[i] += wb.by_class[i];
    for (int i = 0; i < mpt::kLog2BinCount; ++i) want.log2_hist[i] += wb.log2_hist[i];
    CHECK(counters.download() == want);
    counters.clear();
    mpt::cuda::range_counts_into(d_b.get(), b.size(), mpt::formats::bf16, counters, v);
    CHECK(counters.download() == wb);
  }
}

TEST_CASE("range report: an unknown version throws") {
  mpt::test::DeviceArray<float> d(4);
  CHECK_THROWS_AS(mpt::cuda::range_counts(d.get(), 4, mpt::formats::fp16, static_cast<KernelVersion>(0)),
                  std::invalid_argument);
}

int main(int argc, char** argv) { return mpt::test::gpu_test_main(argc, argv); }
