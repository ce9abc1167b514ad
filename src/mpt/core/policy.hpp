// Chapter 02 — precision as data: the Policy, the one place an op learns its
// precision.
// Depends on: dtype.hpp, ops.hpp; path_pattern.hpp (Chapter 6's PathRulePolicy).
//
// Every op asks the policy, with its PyTorch name, its layer's path
// ("fc1", "encoder.0.ffn.fc1") and the dtypes its inputs arrive in, which
// dtype to read its inputs in, which to compute in and which to store its
// result in; a layer that owns parameters also asks which dtype their model
// copy has. Layers are never rewritten for a precision recipe: Chapter 2's
// uniform runs, Chapter 3's norms kept in FP32, Chapter 6's autocast lists
// and policy strings, Chapter 7's FP8 recipes are all policies.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/core/ops.hpp"
#include "mpt/core/path_pattern.hpp"

namespace mpt {

/// One question to a policy: which op, where, on what.
struct OpQuery {
  std::string_view op;        ///< PyTorch's op name, e.g. "linear" (see known_ops())
  std::string_view path;      ///< the layer's path in its model, e.g. "fc1"
  std::vector<DType> inputs;  ///< the dtypes the op's floating inputs arrive in
  /// Chapter 7: the op is a GEMM that can run in FP8 with scales (a Linear
  /// layer, Transformer Engine's te.Linear); an FP8 policy gives only such
  /// an op FP8 inputs, every other op (the tied head's F.linear too) its
  /// surrounding precision.
  bool fp8_gemm = false;
};

/// A policy's answer. A GPU computes in `compute` and rounds only where it
/// stores: at the op's output, in `output`.
struct OpPrecision {
  /// The dtype the op reads its floating inputs in; an input that arrives in
  /// another dtype is cast at the op's boundary (and the cast is counted).
  DType input;
  /// The dtype products and sums (a GEMM's accumulator) or elementwise math
  /// are computed in: f32, as on a GPU; f16 only for the pitfalls about FP16
  /// accumulation.
  DType compute;
  /// The dtype the op's result is stored in.
  DType output;
};

/// Decides the precision of every op. Subclasses implement decide_op() and
/// parameter_dtype_of(); the public calls check the op name first.
class Policy {
 public:
  virtual ~Policy() = default;
  /// The precision of one op call. Throws std::invalid_argument naming the
  /// known ops when q.op is not one of them.
  OpPrecision decide(const OpQuery& q) const;
  /// The dtype of the model copy of the parameters of `op` at `path` (what
  /// forward and backward read; the FP32 master stays FP32). Throws as decide().
  DType parameter_dtype(std::string_view op, std::string_view path) const;
  /// One line for people: "uniform f16", "uniform f16; f32 at fc3".
  virtual std::string describe() const = 0;
  /// Chapter 6: the dtype a model's output is cast to where it leaves the
  /// model (jmp's output dtype: "p=f32,c=f16,o=f32" hands f32 logits to the
  /// loss), or nullopt to leave it as the last op stored it (every other
  /// policy).
  virtual std::optional<DType> model_output_dtype() const { return std::nullopt; }

 protected:
  /// decide() for a known op.
  virtual OpPrecision decide_op(const OpInfo& op, const OpQuery& q) const = 0;
  /// parameter_dtype() for a known op.
  virtual DType parameter_dtype_of(const OpInfo& op, std::string_view path) const = 0;
};

/// Chapter 2's policy: one dtype `d` for everything stored — activations,
/// their gradients, parameters' model copies (a model converted with
/// `.half()`, or Apex O2 without its exceptions) — and FP32 compute. A loss
/// reads its input as it arrives, computes in FP32 and returns the loss in
/// FP32, as in the chapter's runs.
class UniformPolicy final : public Policy {
 public:
  /// Everything stored in d.
  explicit UniformPolicy(DType d) : dtype_(d) {}
  /// The dtype everything is stored in.
  DType dtype() const { return dtype_; }
  /// "uniform f16".
  std::string describe() const override;

 protected:
  /// {d, f32, d}; a loss: {its input's dtype, f32, f32}.
  OpPrecision decide_op(const OpInfo& op, const OpQuery& q) const override;
  /// d.
  DType parameter_dtype_of(const OpInfo& op, std::string_view path) const override;

