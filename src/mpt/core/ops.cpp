// Chapter 02 — precision as data: the op table.
// Depends on: ops.hpp.
//
// The names are PyTorch's (torch.nn.functional and the aten ops that
// torch.autocast lists in aten/src/ATen/autocast_mode.cpp). `chapter` is 0
// for ops a policy may already name but no layer of the library runs yet;
// the chapter that implements one sets it. Chapter 6 added the rows with
// chapter 0: the ops torch.autocast's lists name that the chapter's models
// and pitfalls talk about (`mpt op list` says which ones run).
#include "mpt/core/ops.hpp"

#include <stdexcept>

namespace mpt {

const std::vector<OpInfo>& known_ops() {
  static const std::vector<OpInfo> ops = {
      {"linear", OpKind::matmul, 2, "y = x W^T + b (torch.nn.functional.linear)"},
      {"matmul", OpKind::matmul, 2, "a matrix product, products summed in the compute dtype"},
      {"bmm", OpKind::matmul, 0, "a batch of matrix products"},
      {"conv2d", OpKind::matmul, 3, "2-D convolution"},
      {"scaled_dot_product_attention", OpKind::matmul, 4, "softmax(Q K^T / sqrt(d) + mask) V"},
      {"relu", OpKind::pointwise, 2, "max(x, 0), NaN kept"},
      {"gelu", OpKind::pointwise, 2, "x Phi(x), exact (erf) or tanh-approximated"},
      {"add", OpKind::pointwise, 4, "a + b, elementwise"},
      {"mul", OpKind::pointwise, 0, "a * b, elementwise"},
      {"exp", OpKind::pointwise, 0, "e^x, elementwise"},
      {"log", OpKind::pointwise, 0, "ln x, elementwise"},
      {"pow", OpKind::pointwise, 0, "x^p, elementwise"},
      {"cat", OpKind::pointwise, 0, "tensors joined along one dimension"},
      {"sum", OpKind::reduction, 0, "the sum over a dimension (or all)"},
      {"mean", OpKind::reduction, 0, "the mean over a dimension (or all)"},
      {"norm", OpKind::reduction, 0, "the p-norm over a dimension (or all)"},
      {"cumsum", OpKind::reduction, 0, "running sums along a dimension"},
      {"layer_norm", OpKind::normalization, 3, "normalize over the last dimension(s)"},
      {"batch_norm", OpKind::normalization, 3, "normalize over the batch (and H, W) per channel"},
      {"group_norm", OpKind::normalization, 0, "normalize over groups of channels per sample"},
      {"softmax", OpKind::softmax, 4, "exp(x - max) / sum exp(x - max)"},
      {"log_softmax", OpKind::softmax, 4, "x - max - log sum exp(x - max)"},
      {"cross_entropy", OpKind::loss, 2, "softmax cross-entropy against class ids, mean"},
      {"nll_loss", OpKind::loss, 4, "negative log-likelihood of log-probabilities"},
      {"mse_loss", OpKind::loss, 2, "mean squared error"},
      {"binary_cross_entropy", OpKind::loss, 0, "-(y log p + (1-y) log(1-p)) of probabilities p"},
      {"binary_cross_entropy_with_logits", OpKind::loss, 0,
       "binary cross-entropy of logits z, with p = sigmoid(z) taken inside"},
      {"max_pool2d", OpKind::pooling, 3, "2-D max pooling"},
      {"avg_pool2d", OpKind::pooling, 3, "2-D average pooling"},
      {"embedding", OpKind::lookup, 4, "rows of a table selected by index"},
  };
  return ops;
}

std::string op_names() {
  std::string s;
  for (const OpInfo& op : known_ops()) s += (s.empty() ? "" : ", ") + std::string(op.name);
  return s;
}

const OpInfo& op_info(std::string_view name) {
  for (const OpInfo& op : known_ops())
    if (op.name == name) return op;
  throw std::invalid_argument("unknown op '" + std::string(name) + "'; known ops: " + op_names());
}

std::string_view op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::matmul: return "matmul";
    case OpKind::pointwise: return "pointwise";
    case OpKind::reduction: return "reduction";
    case OpKind::normalization: return "normalization";
    case OpKind::softmax: return "softmax";
    case OpKind::loss: return "loss";
    case OpKind::pooling: return "pooling";
    case OpKind::lookup: return "lookup";
  }
  return "?";
}

}  // namespace mpt
