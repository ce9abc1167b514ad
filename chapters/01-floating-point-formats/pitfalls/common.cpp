// Chapter 01 — floating-point formats and their limits: the helpers the
// chapter's pitfalls share (declared and described in common.hpp).
// Depends on: common.hpp, mpt/formats/explain.hpp (shortest_decimal,
// power_of_two_or_decimal), mpt/formats/format.hpp; <cmath>, <cstdio>,
// <string>, <utility>.
#include "common.hpp"

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "mpt/formats/explain.hpp"
#include "mpt/formats/format.hpp"

namespace mpt::ch01 {

const Format& fp16() { return format_named("fp16"); }
const Format& fp32() { return format_named("fp32"); }

double unit_roundoff(const Format& f) { return limits_of(f.spec).unit_roundoff; }

double ulp_in(const Format& f, double x) {
  const Limits l = limits_of(f.spec);
  int e = l.emin;
  if (x != 0.0) {
    int k = 0;
    std::frexp(std::fabs(x), &k);  // |x| = m * 2^k with m in [0.5, 1)
    e = k - 1 > l.emin ? k - 1 : l.emin;
  }
  return std::ldexp(1.0, e - f.spec.mantissa_bits);
}

std::string num(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.8g", v);
  return buf;
}
std::string num(float v) { return shortest_decimal(v); }

std::string p2(double x) { return power_of_two_or_decimal(x); }

Check check(std::string claim, std::function<bool(const RunResult&)> holds) {
  return Check{std::move(claim), std::move(holds)};
}

}  // namespace mpt::ch01
