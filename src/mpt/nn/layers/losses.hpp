// Chapter 02 — loss scaling and FP32 master weights: the losses.
// Depends on: layer_math.hpp (the formulas), the core tier (tensor.hpp,
// context.hpp).
//
// Losses read their input widened to FP32 and return the loss in FP32
// whatever the input's dtype (autocast runs them in FP32); their gradient is
// computed in FP32 and stored in the input's dtype, as the gradient of an
// f16 tensor is an f16 tensor: the first place where small gradients flush
// to zero when the loss is not scaled. The overloads with a Context ask its
// policy (op "cross_entropy", "mse_loss") and record into its trace.
#pragma once

#include <string_view>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/nn/layers/layer_math.hpp"

namespace mpt {

/// Mean softmax cross-entropy of logits [B, C] against B class ids
/// (torch.nn.functional.cross_entropy, reduction='mean').
float cross_entropy_loss(const Tensor& logits, const std::vector<int>& labels);
/// Its gradient dloss·(softmax − onehot)/B, in FP32, stored in the logits'
/// dtype. dloss is the gradient arriving from above: 1, or the loss scale S.
Tensor cross_entropy_backward(const Tensor& logits, const std::vector<int>& labels, float dloss = 1.0f);
/// Mean squared error of pred [B, K] against an FP32 target (MSELoss, 'mean').
float mse_loss(const Tensor& pred, const MatrixF& target);
/// Its gradient 2·dloss·(pred − target)/(B·K) in FP32, stored in pred's dtype.
Tensor mse_backward(const Tensor& pred, const MatrixF& target, float dloss = 1.0f);

/// cross_entropy_loss as the op "cross_entropy" at `path`: the logits are
/// cast to the policy's input dtype first; traced.
float cross_entropy_loss(const Tensor& logits, const std::vector<int>& labels, Context& ctx,
                         std::string_view path = "loss");
/// Its backward: computed for the logits as the op read them, then returned
/// in the logits' own dtype (the cast's backward); traced.
Tensor cross_entropy_backward(const Tensor& logits, const std::vector<int>& labels, float dloss, Context& ctx,
                              std::string_view path = "loss");
/// mse_loss as the op "mse_loss" at `path` (see cross_entropy_loss).
float mse_loss(const Tensor& pred, const MatrixF& target, Context& ctx, std::string_view path = "loss");
/// Its backward (see cross_entropy_backward).
Tensor mse_backward(const Tensor& pred, const MatrixF& target, float dloss, Context& ctx,
                    std::string_view path = "loss");

/// Fraction of rows whose largest logit is at the label (ties: lowest index).
double accuracy(const Tensor& logits, const std::vector<int>& labels);

}  // namespace mpt
