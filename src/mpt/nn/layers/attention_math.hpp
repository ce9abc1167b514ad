// Chapter 04 — numerically stable attention: the formulas of one query row.
// Depends on: softmax_math.hpp (MaxSum, max_sum_add, exp_in), format_spec.hpp
// (MPT_HD). Host-and-device and templated on the scalar: the CPU attention
// (attention.cpp) runs the softmax pieces in float, the tests run the whole
// row in double against finite differences, and a CUDA kernel can call the
// same functions.
//
// Scaled dot-product attention of one query row q (D values) against Lk keys
// and values (PyTorch's torch.nn.functional.scaled_dot_product_attention):
//
//   s_j = q·k_j                      the raw score (a GEMM's output)
//   t_j = s_j·scale + mask_j         −inf where the mask says "does not take part"
//   p   = softmax(t)                 one online (max, sum) pass, then exp(t − max)/sum
//   o   = Σ_j p_j v_j
//
// A row whose every t_j is −inf (every position masked) has no softmax: its
// (max, sum) is {−inf, 0} and exp(−inf − (−inf)) would be NaN. PyTorch's math
// backend gives such a row zeros (at::_safe_softmax in
// aten/src/ATen/native/transformers/attention.cpp: "where every input is
// −inf, the output is 0"), and so does row_prob(): p = 0, o = 0, and no
// gradient flows through the row.
//
// Backward, with dp_j = dout·v_j:
//
//   dv_j += p_j·dout,  ds_j = p_j (dp_j − Σ_k p_k dp_k),
//   dq = scale·Σ_j ds_j k_j,  dk_j += scale·ds_j q.
#pragma once

#include <limits>

#include "mpt/formats/format_spec.hpp"
#include "mpt/nn/layers/softmax_math.hpp"

namespace mpt {

/// Scaled dot-product attention's formulas for one query row, host and device.
namespace attention_math {

/// The score t of one position from its raw product s: −inf when the
/// position does not take part (`keep` false: a boolean or causal mask says
/// so, whatever s is, so an overflowed or NaN score at a masked position
/// cannot reach the row), else s·post_scale + add (an additive mask's value,
/// 0 without one; an additive −inf gives −inf for any finite s).
template <class T>
MPT_HD inline T score(T s, T post_scale, bool keep, T add) {
  if (!keep) return -std::numeric_limits<T>::infinity();
  return s * post_scale + add;
}

/// One probability of a row whose (max, sum) is `ms`: exp(t − max)/sum, or 0
/// when the row has no position that takes part (sum 0: every score −inf).
template <class T>
MPT_HD inline T row_prob(const MaxSum<T>& ms, T t) {
  if (ms.sum == T(0)) return T(0);
  return exp_in(t - ms.max) / ms.sum;
}

/// The softmax of the n scores t into p: one online (max, sum) pass (MaxSum)
/// and one pass of row_prob. Returns the row's (max, sum).
template <class T>
MPT_HD inline MaxSum<T> row_softmax(const T* t, int n, T* p) {
  MaxSum<T> ms;
  for (int j = 0; j < n; ++j) max_sum_add(ms, t[j]);
  for (int j = 0; j < n; ++j) p[j] = row_prob(ms, t[j]);
  return ms;
}

/// The softmax's backward for one row: ds_j = p_j (dp_j − Σ_k p_k dp_k),
/// the sum in T. A row of zeros (fully masked) gives ds = 0.
template <class T>
MPT_HD inline void row_softmax_backward(const T* p, const T* dp, int n, T* ds) {
  T dot = T(0);
  for (int j = 0; j < n; ++j) dot += p[j] * dp[j];
  for (int j = 0; j < n; ++j) ds[j] = p[j] * (dp[j] - dot);
}

/// What decides which of a row's positions take part, and what is added to
/// their scores: keep[j] (nullptr: all), add[j] (nullptr: 0), and only
/// positions j < visible (the causal mask: visible = i + 1 for row i; Lk for
/// none).
template <class T>
struct RowMask {
  const unsigned char* keep = nullptr;  ///< boolean mask row (nonzero = takes part), or nullptr
  const T* add = nullptr;               ///< additive mask row, or nullptr
  int visible = 0;                      ///< positions j >= visible do not take part
};

/// Whole-row forward in T: t_j = score(q·k_j, scale, ...), p = softmax(t),
/// o = Σ_j p_j v_j. q is [d], k [lk, d] and v [lk, dv] row-major; t and p
/// receive lk values, o dv. Every product and sum in T.
template <class T>
MPT_HD inline void row_forward(const T* q, const T* k, const T* v, int lk, int d, int dv, T scale,
                               const RowMask<T>& mask, T* t, T* p, T* o) {
  for (int j = 0; j < lk; ++j) {
    T s = T(0);
    for (int c = 0; c < d; ++c) s += q[c] * k[j * d + c];
    const bool keep = j < mask.visible && (mask.keep == nullptr || mask.keep[j] != 0);
    t[j] = score(s, scale, keep, mask.add ? mask.add[j] : T(0));
  }
  row_softmax(t, lk, p);
  for (int c = 0; c < dv; ++c) o[c] = T(0);
  for (int j = 0; j < lk; ++j)
    for (int c = 0; c < dv; ++c) o[c] += p[j] * v[j * dv + c];
}

/// Whole-row backward in T from the row's probabilities p (what forward
/// kept) and the output's gradient dout [dv]: writes dq [d] and *adds* this
/// row's part into dk [lk, d] and dv_acc [lk, dv] (every row of a head adds
/// into the same dK and dV). dp and ds are lk values of scratch (ds holds
/// the scores' gradient afterwards). `scale` is the factor between the raw
/// product q·k and the score (1 when the scale went into q first).
template <class T>
MPT_HD inline void row_backward(const T* q, const T* k, const T* v, const T* p, const T* dout, int lk, int d,
                                int dv, T scale, T* dp, T* ds, T* dq, T* dk, T* dv_acc) {
  for (int j = 0; j < lk; ++j) {
    T s = T(0);
    for (int c = 0; c < dv; ++c) {
      s += dout[c] * v[j * dv + c];
      dv_acc[j * dv + c] += p[j] * dout[c];
    }
    dp[j] = s;
  }
  row_softmax_backward(p, dp, lk, ds);
  for (int c = 0; c < d; ++c) dq[c] = T(0);
  for (int j = 0; j < lk; ++j) {
    const T g = scale * ds[j];
    for (int c = 0; c < d; ++c) {
      dq[c] += g * k[j * d + c];
      dk[j * d + c] += g * q[c];
    }
  }
}

}  // namespace attention_math

}  // namespace mpt
