// Chapter 01 — floating-point formats and their limits: the numbers the
// chapter text quotes, computed by the library (program `ch01_numbers`).
// Depends on: mpt/format.hpp, mpt/rounding.hpp, mpt/explain.hpp (number
// spelling only).
//
// The chapter's README contains no typed-in numbers: generate.sh runs this
// program once per section and splices the output into the text. Usage:
//   ch01_numbers layouts|derivation|rounding|sum-exactness|fp8|claims
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mpt/formats/explain.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/formats/rounding.hpp"

namespace {

using mpt::Format;
using mpt::format_named;
using mpt::limits_of;
using mpt::round_value;
using mpt::RoundingMode;
using mpt::RoundingOptions;

const Format& fp16() { return format_named("fp16"); }

// Spelling: fp32 values as their shortest round-trip decimal, powers of two
// as 2^k where that is what they are.
std::string dec(double x) { return mpt::shortest_decimal(static_cast<float>(x)); }
std::string p2(double x) { return mpt::power_of_two_or_decimal(x); }
std::string stored(float x, const Format& f, const RoundingOptions& o = {}) {
  return dec(round_value(x, f, o));
}

// --- layouts ---------------------------------------------------------------

int layouts() {
  std::printf("%-5s %-44s %4s %4s %4s %4s %5s  %s\n", "name", "bit layout (S sign, E exponent, M fraction)",
              "sign", "exp", "frac", "bias", "bytes", "all-ones exponent means");
  for (const Format& f : mpt::all_formats()) {
    const auto& s = f.spec;
    std::string picture = "S " + std::string(s.exponent_bits, 'E') + " " + std::string(s.mantissa_bits, 'M');
    const int used = 1 + s.exponent_bits + s.mantissa_bits;
    if (used < s.storage_bits) picture += " (+" + std::to_string(s.storage_bits - used) + " unused)";
    std::printf("%-5s %-44s %4d %4d %4d %4d %5d  %s\n", std::string(f.name).c_str(), picture.c_str(), 1,
                s.exponent_bits, s.mantissa_bits, s.bias, s.storage_bits / 8,
                s.has_inf() ? "inf (fraction 0) or NaN" : "normal numbers; NaN only at S.1111.111");
  }
  return 0;
}

// --- derivation ------------------------------------------------------------

// Each limit evaluated from its formula here and compared with the
// library's limits_of(), so the table shows the formula and proves the value.
int derivation() {
  int mismatches = 0;
  for (const Format& f : mpt::all_formats()) {
    const auto& s = f.spec;
    const mpt::Limits l = limits_of(s);
    const int p = s.precision(), m = s.mantissa_bits;
    const int emin = 1 - s.bias;
    const int emax_field = (1 << s.exponent_bits) - (s.has_inf() ? 2 : 1);
    const int emax = emax_field - s.bias;
    // IEEE: the largest significand is all ones, 2 - 2^-m. E4M3: all ones is
    // NaN, so one step less, 2 - 2^(1-m).
    const int top_gap = s.has_inf() ? -m : 1 - m;
    const double max = (2.0 - std::ldexp(1.0, top_gap)) * std::ldexp(1.0, emax);
    const double min_normal = std::ldexp(1.0, emin);
    const double min_sub = std::ldexp(1.0, emin - m);
    const double eps = std::ldexp(1.0, 1 - p);
    const double u = std::ldexp(1.0, -p);
    const bool same = max == l.max && min_normal == l.min_normal && min_sub == l.min_subnormal &&
                      eps == l.epsilon && u == l.unit_roundoff && emin == l.emin && emax == l.emax;
    mismatches += !same;
    std::printf("%s: p = m + 1 = %d, bias = %d\n", std::string(f.name).c_str(), p, s.bias);
    std::printf("  emin = 1 - bias = %d;  emax = %d - bias = %d (%s)\n", emin, emax_field, emax,
                s.has_inf() ? "the largest exponent field below all ones"
                            : "the all-ones exponent field holds numbers too");
    std::printf("  max           = (2 - 2^%d) * 2^%d = %s\n", top_gap, emax, dec(max).c_str());
    std::printf("  min normal    = 2^emin = 2^%d = %s\n", emin, dec(min_normal).c_str());
    std::printf("  min subnormal = 2^(emin - m) = 2^%d = %s\n", emin - m, dec(min_sub).c_str());
    std::printf("  epsilon       = 2^(1 - p) = 2^%d = %s\n", 1 - p, dec(eps).c_str());
    std::printf("  unit roundoff = 2^-p = 2^%d = %s\n", -p, dec(u).c_str());
    std::printf("  finite values = %llu;  library's limits_of() agrees: %s\n",
                static_cast<unsigned long long>(l.finite_values), same ? "yes" : "NO");
  }
  return mismatches == 0 ? 0 : 1;
}

// --- rounding --------------------------------------------------------------

// Mean of n stochastic roundings of x (element index i draws its own bits).
double sr_mean(float x, const Format& f, int n, std::uint64_t seed) {
  RoundingOptions o;
  o.mode = RoundingMode::stochastic;
  o.seed = seed;
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += round_value(x, f, o, static_cast<std::uint64_t>(i));
  return sum / n;
}

std::string g10(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", x);
  return buf;
}

int rounding() {
  const Format& f = fp16();
  const mpt::Limits l = limits_of(f.spec);
  RoundingOptions rtz;
  rtz.mode = RoundingMode::toward_zero;
  RoundingOptions flush;
  flush.subnormals = mpt::SubnormalMode::flush;
  RoundingOptions saturate;
  saturate.overflow = mpt::OverflowMode::saturate;
  const float one = 1.0f, ulp1 = static_cast<float>(l.epsilon);
  struct Case {
    std::string what;
    float x;
  };
  const std::vector<Case> cases = {
      {"1 + ulp/2 (a tie)", one + ulp1 / 2},
      {"1 + 3ulp/2 (a tie)", one + 3 * ulp1 / 2},
      {"1 + ulp/4", one + ulp1 / 4},
      {"-(1 + 3ulp/4)", -(one + 3 * ulp1 / 4)},
      {"max + ulp(max)/2 - tiny", std::nextafter(65520.0f, 0.0f)},
      {"max + ulp(max)/2", 65520.0f},
      {"min subnormal / 2 (a tie)", static_cast<float>(l.min_subnormal / 2)},
      {"3/4 min subnormal", static_cast<float>(0.75 * l.min_subnormal)},
      {"min normal / 3", static_cast<float>(l.min_normal / 3)},
  };
  const int n = 1 << 20;
  const std::uint64_t seed = 1;
  std::printf(
      "fp16; ulp = spacing at 1 = %s. RNE = round to nearest, ties to even;\n"
      "RTZ = toward zero; SR mean = mean of %d stochastic roundings (seed %llu);\n"
      "FTZ = RNE with subnormal results flushed to 0; SAT = RNE saturating at max\n\n",
      p2(ulp1).c_str(), n, static_cast<unsigned long long>(seed));
  std::printf("%-26s %-15s %-14s %-14s %-16s %-10s %s\n", "x", "x (fp32)", "RNE", "RTZ", "SR mean", "FTZ",
              "SAT");
  for (const Case& c : cases)
    std::printf("%-26s %-15s %-14s %-14s %-16s %-10s %s\n", c.what.c_str(), dec(c.x).c_str(),
                stored(c.x, f).c_str(), stored(c.x, f, rtz).c_str(), g10(sr_mean(c.x, f, n, seed)).c_str(),
                stored(c.x, f, flush).c_str(), stored(c.x, f, saturate).c_str());

  // Stochastic rounding is unbiased: E[SR(x)] = x. x lies a fraction t of
  // the way from its lower neighbour to the upper one and rounds up with
  // probability t, so the mean of n draws has standard error
  // ulp * sqrt(t (1 - t) / n).
  const float x = one + ulp1 / 4;
  const double t = (static_cast<double>(x) - one) / ulp1;
  const double mean = sr_mean(x, f, n, seed);
  const double se = std::sqrt(t * (1 - t) / n);
  std::printf(
      "\nunbiased? x = 1 + ulp/4 = %s: RNE always gives %s (error %s = -ulp/4);\n"
      "the SR mean is off by %.2g ulp, %.2f standard errors (one standard error = %.2g ulp)\n",
      dec(x).c_str(), stored(x, f).c_str(), p2(round_value(x, f) - double(x)).c_str(), (mean - x) / ulp1,
      (mean - x) / ulp1 / se, se);

  // The stagnating sum of the pitfall fp16-sum-stagnation, with SR instead.
  const float addend = round_value(0.01f, f);
  const int steps = 10000;
  float sum_rne = 0;
  for (int i = 0; i < steps; ++i) sum_rne = round_value(sum_rne + addend, f);
  std::printf("\nsum of %d x fp16(0.01) = %s in an fp16 accumulator (exact: %s)\n", steps,
              dec(addend).c_str(), mpt::shortest_decimal(steps * static_cast<double>(addend)).c_str());
  std::printf("  RNE: %s\n  SR, seeds 1 to 8:", dec(sum_rne).c_str());
  double total = 0;
  for (std::uint64_t s = 1; s <= 8; ++s) {
    RoundingOptions sr;
    sr.mode = RoundingMode::stochastic;
    sr.seed = s;
    float sum = 0;
    for (int i = 0; i < steps; ++i) sum = round_value(sum + addend, f, sr, static_cast<std::uint64_t>(i));
    std::printf(" %s", dec(sum).c_str());
    total += sum;
  }
  std::printf("\n  SR mean over the 8 seeds: %s\n", g10(total / 8).c_str());
  return 0;
}

// --- sum-exactness ----------------------------------------------------------

// When does the fp32 accumulator of the pitfall fp16-sum-stagnation stop
// being exact? The addend fp16(0.01) is an odd integer m times 2^e, so every
// partial sum n * m * 2^e is a multiple of 2^e; a format of precision p
// holds every multiple of 2^e exactly below 2^(p + e) and not all of them
// from there on. Then the sum itself is run, each add compared with the
// exact sum (in fp64, exact here), to find the first inexact one.
int sum_exactness() {
  const float addend = round_value(0.01f, fp16());
  // addend = m * 2^e with m odd: strip the trailing zero bits of the significand.
  int e = 0;
  double m = std::frexp(static_cast<double>(addend), &e);  // addend = m * 2^e, m in [0.5, 1)
  while (m != std::floor(m)) {
    m *= 2;
    --e;
  }
  std::printf(
      "the addend: fp16(0.01) = %s = %.0f * 2^%d (%.0f is odd), so the n-th partial sum is\n"
      "n * %.0f * 2^%d: a multiple of 2^%d\n\n",
      dec(addend).c_str(), m, e, m, m, e, e);
  const std::string exact_below = "multiples of 2^" + std::to_string(e) + " exact below";
  std::printf("%-11s %3s %-30s %-14s %-17s %-14s %s\n", "accumulator", "p", exact_below.c_str(),
              "sum reaches it", "first inexact add", "exact sum", "stored");
  for (const char* name : {"fp32", "fp16"}) {
    const Format& f = format_named(name);
    const int p = limits_of(f.spec).precision;
    // p significant bits hold k * 2^e exactly for every k < 2^p, that is for
    // every multiple below 2^(p + e); at and above it only the even ones.
    const double bound = std::ldexp(1.0, p + e);
    const long reaches = static_cast<long>(std::ceil(bound / addend));
    // Run the sum as the pitfall does (an fp32 add, rounded to the
    // accumulator's format) against the exact partial sum, in fp64 (53 bits
    // hold every one of them).
    float sum = 0;
    long first_inexact = 0;
    double exact_there = 0;
    for (long n = 1; n <= 10 * reaches && first_inexact == 0; ++n) {
      const double exact = static_cast<double>(sum) + addend;
      sum = round_value(sum + addend, f);
      if (static_cast<double>(sum) != exact) first_inexact = n, exact_there = exact;
    }
    const std::string at =
        "2^(" + std::to_string(p) + std::to_string(e) + ") = " + p2(bound) + " = " + dec(bound);
    std::printf("%-11s %3d %-30s %-14s %-17s %-14s %s\n", name, p, at.c_str(),
                ("step " + std::to_string(reaches)).c_str(),
                ("step " + std::to_string(first_inexact)).c_str(), g10(exact_there).c_str(),
                dec(sum).c_str());
  }
  std::printf(
      "\np = significant bits; 'sum reaches it' = the first step whose exact sum is at or above the\n"
      "bound; 'first inexact add' = the first step whose stored sum differs from the exact one,\n"
      "found by running the sum (from the bound on, the even multiples are still exact).\n");
  return 0;
}

// --- fp8 -------------------------------------------------------------------

int fp8() {
  std::printf("%-5s %-10s %-12s %-14s %-5s %-10s %-8s %-10s %-10s %-10s\n", "name", "max", "min normal",
              "min subnormal", "inf", "NaN codes", "finite", "500 (sat)", "500 (inf)", "1e5 (sat)");
  for (const char* name : {"e4m3", "e5m2", "fp16"}) {
    const Format& f = format_named(name);
    const mpt::Limits l = limits_of(f.spec);
    int nan_codes = 0;
    const std::uint32_t codes = 1u << (1 + f.spec.exponent_bits + f.spec.mantissa_bits);
    for (std::uint32_t c = 0; c < codes; ++c) nan_codes += std::isnan(mpt::decode(c, f.spec));
    RoundingOptions sat, to_inf;
    sat.overflow = mpt::OverflowMode::saturate;
    to_inf.overflow = mpt::OverflowMode::infinity;
    std::printf("%-5s %-10s %-12s %-14s %-5s %-10d %-8llu %-10s %-10s %-10s\n", name, dec(l.max).c_str(),
                p2(l.min_normal).c_str(), p2(l.min_subnormal).c_str(), l.has_inf ? "yes" : "no", nan_codes,
                static_cast<unsigned long long>(l.finite_values), stored(500.0f, f, sat).c_str(),
                stored(500.0f, f, to_inf).c_str(), stored(1e5f, f, sat).c_str());
  }
  std::printf(
      "\n(sat) = saturate to max, the FP8 default here; (inf) = IEEE overflow, which for\n"
      "a format without inf (e4m3) can only produce NaN\n");
  return 0;
}

// --- claims ----------------------------------------------------------------

void row(const std::string& what, const std::string& value) {
  std::printf("  %-52s %s\n", what.c_str(), value.c_str());
}

/// The verdict on a claim, from a comparison the caller made: "right" when
/// the measurement agrees with the claim, "wrong" when it does not; the
/// claimed and the measured value side by side, then the reason for a
/// wrong one (built from the measurements).
void verdict(bool claim_holds, const std::string& claimed, const std::string& measured,
             const std::string& why_wrong) {
  std::printf("  verdict: %s (claimed: %s; measured: %s).\n", claim_holds ? "right" : "wrong",
              claimed.c_str(), measured.c_str());
  if (!claim_holds) std::printf("  %s\n", why_wrong.c_str());
}

int claims() {
  const Format& f = fp16();
  const mpt::Limits l = limits_of(f.spec);
  // Round-to-nearest keeps everything below max + ulp(max)/2 finite.
  const double overflow_from = l.max + std::ldexp(1.0, l.emax - f.spec.mantissa_bits) / 2;

  std::printf("claim: \"fp16's largest value is 65536 (2^16)\"\n");
  const double claimed_max = 65536.0;
  row("largest finite fp16 (limits_of)", dec(l.max));
  for (float x : {65504.0f, std::nextafter(65520.0f, 0.0f), 65520.0f, 65536.0f})
    row(dec(x) + " stored in fp16", stored(x, f));
  const bool in_fp16 = round_value(static_cast<float>(claimed_max), f) == static_cast<float>(claimed_max);
  verdict(l.max == claimed_max, dec(claimed_max), dec(l.max),
          "The largest is " + dec(l.max) + "; from " + dec(overflow_from) +
              " up everything rounds to inf,\n  so " + dec(claimed_max) +
              (in_fp16 ? " is an fp16 value, but not the largest." : " is not an fp16 value at all."));

  std::printf("\n");
  std::printf("claim: \"exp overflows fp16 from x = 10\"\n");
  const float claimed_from = 10.0f;
  for (float x : {10.0f, 11.0f, 11.08f, 11.09f, 11.1f, 12.0f})
    row("exp(" + dec(x) + ") = " + dec(std::exp(x)) + " stored in fp16", stored(std::exp(x), f));
  row("ln(max) = ln(" + dec(l.max) + ")", std::to_string(std::log(l.max)));
  row("ln(" + dec(overflow_from) + "), where rounding starts to give inf",
      std::to_string(std::log(overflow_from)));
  float last = 11.0f;  // walk fp32 values up to the first whose fp16 exp is inf
  while (std::isfinite(round_value(std::exp(std::nextafter(last, 12.0f)), f)))
    last = std::nextafter(last, 12.0f);
  row("largest fp32 x with exp(x) finite in fp16", dec(last));
  float last16 = 11.0f;  // the same among fp16 inputs, stepping code by code
  for (std::uint32_t c = mpt::encode_exact(11.0f, f.spec);; ++c) {
    const float x = mpt::decode(c, f.spec);
    if (!std::isfinite(round_value(std::exp(x), f))) break;
    last16 = x;
  }
  row("largest fp16 x with exp(x) finite in fp16", dec(last16));
  // The claim: exp(x) is inf in fp16 from x = 10 on (and finite below).
  const bool overflows_at_claim = !std::isfinite(round_value(std::exp(claimed_from), f));
  const bool finite_below = std::isfinite(round_value(std::exp(std::nextafter(claimed_from, 0.0f)), f));
  char ln_max[32];
  std::snprintf(ln_max, sizeof ln_max, "%.2f", std::log(l.max));
  verdict(
      overflows_at_claim && finite_below, "inf from x = " + dec(claimed_from),
      "exp(" + dec(claimed_from) + ") stored in fp16 = " + stored(std::exp(claimed_from), f) +
          "; inf from x = " + dec(std::nextafter(last, 12.0f)),
      std::string("exp(") + dec(claimed_from) + ") fits easily; the limit is ln(max), about " + ln_max + ".");

  std::printf("\n");
  std::printf(
      "claim: \"the usual initial loss scale 2^16 is an fp16 number\"\n"
      "  (2^16 is the default init_scale of PyTorch's GradScaler)\n");
  const float scale = std::ldexp(1.0f, 16);
  row("2^16 stored in fp16", stored(scale, f));
  row("2^16 stored in bf16", stored(scale, format_named("bf16")));
  row("2^16 stored in fp32", stored(scale, format_named("fp32")));
  const float scale16 = round_value(scale, f);
  verdict(scale16 == scale, "fp16(2^16) = " + dec(scale), "fp16(2^16) = " + dec(scale16),
          "2^16 = " + dec(scale) +
              " overflows fp16; the scale (and the multiply by it)\n  lives in fp32, where it is exact.");

  std::printf("\n");
  std::printf("claim: \"the smallest positive fp16 is 2^-14\"\n");
  const double claimed_min = std::ldexp(1.0, -14);
  row("min normal (limits_of)", p2(l.min_normal) + " = " + dec(l.min_normal));
  row("min subnormal (limits_of)", p2(l.min_subnormal) + " = " + dec(l.min_subnormal));
  row("2^-24 stored in fp16", stored(static_cast<float>(l.min_subnormal), f));
  row("2^-25 stored in fp16 (a tie: to even, 0)", stored(static_cast<float>(l.min_subnormal / 2), f));
  // The smallest positive value: the code with only the lowest bit set.
  const double smallest = mpt::decode(1u, f.spec);
  row("smallest positive code (0x0001) decoded", p2(smallest));
  verdict(smallest == claimed_min, p2(claimed_min), p2(smallest),
          p2(l.min_normal) + " is the smallest normal number; subnormals go down to\n  " + p2(smallest) +
              ", with fewer significant bits.");

  std::printf("\n");
  std::printf("claim: \"fp16 stores every integer up to its max exactly\"\n");
  int first_gap = 1;  // first integer that fp16 cannot hold
  while (round_value(static_cast<float>(first_gap), f) == static_cast<float>(first_gap)) ++first_gap;
  row("first integer not representable", std::to_string(first_gap));
  row(std::to_string(first_gap) + " stored in fp16", stored(static_cast<float>(first_gap), f));
  row("2^p, p = precision", dec(std::ldexp(1.0, l.precision)));
  verdict(first_gap > l.max, "every integer up to " + dec(l.max),
          "the first one missing is " + std::to_string(first_gap),
          "Integers are exact only up to 2^p = 2^" + std::to_string(l.precision) +
              "; above it the spacing\n  is 2 or more.");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage = "usage: ch01_numbers layouts|derivation|rounding|sum-exactness|fp8|claims\n";
  if (argc != 2) {
    std::fputs(usage, stderr);
    return 2;
  }
  const std::string section = argv[1];
  if (section == "layouts") return layouts();
  if (section == "derivation") return derivation();
  if (section == "rounding") return rounding();
  if (section == "sum-exactness") return sum_exactness();
  if (section == "fp8") return fp8();
  if (section == "claims") return claims();
  std::fprintf(stderr, "unknown section '%s'; %s", section.c_str(), usage);
  return 2;
}
