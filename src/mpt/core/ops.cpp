// Chapter 02 — precision as data: the op table.
// Depends on: ops.hpp.
//
// The names are PyTorch's (torch.nn.functional and the aten ops that
// torch.autocast lists in aten/src/ATen/autocast_mode.cpp). `chapter` is 0
// for ops a policy may already name but no layer of the library runs yet;
// the chapter that implements one sets it.
#include "mpt/core/ops.hpp"

#include <stdexcept>

namespace mpt {

const std::vector<OpInfo>& known_ops() {
  static const std::vector<OpInfo> ops = {
      {"linear", OpKind::matmul, 2, "y = x W^T + b (torch.nn.functional.linear)"},
      {"matmul", OpKind::matmul, 2, "a matrix product, products summed in the compute dtype"},
      {"conv2d", OpKind::matmul, 3, "2-D convolution"},
      {"scaled_dot_product_attention", OpKind::matmul, 4, "softmax(Q K^T / sqrt(d) + mask) V"},
      {"relu", OpKind::pointwise, 2, "max(x, 0)"},
      {"gelu", OpKind::pointwise, 2, "x Phi(x), exact (erf) or tanh-approximated"},
      {"add", OpKind::pointwise, 4, "a + b, elementwise"},
      {"layer_norm", OpKind::normalization, 3, "normalize over the last dimension(s)"},
      {"batch_norm", OpKind::normalization, 3, "normalize over the batch (and H, W) per channel"},
      {"softmax", OpKind::softmax, 4, "exp(x - max) / sum exp(x - max)"},
      {"log_softmax", OpKind::softmax, 4, "x - max - log sum exp(x - max)"},
      {"cross_entropy", OpKind::loss, 2, "softmax cross-entropy against class ids, mean"},
      {"nll_loss", OpKind::loss, 4, "negative log-likelihood of log-probabilities"},
      {"mse_loss", OpKind::loss, 2, "mean squared error"},
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
    case OpKind::normalization: return "normalization";
    case OpKind::softmax: return "softmax";
    case OpKind::loss: return "loss";
    case OpKind::pooling: return "pooling";
    case OpKind::lookup: return "lookup";
  }
  return "?";
}

}  // namespace mpt
