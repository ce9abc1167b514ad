// Chapter 04 — a tiny language model's layers: the token embedding and the
// output layer that reuses its table (tied weights).
// Depends on: module.hpp, parameter.hpp, the core tier (Context, Tensor, Rng);
// gemm.hpp (TiedLinear's products, in embedding.cpp).
//
// torch.nn.Embedding(num_embeddings, embedding_dim)
// (torch/nn/modules/sparse.py; aten/src/ATen/native/Embedding.cpp): a table
// W [V, D] of FP32 master weights with a model copy in
// Policy::parameter_dtype("embedding", path); forward gathers the rows of
// the indices, y [..., D] = W[ids]; backward adds each dy row into the row of
// its index (a scatter-add: an index that appears twice gets both rows'
// gradients), summed in FP32, rounded into the model copy's dtype and added
// into the FP32 grad. The indices are data: no gradient flows to them.
//
// Indices come as a Tensor (the Module interface takes one) whose elements
// are whole numbers in [0, V) — exact in f32 up to 2^24, far above any
// vocabulary here — or, more plainly, through lookup() with integers.
// PyTorch's padding_idx, max_norm and sparse are not implemented.
//
// Tied output weights (GPT-2's lm_head, "Using the Output Embedding to
// Improve Language Models", Press and Wolf, 2017): TiedLinear computes
// logits = h Eᵀ with the embedding's own Parameter — no copy, no bias — and
// its backward adds dE = dyᵀ h into the same FP32 grad the embedding's
// scatter-add goes to, so the table receives both gradients. It lists no
// parameters of its own (the optimizer must see the table once).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mpt/core/random.hpp"
#include "mpt/nn/module.hpp"
#include "mpt/nn/parameter.hpp"

namespace mpt {

/// torch.nn.Embedding: rows of a table [V, D] selected by index.
class Embedding final : public Module {
 public:
  /// V = num_embeddings, D = embedding_dim, every weight N(0, 1) from rng
  /// (PyTorch's default init). Throws std::invalid_argument unless both
  /// sizes are >= 1.
  Embedding(int num_embeddings, int embedding_dim, Rng& rng);
  /// Given the table [V, D] (f32).
  explicit Embedding(Tensor weight);

  /// "Embedding".
  const char* kind() const override { return "Embedding"; }
  /// V.
  std::int64_t num_embeddings() const { return weight.master.size(0); }
  /// D.
  std::int64_t embedding_dim() const { return weight.master.size(1); }

  /// The table [V, D]: FP32 master, model copy, FP32 grad. A TiedLinear
  /// reads and accumulates into this same Parameter.
  Parameter weight;

  /// y [ids_shape..., D] for integer indices (row-major, ids.size() ==
  /// numel(ids_shape)): builds the index tensor and calls forward().
  Tensor lookup(const std::vector<std::int64_t>& ids, const Shape& ids_shape, Context& ctx);

  /// {weight}.
  std::vector<Parameter*> parameters() override { return {&weight}; }
  /// The model copy in Policy::parameter_dtype("embedding", path()).
  void apply_policy(const Policy& policy) override;
  /// Nothing of the activations: backward needs only the indices, which are
  /// kept as integers (8 bytes each, not counted here).
  std::vector<const Tensor*> saved() const override { return {}; }
  /// Names the table "<path>.weight".
  void set_path(std::string path) override;

 protected:
  /// ids (any shape, any dtype, whole numbers in [0, V)) to y [ids..., D] in
  /// the policy's output dtype: the rows of the model copy, read exactly.
  /// Throws std::invalid_argument, naming the first bad index and its
  /// position, for an index out of range or not a whole number.
  Tensor forward_impl(const Tensor& ids, Context& ctx) override;
  /// Scatter-adds dy [ids..., D] into the table's grad (FP32 sums, rounded
  /// into the model dtype, added into the grad); returns an empty tensor
  /// (indices have no gradient).
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  std::string who() const;
  std::vector<std::int64_t> ids_;
  Shape ids_shape_;
  OpPrecision op_{};
};

/// logits = h Eᵀ with an Embedding's table E [V, D]: the output layer of a
/// language model with tied weights. Asks the policy for "linear" at its
/// path (products summed in FP32, the output rounded once); backward adds
/// dE = dyᵀ h into E's grad (the same Parameter the Embedding scatter-adds
/// into) and returns dh = dy E.
class TiedLinear final : public Module {
 public:
  /// Reads `table` (not owned; it must outlive this layer).
  explicit TiedLinear(Parameter& table) : table_(&table) {}

  /// "TiedLinear".
  const char* kind() const override { return "TiedLinear"; }
  /// The shared table.
  const Parameter& table() const { return *table_; }
  /// None: the table belongs to the Embedding, and an optimizer must step it once.
  std::vector<Parameter*> parameters() override { return {}; }
  /// The input as the product read it.
  std::vector<const Tensor*> saved() const override { return {&h_}; }

 protected:
  /// h [B, D] to logits [B, V] in the policy's output dtype.
  Tensor forward_impl(const Tensor& h, Context& ctx) override;
  /// dE [V, D] = dyᵀ h in FP32, rounded into the table's model dtype and
  /// added into its grad; dh [B, D] = dy E in the dtype h was read in.
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  Parameter* table_;
  Tensor h_;
  OpPrecision op_{};
};

}  // namespace mpt
