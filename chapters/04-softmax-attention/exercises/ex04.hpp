// Chapter 04 — exercises: the adapter header, the student's specification.
// Depends on: the C++17 standard library for 4.1 to 4.3 (the grader compares
// them with mpt's online (max, sum) and cross-entropy rows,
// src/mpt/nn/layers/softmax_math.hpp, in double); mpt/core/tensor.hpp for 4.4 (a
// tensor in and out; the grader compares with the softmax of mpt's
// attention rows, src/mpt/nn/layers/attention_math.hpp, in double).
// The grader includes this file and calls exactly these functions; the
// student writes them in ex04.cpp. Changing a signature breaks the grader.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "mpt/core/tensor.hpp"

/// Chapter 4 exercises: a stable log-sum-exp, the online (max, sum) of a
/// softmax and its merge, the fused backward of softmax cross-entropy with
/// label smoothing, and a broken masked softmax of an attention row to
/// diagnose and fix.
namespace mpt::ex04 {

/// Exercise 4.1 — log Σⱼ exp(z[j]) over the n floats z[0], …, z[n − 1].
///
/// Subtract the maximum m first: log Σ exp(z) = m + log Σ exp(z − m). Every
/// exponent is then ≤ 0, so nothing overflows, and the largest term is
/// exactly 1, so the sum is ≥ 1 and its log is finite. Accumulate the sum
/// in float (or double), never in fp16 or bf16; return the result as float.
/// Logits of ±60000 and ±1e30, rows whose exp all underflow and rows of up
/// to 2^20 logits are graded: log(Σ exp(z)) as written overflows to inf,
/// or underflows to log(0) = −inf, on most of them.
///
/// Special values, as torch.logsumexp (aten/src/ATen/native/ReduceOps.cpp,
/// logsumexp_out_impl, which replaces an infinite maximum by 0 before the
/// subtraction):
///  - a −inf logit adds exp(−inf) = 0 (a masked position);
///  - a row of −inf only, or n = 0 (nothing to sum), gives −inf, not NaN;
///  - a +inf logit (and no NaN) gives +inf;
///  - a NaN logit anywhere gives NaN;
///  - one logit z gives z exactly (z + log 1).
/// (mpt's own MaxSum makes the sum NaN at a +inf logit instead: it serves
/// softmax, where exp(inf − inf) is what PyTorch's softmax computes too.)
///
/// Graded against mpt's two-pass (max, sum) in double over the same floats:
/// within 8 float epsilons (2^-23) of 1 + |answer| for rows of up to 4096
/// logits, within 2e-5 of it for the rows of 2^16 to 2^20 logits, whose
/// float sums are only that good; special values and single logits
/// exactly. Preconditions: n >= 0 (z may be null when n = 0).
///
/// Do not call mpt's log_sum_exp, MaxSum or row functions
/// (mpt/nn/layers/softmax_math.hpp), mpt::softmax or mpt::log_softmax: the grader
/// uses them as its reference.
float stable_log_sum_exp(const float* z, std::int64_t n);

/// The state of an online softmax over the logits read so far: their
/// maximum and the sum of exp(z − max) over them, in float. The empty set
/// (nothing read yet, or only −inf) is {−inf, 0}.
struct OnlineSoftmax {
  float max = -std::numeric_limits<float>::infinity();  ///< the largest logit read (−inf for none)
  float sum = 0.0f;  ///< Σ exp(z − max) over them (>= 1 once one is read)
};

/// Exercise 4.2, part 1 — read one more logit z (Milakov and Gimelshein,
/// "Online normalizer calculation for softmax", 2018).
///
/// Return the state of the set read so far plus z: when z is not larger
/// than s.max, add exp(z − s.max) to the sum; when it is, z becomes the
/// maximum and the old sum, measured against the old maximum, must be
/// rescaled to the new one: sum·exp(s.max − z) + 1. A −inf logit (a masked
/// position) leaves the state exactly as it is, including the empty one.
///
/// Graded against mpt's max_sum_add in double on the same float operands:
/// max exact, sum within 8 float epsilons relative. Preconditions: z is
/// finite or −inf; s is a state these functions produced ({−inf, 0}, or a
/// finite max with sum >= 1).
OnlineSoftmax online_add(OnlineSoftmax s, float z);

/// Exercise 4.2, part 2 — merge the states of two disjoint sets of logits:
/// the step of a parallel reduction (a warp's shuffle tree, a block's, the
/// split rows of a long vocabulary).
///
/// The merged maximum is the larger one; each sum is measured against its
/// own maximum, so the sum that belongs to the smaller maximum must be
/// rescaled by exp(smaller − larger) before the two are added. Merging with
/// an empty state ({−inf, 0}) returns the other operand exactly, bit for
/// bit, on either side; two empty states give {−inf, 0}, not NaN: a
/// reduction pads with empty states, and a fully masked chunk is one.
///
/// Graded against mpt's max_sum_merge in double on the same float operands
/// (max exact, sum within 8 float epsilons relative), and over whole sets:
/// folds in any order and reduction trees over up to 8192 logits, as a GPU
/// block runs them, against a two-pass computation in double (max exact,
/// sum within 1e-4 relative). Preconditions: as online_add.
///
/// In 4.2 do not call mpt's max_sum_add, max_sum_merge or MaxSum
/// (mpt/nn/layers/softmax_math.hpp): the grader uses them as its reference.
OnlineSoftmax online_merge(const OnlineSoftmax& a, const OnlineSoftmax& b);

/// Exercise 4.3 — the gradient of one row's softmax cross-entropy with
/// label smoothing, fused (torch.nn.functional.cross_entropy with
/// label_smoothing; aten/src/ATen/native/LossNLL.cpp).
///
/// `z` holds the row's k logits, `target` its class y, `g` the gradient
/// arriving at this row's loss (dloss/N for the mean over N rows, times the
/// loss scale). With label smoothing ε the target distribution is
/// (1 − ε)·onehot(y) + ε/k, and the gradient of the loss with respect to
/// the logits is softmax minus that distribution:
///
///   dz[j] = g·(p_j − ε/k − (1 − ε)·[j = y]),   p = softmax(z),
///
/// p_j = exp(z_j − max z)/Σ exp(z − max z), computed in float (or double)
/// with the maximum subtracted; write all k entries of dz. When target ==
/// ignore_index (a padding position, whatever value ignore_index has) the
/// row adds nothing: write dz = 0 everywhere.
///
/// Graded against mpt's cross_entropy_backward_row in double on the same
/// floats: every dz[j] within 1e-4 (1e-3 for rows of 8192 logits or more,
/// a vocabulary's) of the size of its terms, |g|·(p_j + ε/k + (1 − ε)·[j =
/// y]); a float sum left to right passes, an fp16 one does not. Logits of ±60000 and 1e30, −inf at positions
/// other than the target (masked vocabulary entries) and rows of 50257 logits are graded. Preconditions: k >=
/// 1; target in [0, k) or equal to ignore_index; 0 <= ε <= 1; g finite; z finite except −inf away from the
/// target.
///
/// Do not call mpt's cross_entropy functions or row functions
/// (mpt/nn/layers/softmax.hpp, mpt/nn/layers/softmax_math.hpp) or its fused kernel
/// (mpt/nn/cpu/softmax_cpu.hpp): the grader uses them.
void softmax_cross_entropy_backward(const float* z, std::int64_t k, std::int64_t target,
                                    std::int64_t ignore_index, float label_smoothing, float g, float* dz);

/// Exercise 4.4 — DIAGNOSE: the probabilities of one masked attention row.
///
/// Not written from scratch: ex04.cpp comes with a body for this function
/// that compiles, runs, gives rows that sum to 1 and has one real
/// mixed-precision bug. Find it and fix it, changing as little as you can
/// (README.md lists the symptoms the grader reports).
///
/// `scores` is an f16 or bf16 tensor of shape [n] (n >= 1): one query's raw
/// products s_j = q·k_j with the n keys, as a GEMM stored them. keep[j]
/// (n entries) says whether key j takes part (PyTorch's boolean attn_mask:
/// true = attend; padding and causal masks are such rows). `scale` > 0 is
/// the softmax scale, 1/√d for a head of dimension d. One call, as the
/// softmax step of mpt's scaled_dot_product_attention
/// (src/mpt/nn/layers/attention.hpp) and of PyTorch's math backend:
///
///  - t_j = s_j·scale for a kept position, computed in FP32 from the
///    widened s_j (no rounding in between); a position not kept has no
///    score: its probability is exactly 0;
///  - p_j = exp(t_j − max t)/Σ exp(t − max t) over the kept positions,
///    computed in FP32 (the maximum subtracted, the sum in FP32);
///  - a row in which no position is kept (a padded query) gives p = 0
///    everywhere, not NaN (PyTorch's at::_safe_softmax): a NaN row would
///    reach every parameter through the backward pass;
///  - the returned tensor: p rounded once into the scores' dtype, shape [n].
///
/// Graded against the softmax of mpt's attention rows (attention_math.hpp)
/// in double on the same stored scores: a kept position's p within one unit
/// of the dtype's spacing at the exact value (plus 64 float epsilons of it),
/// a position not kept exactly 0.
mpt::Tensor attention_row_probabilities(const mpt::Tensor& scores, const std::vector<bool>& keep,
                                        float scale);

}  // namespace mpt::ex04
