// Chapter 04 — a tiny language model: the decoder-only Transformer.
// Depends on: model.hpp (Model, Sequential), attention.hpp
// (MultiHeadSelfAttention), embedding.hpp (Embedding, TiedLinear),
// layer_norm.hpp, linear.hpp, activations.hpp (GELU); the core tier
// (Context, Policy, Tensor, Rng).
//
// GPT-2's architecture at toy size (Radford et al. 2019; the layer names
// follow nanoGPT's model.py, a PyTorch reference of it), character level:
//
//   h   = tok_emb(ids) + pos_emb(0..T−1)                  [B, T, D]
//   for each block l:  h = h + attn(ln1(h))                (causal, H heads)
//                      h = h + mlp(ln2(h))                 fc1 D→4D, GELU, fc2 4D→D
//   logits = ln_f(h) · Eᵀ                                  [B·T, V], E = tok_emb's table
//
// Layer paths: "tok_emb", "pos_emb", "block0.ln1", "block0.attn" (its
// projections "block0.attn.q", ".k", ".v", ".out"), "block0.ln2",
// "block0.mlp.fc1", "block0.mlp.gelu", "block0.mlp.fc2", ..., "ln_f",
// "lm_head". The sums are the op "add" at "embedding_sum",
// "block0.residual1" (after attention) and "block0.residual2" (after the MLP).
//
// Why a Model: the chapters' training code, trace_step and `mpt trace` take
// a Model, and a Model is a Sequential, whose children give the paths,
// parameters(), apply_policy() and saved() for free. The data flow is not a
// chain, so TinyTransformer and TransformerBlock (a Sequential too, so that
// paths() and find() reach "block0.ln1") override forward_impl and
// backward_impl and wire their children by hand: forward and backward are
// written out, as everywhere in the library.
//
// Precision. Every op asks the model's Context's policy: the embeddings
// ("embedding"), the norms ("layer_norm", FP32 statistics), attention
// ("scaled_dot_product_attention" and "linear" for its projections), the
// MLP ("linear", "gelu"), the tied head ("linear") and each sum ("add": both
// operands cast to the policy's input dtype, added in FP32, rounded once
// into its output dtype). A residual's gradient is the sum of the gradient
// that passes the add unchanged and the one that comes back through its
// branch: summed in FP32 from the two widened gradients and rounded once
// into the dtype the residual stream is stored in (autograd's accumulation
// of a tensor used twice). The position table's gradient sums dh over the
// batch in FP32 (the broadcast's backward).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/nn/layers/activations.hpp"
#include "mpt/nn/layers/attention.hpp"
#include "mpt/nn/layers/embedding.hpp"
#include "mpt/nn/layers/layer_norm.hpp"
#include "mpt/nn/layers/linear.hpp"
#include "mpt/nn/model.hpp"

namespace mpt {

/// What a TinyTransformer is built from. The defaults train a few hundred
/// steps of batch 16 × context 64 in seconds on one core.
struct TransformerConfig {
  int vocab_size = 96;                   ///< V: token ids are 0 .. V−1
  int context = 64;                      ///< T_max: the longest sequence (rows of pos_emb)
  int d_model = 64;                      ///< D: the residual stream's width
  int num_heads = 4;                     ///< H: attention heads (H divides D)
  int num_layers = 2;                    ///< L: blocks
  int mlp_ratio = 4;                     ///< the MLP's hidden width is mlp_ratio·D
  double init_std = 0.02;                ///< GPT-2's N(0, σ) for every weight and both tables
  DType dtype = DType::f32;              ///< the uniform policy's dtype
  std::shared_ptr<const Policy> policy;  ///< when set, asked instead of UniformPolicy(dtype)
  std::uint64_t seed = 0;                ///< the initialisation's seed
};

/// One pre-norm Transformer block at its path ("block0"): x + attn(ln1(x)),
/// then + mlp(ln2(·)). Children "ln1", "attn", "ln2", "mlp" (a Sequential
/// of "fc1", "gelu", "fc2").
class TransformerBlock final : public Sequential {
 public:
  /// d_model D, H heads, MLP hidden width `hidden`; layers initialised by
  /// their constructors from rng (TinyTransformer re-initialises them).
  TransformerBlock(int d_model, int num_heads, int hidden, Rng& rng);
  /// "TransformerBlock".
  const char* kind() const override { return "TransformerBlock"; }

