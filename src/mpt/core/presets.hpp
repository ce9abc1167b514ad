// Chapter 06 — per-task precision policies: the presets other libraries ship,
// as policies of this one — apex's O0–O3, Keras's mixed_float16 and
// mixed_bfloat16, jmp's policy strings, torch.autocast by device.
// Depends on: policy.hpp, policy_string.hpp (NamedBase, PolicyNeeds: the
// grammar's view of a preset), autocast.hpp (O1 and autocast:...).
//
// Sources (each preset's settings are theirs, read at these commits):
// - apex: apex/amp/frontend.py at 0466713933de1a2b5e1760d2818c0a8076adea46
//   (the classes O0..O3: cast_model_type, patch_torch_functions,
//   keep_batchnorm_fp32, master_weights, loss_scale).
// - jmp: jmp/_src/policy.py at 7b3a5f784eca7e1f0f9d231ef8c9dae181f01f16
//   (get_policy, parse_dtype, dtype_to_names, Policy.__str__).
// - Keras: the mixed precision guide's policies "mixed_float16" and
//   "mixed_bfloat16" (variable dtype float32, compute dtype float16 or
//   bfloat16; Model.compile wraps the optimizer in a LossScaleOptimizer under
//   mixed_float16 only).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/policy_string.hpp"

namespace mpt {

/// One apex opt_level's properties, as apex/amp/frontend.py sets them.
struct ApexLevel {
  std::string name;                 ///< "O0" .. "O3"
  std::string cast_model_type;      ///< "torch.float32", "torch.float16", "None"
  bool patch_torch_functions;       ///< O1 only: autocast-style lists around torch functions
  std::string keep_batchnorm_fp32;  ///< "True", "False", "None"
  std::string master_weights;       ///< "True", "False", "None"
  std::string loss_scale;           ///< "1.0" or "dynamic"
};
/// O0, O1, O2, O3 in order.
const std::vector<ApexLevel>& apex_levels();

/// A parsed jmp policy: params, compute and output dtype.
struct JmpSpec {
  DType params = DType::f32;   ///< what the parameters are stored in
  DType compute = DType::f32;  ///< what every op reads and stores
  DType output = DType::f32;   ///< what the model's output is cast to
  /// jmp's own str(policy): "p=full,c=f16,o=full" (jmp names f32 "full" first).
  std::string jmp_text() const;
  /// This library's canonical spelling: "p=f32,c=f16,o=f32".
  std::string text() const;
};
/// jmp.get_policy(text), with jmp's grammar and defaults: "KEY=DTYPE[,...]"
/// with keys params|p, compute|c, output|o (a later key wins), params
/// defaulting to f32, compute following params, output following compute;
/// or a single dtype for all three. Dtype names: jmp's (f32, float32, full,
/// f16, float16, bf16, bfloat16, half = f16 off TPU, f64, float64). Throws
/// std::invalid_argument, one line, where jmp raises, and for f64, which jmp
/// accepts and this library cannot store.
JmpSpec parse_jmp(const std::string& text);

/// Keras's and jmp's policies: every op reads and stores `compute`,
/// computes in f32; the parameters' model copy is `params` (f32: forward
/// reads the FP32 variable itself and casts it where an op reads it in
/// `compute`, as Keras's AutoCastVariable does); a loss reads what arrives and
/// returns f32, as UniformPolicy's. `output`, when set, is the dtype the
/// model's output is cast to (jmp's cast_to_output).
class CastAllPolicy final : public Policy {
 public:
  /// `name` is what describe() returns ("mixed_float16", "jmp p=f32,c=f16,o=f32").
  CastAllPolicy(std::string name, DType params, DType compute, std::optional<DType> output);
  /// The name given.
  std::string describe() const override { return name_; }
  /// `output` as given.
  std::optional<DType> model_output_dtype() const override { return output_; }

 protected:
  /// {compute, f32, compute}; a loss: {its input's dtype, f32, f32}.
  OpPrecision decide_op(const OpInfo& op, const OpQuery& q) const override;
  /// `params`.
  DType parameter_dtype_of(const OpInfo& op, std::string_view path) const override;

 private:
  std::string name_;
  DType params_, compute_;
  std::optional<DType> output_;
};

}  // namespace mpt
