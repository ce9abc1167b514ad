// Chapter 07 — pitfall e4m3-max-240-448-480: which E4M3 tops out where
// Depends on: common.hpp (check, num, this entry's declaration),
// mpt/fp8/fp8_math.hpp (quantize_element), mpt/formats/round_element.hpp
// (round_to_format, encode_exact, decode, format_max),
// mpt/formats/format_spec.hpp (FormatSpec, formats::e4m3); <cmath>,
// <string>, <vector>.
//
// Three answers to "what is E4M3's largest value" are in use:
//  - 240: an E4M3 built with IEEE 754's conventions reserves the all-ones
//    exponent field for inf and NaN, so its top binade is 2^7 and its max
//    1.875 × 2^7 = 240; a value from 248 up rounds to inf.
//  - 448: the OCP 8-bit Floating Point Specification (OFP8, revision 1.0,
//    2023-12-01), which Hopper's and Blackwell's tensor cores, CUDA's
//    cuda_fp8.h and torch.float8_e4m3fn implement, gives up inf: only
//    S.1111.111 is NaN, so the all-ones exponent holds normal numbers and the
//    max is S.1111.110 = 1.75 × 2^8 = 448 (its table of the formats' limits; the
//    same choice in Micikevicius et al., "FP8 Formats for Deep Learning",
//    arXiv:2209.05433: E4M3's range is extended by not representing
//    infinities and keeping one NaN mantissa pattern). Values up to 464
//    round to 448; beyond, a saturating cast clamps to ±448 and a
//    non-saturating one gives NaN.
//  - 480: S.1111.111 read as 1.875 × 2^8, a format with no special values
//    at all. Simulators have used it (OpenPPL/ppq issue 398, 2023, asks why
//    its E4M3 maximum was 0 1111 111 = 480). A simulator with that max keeps
//    472 to 488 as 480 (and clamps from 496): a code that OCP hardware reads
//    as NaN.
// The broken run simulates the 480 convention, the fixed run OCP's; both
// also measure the IEEE-style E4M3, whose inf code S.1111.000 an OCP decoder
// reads as 256. This project's E4M3 is OCP's (formats::e4m3).
#include <cmath>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/formats/format_spec.hpp"
#include "mpt/formats/round_element.hpp"
#include "mpt/fp8/fp8_math.hpp"

