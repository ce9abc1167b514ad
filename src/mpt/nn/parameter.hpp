// Chapter 02 — loss scaling and FP32 master weights: the Parameter.
// Depends on: the core tier (tensor.hpp, dtype.hpp, random.hpp; context.hpp
// for Chapter 6's weight cast cache).
//
// A trainable tensor as mixed precision keeps it: the FP32 master the
// optimizer updates, the model copy that forward and backward read — in the
// dtype the policy gives it, 2 bytes an element for f16/bf16, really
// allocated; none for f32, where forward reads the master itself — and the
// FP32 gradient the optimizer and the GradScaler work on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/tensor.hpp"

namespace mpt {

/// Where the weights live between optimizer steps.
enum class MasterWeights : std::uint8_t {
  /// Mixed precision as published: the optimizer updates FP32 masters and
  /// the refresh rounds them into the low-precision copy that forward and
  /// backward read. Updates smaller than the copy's ulp keep accumulating in
  /// the master.
  fp32,
  /// THE PITFALL "fp16 weights without FP32 master weights": the weights
  /// exist only in the model dtype. The optimizer's arithmetic still runs in
  /// FP32, but the refresh writes the rounded weights back into the master,
  /// so an update below half an ulp of the weight is lost for good. Same as
  /// fp32 for an f32 model copy.
  none,
};

/// What one refresh did to the weights forward reads, compared with what it
/// read before the optimizer step.
struct RefreshStats {
  std::size_t elements = 0;  ///< parameter elements refreshed
  /// Elements of a low-precision copy that forward will now read a new value
  /// for. An f32 parameter has no copy: it counts in `elements` only.
  std::size_t changed = 0;
  /// MasterWeights::none only: elements the optimizer moved whose weight
  /// rounded back to its old value — updates lost for good. Always 0 with
  /// FP32 masters, which keep such updates.
  std::size_t lost = 0;
  /// Add another refresh's counts.
  RefreshStats& operator+=(const RefreshStats& o);
};

/// A new f32 tensor of independent draws from U(−bound, bound), in order:
/// the initial weights of Linear and Conv2d (PyTorch's default bound
/// 1/√fan_in is the caller's).
Tensor uniform_f32(Shape shape, double bound, Rng& rng);

/// One trainable tensor. `master` is the truth; refresh() rounds it into the
/// model copy after each optimizer step.
class Parameter {
 public:
  /// An empty parameter (f32, no elements).
  Parameter() = default;
  /// master = init (which must be f32: std::invalid_argument otherwise),
  /// grad = 0 of the same shape, and the model copy = init rounded into
  /// model_dtype (none for f32).
  Parameter(std::string name, Tensor init, DType model_dtype = DType::f32);

  std::string name;  ///< e.g. "fc1.weight"
  Tensor master;     ///< FP32 master weights (what the optimizer updates)
  Tensor grad;       ///< FP32 gradient (scaled until GradScaler::unscale)

