// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the helpers the
// chapter's pitfalls share (declared and described in common.hpp).
// Depends on: common.hpp, mpt/core/dtype.hpp (format_of), mpt/core/random.hpp
// (Rng), mpt/formats/format.hpp (limits_of), mpt/formats/rounding.hpp
// (round_value); <algorithm>, <cmath>, <cstddef>, <limits>.
#include "common.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "mpt/core/dtype.hpp"
#include "mpt/core/random.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/formats/rounding.hpp"

namespace mpt::ch03 {

namespace {
const Format& fp16_format() { return format_of(DType::f16); }
const Limits& fp16_limits() {
  static const Limits l = limits_of(fp16_format().spec);
  return l;
}
}  // namespace

float h(float x) { return round_value(x, fp16_format()); }

double fp16_ulp(double x) {
  const Limits& l = fp16_limits();
  const double a = std::fabs(x);
  if (!(a >= l.min_normal)) return l.min_subnormal;
  int e = 0;
  std::frexp(a, &e);  // a = m·2^e with m in [0.5, 1): the leading bit is 2^(e−1)
  return std::ldexp(1.0, e - l.precision);
}

Fp16Rounding fp16_rounding(double v) {
  const double r = h(static_cast<float>(v));
  int bits = 0;
  if (r != 0 && std::isfinite(r)) {
    const Limits& l = fp16_limits();
    if (std::fabs(r) >= l.min_normal) {
      bits = l.precision;
    } else {
      // A subnormal is k·2^-24 with k < 2^10: its significant bits are k's.
      for (double k = std::fabs(r) / l.min_subnormal; k >= 1; k /= 2) ++bits;
    }
  }
  return {r, bits};
}

double variance_from_invstd(double invstd, double eps) { return 1.0 / (invstd * invstd) - eps; }

std::vector<float> normal_values(std::int64_t n, double mean, double std, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = static_cast<float>(mean + std * rng.normal());
  return v;
}

Fp64Stats fp64_statistics(const std::vector<float>& x, const norm_math::Layout& l) {
  Fp64Stats s;
  s.mean.assign(static_cast<std::size_t>(l.channels), 0.0);
  s.var.assign(static_cast<std::size_t>(l.channels), 0.0);
  const auto m = static_cast<double>(l.count());
  for (std::int64_t c = 0; c < l.channels; ++c) {
    double sum = 0;
    for (std::int64_t n = 0; n < l.outer; ++n)
      for (std::int64_t i = 0; i < l.inner; ++i) sum += x[static_cast<std::size_t>(l.offset(n, c, i))];
    const double mean = sum / m;
    double sq = 0;
    for (std::int64_t n = 0; n < l.outer; ++n)
      for (std::int64_t i = 0; i < l.inner; ++i) {
        const double d = x[static_cast<std::size_t>(l.offset(n, c, i))] - mean;
        sq += d * d;
      }
    s.mean[static_cast<std::size_t>(c)] = mean;
    s.var[static_cast<std::size_t>(c)] = sq / m;
  }
  return s;
}

std::vector<double> fp64_normalize(const std::vector<float>& x, const norm_math::Layout& l,
                                   const Fp64Stats& s, double eps) {
  std::vector<double> y(x.size());
  for (std::int64_t n = 0; n < l.outer; ++n)
    for (std::int64_t c = 0; c < l.channels; ++c) {
      const auto k = static_cast<std::size_t>(c);
      const double invstd = 1.0 / std::sqrt(s.var[k] + eps);
      for (std::int64_t i = 0; i < l.inner; ++i) {
        const auto e = static_cast<std::size_t>(l.offset(n, c, i));
        y[e] = (x[e] - s.mean[k]) * invstd;
      }
    }
  return y;
}

OutputErrors compare_outputs(const std::vector<float>& y, const std::vector<double>& ref,
                             const norm_math::Layout& l) {
  const double inf = std::numeric_limits<double>::infinity();
  OutputErrors r;
  r.channels = static_cast<double>(l.channels);
  for (std::int64_t c = 0; c < l.channels; ++c) {
    bool all_zero = true, ref_zero = true;
    for (std::int64_t n = 0; n < l.outer; ++n)
      for (std::int64_t i = 0; i < l.inner; ++i) {
        const auto e = static_cast<std::size_t>(l.offset(n, c, i));
        const double v = y[e], want = ref[e];
        all_zero = all_zero && v == 0;
        ref_zero = ref_zero && want == 0;
        r.nan += std::isnan(v);
        r.inf += std::isinf(v);
        const double err = std::fabs(v - want);
        if (!std::isfinite(err)) {
          r.max_error = inf;
          r.worst_ulps = inf;
          r.off += 1;
          continue;
        }
        r.max_error = std::max(r.max_error, err);
        const double ulps = err / fp16_ulp(std::max(std::fabs(want), 1.0));
        r.worst_ulps = std::max(r.worst_ulps, ulps);
        r.off += ulps > 1;
      }
    r.collapsed += all_zero && !ref_zero;
  }
  return r;
}

}  // namespace mpt::ch03
