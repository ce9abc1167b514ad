// Chapter 01 — floating-point formats and their limits: range reports.
// Depends on: mpt/range_report.hpp, mpt/explain.hpp (an independent route to
// each value's class), mpt/format.hpp.
//
// Crafted tensors with a known number of values in every class and bin, the
// regions of the log2 bins, the display span, and the text and SVG renderers.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mpt/formats/explain.hpp"
#include "mpt/formats/range_report.hpp"
#include "test_support.hpp"

namespace {

using mpt_test::count_of;
using mpt_test::well_formed_xml;

const mpt::Format& fmt(const char* name) { return mpt::format_named(name); }

// fp16: every class with a known count; comments give the bin floor(log2|x|).
std::vector<float> crafted_fp16_tensor() {
  const float inf = std::numeric_limits<float>::infinity();
  return {
      0.0f,
      -0.0f,  // zero x2
      1.0f,
      65504.0f,
      -2.0f,
      std::ldexp(1.0f, -14),  // exact x4: bins 0, 15, 1, -14
      0.1f,
      1.0001f,
      65519.0f,  // rounded x3: bins -4, 0, 15
      std::ldexp(1.0f, -24),
      3e-6f,
      1.5f * std::ldexp(1.0f, -25),  // subnormal x3: -24, -19, -25
      1e-8f,
      std::ldexp(1.0f, -25),
      -1e-30f,  // flushed x3: -27, -25, -100
      65520.0f,
      1e5f,
      -7e4f,  // overflow x3: 15, 16, 16
      inf,
      -inf,
      std::numeric_limits<float>::quiet_NaN(),  // nonfinite x3
  };
}

}  // namespace

