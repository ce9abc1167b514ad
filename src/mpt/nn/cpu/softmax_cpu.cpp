// Chapter 04 — numerically stable softmax and cross-entropy: the fused CPU
// kernel, its portable loops and the dispatch to the AVX2 ones.
// Depends on: softmax_cpu.hpp, softmax_math.hpp (rows with NaN or inf),
// cpu_dispatch.hpp, the core tier (load_from, store_as).
#include "mpt/nn/cpu/softmax_cpu.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/formats/cpu_dispatch.hpp"
#include "mpt/nn/layers/softmax_math.hpp"

namespace mpt::softmax_cpu {

namespace {

constexpr int kLanes = 8;
using detail::kExpPoly;
using detail::kLn2Hi;
using detail::kLn2Lo;
using detail::kLog2e;

bool use_avx2(Implementation impl) {
  return detail::use_avx2(impl,
                          "softmax_cpu: the AVX2 path was asked for, but this CPU or build has no AVX2, FMA "
                          "and F16C; use Implementation::portable or automatic");
}

/// The 8 lane partial results combined pairwise: ((0 1)(2 3))((4 5)(6 7)).
float lane_tree(const float* l) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }

float widen(std::uint16_t code) {
  float v = 0;
  load_from(DType::f16, &code, &v, 1);
  return v;
}

std::uint16_t narrow(float v) {
  std::uint16_t code = 0;
  store_as(DType::f16, &v, &code, 1);
  return code;
}

/// Pass 1, portable: the lanes of row_max_avx2, then the rest. A NaN is
/// passed over (v > max is false), as the vector max passes it over; pass 2
/// sees it.
float row_max(const std::uint16_t* z, std::int64_t n, bool avx2) {
  const std::int64_t n8 = n - n % kLanes;
  float m = -std::numeric_limits<float>::infinity();
#if defined(MPT_HAVE_AVX2_PATH)
  if (avx2) {
    m = detail::row_max_avx2(z, n);
  } else
#endif
  {
    (void)avx2;
    float mx[kLanes];
    for (float& v : mx) v = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < n8; j += kLanes)
      for (int k = 0; k < kLanes; ++k) {
        const float v = widen(z[j + k]);
        mx[k] = v > mx[k] ? v : mx[k];
      }
    m = mx[0];
    for (int k = 1; k < kLanes; ++k) m = mx[k] > m ? mx[k] : m;
  }
  for (std::int64_t j = n8; j < n; ++j) {
    const float v = widen(z[j]);
    m = v > m ? v : m;
  }
  return m;
}

/// Pass 2, portable: e[j] = exp_fused(z[j] − m), their sum s and the sum
/// of the shifted logits Σ(z[j] − m), in lanes.
void row_exp_sum(const std::uint16_t* z, std::int64_t n, float m, bool avx2, float* e, float* s,
                 float* shifted) {
  std::int64_t done = 0;
#if defined(MPT_HAVE_AVX2_PATH)
  if (avx2) done = detail::row_exp_sum_avx2(z, n, m, e, s, shifted);
#endif
  if (!avx2) {
    const std::int64_t n8 = n - n % kLanes;
    float sm[kLanes] = {}, sh[kLanes] = {};
    for (std::int64_t j = 0; j < n8; j += kLanes)
      for (int k = 0; k < kLanes; ++k) {
        const float d = widen(z[j + k]) - m;
        sm[k] += (e[j + k] = exp_shifted(d));
        sh[k] += d;
      }
    *s = lane_tree(sm);
    *shifted = lane_tree(sh);
    done = n8;
  }
  for (std::int64_t j = done; j < n; ++j) {
    const float d = widen(z[j]) - m;
    *s += (e[j] = exp_shifted(d));
    *shifted += d;
  }
}

/// Pass 3, portable: grad[j] = fp16((e[j]·inv_s − c)·g).
void row_grad(const float* e, std::int64_t n, float inv_s, float c, float g, bool avx2, std::uint16_t* grad) {
  std::int64_t done = 0;
#if defined(MPT_HAVE_AVX2_PATH)
  if (avx2) done = detail::row_grad_avx2(e, n, inv_s, c, g, grad);
#else
  (void)avx2;
#endif
  for (std::int64_t j = done; j < n; ++j) grad[j] = narrow((e[j] * inv_s - c) * g);
}

