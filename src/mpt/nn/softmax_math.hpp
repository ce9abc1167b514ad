// Chapter 04 — numerically stable softmax and cross-entropy: the online
// (max, sum) of a row of logits, and its merge.
// Depends on: format_spec.hpp (for MPT_HD) and <cmath>. Host-and-device: the
// CPU softmax and cross-entropy (softmax.cpp), attention (attention.cpp) and
// the CUDA kernels (kernels/nn/) call these exact functions, so the CPU
// tests cover the code the GPU runs. Templated on the scalar: float is what
// the library accumulates in; double is the reference the tests compare with.
//
// softmax(z)ᵢ = exp(zᵢ − m) / Σⱼ exp(zⱼ − m) for any m; m = max z keeps every
// exponent ≤ 0, so no exp overflows and the largest term is exactly 1 (the
// sum is ≥ 1 and its log is finite). Reading the row once, the maximum is
// not known in advance: keep (m, s) with s = Σ exp(zⱼ − m) over what was
// read, and when a larger logit arrives rescale s by exp(m_old − m_new)
// (Milakov and Gimelshein, "Online normalizer calculation for softmax",
// 2018). Two partial results combine the same way, which is what a parallel
// reduction (a warp, a block) does.
#pragma once

#include <cmath>
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
/// (a masked position). A +inf logit becomes the maximum with sum 1; a second
/// one makes the sum NaN (exp(inf − inf)), and a softmax's own exp(z − max)
/// is NaN at a +inf position anyway, as PyTorch's is.
//! [max-sum-add]
template <class T>
MPT_HD inline void max_sum_add(MaxSum<T>& s, T z) {
  if (z != z) {  // NaN: the row's softmax is NaN
    s.max = z;
    s.sum = z;
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

}  // namespace mpt