  /// The dtype forward and backward read the parameter in.
  DType model_dtype() const { return model_dtype_; }
  /// What forward and backward read: the model copy, or the master for f32.
  const Tensor& weights() const { return model_dtype_ == DType::f32 ? master : model_; }
  /// Give the parameter a model copy in d (rounded from the master now), or
  /// drop it for f32.
  void set_model_dtype(DType d);
  /// After an optimizer step: round the master into the model copy; with
  /// MasterWeights::none also write the rounded weights back into the
  /// master. Returns what changed (see RefreshStats).
  RefreshStats refresh(MasterWeights mode = MasterWeights::fp32);
  /// The weights as an op reads them in dtype d, at the op's boundary:
  /// weights() itself when it already is d. Otherwise a cast, counted in
  /// `ctx` (Context::cast) — except that an f32 weight cast to f16 or bf16 is
  /// cast once and then reused until the weights change (Chapter 6: the
  /// weight cast cache of PyTorch's autocast, which caches exactly these
  /// casts of fp32 leaf weights), each reuse counted and traced as a cached
  /// cast (Context::note_cached_cast). "Change" is any write to the tensor
  /// (Tensor::version): an optimizer step, a refresh, a broadcast, a load.
  /// `role` names the tensor in the trace ("weight").
  Tensor read(DType d, Context& ctx, std::string_view path, Phase phase, const std::string& role);
  /// The dtype a normalization (LayerNorm, BatchNorm) reads this parameter in
  /// when its op reads its inputs in `d`: an FP32 parameter as it is stored,
  /// whatever `d` is (PyTorch's layer_norm and batch_norm, and cuDNN's batch
  /// norm, take FP32 γ and β beside a low-precision input: apex O2's and
  /// CPU autocast's norms), anything else in `d`. So an f16 γ under an op
  /// that reads f32 (a `.half()` model under CUDA autocast, whose fp32 list
  /// holds layer_norm) is cast at every call — an f16-to-f32 cast the weight
  /// cast cache does not keep (Chapter 6's pitfall half-under-autocast).
  DType norm_read_dtype(DType d) const { return weights().dtype() == DType::f32 ? DType::f32 : d; }
  /// read(norm_read_dtype(d), ...).
  Tensor read_for_norm(DType d, Context& ctx, std::string_view path, Phase phase, const std::string& role) {
    return read(norm_read_dtype(d), ctx, path, phase, role);
  }
  /// A layer's backward hands over this parameter's gradient: `g` (n FP32
  /// values, scratch) is rounded in place into the dtype of `as_read`, the
  /// tensor the op read the weights as (weights(), or what read() gave it),
  /// and *added* into the FP32 grad (PyTorch's .grad accumulation). So the
  /// gradient passes through the dtype the weight was read in: an f16 model
  /// copy's gradient is an f16 tensor, and so is the gradient of an f32
  /// weight that autocast cast to f16 (the backward of that cast widens it).
  /// Every layer's call goes through here: the rule lives in one place.
  void accumulate_grad(float* g, std::int64_t n, const Tensor& as_read) {
    accumulate_grad(g, n, as_read.dtype());
  }
  /// accumulate_grad with the dtype given directly: rounded into `d`, then,
  /// for an f16 or bf16 model copy read in another dtype, into the copy's dtype too (the
  /// backward of the cast that read it: a `.half()` weight read in f32 gets an
  /// f16 gradient, as PyTorch's .grad of an f16 leaf is), and added into grad. Throws std::invalid_argument
  /// unless n == grad.numel(). Then calls grad_hook, if set. With grad_factor or grad_carry set (below), in
  /// the same pass: grad = grad × grad_carry + g × grad_factor, and
  /// grad_carry becomes 1.
  void accumulate_grad(float* g, std::int64_t n, DType d);
  /// Chapter 5: DistributedDataParallel divides by the world size here, in
  /// the pass accumulate_grad makes anyway, instead of in a pass of its own
  /// over the bucket. Each contribution is multiplied by grad_factor; what
  /// grad already holds is multiplied by grad_carry at the next
  /// accumulate_grad() only. Both 1 otherwise (the plain addition).
  /// Copied with the parameter.
  float grad_factor = 1.0f;
  float grad_carry = 1.0f;  ///< see grad_factor
  /// Called at the end of every accumulate_grad(), after the contribution
  /// is in `grad` (Chapter 5: DistributedDataParallel's gradient-ready hook,
  /// which counts a parameter's contributions in one backward — a tied
  /// weight gets two). Empty: nothing is called. Copied with the parameter.
  std::function<void(Parameter&)> grad_hook;
  /// Bytes of the model copy (0 for f32: forward reads the master).
  std::size_t model_bytes() const { return model_dtype_ == DType::f32 ? 0 : model_.bytes(); }

 private:
  struct CachedCast {
    DType dtype;                   // what the weights were cast to
    std::uint64_t source_version;  // weights().version() when they were
    Tensor cast;
  };
  DType model_dtype_ = DType::f32;
  Tensor model_;
  std::vector<CachedCast> cast_cache_;  // at most one per dtype
};

/// A parameter holding the FP32 matrix `init`, its model copy in d.
Parameter make_parameter(std::string name, const MatrixF& init, DType d);
/// p.refresh(): round the master into the model copy (no-op for f32).
inline RefreshStats refresh_model_copy(Parameter& p) { return p.refresh(); }

}  // namespace mpt