/// The loss of a row from log s, the target's shifted logit z_y − m and
/// the shifted sum Σ(z − m): (1 − ε)(log s − (z_y − m)) + ε(log s − Σ(z − m)/K).
/// Each term is a difference of small numbers (z − m ≤ 0 is exact for fp16
/// logits in FP32), where lse − z_y would cancel two large ones. The ε term
/// is left out for ε = 0, so that an infinite logit elsewhere cannot make
/// it 0·NaN (PyTorch's plain NLL part alone).
float row_loss_of(float log_s, float zy_shifted, float shifted_sum, std::int64_t n, float eps) {
  const float nll = log_s - zy_shifted;
  if (eps == 0.0f) return nll;
  return (1.0f - eps) * nll + eps * (log_s - shifted_sum / static_cast<float>(n));
}

/// A row with a NaN or an infinite logit, through the reference's MaxSum
/// (what PyTorch gives: NaN somewhere, usually everywhere).
float nonfinite_row(const std::uint16_t* z, std::int64_t n, int y, float eps, float g, std::uint16_t* grad) {
  MaxSum<float> ms;
  float shifted = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) max_sum_add(ms, widen(z[j]));
  for (std::int64_t j = 0; j < n; ++j) shifted += widen(z[j]) - ms.max;
  const float inv_s = 1.0f / ms.sum, c = eps / static_cast<float>(n);
  for (std::int64_t j = 0; j < n; ++j) {
    const float p = exp_in(widen(z[j]) - ms.max) * inv_s;
    grad[j] = narrow(((p - c) - (j == y ? 1.0f - eps : 0.0f)) * g);
  }
  return row_loss_of(log_in(ms.sum), widen(z[y]) - ms.max, shifted, n, eps);
}

void check(std::int64_t rows, std::int64_t classes, const int* targets, const FusedOptions& o,
           const char* who) {
  if (rows < 1 || classes < 1)
    throw std::invalid_argument(std::string(who) + ": logits are [" + std::to_string(rows) + ", " +
                                std::to_string(classes) + "]; both must be at least 1");
  if (!(o.label_smoothing >= 0.0f && o.label_smoothing <= 1.0f))
    throw std::invalid_argument(std::string(who) + ": label_smoothing " + std::to_string(o.label_smoothing) +
                                " is outside [0, 1]");
  for (std::int64_t i = 0; i < rows; ++i) {
    const int y = targets[i];
    if (y != o.ignore_index && (y < 0 || y >= classes))
      throw std::invalid_argument(std::string(who) + ": target " + std::to_string(y) + " of row " +
                                  std::to_string(i) + " is out of bounds (classes 0.." +
                                  std::to_string(classes - 1) + ", or ignore_index " +
                                  std::to_string(o.ignore_index) + ")");
  }
}

/// The upstream gradient of each counted row: dloss / count for the mean.
float row_gradient_factor(std::int64_t rows, const int* targets, const FusedOptions& o, std::int64_t* count) {
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < rows; ++i) counted += targets[i] != o.ignore_index ? 1 : 0;
  *count = counted;
  return o.mean ? o.dloss / static_cast<float>(counted) : o.dloss;
}

}  // namespace

namespace {

/// e^x for x in [−87, 88]: the operations of detail::exp8_core, one lane.
float exp_core(float x) {
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kExpPoly[6];
  for (int k = 5; k >= 0; --k) p = std::fma(p, r, kExpPoly[k]);
  // ·2ⁿ: n added to the exponent field (p ∈ [0.7, 1.5] and n ≥ −126 keep
  // the result normal). A NaN's n adds 0, as the vector conversion's
  // INT32_MIN shifted by 23 does.
  const std::uint32_t n_bits = static_cast<std::uint32_t>(n != n ? 0 : static_cast<std::int32_t>(n)) << 23;
  std::uint32_t bits = 0;
  std::memcpy(&bits, &p, sizeof bits);
  bits += n_bits;
  float y = 0;
  std::memcpy(&y, &bits, sizeof y);
  return y;
}

}  // namespace

float exp_fused(float x) {
  float xc = -87.0f > x ? -87.0f : x;  // the vector max's and min's rules: a NaN x stays x
  xc = 88.0f < xc ? 88.0f : xc;
  float y = exp_core(xc);
  y = x < -87.0f ? 0.0f : y;
  return x > 88.0f ? std::numeric_limits<float>::infinity() : y;
}

float exp_shifted(float d) { return exp_core(-87.0f > d ? -87.0f : d); }

void exp_fused_array(const float* x, float* y, std::int64_t n, Implementation impl) {
  std::int64_t done = 0;
#if defined(MPT_HAVE_AVX2_PATH)
  if (use_avx2(impl)) done = detail::exp_fused_avx2(x, y, n);
#else
  (void)use_avx2(impl);
#endif
  for (std::int64_t j = done; j < n; ++j) y[j] = exp_fused(x[j]);
}

