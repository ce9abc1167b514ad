// Chapter 04 — numerically stable attention: scaled dot-product attention and
// the causal multi-head self-attention layer.
// Depends on: module.hpp, linear.hpp (the projections), the core tier
// (Context, Policy, Tensor, Rng); attention_math.hpp and gemm.hpp (the
// formulas and the products, in attention.cpp).
//
// scaled_dot_product_attention follows PyTorch's
// torch.nn.functional.scaled_dot_product_attention (its documentation, and
// the math backend, _scaled_dot_product_attention_math in
// aten/src/ATen/native/transformers/attention.cpp):
//
//   out = softmax(Q Kᵀ·scale + mask) V,   scale = 1/√D unless given,
//
// with q [B, H, Lq, D] (or [N, Lq, D]), k [B, H, Lk, D], v [B, H, Lk, Dv]
// (the same leading dimensions as q: no broadcasting of batch or heads), and
// out [B, H, Lq, Dv]. The mask, broadcast to [B, H, Lq, Lk] as PyTorch
// broadcasts it, is either boolean — true: the position takes part in
// attention, PyTorch's convention — or additive, added to the scaled
// scores (−inf removes a position; a finite large negative value, such as
// the dtype's lowest, only makes it negligible). is_causal is the
// lower-triangular boolean mask aligned at the top left (row i sees keys
// j <= i: torch.ones(Lq, Lk).tril()), and, as in PyTorch, cannot be
// combined with an explicit mask.
//
// Two choices differ from or go beyond PyTorch, and say why:
//  - A position a boolean (or the causal) mask removes gets the score −inf
//    whatever its product was; PyTorch adds −inf to it, so a product that
//    overflowed to +inf or is NaN at a removed position makes its row NaN
//    there. A removed position here cannot influence its row.
//  - A row in which no position takes part (every score −inf) gives zeros —
//    probabilities, output and gradients — as PyTorch's math backend has done
//    since it switched to at::_safe_softmax (older versions, and the plain
//    softmax, give NaN). Zeros, not an error, because padding in a batch of
//    sequences produces such rows routinely, and not NaN, because one NaN
//    row reaches every parameter through the backward pass.
//
// Precision. The op asks the policy for "scaled_dot_product_attention": it
// reads Q, K, V in the policy's input dtype (cast at its boundary), computes
// in FP32 (f16 compute is refused) and stores the output in the output
// dtype. It runs as the unfused math path does, three steps each stored:
//
//   1. S = Q Kᵀ: products summed in FP32 and rounded once into the input
//      dtype (the GEMM of gemm.hpp, as Chapter 2's linear rounds y);
//   2. P = softmax(S·scale + mask) per row, in FP32 from the widened S by
//      one online (max, sum) pass (softmax_math.hpp), rounded into the input
//      dtype;
//   3. out = P V: FP32 accumulation, rounded into the output dtype.
//
// S and P are stored in the input dtype because the products that read them
// (P V here, dS·K in the backward) take both operands in one format, as a
// GPU GEMM does. Where the scale is applied is an option, because in f16 it
// decides whether S can be stored at all: with scale_q_first (the default;
// PyTorch's math backend, too, scales before the product "for stability",
// splitting √scale between Q and K), Q
// is multiplied by the scale in FP32 and rounded into the input dtype, and
// S = (Q·scale) Kᵀ has the magnitude of the final scores; without it, S = Q Kᵀ
// is stored unscaled — √D times larger — and overflows to inf in f16 before
// the FP32 multiply by the scale can help.
//
// Backward keeps Q as the product read it (Q·scale with scale_q_first), K, V
// and P as stored (as PyTorch's math backend keeps the softmax's output),
// and computes in FP32 from their widened values: dV = Pᵀ dO, dP = dO Vᵀ,
// dS = P∘(dP − rowsum(dP∘P)), dQ = dS K·scale, dK = dSᵀ Q·scale (the row
// formulas of attention_math.hpp); dQ, dK and dV are rounded once into the
// input dtype.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/nn/layers/linear.hpp"
#include "mpt/nn/module.hpp"

namespace mpt {

/// An attention mask: none, boolean (which positions take part) or additive
/// (added to the scaled scores). Its shape broadcasts to the scores'
/// [..., Lq, Lk] as NumPy and PyTorch broadcast: aligned at the right, each
/// dimension equal or 1, missing leading dimensions taken as 1.
class AttentionMask {
 public:
  /// What the mask is.
  enum class Kind : std::uint8_t {
    none,      ///< every position takes part
    boolean,   ///< keep[i] nonzero: the position takes part (PyTorch's true)
    additive,  ///< a tensor added to the scaled scores
  };
  /// No mask.
  AttentionMask() = default;
  /// A boolean mask of `shape`, row-major, nonzero = takes part. Throws
  /// std::invalid_argument unless keep has numel(shape) elements and every
  /// size is >= 1.
  static AttentionMask boolean(Shape shape, std::vector<std::uint8_t> keep);
  /// An additive mask: `add`'s values, in any dtype, widened to FP32 and
  /// added to the scaled scores in FP32. Throws std::invalid_argument for an
  /// empty tensor.
  static AttentionMask additive(Tensor add);

  /// What the mask is.
  Kind kind() const { return kind_; }
  /// Its shape (empty for none).
  const Shape& shape() const { return shape_; }
  /// The boolean mask's elements (empty unless boolean).
  const std::vector<std::uint8_t>& keep() const { return keep_; }
  /// The additive mask (empty unless additive).
  const Tensor& add() const { return add_; }

