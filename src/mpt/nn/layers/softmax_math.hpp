// Chapters 02 onwards — numerically stable softmax and cross-entropy
// (Chapter 04): the online (max, sum) of a row of logits and its merge, and
// the row functions of softmax, log-softmax and cross-entropy built on it
// (Chapter 2's cross_entropy_forward in layer_math.hpp is one of their callers).
// Depends on: format_spec.hpp (for MPT_HD), <cmath>, <cstdint>, <limits>.
// Host-and-device: the CPU softmax and cross-entropy (softmax.cpp), attention
// and the CUDA kernels (kernels/nn/) call these exact functions, so the CPU
// tests cover the code the GPU runs. Templated on the scalar: float is what
// the library accumulates in; double is the reference the tests compare with.
// No Eigen, no std::vector, no exceptions: the callers check their input.
//
// softmax(z)ᵢ = exp(zᵢ − m) / Σⱼ exp(zⱼ − m) for any m; m = max z keeps every
// exponent ≤ 0, so no exp overflows and the largest term is exactly 1 (the
// sum is ≥ 1 and its log is finite). Reading the row once, the maximum is
// not known in advance: keep (m, s) with s = Σ exp(zⱼ − m) over what was
// read, and when a larger logit arrives rescale s by exp(m_old − m_new)
// (Milakov and Gimelshein, "Online normalizer calculation for softmax",
// 2018). Two partial results combine the same way, which is what a parallel
// reduction (a warp, a block) does.
//
// A row that is in memory as a whole is read twice instead (row_max_sum):
// its maximum first, then Σ exp(zⱼ − max) left to right, with no rescaling
// (and so none of its roundings). That is the order of PyTorch's CPU kernels
// (aten/src/ATen/native/cpu/SoftmaxKernel.cpp: max, then the sum of exp(x −
// max)) and of Chapter 2's cross-entropy, whose numbers must not change.
//
// Special values follow PyTorch's softmax, whose two passes give them too:
// a −inf logit is a masked position (probability 0); a row of −inf only, or
// an empty row, has (max, sum) = (−inf, 0) and a softmax of NaN (0/0); a
// +inf logit makes the row's sum NaN (exp(inf − inf)), so the whole row's
// softmax is NaN; a NaN logit makes the whole row NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "mpt/formats/format_spec.hpp"