TEST_SUITE("ch01 range report") {
  TEST_CASE("crafted fp16 tensor: counts and fractions of every class") {
    const std::vector<float> x = crafted_fp16_tensor();
    const mpt::RangeReport r = mpt::range_report(x.data(), x.size(), fmt("fp16"));
    CHECK(r.total() == 21);
    CHECK(r.count(mpt::RangeClass::zero) == 2);
    CHECK(r.count(mpt::RangeClass::exact) == 4);
    CHECK(r.count(mpt::RangeClass::rounded) == 3);
    CHECK(r.count(mpt::RangeClass::subnormal_result) == 3);
    CHECK(r.count(mpt::RangeClass::flushed_to_zero) == 3);
    CHECK(r.count(mpt::RangeClass::overflow) == 3);
    CHECK(r.count(mpt::RangeClass::nonfinite) == 3);
    CHECK(r.fraction(mpt::RangeClass::overflow) == doctest::Approx(3.0 / 21.0));
    CHECK(r.fraction(mpt::RangeClass::exact) == doctest::Approx(4.0 / 21.0));
    CHECK(r.amax == 1e5f);
    CHECK(r.min_nonzero == 1e-30f);
  }

  TEST_CASE("crafted fp16 tensor: log2 histogram bins") {
    const std::vector<float> x = crafted_fp16_tensor();
    const mpt::RangeReport r = mpt::range_report(x.data(), x.size(), fmt("fp16"));
    CHECK(r.bin_count(0) == 2);
    CHECK(r.bin_count(1) == 1);
    CHECK(r.bin_count(15) == 3);  // 65504, 65519 and 65520 all lie below 2^16
    CHECK(r.bin_count(16) == 2);
    CHECK(r.bin_count(-4) == 1);
    CHECK(r.bin_count(-14) == 1);
    CHECK(r.bin_count(-19) == 1);
    CHECK(r.bin_count(-24) == 1);
    CHECK(r.bin_count(-25) == 2);
    CHECK(r.bin_count(-27) == 1);
    CHECK(r.bin_count(-100) == 1);
    CHECK(r.bin_count(200) == 0);
    std::uint64_t binned = 0;
    for (int k = mpt::kLog2BinMin; k <= mpt::kLog2BinMax; ++k) binned += r.bin_count(k);
    // zeros and non-finite values have no bin
    CHECK(binned == r.total() - r.count(mpt::RangeClass::zero) - r.count(mpt::RangeClass::nonfinite));

    // The data span -100..16 (plus a bin each side) is already wider than 72
    // bins, so no landmark widens it further; all three lie inside anyway.
    const mpt::BinSpan span = r.display_span();
    CHECK(span.lo == -101);
    CHECK(span.hi == 17);
    const std::vector<mpt::HistogramBin> bins = r.histogram();
    REQUIRE(bins.size() == 119);
    CHECK(bins.front().log2_lo == -101);
    CHECK(bins.front().region == mpt::BinRegion::below_min_subnormal);
    CHECK(bins.back().region == mpt::BinRegion::above_max);
  }

  TEST_CASE("bin regions against each format's range") {
    const mpt::FormatSpec& h = fmt("fp16").spec;
    CHECK(mpt::bin_region(-25, h) == mpt::BinRegion::below_min_subnormal);
    CHECK(mpt::bin_region(-24, h) == mpt::BinRegion::subnormal);
    CHECK(mpt::bin_region(-15, h) == mpt::BinRegion::subnormal);
    CHECK(mpt::bin_region(-14, h) == mpt::BinRegion::normal);
    CHECK(mpt::bin_region(15, h) == mpt::BinRegion::normal);
    CHECK(mpt::bin_region(16, h) == mpt::BinRegion::above_max);
    const mpt::FormatSpec& e4 = fmt("e4m3").spec;
    CHECK(mpt::bin_region(-10, e4) == mpt::BinRegion::below_min_subnormal);
    CHECK(mpt::bin_region(-9, e4) == mpt::BinRegion::subnormal);
    CHECK(mpt::bin_region(-7, e4) == mpt::BinRegion::subnormal);
    CHECK(mpt::bin_region(-6, e4) == mpt::BinRegion::normal);
    CHECK(mpt::bin_region(8, e4) == mpt::BinRegion::normal);  // 448 = 1.75 * 2^8
    CHECK(mpt::bin_region(9, e4) == mpt::BinRegion::above_max);
    const mpt::FormatSpec& b = fmt("bf16").spec;
    CHECK(mpt::bin_region(-134, b) == mpt::BinRegion::below_min_subnormal);
    CHECK(mpt::bin_region(-133, b) == mpt::BinRegion::subnormal);
    CHECK(mpt::bin_region(127, b) == mpt::BinRegion::normal);
    CHECK(mpt::bin_region(mpt::kLog2BinMin, fmt("fp32").spec) == mpt::BinRegion::subnormal);
  }

  TEST_CASE("display span takes in the landmarks when they fit") {
    const std::vector<float> x = {1.0f, 2.0f, 3.0f};
    const mpt::RangeReport h = mpt::range_report(x.data(), x.size(), fmt("fp16"));
    const mpt::BinSpan s = h.display_span();
    CHECK(s.lo == -25);  // one bin below min subnormal 2^-24
    CHECK(s.hi == 16);   // one bin above max's bin 15
    const std::vector<mpt::HistogramBin> bins = h.histogram();
    REQUIRE(bins.size() == 42);
    CHECK(bins[1].log2_lo == -24);
    CHECK(bins[1].region == mpt::BinRegion::subnormal);

    // fp32's landmarks are ~125 bins away from data near 1: left off scale.
    const mpt::RangeReport f = mpt::range_report(x.data(), x.size(), fmt("fp32"));
    CHECK(f.display_span().lo == -1);
    CHECK(f.display_span().hi == 2);
    const std::string text = mpt::render_text(f);
    CHECK(text.find("off scale: min subnormal 2^-149, min normal 2^-126, max 3.4028235e+38") !=
          std::string::npos);
    CHECK(mpt::render_svg(f).find("(off scale)") != std::string::npos);

    // e4m3: its whole range spans -10..9.
    const mpt::RangeReport e = mpt::range_report(x.data(), x.size(), fmt("e4m3"));
    CHECK(e.display_span().lo == -10);
    CHECK(e.display_span().hi == 9);
  }

  TEST_CASE("an empty tensor gives an empty, well-formed report") {
    const mpt::RangeReport r = mpt::range_report(nullptr, 0, fmt("fp16"));
    CHECK(r.total() == 0);
    CHECK(r.fraction(mpt::RangeClass::overflow) == 0.0);
    CHECK(std::isnan(r.amax));
    CHECK(std::isnan(r.min_nonzero));
    CHECK(r.display_span().lo == -25);
    CHECK(mpt::render_text(r).find("no finite nonzero values") != std::string::npos);
    std::string why;
    CHECK_MESSAGE(well_formed_xml(mpt::render_svg(r), why), why);
  }

  TEST_CASE("text renderer: aligned table, bars and landmark rules") {
    const std::vector<float> x = crafted_fp16_tensor();
    const mpt::RangeReport r = mpt::range_report(x.data(), x.size(), fmt("fp16"));
    const std::string t = mpt::render_text(r);
    CHECK(t.find("range report: 21 values stored as fp16") != std::string::npos);
    CHECK(t.find("  overflow              3    14.29%\n") != std::string::npos);
    CHECK(t.find("  flushed to zero       3    14.29%\n") != std::string::npos);
    CHECK(t.find("  total                21   100.00%\n") != std::string::npos);
    CHECK(t.find("---- min subnormal 2^-24") != std::string::npos);
    CHECK(t.find("---- min normal 2^-14") != std::string::npos);
    CHECK(t.find("---- max 65504") != std::string::npos);
    // The fullest bin (15, three values) gets the full 40-character bar.
    CHECK(t.find("     15  normal                   3  " + std::string(40, '#') + "\n") != std::string::npos);
    // Rules sit between the right bins: min normal just before bin -14.
    CHECK(t.find("---- min normal") < t.find("    -14  normal"));
    CHECK(t.find("    -15  subnormal") < t.find("---- min normal"));
    CHECK(t.find(" \n") == std::string::npos);  // no trailing blanks
  }

  TEST_CASE("SVG renderer: a well-formed document with the three landmark lines") {
    const std::vector<float> x = crafted_fp16_tensor();
    const mpt::RangeReport r = mpt::range_report(x.data(), x.size(), fmt("fp16"));
    const std::string svg = mpt::render_svg(r);
    CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
    CHECK(svg.substr(svg.size() - 7) == "</svg>\n");
    std::string why;
    CHECK_MESSAGE(well_formed_xml(svg, why), why);
    CHECK(count_of(svg, "<line class=\"marker min-subnormal\"") == 1);
    CHECK(count_of(svg, "<line class=\"marker min-normal\"") == 1);
    CHECK(count_of(svg, "<line class=\"marker max\"") == 1);
    CHECK(svg.find("min subnormal 2^-24") != std::string::npos);
    CHECK(svg.find("max 65504") != std::string::npos);
    CHECK(count_of(svg, "<rect class=\"bin\"") == r.histogram().size());
    CHECK(svg.find("(off scale)") == std::string::npos);
  }

  TEST_CASE("counts agree with explain()'s outcome for every value") {
    // explain() decides each outcome from the rounded value; the report uses
    // classify(). Two routes, one answer.
    std::mt19937 rng(11);
    std::normal_distribution<float> log2_magnitude(-12.0f, 10.0f);
    std::vector<float> x(5000);
    for (float& v : x) v = std::exp2(log2_magnitude(rng)) * (rng() & 1u ? -1.0f : 1.0f);
    x[0] = 0.0f;
    x[1] = std::numeric_limits<float>::infinity();
    for (const mpt::Format& f : mpt::all_formats()) {
      const std::string format_name(f.name);
      CAPTURE(format_name);
      const mpt::RangeReport r = mpt::range_report(x.data(), x.size(), f);
      std::uint64_t by_explain[mpt::kRangeClassCount] = {};
      for (float v : x) ++by_explain[static_cast<int>(mpt::explain(v, f).outcome)];
      for (int c = 0; c < mpt::kRangeClassCount; ++c) {
        CAPTURE(c);
        CHECK(r.counts.by_class[c] == by_explain[c]);
      }
    }
  }

  TEST_CASE("a report from counts made elsewhere (the CUDA reduction's path)") {
    // Counts filled in by hand, as a device reduction would hand them over:
    // the report keeps every class count and bin, and knows no amax.
    mpt::RangeCounts counts;
    counts.by_class[static_cast<int>(mpt::RangeClass::exact)] = 7;
    counts.by_class[static_cast<int>(mpt::RangeClass::overflow)] = 2;
    counts.by_class[static_cast<int>(mpt::RangeClass::flushed_to_zero)] = 1;
    counts.log2_hist[0 - mpt::kLog2BinMin] = 7;
    counts.log2_hist[17 - mpt::kLog2BinMin] = 2;
    counts.log2_hist[-30 - mpt::kLog2BinMin] = 1;
    const mpt::RangeReport r = mpt::range_report_from_counts(counts, fmt("fp16"));
    CHECK(r.format == &fmt("fp16"));
    CHECK(r.total() == 10);
    CHECK(r.count(mpt::RangeClass::exact) == 7);
    CHECK(r.count(mpt::RangeClass::overflow) == 2);
    CHECK(r.count(mpt::RangeClass::flushed_to_zero) == 1);
    CHECK(r.count(mpt::RangeClass::rounded) == 0);
    CHECK(r.fraction(mpt::RangeClass::overflow) == doctest::Approx(0.2));
    CHECK(r.bin_count(0) == 7);
    CHECK(r.bin_count(17) == 2);
    CHECK(r.bin_count(-30) == 1);
    CHECK(r.bin_count(1) == 0);
    CHECK(std::isnan(r.amax));
    CHECK(std::isnan(r.min_nonzero));
    CHECK(mpt::render_text(r).find("data: largest") == std::string::npos);
  }

}  // TEST_SUITE