 private:
  Kind kind_ = Kind::none;
  Shape shape_;
  std::vector<std::uint8_t> keep_;
  Tensor add_;
};

/// PyTorch's keyword arguments of scaled_dot_product_attention, and where
/// the scale is applied.
struct AttentionOptions {
  std::optional<double> scale;  ///< the factor on Q Kᵀ (finite); default 1/√D
  bool is_causal = false;       ///< the top-left-aligned lower-triangular mask (no explicit mask then)
  /// true: Q·scale in FP32, rounded into the input dtype, then the product;
  /// false: the product stored unscaled, then the scale in FP32 (see above).
  bool scale_q_first = true;
};

/// Options with is_causal set: what a decoder's self-attention uses.
inline AttentionOptions causal_attention() {
  AttentionOptions o;
  o.is_causal = true;
  return o;
}

/// What scaled_dot_product_attention keeps for its backward.
struct AttentionState {
  Tensor q;              ///< Q as the product read it: Q·scale with scale_q_first, else Q (input dtype)
  Tensor k;              ///< K as read (input dtype)
  Tensor v;              ///< V as read (input dtype)
  Tensor probs;          ///< P [..., Lq, Lk] as stored (input dtype); fully masked rows are 0
  OpPrecision op{};      ///< the policy's decision
  double scale = 1;      ///< the scale used
  bool scale_q_first{};  ///< where it was applied
};

/// The output of scaled_dot_product_attention, the scores it stored and what
/// backward needs.
struct AttentionResult {
  Tensor out;            ///< [..., Lq, Dv] in the output dtype
  Tensor scores;         ///< S = Q Kᵀ [..., Lq, Lk] as stored (input dtype; scaled iff scale_q_first)
  AttentionState saved;  ///< for scaled_dot_product_attention_backward
};

/// The gradients of q, k and v, in the dtype forward read them in.
struct AttentionGrads {
  Tensor dq;  ///< like q
  Tensor dk;  ///< like k
  Tensor dv;  ///< like v
};

/// softmax(Q Kᵀ·scale + mask) V (see the top of this file). q is [B, H, Lq, D]
/// or [N, Lq, D]; k and v [.., Lk, D] and [.., Lk, Dv] with q's leading
/// dimensions. Records one trace entry (op "scaled_dot_product_attention",
/// path `path`) when ctx is tracing. Throws std::invalid_argument, naming
/// the shapes, for shapes that do not fit, a mask that does not broadcast,
/// is_causal with a mask, a scale that is not finite, or f16 compute.
AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionMask& mask, const AttentionOptions& options,
                                             Context& ctx, std::string_view path = "");

/// dQ, dK, dV from the output's gradient `dout` (shape of the output; read in
/// the input dtype), in FP32 from what forward kept, rounded into the input
/// dtype. Records one backward trace entry. Throws std::invalid_argument
/// when dout's shape is not the output's.
AttentionGrads scaled_dot_product_attention_backward(const AttentionState& saved, const Tensor& dout,
                                                     Context& ctx, std::string_view path = "");

/// Multi-head self-attention on x [B, L, E]: q, k and v projections (three
/// Linear E → E), H heads of E/H dimensions, scaled_dot_product_attention
/// per head (causal by default), the heads concatenated and the output
/// projection (Linear E → E). PyTorch's nn.MultiheadAttention with separate
/// projection weights and need_weights=False, or the attention of a GPT
/// block. Children at "<path>.q", "<path>.k", "<path>.v", "<path>.out".
class MultiHeadSelfAttention final : public Module {
 public:
  /// E = embed_dim, H = num_heads; the projections initialised as Linear's
  /// (q, k, v, out, in that order, from rng). Throws std::invalid_argument
  /// unless E >= 1, H >= 1 and H divides E, or when options carry a scale
  /// that is not finite.
  MultiHeadSelfAttention(int embed_dim, int num_heads, Rng& rng,
                         AttentionOptions options = causal_attention());

  /// "MultiHeadSelfAttention".
  const char* kind() const override { return "MultiHeadSelfAttention"; }
  /// E.
  int embed_dim() const { return embed_dim_; }
  /// H.
  int num_heads() const { return num_heads_; }
  /// The attention's options.
  const AttentionOptions& options() const { return options_; }

  Linear q;    ///< the query projection, [E, E]
  Linear k;    ///< the key projection, [E, E]
  Linear v;    ///< the value projection, [E, E]
  Linear out;  ///< the output projection, [E, E]

  /// The last forward's attention (probabilities, stored scores).
  const AttentionResult& attention() const { return attn_; }

  /// q's, k's, v's and out's weight and bias, in that order.
  std::vector<Parameter*> parameters() override;
  /// Passed to the four projections.
  void apply_policy(const Policy& policy) override;
  /// The projections' saved inputs, and the attention's Q, K, V and P.
  std::vector<const Tensor*> saved() const override;
  /// Sets the projections' paths "<path>.q", ... (and their parameter names).
  void set_path(std::string path) override;
  /// The projections' paths: "<path>.q", "<path>.k", "<path>.v", "<path>.out".
  /// This layer, then its four projections (Chapter 7: FP8 reaches them).
  void visit(const std::function<void(Module&)>& f) override {
    f(*this);
    for (Linear* p : {&q, &k, &v, &out}) p->visit(f);
  }
  std::vector<std::string> inner_paths() const override { return {q.path(), k.path(), v.path(), out.path()}; }

 protected:
  /// y [B, L, E] in the output projection's output dtype.
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  /// Through the output projection, the attention and the three input
  /// projections; dx = dx_q + dx_k + dx_v summed in FP32 and rounded once
  /// into the dtype the projections returned (the gradient of x, which all
  /// three read, is their sum).
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  int embed_dim_, num_heads_;
  AttentionOptions options_;
  std::int64_t batch_ = 0, length_ = 0;
  AttentionResult attn_;
};

}  // namespace mpt
