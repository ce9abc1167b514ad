// Chapter 02 — precision as data: the names of the ops a Policy decides for.
// Depends on: the standard library only.
//
// Every op the library runs is asked for by its PyTorch name (`linear`,
// `layer_norm`, `cross_entropy`, ...), so what a reader knows about
// torch.autocast's op lists carries over. The table also says what kind of
// op each is: a Policy may treat all matrix products alike, all losses alike.
// A chapter that adds an op adds one row to the table in ops.cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mpt {

/// What kind of computation an op is; policies decide by kind or by name.
enum class OpKind {
  matmul,         ///< products summed over an inner dimension (linear, matmul, conv2d, attention)
  pointwise,      ///< one output per input element (relu, gelu, add, exp)
  reduction,      ///< sums or products over a dimension (sum, mean, norm, cumsum)
  normalization,  ///< statistics over a dimension, then a pointwise map (layer_norm, batch_norm)
  softmax,        ///< exp and a sum over a dimension (softmax, log_softmax)
  loss,           ///< reduces to a loss value (cross_entropy, mse_loss, nll_loss)
  pooling,        ///< a window reduction (max_pool2d, avg_pool2d)
  lookup,         ///< a table read (embedding)
};

/// One known op.
struct OpInfo {
  std::string_view name;  ///< PyTorch's name: "linear"
  OpKind kind;            ///< what kind of computation it is
  int chapter;            ///< the chapter whose code runs it (0: named for policies, no kernel yet)
  std::string_view what;  ///< one line for `mpt op list` and error messages
};

/// Every op name a Policy accepts, in table order.
const std::vector<OpInfo>& known_ops();
/// The op with this name; throws std::invalid_argument with a one-line
/// message naming every known op when there is none.
const OpInfo& op_info(std::string_view name);
/// "linear, matmul, ..." — for messages.
std::string op_names();
/// "matmul", "pointwise", ... — the kind's name.
std::string_view op_kind_name(OpKind kind);

}  // namespace mpt
