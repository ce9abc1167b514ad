// Chapters 02 onwards — the CUDA kernels of the nn tier (mpt::kernels_nn):
// the FP16-input, FP32-accumulate GEMM (Chapter 2, kernels/nn/gemm_fp16.cu)
// BatchNorm and LayerNorm with FP32 statistics, forward and backward
// (Chapter 3, kernels/nn/norms.cu), the fused softmax cross-entropy and
// the masked softmax of attention rows (Chapter 4, kernels/nn/softmax.cu),
// and the tensor-core GEMM, fp16 or bf16 inputs (Chapter 6,
// kernels/nn/gemm_tc.cu).
// Depends on: kernels/formats/formats_kernels.hpp (and through it
// mpt/formats/codes.hpp: Fp16Code, Bf16Code). Host-only: no CUDA types, so
// CPU code and cling notebooks can include it; it includes nothing of
// Chapters 3 or 4, so Chapter 2's code includes it as before.
//
// Every pointer named d_* is a DEVICE pointer (cudaMalloc'd). All work goes
// to the default stream. A CUDA error throws std::runtime_error carrying
// CUDA's error name and text.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/formats/formats_kernels.hpp"

namespace mpt::cuda {

// --- FP16-input, FP32-accumulate GEMM (kernels/nn/gemm_fp16.cu) ----------------

/// Whether a GEMM operand is read as stored (no) or transposed (yes).
enum class Trans : int {
  no = 0,   ///< op(X) = X
  yes = 1,  ///< op(X) = X^T
};

/// The GEMM kernels, simplest first.
enum class GemmVersion : int {
  naive = 1,  ///< one thread per output, operands read straight from global memory
  tiled = 2,  ///< 16x16 shared-memory tiles: each operand value loaded once per tile
};

/// C = op(A) · op(B), all row-major and contiguous, fp16 inputs given as
/// IEEE binary16 codes (Fp16Code, so bf16 codes do not compile), products
/// and sums in FP32:
///   op(A): M x K — A stored as [M, K] (ta = no) or [K, M] (ta = yes)
///   op(B): K x N — B stored as [K, N] (tb = no) or [N, K] (tb = yes)
///   C:     M x N, FP32
/// A Linear layer y = x W^T with x [batch, in], W [out, in] (PyTorch's
/// layout) is gemm_fp16(no, yes, batch, out, in, x, W, y); its backward is
/// dx = dy W: (no, no, batch, in, out, dy, W, dx) and dW = dy^T x:
/// (yes, no, out, in, batch, dy, x, dW).
/// Each output sums its K products in order k = 0..K-1 with one FMA each.
/// A product of two fp16 values is exact in FP32, so an FMA equals "round
/// the sum once": the result is bit for bit a CPU loop acc += a*b in the same
/// order (NaN payloads aside). M, N, K >= 0; K == 0 gives zeros; M above
/// 65535 * 16 = 1048560 (the grid's y limit) throws std::length_error. Queued.
void gemm_fp16(Trans ta, Trans tb, int M, int N, int K, const Fp16Code* d_a, const Fp16Code* d_b, float* d_c,
               GemmVersion v = GemmVersion::tiled);

/// As above with C stored as fp16 codes: the FP32 sum rounded once to fp16
/// (nearest-even, overflow to ±inf, subnormals kept, NaN → 0x7E00 with its
/// sign), via round_element.hpp's round_to_format, as mpt::encode_array does.
void gemm_fp16(Trans ta, Trans tb, int M, int N, int K, const Fp16Code* d_a, const Fp16Code* d_b,
               Fp16Code* d_c, GemmVersion v = GemmVersion::tiled);

/// The same GEMM with FP32 inputs, on the CUDA cores (Chapter 6: the matmul
/// a policy keeps in f32, as PyTorch runs it with
/// torch.backends.cuda.matmul.allow_tf32 = False). Same shapes, storage,
/// versions and errors as gemm_fp16. Each output is
///   acc = +0; for k = 0..K-1: acc = fma(op(A)[m][k], op(B)[k][n], acc)
/// so it equals bit for bit a CPU loop of std::fma in that order (NaN
/// payloads aside); a product of two floats is not exact, so it is not the
/// loop acc += a * b. Queued.
void gemm_f32(Trans ta, Trans tb, int M, int N, int K, const float* d_a, const float* d_b, float* d_c,
              GemmVersion v = GemmVersion::tiled);

// --- BatchNorm and LayerNorm with FP32 statistics (kernels/nn/norms.cu) ------------
//
// The computations of mpt::BatchNorm and mpt::LayerNorm (Chapter 3) on the
// GPU: statistics by Welford's update and Chan's merge in FP32 (the very
// functions of mpt/nn/layers/welford.hpp), normalization, affine and gradients by
// the per-element formulas of mpt/nn/layers/norm_math.hpp, every value read from
// its storage type widened exactly to FP32 and every result rounded once
// into its storage type (nearest-even, overflow to inf, as mpt's Tensor
// writes). An input of X elements is read as norm_math's (outer, channels,
// inner) layout: element (n, c, i) at (n·channels + c)·inner + i.
//   BatchNorm on [N, C], [N, C, L], [N, C, H, W]: outer N, channels C, inner 1, L or H·W
//   LayerNorm on [rows, cols]: one row per normalized set of cols values
// No two arrays may overlap (the kernels declare every pointer __restrict__;
// the running estimates are updated in place, in their own arrays). Sizes
// and offsets are 64-bit throughout. A size < 0, a null pointer that is
// required, or an eps or momentum out of range throws
// std::invalid_argument before any launch; more channels (or row blocks)
// than a grid holds, or more elements than 64-bit offsets hold, throws
// std::length_error. Every launch is checked, and everything is queued on
// the default stream (no host synchronisation). Template arguments are
// deduced from the pointers: where every pointer of one type is nullptr,
// name the types (batch_norm_forward_eval<Fp16Code, float>(...)).
//
// Element-wise steps (x̂, y, dx) are the CPU layer's float operations in the
// same order, with no contraction into FMAs (norms.cu is compiled with
// -fmad=false): given the same statistics and sums they give the CPU's
// bits. What differs is the order of the reductions, and with it the last
// bits of the statistics and of the sums.

/// The norm kernels, simplest first (the GPU test runs both; the same
/// results up to the order of the reductions, each deterministic).
enum class NormVersion : int {
  /// one block per BatchNorm channel; one warp per LayerNorm row, one thread
  /// per LayerNorm column for dγ, dβ; one element per load, decoded and
  /// rounded by the library's functions (round_element.hpp)
  simple = 1,
  /// BatchNorm: a channel split over many blocks (partial Welford states or
  /// sums in scratch memory, merged in a fixed order by a second kernel),
  /// the [N, C] layout read 32 channels of a row at a time, y and dx written
  /// element-wise with 16-byte accesses (x, y, dy, dx 16-byte aligned;
  /// otherwise the call runs the simple version); LayerNorm: 16-byte loads
  /// and stores (where the row length and the arrays' alignment allow;
  /// otherwise the simple kernel runs), dγ,
  /// dβ over row chunks; both with the GPU's fp16/bf16 conversions, which
  /// give the library's bits for every non-NaN value (a NaN is stored as
  /// 0x7FFF: a NaN, not the library's payload). Scratch memory comes from
  /// CUDA's stream-ordered pool (cudaMallocAsync) for the call.
  fast = 2,
};

/// How many rows NormVersion::fast's LayerNorm dγ, dβ kernel adds, in
/// order, into one FP32 partial sum per column: 64, or more where chunks of
/// 64 would be more than 65535 (the grid's y limit). The partial sums are
/// then added in chunk order, from 0. A function of rows alone, so the
/// result does not depend on the GPU or on scheduling; one chunk is the
/// simple version's order.
constexpr std::int64_t layer_norm_dweight_chunk_rows(std::int64_t rows) {
  constexpr std::int64_t kChunk = 64, kMaxChunks = 65535;
  const std::int64_t least = rows / kMaxChunks + (rows % kMaxChunks != 0 ? 1 : 0);
  return least > kChunk ? least : kChunk;
}

/// True for the element types the norm kernels read and write: float (f32),
/// Fp16Code (f16) and Bf16Code (bf16).
template <class T>
inline constexpr bool is_norm_storage_v =
    std::is_same_v<T, float> || std::is_same_v<T, Fp16Code> || std::is_same_v<T, Bf16Code>;

namespace detail {
// The definitions, in kernels/nn/norms.cu, for every pair of norm storage types.
template <class X, class P>
void batch_norm_forward_train(std::int64_t outer, std::int64_t channels, std::int64_t inner, const X* d_x,
                              const P* d_weight, const P* d_bias, P* d_running_mean, P* d_running_var,
                              float momentum, float eps, X* d_y, float* d_mean, float* d_invstd,
                              NormVersion v);
template <class X, class P>
void batch_norm_forward_eval(std::int64_t outer, std::int64_t channels, std::int64_t inner, const X* d_x,
                             const P* d_weight, const P* d_bias, const P* d_running_mean,
                             const P* d_running_var, float eps, X* d_y, NormVersion v);
template <class X, class P>
void batch_norm_backward(std::int64_t outer, std::int64_t channels, std::int64_t inner, const X* d_x,
                         const X* d_dy, const float* d_mean, const float* d_invstd, const P* d_weight,
                         bool batch_statistics, X* d_dx, float* d_dweight, float* d_dbias, NormVersion v);
template <class X, class P>
void layer_norm_forward(std::int64_t rows, std::int64_t cols, const X* d_x, const P* d_weight,
                        const P* d_bias, float eps, X* d_y, float* d_mean, float* d_rstd, NormVersion v);
template <class X, class P>
void layer_norm_backward(std::int64_t rows, std::int64_t cols, const X* d_x, const X* d_dy,
                         const float* d_mean, const float* d_rstd, const P* d_weight, X* d_dx,
                         float* d_dweight, float* d_dbias, NormVersion v);
}  // namespace detail

/// BatchNorm forward in training mode (mpt::BatchNorm::forward with
/// training() on). x and y: X codes [outer, channels, inner]; weight, bias
/// and the running estimates: P codes [channels] (P is the parameters'
/// model dtype, X the activations'; any pair of float, Fp16Code, Bf16Code).
/// Per channel, over its M = outer·inner values, all in FP32:
///  - the Welford statistics; d_mean[c] = mean, d_invstd[c] =
///    1/√(biased variance + eps) (f32 [channels], what backward reads);
///  - y = x̂·γ + β with x̂ = (x − mean)·invstd, rounded once into X
///    (weight nullptr: γ = 1; bias nullptr: β = 0);
///  - with running estimates (both pointers, or neither), in place:
///    running = (1 − momentum)·running + momentum·batch, the batch variance
///    unbiased (M2 / (M − 1)), computed in FP32 from the widened estimate
///    and rounded once into P: PyTorch's update. `momentum` is the factor
///    itself: the layer's momentum, or 1/num_batches_tracked (after the
///    increment) for the cumulative average.
/// A non-finite input makes its channel's statistics, outputs and running
/// estimates non-finite, as on the CPU. Requires M >= 2 (PyTorch: "Expected
/// more than 1 value per channel when training"), momentum in [0, 1], eps
/// finite and >= 0, d_x, d_y, d_mean, d_invstd non-null. Simple: one block
/// per channel; fast: see NormVersion. Queued.
template <class X, class P>
void batch_norm_forward_train(std::int64_t outer, std::int64_t channels, std::int64_t inner, const X* d_x,
                              const P* d_weight, const P* d_bias, P* d_running_mean, P* d_running_var,
                              float momentum, float eps, X* d_y, float* d_mean, float* d_invstd,
                              NormVersion v = NormVersion::fast) {
  static_assert(is_norm_storage_v<X> && is_norm_storage_v<P>,
                "batch_norm_forward_train: X and P must be float, Fp16Code or Bf16Code");
  detail::batch_norm_forward_train(outer, channels, inner, d_x, d_weight, d_bias, d_running_mean,
                                   d_running_var, momentum, eps, d_y, d_mean, d_invstd, v);
}

/// BatchNorm forward in eval mode: y = x̂·γ + β with the running estimates,
/// mean = running_mean[c] and invstd = 1/√(running_var[c] + eps), both in
/// FP32 from the widened P values. Bit for bit mpt::BatchNorm::forward in
/// eval mode (nothing is reduced). The layout, the types and the checks as
/// in batch_norm_forward_train (M >= 1 is enough here). Queued.
template <class X, class P>
void batch_norm_forward_eval(std::int64_t outer, std::int64_t channels, std::int64_t inner, const X* d_x,
                             const P* d_weight, const P* d_bias, const P* d_running_mean,
                             const P* d_running_var, float eps, X* d_y, NormVersion v = NormVersion::fast) {
  static_assert(is_norm_storage_v<X> && is_norm_storage_v<P>,
                "batch_norm_forward_eval: X and P must be float, Fp16Code or Bf16Code");
  detail::batch_norm_forward_eval(outer, channels, inner, d_x, d_weight, d_bias, d_running_mean,
                                  d_running_var, eps, d_y, v);
}

/// BatchNorm backward (mpt::BatchNorm::backward): from x and dy (X codes,
/// the layout above) and the mean and invstd the forward normalized with
/// (f32 [channels]: the batch statistics in training, the running ones in
/// eval), per channel in FP32:
///   d_dbias[c] = Σ dy,  d_dweight[c] = Σ dy·x̂   (f32 sums; the layer rounds
///                                              them into P before adding
///                                              them into the FP32 grad)
///   dx = invstd/M·(M·g − Σg − x̂·Σg·x̂), g = γ·dy   (batch_statistics), or
///   dx = g·invstd                                 (fixed statistics, eval)
/// with Σg = γ·Σdy and Σg·x̂ = γ·Σdy·x̂ (γ is one number per channel), dx
/// rounded once into X. weight nullptr means γ = 1; d_dx, d_dweight and
/// d_dbias may each be nullptr (not computed). Simple: one block per
/// channel; fast: see NormVersion (dx from the very sums written to
/// d_dweight and d_dbias). Queued.
template <class X, class P>
void batch_norm_backward(std::int64_t outer, std::int64_t channels, std::int64_t inner, const X* d_x,
                         const X* d_dy, const float* d_mean, const float* d_invstd, const P* d_weight,
                         bool batch_statistics, X* d_dx, float* d_dweight, float* d_dbias,
                         NormVersion v = NormVersion::fast) {
  static_assert(is_norm_storage_v<X> && is_norm_storage_v<P>,
                "batch_norm_backward: X and P must be float, Fp16Code or Bf16Code");
  detail::batch_norm_backward(outer, channels, inner, d_x, d_dy, d_mean, d_invstd, d_weight, batch_statistics,
                              d_dx, d_dweight, d_dbias, v);
}

/// LayerNorm forward (mpt::LayerNorm::forward): every row of x (X codes
/// [rows, cols]) normalized with its own FP32 Welford mean and biased
/// variance; d_mean[r] and d_rstd[r] = 1/√(var + eps) (f32 [rows]);
/// y = x̂·γ[i] + β[i] rounded once into X (weight, bias: P codes [cols], or
/// nullptr for γ = 1, β = 0). One warp per row; fast: 16-byte accesses
/// where cols is a multiple of 8 codes (4 floats) and the arrays are
/// aligned, the simple kernel otherwise. Queued.
template <class X, class P>
void layer_norm_forward(std::int64_t rows, std::int64_t cols, const X* d_x, const P* d_weight,
                        const P* d_bias, float eps, X* d_y, float* d_mean, float* d_rstd,
                        NormVersion v = NormVersion::fast) {
  static_assert(is_norm_storage_v<X> && is_norm_storage_v<P>,
                "layer_norm_forward: X and P must be float, Fp16Code or Bf16Code");
  detail::layer_norm_forward(rows, cols, d_x, d_weight, d_bias, eps, d_y, d_mean, d_rstd, v);
}

/// LayerNorm backward (mpt::LayerNorm::backward), all sums in FP32:
///   dx = rstd/D·(D·g − Σg − x̂·Σg·x̂), g = γ[i]·dy, sums over the row (one
///   warp per row), rounded once into X;
///   d_dweight[i] = Σ_rows dy·x̂, d_dbias[i] = Σ_rows dy (f32 [cols]), the
///   terms the CPU layer adds (the same FP32 products), in a fixed order:
///    - NormVersion::simple: one thread per column adding the rows in order
///      0, 1, ...: the CPU layer's order, so its FP32 sums bit for bit;
///    - NormVersion::fast: the rows in chunks of
///      layer_norm_dweight_chunk_rows(rows), each chunk's terms added in row
///      order into a partial sum (from 0), the partials added in chunk order
///      (from 0): deterministic, and within the order-independent bound
///      γ(rows)·Σ|terms| of the CPU's sums (rows <= 64: the simple order).
///      Its partial sums live in scratch memory taken from CUDA's stream-
///      ordered pool (cudaMallocAsync) for the call.
/// weight nullptr means γ = 1; d_dx, d_dweight and d_dbias may each be
/// nullptr (not computed). Queued.
template <class X, class P>
void layer_norm_backward(std::int64_t rows, std::int64_t cols, const X* d_x, const X* d_dy,
                         const float* d_mean, const float* d_rstd, const P* d_weight, X* d_dx,
                         float* d_dweight, float* d_dbias, NormVersion v = NormVersion::fast) {
  static_assert(is_norm_storage_v<X> && is_norm_storage_v<P>,
                "layer_norm_backward: X and P must be float, Fp16Code or Bf16Code");
  detail::layer_norm_backward(rows, cols, d_x, d_dy, d_mean, d_rstd, d_weight, d_dx, d_dweight, d_dbias, v);
}

// --- Softmax cross-entropy and masked softmax (kernels/nn/softmax.cu, Chapter 4) ----------
//
// Every row of logits or scores is reduced with the online (max, sum) of
// mpt/nn/layers/softmax_math.hpp (max_sum_add per thread, max_sum_merge across the
// warp and the block), so the maximum is subtracted before every exp and the
// row is read once for its statistics. fp16 in, FP32 arithmetic throughout,
// each stored result rounded once to fp16 (nearest-even, overflow to ±inf,
// subnormals kept). Rows are row-major and contiguous; no two arrays may
// overlap. A size < 0, a null pointer that is required or an option out of
// range throws std::invalid_argument before any launch; more rows than a grid
// holds, or more elements than 64-bit offsets hold, std::length_error. Queued
// on the default stream.

/// How the per-row losses of softmax_cross_entropy become the loss
/// (PyTorch's `reduction` argument of torch.nn.functional.cross_entropy).
enum class Reduction : int {
  none = 0,  ///< no reduction: the per-row losses are the result
  mean = 1,  ///< their sum divided by the number of rows whose target is not ignore_index
  sum = 2,   ///< their sum
};

/// The options of torch.nn.functional.cross_entropy that the fused kernel
/// takes (class weights are not supported).
struct CrossEntropyOptions {
  std::int32_t ignore_index = -100;       ///< rows with this target get no loss and zero gradient
  float label_smoothing = 0.0f;           ///< ε in [0, 1]: the target is (1 − ε)·onehot + ε/K
  Reduction reduction = Reduction::mean;  ///< how the per-row losses are combined
};

/// The fused softmax cross-entropy kernels, simplest first.
enum class SoftmaxCeVersion : int {
  block_per_row = 1,  ///< one block of 256 threads per row, one fp16 code per load
  vectorized = 2,     ///< one block of 512 threads per row, 16-byte loads and stores (8 codes)
};

/// Softmax cross-entropy forward and backward in one kernel (llm.c's fused
/// classifier): logits fp16 [rows, classes], targets int32 [rows].
/// Per row, in FP32, with (max, sum = Σⱼ exp(zⱼ − max)) from one online
/// pass and K = classes, by softmax_math.hpp's cross_entropy_of (the CPU's
/// formula: no large max is added to log(sum) and then taken off again):
///   loss  = log(sum) − (z_y − max)                                  (ε = 0)
///   loss  = (1 − ε)·(log(sum) − (z_y − max)) +
///           ε·(log(sum) − Σⱼ(zⱼ − max) / K)                         (ε > 0)
///   dzⱼ   = g·(softmaxⱼ − (1 − ε)·[j = y] − ε/K), rounded once to fp16
/// with g = dloss for Reduction::sum and none, and dloss / (the number of
/// rows whose target is not ignore_index) for mean: the gradient of
/// dloss·(the reduced loss), dloss being the loss scale (for none, the
/// gradient of dloss·Σ losses). The same per-row loss and the same mean as
/// PyTorch (aten/src/ATen/native/LossNLL.cpp, cross_entropy_loss_label_smoothing:
/// (1 − ε)·nll + (ε/K)·Σⱼ(−log softmaxⱼ)).
///   - d_losses (f32 [rows], required): the per-row losses, 0 where the
///     target is ignore_index (PyTorch's reduction='none').
///   - d_loss (f32, one value): the mean or the sum (NaN for a mean over no
///     counted rows, 0/0 as in PyTorch); required for mean and sum, unused
///     (may be nullptr) for none. For mean it also carries g between the
///     kernels of one call.
///   - d_dlogits (fp16 [rows, classes]): the gradient, exactly 0 on ignored
///     rows; nullptr: forward only.
/// A NaN logit makes its row's loss and gradient NaN and nothing else (the
/// mean and sum, which add it, become NaN too). A target outside [0, K) that
/// is not ignore_index makes its row's loss and gradient NaN (PyTorch stops
/// with a device-side assertion; a kernel cannot throw, and a NaN loss does
/// not go unnoticed). Requires rows >= 0, classes >= 1, ε in [0, 1], d_logits
/// and d_targets non-null when rows > 0. Version 2 needs classes % 8 == 0 and
/// 16-byte aligned logits and gradient; otherwise the call runs version 1.
void softmax_cross_entropy(std::int64_t rows, std::int64_t classes, const Fp16Code* d_logits,
                           const std::int32_t* d_targets, float dloss, const CrossEntropyOptions& options,
                           float* d_losses, float* d_loss, Fp16Code* d_dlogits,
                           SoftmaxCeVersion v = SoftmaxCeVersion::vectorized);

/// The masked softmax kernels, simplest first.
enum class MaskedSoftmaxVersion : int {
  warp_per_row = 1,  ///< one warp per row, one fp16 code (and one mask byte) per load, software conversions
  vectorized = 2,    ///< one warp per row, 16-byte loads and stores (8 codes), hardware conversions
};

/// Softmax of attention rows with a mask: scores fp16 [rows, cols], output
/// fp16 probabilities [rows, cols], FP32 in between. Column c of row r takes
/// part when d_mask[r·cols + c] is true (d_mask bool [rows, cols]; nullptr:
/// every column) and, with causal, when c <= r mod cols (the rows are
/// stacked [cols, cols] blocks of query rows, PyTorch's is_causal, a lower
/// triangle of ones, aligned top left; rows must be a multiple of cols).
///   pᵣ꜀ = exp(z − max) / Σ exp(z − max) over the kept columns, 0 elsewhere,
/// by the CPU attention's functions (attention_math.hpp: score, row_prob),
/// with PyTorch's answers (scaled_dot_product_attention's math backend,
/// at::_safe_softmax) on special rows:
///  - a row with no kept column (or only kept −inf scores) outputs zeros:
///    the attention of a query that may see nothing adds nothing (the plain
///    softmax would give NaN there, which then poisons the whole backward);
///  - a row whose kept scores hold a NaN or a +inf outputs NaN at every
///    column, masked ones included (exp(inf − inf) makes the row's sum NaN);
///  - a masked column's score is never used: a NaN or inf stored there
///    changes nothing.
/// One warp per row. Version 2 needs cols % 8 == 0, 16-byte aligned scores
/// and probs and an 8-byte aligned mask; otherwise the call runs version 1.
/// Both give the same values up to the order of the row's (max, sum) merge;
/// version 2 stores a NaN probability as 0x7FFF (version 1: 0x7E00). Queued.
void masked_softmax(std::int64_t rows, std::int64_t cols, const Fp16Code* d_scores, const bool* d_mask,
                    bool causal, Fp16Code* d_probs,
                    MaskedSoftmaxVersion v = MaskedSoftmaxVersion::vectorized);

// --- Tensor-core GEMM, fp16 or bf16 inputs (kernels/nn/gemm_tc.cu, Chapter 6) ------------
//
// The GEMM of gemm_fp16 above on the tensor cores (nvcuda::wmma, 16x16x16
// tiles, FP32 accumulation), for both 16-bit input formats a precision
// policy may give a matmul. Same shapes, storage and Trans as gemm_fp16;
// FP32 output only. Any M, N, K >= 0 (the edge tiles are zero-padded in
// shared memory). Needs a device of compute capability 8.0 (sm_80) or newer.

/// C = op(A) · op(B) on the tensor cores, fp16 inputs as IEEE binary16 codes
/// (Fp16Code), products exact and sums in FP32:
///   op(A): M x K — A stored as [M, K] (ta = no) or [K, M] (ta = yes)
///   op(B): K x N — B stored as [K, N] (tb = no) or [N, K] (tb = yes)
///   C:     M x N, FP32
/// The sum order and its rounding are the tensor core's, not a CPU loop's,
/// so results need not match gemm_fp16 bit for bit. The GPU test holds each
/// output to the order-independent bound
///   |exact − c| ≤ K · 2^-23 · Σₖ |a_mk · b_kn|
/// and to the exact value when the inputs are integers whose products and
/// partial sums stay below 2^24 in magnitude; a zero result is +0. inf and
/// NaN propagate (a NaN in a row of op(A) makes that row of C NaN; inf · 0
/// is NaN). One warp per 16x16 tile of C. K == 0 gives zeros. A size < 0,
/// an unknown Trans or a null pointer that is needed throws
/// std::invalid_argument, M above 65535 · 16 = 1048560 (the grid's y limit)
/// std::length_error, a device older than sm_80 std::runtime_error, all
/// before any launch. Queued.
void gemm_tc(Trans ta, Trans tb, int M, int N, int K, const Fp16Code* d_a, const Fp16Code* d_b, float* d_c);

/// As above with bf16 inputs (Bf16Code: 8 exponent bits, 7 fraction bits;
/// a product of two bf16 values is exact in FP32 unless it overflows or
/// underflows FP32's range, which bf16 shares). Overloaded on the code type,
/// so fp16 codes cannot reach the bf16 kernel or the other way round.
void gemm_tc(Trans ta, Trans tb, int M, int N, int K, const Bf16Code* d_a, const Bf16Code* d_b, float* d_c);

}  // namespace mpt::cuda
