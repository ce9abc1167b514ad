// Chapter 06 — a policy found by measurement: per layer, how much the loss
// and the gradients move when that layer alone runs in a lower precision;
// then, greedily, the lowest-precision assignment whose final loss stays
// within a budget of FP32's; the result a policy string a person can read
// and reuse. Every candidate is costed with the cost model (bytes of
// activations and weights, an estimated step time on a named GPU).
// Depends on: run.hpp (TrainRun, the chapters' recipes), the core tier
// (policy strings, the trace, the cost model).
//
// The method, for a model M, a low dtype D (f16 or bf16), a budget b, N steps
// and K seeds:
//
//   1. FP32: K runs of N steps from seeds s, s+1, ..., s+K−1 (s the chapter's
//      seed); L32 = the mean of their final losses (the mean of the last
//      kTail steps' training losses of each run, so that one batch's noise
//      does not decide), G32 = the first step's gradient of the first seed.
//   2. The layers: every path of M that runs an op in a traced FP32 step
//      (the loss left out: it reads what arrives and returns FP32), in the
//      order they run; with a depth D, those paths cut to D segments
//      (SearchOptions::depth).
//   3. Sensitivity of each layer p: the K runs with only p in D
//      (f32+p=D): the loss change ΔL(p) = mean final loss − L32, and the
//      gradient error ‖G(p) − G32‖ / ‖G32‖ of the first step (same weights,
//      same batch: only precision differs).
//   4. Greedy: the layers from the least to the most sensitive (ΔL, then the
//      gradient error); each is lowered, on top of those already lowered,
//      when the K runs all stay finite and their mean final loss is at most
//      L32 + b·|L32|; otherwise it stays FP32.
//   5. The policy string: the shorter of "f32+p=D+..." and "D+p=f32+...",
//      rules ordered from the outermost path inwards so that a rule for a
//      parent (block0.attn) is overridden by its children's (block0.attn.q).
//
// Everything is seeded: the same options give the same result, bit for bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mpt/core/dtype.hpp"

namespace mpt::train {

/// What a search runs.
struct SearchOptions {
  std::string model = "cnn";       ///< mlp | cnn | transformer (with its chapter's data)
  DType low = DType::f16;          ///< the dtype layers are lowered to: f16 or bf16
  std::string scaler = "dynamic";  ///< every run's scaler (dynamic | static:S | none)
  double budget = 0.02;            ///< b: the relative increase of the final loss allowed
  std::int64_t steps = 30;         ///< N: steps of every run
  int seeds = 2;                   ///< K: runs per candidate
  std::string gpu = "h100-sxm";    ///< the cost model's GPU (cost_model.hpp)
  /// How finely step 2 cuts the model: 0, every op path is a layer of its
  /// own; D >= 1, the op paths are cut to their first D segments and a
  /// layer is each such prefix, with everything under it ("block0.attn.q"
  /// belongs to "block0.attn" at depth 2, to "block0" at depth 1). A coarser
  /// cut runs fewer candidates (two per layer): the Transformer's 29 op
  /// paths are 12 layers at depth 2 and 6 at depth 1.
  int depth = 0;
};

/// Throws std::invalid_argument (one line naming the field, the value and
/// what is valid) unless the options can run: a known model, low f16 or
/// bf16, a known scaler, 0 <= budget <= 10, 1 <= steps <= 100000, 1 <= seeds
/// <= 64, a known GPU, 0 <= depth <= 16.
void check_search_options(const SearchOptions& o);

/// The final loss of one run: the mean of its last kTail training losses
/// (all of them when it has fewer steps).
inline constexpr int kTail = 5;

/// One policy, measured.
struct Evaluation {
  std::string policy;                ///< its canonical text
  std::vector<double> final_losses;  ///< per seed (kTail mean)
  double mean_loss = 0;              ///< over the seeds
  double spread = 0;                 ///< max − min over the seeds
  std::int64_t skipped = 0;          ///< steps the scalers skipped, over all seeds
  bool finite = true;                ///< every final loss finite
  double grad_error = 0;             ///< ‖G − G32‖ / ‖G32‖ at the first step of the first seed
  double activation_bytes = 0;       ///< bytes the forward ops wrote in a traced step
  double weight_bytes = 0;           ///< bytes of the parameters' model copies (what forward reads)
  double seconds = 0;                ///< the cost model's step time on SearchOptions::gpu
};

/// One layer's sensitivity and the greedy pass's verdict.
struct LayerResult {
  std::string path;            ///< the layer's path
  std::string ops;             ///< the ops it runs, "conv2d" or "layer_norm"
  double loss_change = 0;      ///< ΔL with only this layer lowered
  double grad_error = 0;       ///< its first-step gradient error alone
  bool lowered = false;        ///< kept in the low dtype by the greedy pass
  double loss_when_tried = 0;  ///< the mean final loss of the greedy candidate that tried it
};

/// A whole search.
struct SearchResult {
  SearchOptions options;            ///< as given
  Evaluation fp32;                  ///< the reference
  std::vector<LayerResult> layers;  ///< in the greedy pass's order
  std::string policy;               ///< the policy string found (canonical text)
  Evaluation found;                 ///< that policy, measured
  double loss_limit = 0;            ///< L32 + b·|L32|
  std::int64_t evaluations = 0;     ///< candidates run (each K runs)
};

/// Measure `policy` (any policy string) as the search measures a candidate;
/// `reference_grads` (the FP32 first-step gradient) may be empty, then
/// grad_error is 0. Throws std::invalid_argument for bad options or policy.
Evaluation evaluate_policy(const SearchOptions& o, const std::string& policy,
                           const std::vector<float>& reference_grads = {});

/// The first-step gradient of the FP32 run of the first seed (G32).
std::vector<float> reference_gradients(const SearchOptions& o);

/// The layers of step 2 with the ops each runs: [(path, "op, op")], in order.
std::vector<std::pair<std::string, std::string>> searchable_layers(const SearchOptions& o);

/// The policy string of step 5 for the layers `lowered` (by path) among
/// `layers`, in the low dtype `low`.
std::string policy_for(const std::vector<std::string>& layers, const std::vector<std::string>& lowered,
                       DType low);

/// Steps 1 to 5 (check_search_options first).
SearchResult search_policy(const SearchOptions& o);

}  // namespace mpt::train
