// Chapter 04 — numerically stable softmax, cross-entropy and attention: the
// helpers the chapter's pitfalls share (declared and described in common.hpp).
// Depends on: common.hpp, mpt/core/context.hpp, mpt/core/dtype.hpp
// (format_of), mpt/core/policy.hpp (uniform_policy), mpt/formats/format.hpp
// (limits_of), mpt/nn/layers/softmax.hpp (softmax); <algorithm>, <cmath>,
// <cstddef>, <limits>.
#include "common.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>

#include "mpt/core/context.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/nn/layers/softmax.hpp"

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

std::vector<double> attention_error_bound(const std::vector<float>& q, const std::vector<float>& k,
                                          const std::vector<float>& v, const AttentionDims& g, double scale,
                                          const AttentionRounding& r, const std::vector<std::uint8_t>& keep) {
  constexpr double kLambda = 5;  // Hoeffding: exceeded with probability at most 2·e^(−λ²/2)
  const double f32_unit = std::ldexp(1.0, -24), keys = static_cast<double>(g.lk);
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  // Half the fp16 spacing at x where the value is rounded into fp16, else 0.
  const auto half_spacing = [](bool rounded, double x) { return rounded ? fp16_ulp(x) / 2 : 0.0; };
  const std::vector<double> out = fp64_attention(q, k, v, g, scale, keep);
  std::vector<double> bound(out.size(), 0.0);
  std::vector<double> s(at(g.lk)), p(at(g.lk)), score_error(at(g.lk)), sum_error(at(g.lk));
  for (std::int64_t n = 0; n < g.n; ++n)
    for (std::int64_t i = 0; i < g.lq; ++i) {
      const auto kept = [&](std::int64_t j) {
        return keep.empty() || keep[at((n * g.lq + i) * g.lk + j)] != 0;
      };
      const auto q_at = [&](std::int64_t c) { return static_cast<double>(q[at((n * g.lq + i) * g.d + c)]); };
      const auto k_at = [&](std::int64_t j, std::int64_t c) {
        return static_cast<double>(k[at((n * g.lk + j) * g.d + c)]);
      };
      const auto v_at = [&](std::int64_t j, std::int64_t c) {
        return static_cast<double>(v[at((n * g.lk + j) * g.dv + c)]);
      };
      // The scores in FP64; each one's stored rounding and FP32-sum error;
      // the row's largest score error Δ, worst case, for the remainder.
      double m = -std::numeric_limits<double>::infinity(), delta = 0;
      for (std::int64_t j = 0; j < g.lk; ++j) {
        double dot = 0, abs_dot = 0, from_q = 0;
        for (std::int64_t c = 0; c < g.d; ++c) {
          dot += q_at(c) * k_at(j, c);
          abs_dot += std::fabs(q_at(c) * k_at(j, c));
          from_q += std::fabs(k_at(j, c)) * half_spacing(r.q_scaled, q_at(c) * scale);
        }
        s[at(j)] = dot * scale;
        score_error[at(j)] =
            r.scores_unscaled ? half_spacing(r.scores, dot) * scale : half_spacing(r.scores, s[at(j)]);
        sum_error[at(j)] =
            static_cast<double>(g.d) * f32_unit * scale * abs_dot + f32_unit * std::fabs(s[at(j)]);
        if (!kept(j)) continue;
        m = std::max(m, s[at(j)]);
        delta = std::max(delta, score_error[at(j)] + from_q + sum_error[at(j)]);
      }
      if (m == -std::numeric_limits<double>::infinity()) continue;  // no key: the output is 0, exactly
      double sum = 0;
      for (std::int64_t j = 0; j < g.lk; ++j) sum += kept(j) ? std::exp(s[at(j)] - m) : 0.0;
      for (std::int64_t j = 0; j < g.lk; ++j) p[at(j)] = kept(j) ? std::exp(s[at(j)] - m) / sum : 0.0;
      const double grow = std::exp(2 * delta);
      for (std::int64_t c = 0; c < g.dv; ++c) {
        const auto e = at((n * g.lq + i) * g.dv + c);
        double first = 0, weighted = 0, stored_p = 0;
        for (std::int64_t j = 0; j < g.lk; ++j) {
          const double spread = p[at(j)] * std::fabs(v_at(j, c) - out[e]);
          first += spread * (score_error[at(j)] + sum_error[at(j)]);
          weighted += p[at(j)] * std::fabs(v_at(j, c));
          stored_p += (r.probs ? fp16_ulp(p[at(j)] * grow) / 2 : (keys + 4) * f32_unit * p[at(j)]) *
                      std::fabs(v_at(j, c));
        }
        if (r.q_scaled) {
          double sq = 0;
          for (std::int64_t cc = 0; cc < g.d; ++cc) {
            double a = 0;  // a_cc = Σ_j P_j (v_jc − out_c) k_j,cc
            for (std::int64_t j = 0; j < g.lk; ++j) a += p[at(j)] * (v_at(j, c) - out[e]) * k_at(j, cc);
            const double rho = half_spacing(true, q_at(cc) * scale);
            sq += rho * rho * a * a;
          }
          first += kLambda * std::sqrt(sq);
        }
        // The second-order remainder: e^x − 1 − x for |x| <= 2Δ, and the gap
        // between log Σ_k P_k e^δ_k and Σ_k P_k δ_k, at most Δ²/2 (Hoeffding's lemma).
        const double remainder = grow - 1 - 2 * delta + delta * delta / 2;
        const double moved = first + remainder * grow * weighted + stored_p;
        const double summed = moved + keys * f32_unit * (weighted + moved);
        bound[e] = summed + half_spacing(r.out, std::fabs(out[e]) + summed);
      }
    }
  return bound;
}