  LayerNorm* ln1;                ///< before attention
  MultiHeadSelfAttention* attn;  ///< causal self-attention
  LayerNorm* ln2;                ///< before the MLP
  Sequential* mlp;               ///< fc1, gelu, fc2
  Linear* fc1;                   ///< the MLP's D → hidden
  Linear* fc2;                   ///< the MLP's hidden → D (a residual projection)
  /// The residual additions' paths: "<path>.residual1", "<path>.residual2".
  std::vector<std::string> inner_paths() const override;

 protected:
  /// x [B, T, D] to x + attn(ln1(x)) + mlp(ln2(·)), stored in the "add" op's output dtype.
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  /// The two residual branches backwards; each residual's gradient is the
  /// FP32 sum of the passed-through and the branch gradient.
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  std::int64_t batch_ = 0, length_ = 0, width_ = 0;
  DType x_dtype_ = DType::f32, mid_dtype_ = DType::f32;
};

/// The decoder-only Transformer of the file comment. forward() takes token
/// ids [B, T] (whole numbers stored as floats, T <= context) and returns the
/// logits [B·T, V], row b·T + t predicting the token after position t.
class TinyTransformer final : public Model {
 public:
  /// Build and initialise as GPT-2 (see init_weights()). Throws
  /// std::invalid_argument, naming the field, unless every size is >= 1,
  /// num_heads divides d_model and init_std is finite and > 0.
  explicit TinyTransformer(TransformerConfig config);
  TinyTransformer(TinyTransformer&&) = default;             ///< moves keep the parameters' addresses
  TinyTransformer& operator=(TinyTransformer&&) = default;  ///< moves keep the parameters' addresses
  /// "TinyTransformer".
  const char* kind() const override { return "TinyTransformer"; }
  /// "embedding_sum", the op that adds the two embeddings.
  std::vector<std::string> inner_paths() const override { return {"embedding_sum"}; }
  /// The configuration it was built from.
  const TransformerConfig& config() const { return config_; }

  using Model::forward;
  /// forward() of `ids` (batch·length integers, row-major [batch, length]).
  /// Throws std::invalid_argument when the sizes do not match.
  const Tensor& forward_tokens(const std::vector<int>& ids, int batch, int length);

  /// GPT-2's initialisation from Rng(seed): every Linear weight and both
  /// tables N(0, init_std), every residual projection (attn.out, mlp.fc2)
  /// N(0, init_std/√(2L)), biases 0, LayerNorms γ = 1, β = 0; parameters
  /// drawn in the order of parameters(). Remakes the model copies.
  void init_weights(std::uint64_t seed);

  Embedding* tok_emb;                     ///< the token table E [V, D] (also the output layer's)
  Embedding* pos_emb;                     ///< the position table [context, D]
  std::vector<TransformerBlock*> blocks;  ///< "block0", "block1", ...
  LayerNorm* ln_f;                        ///< the final norm
  TiedLinear* lm_head;                    ///< logits = h Eᵀ

 protected:
  /// ids [B, T] to logits [B·T, V] (see the file comment).
  Tensor forward_impl(const Tensor& ids, Context& ctx) override;
  /// From dlogits [B·T, V] down to both tables; returns an empty tensor
  /// (token ids have no gradient).
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  TransformerConfig config_;
  std::int64_t batch_ = 0, length_ = 0;
  DType tok_dtype_ = DType::f32, pos_dtype_ = DType::f32;
};

/// The op "add" at `path`: a + b with b broadcast over a's leading elements
/// (a.numel() a multiple of b.numel(), b's shape a suffix of a's): both cast
/// to the policy's input dtype, summed in FP32, rounded once into its output
/// dtype; the result has a's shape. Traced. Throws std::invalid_argument
/// for shapes that do not broadcast or compute other than f32.
Tensor add_op(const Tensor& a, const Tensor& b, Context& ctx, const std::string& path);

/// The gradient of a tensor that two ops read: g1 + g2 (same shape) summed
/// in FP32 from their widened values and rounded once into `dtype`, the
/// tensor's own. Recorded as a backward "add" at `path` when tracing.
/// Throws std::invalid_argument for different shapes.
Tensor sum_gradients(const Tensor& g1, const Tensor& g2, DType dtype, Context& ctx, const std::string& path);

}  // namespace mpt