float fused_cross_entropy_f16(const std::uint16_t* logits, std::int64_t rows, std::int64_t classes,
                              const int* targets, const FusedOptions& o, std::uint16_t* grad, float* row_loss,
                              Implementation impl) {
  check(rows, classes, targets, o, "fused_cross_entropy_f16");
  const bool avx2 = use_avx2(impl);
  std::int64_t counted = 0;
  const float g = row_gradient_factor(rows, targets, o, &counted);
  const float eps = o.label_smoothing, c = eps / static_cast<float>(classes);
  std::vector<float> e(static_cast<std::size_t>(classes));
  float total = 0.0f;
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::uint16_t* z = logits + i * classes;
    std::uint16_t* d = grad + i * classes;
    const int y = targets[i];
    if (y == o.ignore_index) {
      std::memset(d, 0, static_cast<std::size_t>(classes) * sizeof(std::uint16_t));
      if (row_loss) row_loss[i] = 0.0f;
      continue;
    }
    const float m = row_max(z, classes, avx2);
    float s = 0, shifted = 0, loss = 0;
    row_exp_sum(z, classes, m, avx2, e.data(), &s, &shifted);
    if (!std::isfinite(m) || !std::isfinite(s)) {
      // A NaN or +inf logit (or a row of −inf only) reached the sum: the
      // row again, through the reference's MaxSum.
      loss = nonfinite_row(z, classes, y, eps, g, d);
    } else {
      loss = row_loss_of(std::log(s), widen(z[y]) - m, shifted, classes, eps);
      const float inv_s = 1.0f / s;
      row_grad(e.data(), classes, inv_s, c, g, avx2, d);
      d[y] = narrow(((e[static_cast<std::size_t>(y)] * inv_s - c) - (1.0f - eps)) * g);
    }
    if (row_loss) row_loss[i] = loss;
    total += loss;
  }
  return o.mean ? total / static_cast<float>(counted) : total;
}

float unfused_cross_entropy_f16(const std::uint16_t* logits, std::int64_t rows, std::int64_t classes,
                                const int* targets, const FusedOptions& o, std::uint16_t* grad,
                                Implementation impl) {
  check(rows, classes, targets, o, "unfused_cross_entropy_f16");
  const bool avx2 = use_avx2(impl);
  std::int64_t counted = 0;
  const float g = row_gradient_factor(rows, targets, o, &counted);
  const float eps = o.label_smoothing, c = eps / static_cast<float>(classes);
  const auto k = static_cast<std::size_t>(classes);
  // 1. log_softmax of every row into an FP32 [rows, classes] buffer.
  std::vector<float> log_p(static_cast<std::size_t>(rows) * k), e(k);
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::uint16_t* z = logits + i * classes;
    float* lp = log_p.data() + static_cast<std::size_t>(i) * k;
    const float m = row_max(z, classes, avx2);
    float s = 0, shifted = 0;
    row_exp_sum(z, classes, m, avx2, e.data(), &s, &shifted);
    const float lse = m + std::log(s);
    std::int64_t done = 0;
#if defined(MPT_HAVE_AVX2_PATH)
    if (avx2) done = detail::row_log_prob_avx2(z, classes, lse, lp);
#endif
    for (std::int64_t j = done; j < classes; ++j) lp[j] = widen(z[j]) - lse;
  }
  // 2. The loss, gathered from the log-probabilities.
  float total = 0.0f;
  for (std::int64_t i = 0; i < rows; ++i) {
    const int y = targets[i];
    if (y == o.ignore_index) continue;
    const float* lp = log_p.data() + static_cast<std::size_t>(i) * k;
    float nll = -lp[y];
    if (eps > 0.0f) {
      float smooth = 0.0f;
      for (std::int64_t j = 0; j < classes; ++j) smooth += lp[j];
      nll = (1.0f - eps) * nll + eps * -(smooth / static_cast<float>(classes));
    }
    total += nll;
  }
  // 3. The gradient from the log-probabilities read back.
  for (std::int64_t i = 0; i < rows; ++i) {
    std::uint16_t* d = grad + i * classes;
    const int y = targets[i];
    if (y == o.ignore_index) {
      std::memset(d, 0, k * sizeof(std::uint16_t));
      continue;
    }
    const float* lp = log_p.data() + static_cast<std::size_t>(i) * k;
    std::int64_t done = 0;
#if defined(MPT_HAVE_AVX2_PATH)
    if (avx2) done = detail::row_grad_from_log_prob_avx2(lp, classes, g, c * g, d);
#endif
    for (std::int64_t j = done; j < classes; ++j) d[j] = narrow(exp_shifted(lp[j]) * g - c * g);
    d[y] = narrow((exp_shifted(lp[y]) - c - (1.0f - eps)) * g);
  }
  return o.mean ? total / static_cast<float>(counted) : total;
}

}  // namespace mpt::softmax_cpu