double error_to_bound(const std::vector<float>& y, const std::vector<double>& ref,
                      const std::vector<double>& bound, const std::vector<std::uint8_t>& use) {
  const double inf = std::numeric_limits<double>::infinity();
  double worst = 0;
  for (std::size_t e = 0; e < y.size(); ++e) {
    if (!use.empty() && use[e] == 0) continue;
    const double err = std::fabs(static_cast<double>(y[e]) - ref[e]);
    if (!std::isfinite(err)) return inf;
    if (err == 0) continue;
    worst = std::max(worst, bound[e] > 0 ? err / bound[e] : inf);
  }
  return worst;
}

// ---------------------------------------------------------------------------
// The masking pitfalls' batch.

double MaskedBatch::scale() { return 1.0 / std::sqrt(static_cast<double>(kDim)); }

const MaskedBatch& masked_batch() {
  static const MaskedBatch b = [] {
    constexpr std::int64_t n = MaskedBatch::kBatch * MaskedBatch::kLen * MaskedBatch::kDim;
    MaskedBatch r;
    r.q = rounded_to_fp16(normal_values(n, 0, 4, 406));
    r.k = rounded_to_fp16(normal_values(n, 0, 4, 407));
    r.v = rounded_to_fp16(normal_values(n, 0, 1, 408));
    for (std::int64_t s = 0; s < MaskedBatch::kBatch; ++s)
      for (std::int64_t i = 0; i < MaskedBatch::kLen; ++i)
        for (std::int64_t j = 0; j < MaskedBatch::kLen; ++j) {
          const bool causal = j <= i, real = !(s == 0 && j < MaskedBatch::kPad);
          r.causal.push_back(causal);
          r.padding.push_back(real);
          r.keep.push_back(causal && real);
        }
    return r;
  }();
  return b;
}

std::vector<float> masked_batch_scores() {
  const MaskedBatch& b = masked_batch();
  constexpr std::int64_t len = MaskedBatch::kLen, dim = MaskedBatch::kDim;
  const auto scale = static_cast<float>(MaskedBatch::scale());
  std::vector<float> s(static_cast<std::size_t>(MaskedBatch::kBatch * len * len));
  for (std::int64_t seq = 0; seq < MaskedBatch::kBatch; ++seq)
    for (std::int64_t i = 0; i < len; ++i)
      for (std::int64_t j = 0; j < len; ++j) {
        float dot = 0;
        for (std::int64_t c = 0; c < dim; ++c)
          dot += b.q[static_cast<std::size_t>((seq * len + i) * dim + c)] *
                 b.k[static_cast<std::size_t>((seq * len + j) * dim + c)];
        s[static_cast<std::size_t>((seq * len + i) * len + j)] = h(dot * scale);
      }
  return s;
}

std::vector<float> masked_batch_output(const std::vector<float>& p) {
  const MaskedBatch& b = masked_batch();
  constexpr std::int64_t len = MaskedBatch::kLen, dim = MaskedBatch::kDim;
  std::vector<float> o(static_cast<std::size_t>(MaskedBatch::kBatch * len * dim), 0.0f);
  for (std::int64_t seq = 0; seq < MaskedBatch::kBatch; ++seq)
    for (std::int64_t i = 0; i < len; ++i)
      for (std::int64_t j = 0; j < len; ++j)
        for (std::int64_t c = 0; c < dim; ++c)
          o[static_cast<std::size_t>((seq * len + i) * dim + c)] +=
              p[static_cast<std::size_t>((seq * len + i) * len + j)] *
              b.v[static_cast<std::size_t>((seq * len + j) * dim + c)];
  return rounded_to_fp16(std::move(o));
}

std::vector<float> fp32_softmax_rows(const std::vector<float>& t) {
  Context ctx(uniform_policy(DType::f32));
  constexpr std::int64_t len = MaskedBatch::kLen;
  return values_of(softmax(Tensor::from_f32(t.data(), {MaskedBatch::kBatch, 1, len, len}, DType::f32), ctx));
}

std::vector<float> fp32_safe_softmax_rows(const std::vector<float>& t) {
  constexpr std::int64_t len = MaskedBatch::kLen, rows = MaskedBatch::kBatch * len;
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  //! [fully-masked-row-nan-safe]
  std::vector<float> p = fp32_softmax_rows(t);  // a row of −inf only: NaN
  for (std::int64_t row = 0; row < rows; ++row) {
    const auto first = t.begin() + static_cast<std::ptrdiff_t>(row * len);
    if (std::all_of(first, first + len, [](float z) { return z == neg_inf; }))  // no key left: 0
      std::fill_n(p.begin() + static_cast<std::ptrdiff_t>(row * len), len, 0.0f);
  }
  //! [fully-masked-row-nan-safe]
  return p;
}

std::vector<std::uint8_t> masked_batch_kept_outputs() {
  const MaskedBatch& b = masked_batch();
  constexpr std::int64_t len = MaskedBatch::kLen, dim = MaskedBatch::kDim;
  std::vector<std::uint8_t> use;
  for (std::int64_t row = 0; row < MaskedBatch::kBatch * len; ++row) {
    bool any = false;
    for (std::int64_t j = 0; j < len; ++j) any = any || b.keep[static_cast<std::size_t>(row * len + j)] != 0;
    use.insert(use.end(), static_cast<std::size_t>(dim), any ? 1 : 0);
  }
  return use;
}

}  // namespace mpt::ch04