namespace mpt::ch07 {
namespace {
namespace e4m3_max_240_448_480 {

// An E4M3 with IEEE 754's special values: the exponent 1111 is inf or NaN.
constexpr FormatSpec kIeeeE4m3{4, 3, 7, SpecialEncoding::ieee, 8};
// E4M3's precision and subnormals with room above: rounding for the 480 convention.
constexpr FormatSpec kWideE4m3{5, 3, 7, SpecialEncoding::ieee, 8};
constexpr float kSimMax = 480.0f;  // 1.875 × 2^8: S.1111.111 taken as a number

// The inputs: 224 to 512 in steps of 8.
std::vector<float> inputs() {
  std::vector<float> v;
  for (int x = 224; x <= 512; x += 8) v.push_back(static_cast<float>(x));
  return v;
}

// One conversion: the value it stands for, its code, and whether it was kept,
// clamped or became non-finite.
struct Converted {
  float value;
  std::uint32_t code;
  bool kept, clamped, nonfinite;
};

Converted simulate_480(float x) {
  //! [e4m3-max-240-448-480-broken]
  // E4M3 rounding with no special values: the top is 1.875 × 2^8 = 480
  const float r =
      round_to_format(x, kWideE4m3, RoundingMode::nearest_even, OverflowMode::infinity, SubnormalMode::keep);
  const bool clamped = std::fabs(r) > kSimMax;
  const float value = clamped ? std::copysign(kSimMax, x) : r;
  //! [e4m3-max-240-448-480-broken]
  return {value, encode_exact(value, kIeeeE4m3), !clamped, clamped, false};
}

Converted ocp(float x) {
  //! [e4m3-max-240-448-480-fixed]
  // OCP E4M3 (formats::e4m3): the top is 1.75 × 2^8 = 448, saturating
  const fp8::Fp8Element e = fp8::quantize_element(x, 1.0f, formats::e4m3, /*saturate=*/true);
  //! [e4m3-max-240-448-480-fixed]
  const bool clamped = e.outcome == fp8::Fp8Outcome::saturated;
  return {decode(e.code, formats::e4m3), e.code, !clamped, clamped, false};
}

// Without saturation: what x reads back as. OCP E4M3's non-saturating cast
// gives NaN beyond the max; the 480 convention has no inf or NaN to give, so
// its simulator has one mode only.
float without_saturation(float x, bool is_ocp) {
  if (!is_ocp) return simulate_480(x).value;
  return decode(fp8::quantize_element(x, 1.0f, formats::e4m3, false).code, formats::e4m3);
}

RunResult run(bool is_ocp, std::string setup) {
  double kept = 0, clamped = 0, nonfinite = 0, largest_kept = 0, smallest_clamped = 0, ocp_nan = 0;
  double ieee_kept = 0, ieee_largest_kept = 0, ieee_inf = 0, ieee_misread = 0;
  const std::vector<float> xs = inputs();
  for (float x : xs) {
    const Converted c = is_ocp ? ocp(x) : simulate_480(x);
    if (c.kept) {
      kept += 1;
      largest_kept = std::fmax(largest_kept, x);
    }
    if (c.clamped) {
      clamped += 1;
      if (smallest_clamped == 0) smallest_clamped = x;
    }
    if (!std::isfinite(without_saturation(x, is_ocp))) nonfinite += 1;
    if (std::isnan(decode(c.code, formats::e4m3))) ocp_nan += 1;
    // the IEEE-style E4M3, the same in both runs
    const float ri = round_to_format(x, kIeeeE4m3, RoundingMode::nearest_even, OverflowMode::infinity,
                                     SubnormalMode::keep);
    if (std::isfinite(ri)) {
      ieee_kept += 1;
      ieee_largest_kept = std::fmax(ieee_largest_kept, x);
    } else {
      ieee_inf += 1;
    }
    if (decode(encode_exact(ri, kIeeeE4m3), formats::e4m3) != ri) ieee_misread += 1;
  }
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"values", static_cast<double>(xs.size()), "inputs from 224 to 512 in steps of 8"},
      {"kept", kept, "inputs rounded to a value of the format (not clamped)"},
      {"largest_kept", largest_kept, "the largest input kept"},
      {"clamped", clamped, "inputs clamped to the format's max (saturating cast)"},
      {"smallest_clamped", smallest_clamped, "the smallest input clamped"},
      {"nonfinite_without_saturation", nonfinite, "inputs that become NaN or inf without saturation"},
      {"codes_nan_on_ocp", ocp_nan, "codes written that an OCP E4M3 decoder reads as NaN"},
      {"ieee_style_kept", ieee_kept, "inputs an IEEE-style E4M3 (max 240) keeps finite"},
      {"ieee_style_largest_kept", ieee_largest_kept, "the largest of them"},
      {"ieee_style_inf", ieee_inf, "inputs it rounds to inf"},
      {"ieee_style_codes_misread_on_ocp", ieee_misread,
       "its codes an OCP E4M3 decoder reads as another value (its inf, S.1111.000, is 256 there)"},
  };
  r.explanation = std::string(is_ocp ? "OCP E4M3" : "The 480 convention") + " keeps the inputs up to " +
                  num(largest_kept) + " and clamps from " + num(smallest_clamped) + "; " + num(ocp_nan) +
                  " of its codes are NaN on OCP hardware, and without saturation " + num(nonfinite) +
                  " inputs become NaN. An IEEE-style E4M3 keeps up to " + num(ieee_largest_kept) +
                  " and rounds " + num(ieee_inf) + " inputs to inf, a code OCP reads as 256.";
  return r;
}

RunResult broken_run() {
  return run(false,
             "224 to 512 in steps of 8, rounded by a simulator that takes E4M3's max to be 480 "
             "(S.1111.111 a number)");
}
RunResult fixed_run() {
  return run(true, "the same inputs in OCP E4M3 (max 448, S.1111.111 NaN), saturating");
}

}  // namespace e4m3_max_240_448_480
}  // namespace

Pitfall e4m3_max_240_448_480_pitfall() {
  using namespace e4m3_max_240_448_480;
  return Pitfall{
      "e4m3-max-240-448-480",
      7,
      "E4M3's max: 240 (IEEE-style), 448 (OCP), 480 (not a value of the format)",
      "OCP's E4M3 gives up inf to reach 448, keeping S.1111.111 as its only NaN; an IEEE-style E4M3 stops at "
      "240, and a simulator that reads S.1111.111 as 480 keeps values the hardware turns into NaN.",
      broken_run,
      fixed_run,
      {
          check("inputs above 464 are kept", [](const RunResult& r) { return r.get("largest_kept") > 464; }),
          check("some codes written are NaN on OCP E4M3",
                [](const RunResult& r) { return r.get("codes_nan_on_ocp") > 0; }),
          check("nothing becomes NaN or inf, even without saturation",
                [](const RunResult& r) { return r.get("nonfinite_without_saturation") == 0; }),
      },
      {
          check("nothing above 464 is kept", [](const RunResult& r) { return r.get("largest_kept") <= 464; }),
          check("no code written is NaN on OCP E4M3",
                [](const RunResult& r) { return r.get("codes_nan_on_ocp") == 0; }),
          check("without saturation, the inputs beyond the max become NaN",
                [](const RunResult& r) {
                  return r.get("nonfinite_without_saturation") == r.get("clamped") && r.get("clamped") > 0;
                }),
      },
      {
          check("an IEEE-style E4M3 keeps nothing above 248",
                [](const RunResult& r) { return r.get("ieee_style_largest_kept") < 248; }),
          check("an OCP decoder misreads the IEEE-style inf codes",
                [](const RunResult& r) {
                  return r.get("ieee_style_codes_misread_on_ocp") == r.get("ieee_style_inf") &&
                         r.get("ieee_style_inf") > 0;
                }),
      }};
}

}  // namespace mpt::ch07