 private:
  DType dtype_;
};

/// A base policy with islands of FP32: the layers at `paths` (a path and
/// everything below it: "fc3" covers "fc3" and "fc3.x") and the ops named
/// in `ops` read, compute and store f32, and their parameters' model copy is
/// the f32 master itself. Inputs arriving in another dtype are cast to f32 at
/// the island's boundary, its outputs cast back by the next op that wants
/// another dtype. Chapter 2 keeps one Linear in FP32 this way; Chapter 3
/// keeps `batch_norm` and `layer_norm` in FP32.
class KeepF32Policy final : public Policy {
 public:
  /// Throws std::invalid_argument for an op name that is not a known op or an empty path.
  KeepF32Policy(std::shared_ptr<const Policy> base, std::vector<std::string> paths,
                std::vector<std::string> ops = {});
  /// "uniform f16; f32 at fc3; f32 for layer_norm".
  std::string describe() const override;
  /// True when the layer at `path` is inside one of the islands.
  bool keeps(std::string_view op, std::string_view path) const;

 protected:
  /// {f32, f32, f32} inside an island, else the base's decision.
  OpPrecision decide_op(const OpInfo& op, const OpQuery& q) const override;
  /// f32 inside an island, else the base's.
  DType parameter_dtype_of(const OpInfo& op, std::string_view path) const override;

 private:
  std::shared_ptr<const Policy> base_;
  std::vector<std::string> paths_, ops_;
};

/// apex O2's keep_batchnorm_fp32 (Chapter 6): the named ops keep FP32
/// parameters and compute in FP32, but read and store the dtype their first
/// input arrives in. apex's O2 casts the model with convert_network, which
/// leaves affine BatchNorm modules (their parameters and running estimates)
/// in float (apex/fp16_utils/fp16util.py at d2ac4872); cuDNN's batch norm
/// then takes the fp16 activation with fp32 γ and β and returns fp16.
/// KeepF32Policy's island stores f32 instead, which doubles the bytes of
/// every op after it until the next product casts back.
class FloatParamsPolicy final : public Policy {
 public:
  /// Throws std::invalid_argument for no base or an op name that is not a known op.
  FloatParamsPolicy(std::shared_ptr<const Policy> base, std::vector<std::string> ops);
  /// "uniform f16; batch_norm with f32 parameters and compute, in its input's dtype".
  std::string describe() const override;

 protected:
  /// {arriving, f32, arriving} for the named ops, else the base's decision.
  OpPrecision decide_op(const OpInfo& op, const OpQuery& q) const override;
  /// f32 for the named ops, else the base's.
  DType parameter_dtype_of(const OpInfo& op, std::string_view path) const override;

 private:
  bool names(std::string_view op) const;
  std::shared_ptr<const Policy> base_;
  std::vector<std::string> ops_;
};

/// One per-layer rule of Chapter 6: the layers a pattern covers store in
/// `dtype` (see PathRulePolicy).
struct PathRule {
  PathPattern pattern;  ///< the layers it covers (path_pattern.hpp)
  DType dtype;          ///< what they store
};

/// A base policy with per-layer rules `PATTERN=DTYPE` (Chapter 6): for an op
/// at a path, the *last* rule whose pattern covers the path decides. A rule
/// to f32 makes the layer an FP32 island exactly as KeepF32Policy does
/// ({f32, f32, f32}, parameters' model copy the master); a rule to another
/// dtype D answers as UniformPolicy(D) would there. The ops named in `ops`
/// are FP32 islands wherever they are, whatever the rules say (a rule picks
/// layers; the op list picks ops). No rule covers the path: the base decides.
class PathRulePolicy final : public Policy {
 public:
  /// Throws std::invalid_argument for no base or an op name that is not a known op.
  PathRulePolicy(std::shared_ptr<const Policy> base, std::vector<PathRule> rules,
                 std::vector<std::string> ops = {});
  /// "uniform f16; block*.mlp=f32; f32 for layer_norm".
  std::string describe() const override;
  /// The rule that decides for `path` (the last that covers it), or nullptr.
  const PathRule* rule_for(std::string_view path) const;

 protected:
  /// See the class comment.
  OpPrecision decide_op(const OpInfo& op, const OpQuery& q) const override;
  /// f32 for the op list and f32 rules, D for a rule to D, else the base's.
  DType parameter_dtype_of(const OpInfo& op, std::string_view path) const override;

 private:
  std::shared_ptr<const Policy> base_;
  std::vector<PathRule> rules_;
  std::vector<std::string> ops_;
  std::vector<std::shared_ptr<const Policy>> uniform_;  // per rule: UniformPolicy(rule's dtype)
};

/// A shared UniformPolicy(d).
std::shared_ptr<const Policy> uniform_policy(DType d);

}  // namespace mpt
