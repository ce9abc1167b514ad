// Chapter 04 — numerically stable softmax, log-softmax and cross-entropy: the ops.
// Depends on: the core tier (tensor.hpp, context.hpp); softmax_math.hpp (the
// row functions and Reduction).
//
// torch.softmax and torch.log_softmax over the last dimension of any rank;
// F.cross_entropy and F.nll_loss of [N, K] against N class ids, with
// PyTorch's ignore_index, label_smoothing and reduction
// (aten/src/ATen/native/SoftMax.cpp, LossNLL.cpp). Their backward passes are
// written out: softmax's and log_softmax's from the output, as
// _softmax_backward_data and _log_softmax_backward_data read it, and
// cross-entropy's fused, g·((1 − ε)·(softmax − onehot) + ε·(softmax − 1/K)).
//
// Precision. Every op here asks the policy (ops "softmax", "log_softmax",
// "cross_entropy", "nll_loss"), casts its input with Context::cast and
// records a trace entry. The maximum, the sum of exponentials, the log and
// the loss are FP32 whatever dtype the input is stored in — autocast puts
// softmax, log_softmax, nll_loss and cross_entropy on its FP32 list
// (aten/src/ATen/autocast_mode.cpp) — and a policy asking for another
// compute dtype is refused, as Chapter 3's norms refuse it. softmax and
// log_softmax round their result once into the policy's output dtype; a
// loss is an FP32 tensor; a gradient is written in the dtype of the tensor
// it belongs to (the gradient of f16 logits is f16). The naive versions
// (exp in the input's dtype, the log of a softmax) are not library code:
// they are Chapter 4's pitfalls.
#pragma once

#include <string_view>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/nn/layers/softmax_math.hpp"

namespace mpt {

/// F.cross_entropy's options (class-index targets, no class weights).
struct CrossEntropyOptions {
  int ignore_index =
      -100;  ///< a target equal to it adds no loss, no gradient, and is not counted by the mean
  float label_smoothing = 0;  ///< ε in [0, 1]: the target distribution is (1 − ε)·onehot + ε/K
  Reduction reduction = Reduction::mean;  ///< mean over the rows not ignored, sum, or none
};

/// F.nll_loss's options (class-index targets, no class weights).
struct NllLossOptions {
  int ignore_index = -100;                ///< as CrossEntropyOptions::ignore_index
  Reduction reduction = Reduction::mean;  ///< as CrossEntropyOptions::reduction
};

/// "none", "mean" or "sum".
const char* reduction_name(Reduction r);

/// torch.softmax(x, dim=-1) as the op "softmax" at `path`: x of any rank ≥ 1
/// is cast to the policy's input dtype, each row of its last dimension is
/// exp(z − max) / Σ exp(z − max) in FP32 and the result is rounded into the
/// policy's output dtype. Traced. Throws std::invalid_argument for a scalar
/// x or a policy that asks for compute other than f32.
Tensor softmax(const Tensor& x, Context& ctx, std::string_view path = "softmax");
/// torch.log_softmax(x, dim=-1) as the op "log_softmax": (z − max) −
/// log Σ exp(z − max) per row, in FP32 (see softmax).
Tensor log_softmax(const Tensor& x, Context& ctx, std::string_view path = "log_softmax");
/// softmax's backward from its output y and the output's gradient dy (same
/// shape): dx = y·(dy − Σ dy·y) per row, in FP32. dx is computed for the
/// input as the op read it and returned in `input_dtype`, the dtype x had
/// when it was handed to softmax (the cast's backward, as
/// _softmax_backward_data takes input_dtype). Traced.
Tensor softmax_backward(const Tensor& y, const Tensor& dy, DType input_dtype, Context& ctx,
                        std::string_view path = "softmax");
/// log_softmax's backward from its output y: dx = dy − exp(y)·Σ dy per row
/// (see softmax_backward).
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy, DType input_dtype, Context& ctx,
                            std::string_view path = "log_softmax");

/// F.cross_entropy(logits, targets, ignore_index, label_smoothing, reduction)
/// as the op "cross_entropy": logits [N, K], N targets each in [0, K) or
/// ignore_index. Returns an f32 tensor: shape {} for mean and sum, {N} for
/// none (0 for an ignored row). The mean divides by the rows not ignored,
/// so it is NaN (0/0) when every target is ignored, as PyTorch's. Throws
/// std::invalid_argument (one line) for logits that are not 2-D, a count
/// mismatch, a target out of range, label_smoothing outside [0, 1], or a
/// policy asking for compute other than f32.
Tensor cross_entropy(const Tensor& logits, const std::vector<int>& targets,
                     const CrossEntropyOptions& options, Context& ctx, std::string_view path = "loss");
/// cross_entropy's gradient with respect to the logits, fused:
/// dz = g·((1 − ε)·(softmax − onehot) + ε·(softmax − 1/K)) per row, 0 for an
/// ignored row, g = dloss/count (mean), dloss (sum) or dloss_i (none).
/// dloss is the gradient of the returned loss: shape {} (any 1 element) for
/// mean and sum, {N} for none. Computed in FP32, written in the logits' dtype.
Tensor cross_entropy_backward(const Tensor& logits, const std::vector<int>& targets,
                              const CrossEntropyOptions& options, const Tensor& dloss, Context& ctx,
                              std::string_view path = "loss");

/// F.nll_loss(log_probs, targets, ignore_index, reduction) as the op
/// "nll_loss": log_probs [N, K] (a log_softmax's output), loss −log_probs[i,
/// targets[i]] per row, reduced as cross_entropy. Returns an f32 tensor;
/// throws as cross_entropy.
Tensor nll_loss(const Tensor& log_probs, const std::vector<int>& targets, const NllLossOptions& options,
                Context& ctx, std::string_view path = "loss");
/// nll_loss's gradient: −g at each row's target, 0 elsewhere and in ignored
/// rows (g as in cross_entropy_backward); written in log_probs' dtype.
Tensor nll_loss_backward(const Tensor& log_probs, const std::vector<int>& targets,
                         const NllLossOptions& options, const Tensor& dloss, Context& ctx,
                         std::string_view path = "loss");

}  // namespace mpt
