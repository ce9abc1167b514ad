// Chapter 02 — loss scaling and FP32 master weights: the Linear layer.
// Depends on: module.hpp, gemm.hpp, layer_math.hpp (the formulas),
// parameter.hpp; the core tier's Rng (the initialisation).
//
// y = x Wᵀ + b as one GEMM: inputs read in the dtype the policy gives the
// op "linear", products summed in FP32, the bias added to the FP32
// accumulator, the result rounded once into the output dtype.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "mpt/core/random.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/nn/cpu/gemm.hpp"
#include "mpt/nn/module.hpp"
#include "mpt/nn/parameter.hpp"

namespace mpt {

/// Chapter 7: the three tensors of a Linear that an FP8 recipe scales, each
/// with its own scale (Transformer Engine's per-module quantizers).
enum class Fp8Role : std::uint8_t {
  input,        ///< x, forward (E4M3)
  weight,       ///< W, forward (E4M3)
  grad_output,  ///< dy, backward (E5M2 under HYBRID)
};
/// "input", "weight", "grad_output".
const char* fp8_role_name(Fp8Role r);

/// Chapter 7: how a Linear runs its GEMMs in FP8 — the seam through which
/// the fp8 tier (above this one) gives a Linear its scaling state and its
/// FP8 GEMMs (fp8/linear_scaling.hpp implements it: per-tensor scales or MX
/// block scales). A Linear whose policy answer reads an FP8 dtype calls it;
/// without one it refuses to run.
class LinearFp8 {
 public:
  virtual ~LinearFp8() = default;
  /// The dtype the forward GEMM reads x and W in (the policy's answer must be it).
  virtual DType forward_dtype() const = 0;
  /// What a forward did: y and the operands as its GEMM read them (for the trace).
  struct Forward {
    Tensor y;            ///< [B, out] in the output dtype
    TracedValue x;       ///< x as the GEMM read it (dtype, shape, bytes with its scales)
    TracedValue weight;  ///< W likewise
  };
  /// y = x·Wᵀ + bias with x (any dtype) and W (the FP32 master) quantized,
  /// FP32 accumulation, `bias` added to the descaled accumulator, y rounded
  /// once into `out`. Keeps what backward() needs.
  virtual Forward forward(const Tensor& x, const Tensor& w, const Tensor& bias, DType out) = 0;
  /// What a backward did.
  struct Backward {
    Tensor dx;              ///< [B, in] in dx_dtype (empty unless asked for)
    std::vector<float> dw;  ///< [out, in] in FP32
    TracedValue dy;         ///< dy as the GEMMs read it
    TracedValue x;          ///< x as the weight-gradient GEMM read it
    TracedValue weight;     ///< W as the input-gradient GEMM read it
  };
  /// dx = dy·W (when need_dx, rounded into dx_dtype) and dW = dyᵀ·x as FP8
  /// GEMMs, dy quantized here, x and W as the last forward kept them.
  virtual Backward backward(const Tensor& dy, bool need_dx, DType dx_dtype) = 0;
  /// What the last forward kept for backward (the byte count of saved()).
  virtual std::vector<const Tensor*> saved() const = 0;
};

/// torch.nn.Linear(in_features, out_features): weight [out, in], bias [out].
class Linear final : public Module {
 public:
  /// Weight and bias uniform in ±1/√in from `rng` (PyTorch's default:
  /// kaiming_uniform(a=√5) for W and U(±1/√in) for b, both uniform in
  /// ±1/√in), the weight's elements first, then the bias'. Throws
  /// std::invalid_argument unless both sizes are >= 1.
  Linear(int in_features, int out_features, Rng& rng);
  /// Given initial values: weight [out, in] and bias [out] (both f32).
  Linear(Tensor weight, Tensor bias);

  /// "Linear".
  const char* kind() const override { return "Linear"; }
  /// The weight, [out, in].
  Parameter weight;
  /// The bias, [out].
  Parameter bias;

  std::vector<Parameter*> parameters() override { return {&weight, &bias}; }
  /// Both model copies in Policy::parameter_dtype("linear", path()).
  void apply_policy(const Policy& policy) override;
  /// The input as the GEMM read it (kept for dW), and under FP8 the weight's
  /// FP8 copy (kept for dx).
  std::vector<const Tensor*> saved() const override {
    if (fp8_ran_ && fp8) return fp8->saved();
    return {&x_};
  }
  /// Names the parameters "<path>.weight" and "<path>.bias".
  void set_path(std::string path) override;
  /// Chapter 7: the FP8 GEMM and scales this layer runs with when its policy
  /// answer is FP8 (set by fp8::attach_fp8; null: none).
  std::shared_ptr<LinearFp8> fp8;

 protected:
  /// x [B, in] cast to the policy's input dtype, y [B, out] in its output dtype.
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  /// dW [out, in] = dyᵀ·x and db [out] = Σ_B dy, FP32 accumulation, rounded
  /// into the weights' dtype (the gradient of an f16 weight is an f16 tensor)
  /// and then *added* into the FP32 grads (PyTorch's .grad accumulation);
  /// dx [B, in] = dy·W stored in the dtype x was read in. dy is read in that
  /// dtype too (a GEMM takes both inputs in one format).
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  Tensor forward_fp8(const Tensor& x, Context& ctx);
  Tensor backward_fp8(const Tensor& dy, Context& ctx);

  Tensor x_;              // the input as the forward GEMM read it
  bool fp8_ran_ = false;  // Chapter 7: the last forward ran through fp8 (which keeps what backward needs)
  std::int64_t fp8_batch_ = 0;  // ... with a batch of this many rows
  OpPrecision op_{};            // the forward's decision
  // The CPU emulation's widened operands, from forward to backward: x_ and
  // the weights forward read, widened to FP32 once a step instead of once
  // per GEMM (the bits are the same; a GPU reads fp16 operands in place).
  // Released at the end of backward, so that no copy of an f32 master is
  // held while the optimizer writes it.
  std::optional<F32Matrix> x_f32_, w_f32_;
  Tensor w_read_;                // the weights forward read (w_f32_ is theirs)
  std::uint64_t w_version_ = 0;  // their version then
};

}  // namespace mpt
