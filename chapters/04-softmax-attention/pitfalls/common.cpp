// Chapter 04 — numerically stable softmax, cross-entropy and attention: the
// helpers the chapter's pitfalls share (declared and described in common.hpp).
// Depends on: common.hpp, mpt/core/dtype.hpp (format_of),
// mpt/formats/format.hpp (limits_of); <algorithm>, <cmath>, <cstddef>,
// <limits>.
#include "common.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "mpt/core/dtype.hpp"
#include "mpt/formats/format.hpp"

namespace mpt::ch04 {

namespace {
const Limits& fp16_limits() {
  static const Limits l = limits_of(format_of(DType::f16).spec);
  return l;
}

// The row of `width` doubles starting at z[at], softmax or log-softmax.
void fp64_row(const std::vector<float>& z, std::size_t at, std::int64_t width, bool log, double* out) {
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < width; ++j) m = std::max(m, static_cast<double>(z[at + j]));
  double s = 0;
  for (std::int64_t j = 0; j < width; ++j) s += std::exp(static_cast<double>(z[at + j]) - m);
  for (std::int64_t j = 0; j < width; ++j) {
    const double d = static_cast<double>(z[at + j]) - m;
    out[j] = log ? d - std::log(s) : std::exp(d) / s;
  }
}
}  // namespace

double fp16_max() { return fp16_limits().max; }
double fp16_min_subnormal() { return fp16_limits().min_subnormal; }

std::vector<float> values_of(const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  t.to_f32(v.data());
  return v;
}

std::vector<float> rounded_to_fp16(std::vector<float> v) {
  for (float& x : v) x = h(x);
  return v;
}

std::vector<double> fp64_softmax(const std::vector<float>& z, std::int64_t rows, std::int64_t width) {
  std::vector<double> p(z.size());
  for (std::int64_t i = 0; i < rows; ++i) {
    const auto at = static_cast<std::size_t>(i * width);
    fp64_row(z, at, width, false, p.data() + at);
  }
  return p;
}

std::vector<double> fp64_log_softmax(const std::vector<float>& z, std::int64_t rows, std::int64_t width) {
  std::vector<double> p(z.size());
  for (std::int64_t i = 0; i < rows; ++i) {
    const auto at = static_cast<std::size_t>(i * width);
    fp64_row(z, at, width, true, p.data() + at);
  }
  return p;
}

std::vector<double> fp64_attention(const std::vector<float>& q, const std::vector<float>& k,
                                   const std::vector<float>& v, const AttentionDims& g, double scale,
                                   const std::vector<std::uint8_t>& keep) {
  std::vector<double> out(static_cast<std::size_t>(g.n * g.lq * g.dv), 0.0);
  std::vector<double> t(static_cast<std::size_t>(g.lk));
  std::vector<bool> kept(static_cast<std::size_t>(g.lk));
  for (std::int64_t n = 0; n < g.n; ++n)
    for (std::int64_t i = 0; i < g.lq; ++i) {
      double m = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = 0; j < g.lk; ++j) {
        const auto jj = static_cast<std::size_t>(j);
        kept[jj] = keep.empty() || keep[static_cast<std::size_t>((n * g.lq + i) * g.lk + j)] != 0;
        double s = 0;
        for (std::int64_t c = 0; c < g.d; ++c)
          s += static_cast<double>(q[static_cast<std::size_t>((n * g.lq + i) * g.d + c)]) *
               static_cast<double>(k[static_cast<std::size_t>((n * g.lk + j) * g.d + c)]);
        t[jj] = s * scale;
        if (kept[jj]) m = std::max(m, t[jj]);
      }
      if (m == -std::numeric_limits<double>::infinity()) continue;  // no key: the output row stays 0
      double sum = 0;
      for (std::int64_t j = 0; j < g.lk; ++j)
        if (kept[static_cast<std::size_t>(j)]) sum += std::exp(t[static_cast<std::size_t>(j)] - m);
      for (std::int64_t j = 0; j < g.lk; ++j) {
        if (!kept[static_cast<std::size_t>(j)]) continue;
        const double p = std::exp(t[static_cast<std::size_t>(j)] - m) / sum;
        for (std::int64_t c = 0; c < g.dv; ++c)
          out[static_cast<std::size_t>((n * g.lq + i) * g.dv + c)] +=
              p * static_cast<double>(v[static_cast<std::size_t>((n * g.lk + j) * g.dv + c)]);
      }
    }
  return out;
}

Errors compare(const std::vector<float>& y, const std::vector<double>& ref) {
  const double inf = std::numeric_limits<double>::infinity();
  Errors r;
  for (std::size_t e = 0; e < y.size(); ++e) {
    const double v = y[e];
    r.nan += std::isnan(v);
    r.inf += std::isinf(v);
    const double err = std::fabs(v - ref[e]);
    if (!std::isfinite(err)) {
      r.max_error = inf;
      r.worst_ulps = inf;
      continue;
    }
    r.max_error = std::max(r.max_error, err);
    r.worst_ulps = std::max(r.worst_ulps, err / fp16_ulp(ref[e]));
  }
  return r;
}

}  // namespace mpt::ch04
