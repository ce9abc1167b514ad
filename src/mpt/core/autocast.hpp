// Chapter 06 — per-task precision policies: torch.autocast's op lists as
// data, and the policy that applies them with autocast's semantics.
// Depends on: policy.hpp (Policy, OpQuery), ops.hpp (the op table),
// path_pattern.hpp (regions are chosen by layer path).
//
// torch.autocast does not convert tensors. Each op, when it is called,
// looks itself up in a list and casts its *inputs* (PyTorch:
// aten/src/ATen/autocast_mode.cpp and autocast_mode.h):
//
//   lower_precision_fp  inputs cast to the low dtype (f16, bf16): the matrix products
//   fp32                inputs cast to f32 (exp, log, pow, layer_norm on CUDA, most losses)
//   fp32_set_opt_dtype  the op's dtype argument set to f32 (softmax, sum, cumsum on CUDA)
//   fp32_append_dtype   the same for ops whose dtype is a separate overload (norm on CUDA)
//   promote             inputs cast to the widest of them (cat on the CPU)
//   banned              the op refuses to run inside autocast (binary_cross_entropy on CUDA)
//   (none)              the op runs in the dtypes its inputs arrive in
//
// The lists differ by device: on the CPU, layer_norm, softmax, sum and the
// pointwise math are on no list (they run in whatever arrives, bf16
// included), while CUDA keeps them in f32. An autocast region may be
// switched off (and on again inside) by layer path; where it is off, ops run
// in what arrives — a tensor that is already f16 stays f16.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/core/ops.hpp"
#include "mpt/core/path_pattern.hpp"
#include "mpt/core/policy.hpp"

namespace mpt {

/// PyTorch's two autocast device types this chapter covers.
enum class AutocastDevice {
  cuda,  ///< torch.autocast("cuda"): default dtype f16
  cpu,   ///< torch.autocast("cpu"): default dtype bf16
};
/// "cuda" or "cpu".
std::string_view autocast_device_name(AutocastDevice d);
/// The dtype torch.autocast picks when none is given: f16 on CUDA, bf16 on
/// the CPU (the autocast_dtype table of autocast_mode.cpp).
DType autocast_default_dtype(AutocastDevice d);

/// autocast's cast policies (CastPolicy in autocast_mode.h), plus `none`
/// for an op on no list.
enum class CastList {
  lower_precision_fp,
  fp32,
  fp32_set_opt_dtype,
  fp32_append_dtype,
  promote,
  banned,
  none,
};
/// "lower_precision_fp", ..., "none": PyTorch's spelling.
std::string_view cast_list_name(CastList l);

/// One op of the library's table, with the list it is on for each device.
struct AutocastRow {
  std::string_view op;  ///< a known op (ops.hpp)
  CastList cuda;        ///< its list under torch.autocast("cuda")
  CastList cpu;         ///< its list under torch.autocast("cpu")
  /// For an op PyTorch registers on no list of a device because it is a
  /// composite of listed ops (cross_entropy = log_softmax, then nll_loss on
  /// CUDA): the listed op whose cast decides how it runs; empty otherwise.
  std::string_view cuda_via;
};
/// Every known op's row, in known_ops() order.
const std::vector<AutocastRow>& autocast_table();
/// The list `op` (a known op: std::invalid_argument otherwise) is on for `d`.
CastList autocast_list(AutocastDevice d, std::string_view op);

/// Where autocast is switched off or on again, by layer path (the last region
/// that covers a path decides; none: on).
struct AutocastRegion {
  PathPattern pattern;  ///< the layers it covers
  bool enabled;         ///< false: torch.autocast(enabled=False) around them
};

/// How an op runs outside autocast (in a disabled region, or on no list): in
/// the dtypes its inputs arrive in. A matrix product needs its inputs in one
/// dtype (PyTorch refuses "mat1 and mat2 must have the same dtype"): mixed
/// inputs throw std::invalid_argument naming `why` (the reason nothing casts
/// them) and what would help. A norm or a loss runs in its first input's
/// dtype (its parameters are read as they are); other ops in the widest
/// input dtype (PyTorch's type promotion). Compute is f32 throughout.
OpPrecision as_arrives(const OpInfo& op, const OpQuery& q, std::string_view why);

/// torch.autocast(device, dtype=lower) over a whole model, with regions.
/// Parameters keep f32 model copies (autocast converts no tensor; an op that
/// reads a weight in `lower` casts it, once per change of the weight, through
/// the weight cast cache of Parameter::read).
class AutocastPolicy final : public Policy {
 public:
  /// Throws std::invalid_argument unless `lower` is f16 or bf16.
  AutocastPolicy(AutocastDevice device, DType lower, std::vector<AutocastRegion> regions = {});
  /// "autocast cuda f16", "autocast cpu bf16; off at head".
  std::string describe() const override;
  /// The device whose lists apply.
  AutocastDevice device() const { return device_; }
  /// The low-precision dtype.
  DType lower() const { return lower_; }
  /// True unless the last region covering `path` switches autocast off.
  bool enabled_at(std::string_view path) const;

 protected:
  /// The list's cast (see the file comment); as_arrives() where autocast is
  /// off or the op is on no list. A banned op throws std::invalid_argument
  /// with PyTorch's advice.
  OpPrecision decide_op(const OpInfo& op, const OpQuery& q) const override;
  /// f32: autocast leaves the parameters as they are.
  DType parameter_dtype_of(const OpInfo& op, std::string_view path) const override;

 private:
  AutocastDevice device_;
  DType lower_;
  std::vector<AutocastRegion> regions_;
};

}  // namespace mpt