namespace mpt {

/// The running maximum of a set of logits and the sum of exp(z − max) over
/// them. The empty set is {−inf, 0}. A NaN logit makes both NaN for good.
template <class T>
struct MaxSum {
  T max = -std::numeric_limits<T>::infinity();  ///< the largest logit seen (−inf for none)
  T sum = T(0);                                 ///< Σ exp(z − max) over them (≥ 1 once one is seen)
};

/// exp in T: expf for float, exp for double (on the device too).
MPT_HD inline float exp_in(float x) { return expf(x); }
/// exp in T: expf for float, exp for double (on the device too).
MPT_HD inline double exp_in(double x) { return exp(x); }
/// log in T, as exp_in.
MPT_HD inline float log_in(float x) { return logf(x); }
/// log in T, as exp_in.
MPT_HD inline double log_in(double x) { return log(x); }

/// Add one logit z. A logit of −inf adds exp(−inf) = 0 and changes nothing
/// (a masked position). A +inf logit becomes the maximum and makes the sum
/// NaN, exp(inf − inf), as the two-pass sum of row_max_sum and PyTorch's
/// softmax do (the whole row's softmax is NaN). A NaN logit makes both NaN.
//! [max-sum-add]
template <class T>
MPT_HD inline void max_sum_add(MaxSum<T>& s, T z) {
  if (z != z) {  // NaN: the row's softmax is NaN
    s.max = z;
    s.sum = z;
  } else if (z == std::numeric_limits<T>::infinity()) {
    s.sum = z - z;  // exp(inf − inf): NaN, whatever came before
    s.max = z;
  } else if (z > s.max) {
    s.sum = s.sum * exp_in(s.max - z) + T(1);  // exp(−inf) = 0 for the first logit
    s.max = z;
  } else if (z != -std::numeric_limits<T>::infinity()) {
    s.sum += exp_in(z - s.max);
  }
}
//! [max-sum-add]

/// The (max, sum) of the union of two disjoint sets: the larger maximum,
/// and each sum rescaled to it. Merging with an empty set returns the other
/// exactly, whichever side it is on, so a reduction may pad with {−inf, 0}.
//! [max-sum-merge]
template <class T>
MPT_HD inline MaxSum<T> max_sum_merge(const MaxSum<T>& a, const MaxSum<T>& b) {
  if (a.sum == T(0)) return b;  // a is empty (a NaN sum is not 0)
  if (b.sum == T(0)) return a;
  if (a.max != a.max || b.max != b.max) return a.max != a.max ? a : b;
  MaxSum<T> r;
  if (a.max >= b.max) {
    r.max = a.max;
    r.sum = a.sum + b.sum * exp_in(b.max - a.max);
  } else {
    r.max = b.max;
    r.sum = a.sum * exp_in(a.max - b.max) + b.sum;
  }
  return r;
}
//! [max-sum-merge]

/// log Σ exp(z) = max + log(sum): −inf for the empty set or a row of −inf
/// (every position masked), NaN if a NaN was seen.
template <class T>
MPT_HD inline T log_sum_exp(const MaxSum<T>& s) {
  if (s.sum == T(0)) return -std::numeric_limits<T>::infinity();
  return s.max + log_in(s.sum);
}

/// How a loss over rows is reduced, with PyTorch's names (reduction=...).
enum class Reduction : std::uint8_t {
  none,  ///< one loss per row (an ignored row's is 0)
  mean,  ///< the sum over the rows not ignored, divided by their count (0/0 = NaN when all are ignored)
  sum,   ///< the sum over the rows (ignored rows add 0)
};

/// The (max, sum) of the row value(0), …, value(n − 1), read twice: the
/// maximum first, then Σ exp(value(j) − max) left to right (no rescaling).
/// value(j) returns the logit in any type convertible to T (a widened f16,
/// a float, a double). A NaN stops the first pass: {NaN, NaN}. A row of −inf
/// only (or n = 0) is {−inf, 0}, the empty set; a +inf logit gives sum NaN.
//! [row-max-sum]
template <class T, class Value>
MPT_HD inline MaxSum<T> row_max_sum(const Value& value, std::int64_t n) {
  MaxSum<T> s;
  for (std::int64_t j = 0; j < n; ++j) {
    const T z = static_cast<T>(value(j));
    if (z != z) {
      s.max = z;
      s.sum = z;
      return s;
    }
    if (z > s.max) s.max = z;
  }
  if (s.max == -std::numeric_limits<T>::infinity()) return s;  // empty, or every position masked
  for (std::int64_t j = 0; j < n; ++j) s.sum += exp_in(static_cast<T>(value(j)) - s.max);
  return s;
}
//! [row-max-sum]

/// One probability of a row whose (max, sum) is s: exp(z − max) / sum (a
/// division, not a multiplication by 1/sum: one rounding, not two).
template <class T>
MPT_HD inline T softmax_of(const MaxSum<T>& s, T z) {
  return exp_in(z - s.max) / s.sum;
}

/// One log-probability of a row whose (max, sum) is s: (z − max) − log(sum).
/// z − max is exact when z and max are close, and no large max cancels
/// against a large log Σ exp(z): this is why log_softmax is not log(softmax).
template <class T>
MPT_HD inline T log_softmax_of(const MaxSum<T>& s, T z) {
  return (z - s.max) - log_in(s.sum);
}

/// softmax over one row: store(j, p_j) for j = 0 … n − 1, computed in T.
/// (torch.softmax, aten/src/ATen/native/SoftMax.cpp.)
template <class T, class Value, class Store>
MPT_HD inline void softmax_row(const Value& value, std::int64_t n, const Store& store) {
  const MaxSum<T> s = row_max_sum<T>(value, n);
  for (std::int64_t j = 0; j < n; ++j) store(j, softmax_of(s, static_cast<T>(value(j))));
}

/// log_softmax over one row: store(j, (z_j − max) − log Σ exp(z − max)).
template <class T, class Value, class Store>
MPT_HD inline void log_softmax_row(const Value& value, std::int64_t n, const Store& store) {
  const MaxSum<T> s = row_max_sum<T>(value, n);
  for (std::int64_t j = 0; j < n; ++j) store(j, log_softmax_of(s, static_cast<T>(value(j))));
}

/// softmax's backward over one row, from its output y and the output's
/// gradient dy: dx_j = y_j·(dy_j − Σ_k dy_k·y_k), the dot product summed in
/// T left to right (PyTorch's softmax_backward_data reads the output too).
template <class T, class Y, class Dy, class Store>
MPT_HD inline void softmax_backward_row(const Y& y, const Dy& dy, std::int64_t n, const Store& store) {
  T dot = T(0);
  for (std::int64_t j = 0; j < n; ++j) dot += static_cast<T>(dy(j)) * static_cast<T>(y(j));
  for (std::int64_t j = 0; j < n; ++j) store(j, static_cast<T>(y(j)) * (static_cast<T>(dy(j)) - dot));
}

/// log_softmax's backward over one row, from its output y (log-probabilities)
/// and dy: dx_j = dy_j − exp(y_j)·Σ_k dy_k, the sum in T left to right.
template <class T, class Y, class Dy, class Store>
MPT_HD inline void log_softmax_backward_row(const Y& y, const Dy& dy, std::int64_t n, const Store& store) {
  T total = T(0);
  for (std::int64_t j = 0; j < n; ++j) total += static_cast<T>(dy(j));
  for (std::int64_t j = 0; j < n; ++j) store(j, static_cast<T>(dy(j)) - exp_in(static_cast<T>(y(j))) * total);
}

/// The cross-entropy of one row of n logits from what a pass over the row
/// gathered: its (max, sum) s, the target's logit zy and, for ε > 0, the
/// shifted sum Σⱼ(zⱼ − max) (unused for ε = 0), with label smoothing ε
/// (PyTorch, aten/src/ATen/native/LossNLL.cpp,
/// cross_entropy_loss_label_smoothing: the target distribution is
/// (1 − ε)·onehot + ε/n):
///
///   loss = (1 − ε)·(lse − z_y) + ε·(lse − mean_j z_j),  lse = log Σ exp z,
///
/// written as log(sum) − (z_y − max) and log(sum) − mean_j (z_j − max), so
/// that no large max cancels: lse = max + log(sum) would be rounded at the
/// max's magnitude (an FP32 ulp of 30000 is 2^-9) before the nearly equal
/// z_y is taken off it. With ε = 0 the smoothing term is not computed at
/// all (PyTorch runs plain nll_loss(log_softmax) then), so a −inf logit
/// elsewhere in the row does not make the loss NaN through 0·inf.
/// cross_entropy_row (the CPU) and the CUDA cross-entropy kernels
/// (kernels/nn/softmax.cu) both end here: the CPU tests cover the formula
/// the GPU runs, and only the order of the sums' additions differs.
//! [cross-entropy-row]
template <class T>
MPT_HD inline T cross_entropy_of(const MaxSum<T>& s, T zy, T shifted_sum, std::int64_t n, T smoothing) {
  const T log_sum = log_in(s.sum);
  const T nll = log_sum - (zy - s.max);
  if (smoothing == T(0)) return nll;
  const T smooth = log_sum - shifted_sum / static_cast<T>(n);
  return (T(1) - smoothing) * nll + smoothing * smooth;
}

/// The cross-entropy of one row of n logits against the class `target` (in
/// [0, n); the caller has checked it and skipped ignored rows): max first,
/// the sum of exp(z − max) left to right, then cross_entropy_of; with ε = 0
/// exactly Chapter 2's order of operations.
template <class T, class Value>
MPT_HD inline T cross_entropy_row(const Value& value, std::int64_t n, std::int64_t target, T smoothing) {
  const MaxSum<T> s = row_max_sum<T>(value, n);
  T shifted = T(0);
  if (smoothing != T(0))
    for (std::int64_t j = 0; j < n; ++j) shifted += static_cast<T>(value(j)) - s.max;
  return cross_entropy_of(s, static_cast<T>(value(target)), shifted, n, smoothing);
}
//! [cross-entropy-row]

/// The fused gradient of cross_entropy_row times g (the gradient arriving at
/// this row's loss: dloss/count for the mean, dloss for the sum, dloss_i for
/// none): store(j, g·((1 − ε)·(p_j − onehot_j) + ε·(p_j − 1/n))), p = softmax.
/// A row whose target is ignore_index stores 0 everywhere. With ε = 0 it is
/// (p_j − onehot_j)·g, Chapter 2's expression.
//! [cross-entropy-backward-row]
template <class T, class Value, class Store>
MPT_HD inline void cross_entropy_backward_row(const Value& value, std::int64_t n, std::int64_t target,
                                              std::int64_t ignore_index, T smoothing, T g,
                                              const Store& store) {
  if (target == ignore_index) {
    for (std::int64_t j = 0; j < n; ++j) store(j, T(0));
    return;
  }
  const MaxSum<T> s = row_max_sum<T>(value, n);
  const T uniform = T(1) / static_cast<T>(n);
  for (std::int64_t j = 0; j < n; ++j) {
    const T p = softmax_of(s, static_cast<T>(value(j)));
    const T onehot = j == target ? T(1) : T(0);
    if (smoothing == T(0)) store(j, (p - onehot) * g);
    else store(j, g * ((T(1) - smoothing) * (p - onehot) + smoothing * (p - uniform)));
  }
}
//! [cross-entropy-backward-row]

/// The sum of the losses of the rows not ignored, and how many there were.
template <class T>
struct LossTotal {
  T sum = T(0);            ///< Σ over the counted rows, left to right
  std::int64_t count = 0;  ///< rows whose target is not ignore_index
};

/// A loss total reduced: the sum, or the mean sum/count (NaN, 0/0, when no
/// row counted, as PyTorch's nll_loss). For none the caller keeps the rows.
template <class T>
MPT_HD inline T reduce_loss(const LossTotal<T>& t, Reduction r) {
  return r == Reduction::sum ? t.sum : t.sum / static_cast<T>(t.count);
}

/// The gradient arriving at each counted row's loss from the gradient of the
/// reduced loss: dloss/count for the mean, dloss for the sum (for none each
/// row has its own dloss_i).
template <class T>
MPT_HD inline T row_gradient(T dloss, std::int64_t count, Reduction r) {
  return r == Reduction::mean ? dloss / static_cast<T>(count) : dloss;
}

/// Cross-entropy over `rows` rows of `classes` logits, logit(i, j), against
/// target(i) (each in [0, classes) or ignore_index; checked by the caller):
/// row_loss(i, loss_i) for every row (0 for an ignored one), and the total
/// over the counted rows, summed left to right.
template <class T, class Logit, class Target, class RowLoss>
MPT_HD inline LossTotal<T> cross_entropy_rows(const Logit& logit, std::int64_t rows, std::int64_t classes,
                                              const Target& target, std::int64_t ignore_index, T smoothing,
                                              const RowLoss& row_loss) {
  LossTotal<T> t;
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t y = target(i);
    if (y == ignore_index) {
      row_loss(i, T(0));
      continue;
    }
    const T loss = cross_entropy_row<T>([&](std::int64_t j) { return logit(i, j); }, classes, y, smoothing);
    row_loss(i, loss);
    t.sum += loss;
    ++t.count;
  }
  return t;
}

/// How many of the rows' targets are not ignore_index.
template <class Target>
MPT_HD inline std::int64_t counted_rows(const Target& target, std::int64_t rows, std::int64_t ignore_index) {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < rows; ++i) n += target(i) != ignore_index;
  return n;
}

/// nll_loss of one row of log-probabilities against `target`: −logp(target).
template <class T, class Value>
MPT_HD inline T nll_loss_row(const Value& log_prob, std::int64_t target) {
  return -static_cast<T>(log_prob(target));
}

/// nll_loss's backward over one row, times g: −g at the target, 0 elsewhere
/// and everywhere in an ignored row.
template <class T, class Store>
MPT_HD inline void nll_loss_backward_row(std::int64_t n, std::int64_t target, std::int64_t ignore_index, T g,
                                         const Store& store) {
  for (std::int64_t j = 0; j < n; ++j) store(j, target != ignore_index && j == target ? -g : T(0));
}

}  // namespace mpt
