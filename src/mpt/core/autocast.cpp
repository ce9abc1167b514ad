// Chapter 06 — per-task precision policies: the autocast table and policy.
// Depends on: autocast.hpp.
//
// The lists are PyTorch's, read from aten/src/ATen/autocast_mode.h
// (AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE,
// AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE, AT_FORALL_PROMOTE: the CUDA lists)
// at commit d70fe7f33910bbe8bc8b6027388a84bb102a453d and autocast_mode.cpp
// (the AutocastCPU registrations and the CUDA ban of binary_cross_entropy) at
// commit 008ec6b1840c94ff6d0f685bc10fbf585167c673; only the rows of ops this
// library knows. tests/cpu/test_ch06_autocast.cpp holds them to the whole
// lists, copied by hand from those files.
#include "mpt/core/autocast.hpp"

#include <stdexcept>
#include <utility>

namespace mpt {

std::string_view autocast_device_name(AutocastDevice d) { return d == AutocastDevice::cuda ? "cuda" : "cpu"; }

DType autocast_default_dtype(AutocastDevice d) {
  return d == AutocastDevice::cuda ? DType::f16 : DType::bf16;
}

std::string_view cast_list_name(CastList l) {
  switch (l) {
    case CastList::lower_precision_fp: return "lower_precision_fp";
    case CastList::fp32: return "fp32";
    case CastList::fp32_set_opt_dtype: return "fp32_set_opt_dtype";
    case CastList::fp32_append_dtype: return "fp32_append_dtype";
    case CastList::promote: return "promote";
    case CastList::banned: return "banned";
    case CastList::none: return "none";
  }
  return "?";
}

const std::vector<AutocastRow>& autocast_table() {
  using L = CastList;
  static const std::vector<AutocastRow> rows = {
      //  op                                 CUDA                   CPU
      {"linear", L::lower_precision_fp, L::lower_precision_fp, ""},
      {"matmul", L::lower_precision_fp, L::lower_precision_fp, ""},
      {"bmm", L::lower_precision_fp, L::lower_precision_fp, ""},
      {"conv2d", L::lower_precision_fp, L::lower_precision_fp, ""},
      {"scaled_dot_product_attention", L::lower_precision_fp, L::lower_precision_fp, ""},
      {"relu", L::none, L::none, ""},
      {"gelu", L::none, L::none, ""},
      {"add", L::none, L::none, ""},
      {"mul", L::none, L::none, ""},
      {"exp", L::fp32, L::none, ""},
      {"log", L::fp32, L::none, ""},
      {"pow", L::fp32, L::none, ""},
      {"cat", L::none, L::promote, ""},
      {"sum", L::fp32_set_opt_dtype, L::none, ""},
      {"mean", L::none, L::none, ""},
      {"norm", L::fp32_append_dtype, L::none, ""},
      {"cumsum", L::fp32_set_opt_dtype, L::none, ""},
      {"layer_norm", L::fp32, L::none, ""},
      {"batch_norm", L::none, L::none, ""},
      {"group_norm", L::fp32, L::none, ""},
      {"softmax", L::fp32_set_opt_dtype, L::none, ""},
      {"log_softmax", L::fp32_set_opt_dtype, L::none, ""},
      // CUDA registers cross_entropy_loss on no list: it is a composite that
      // calls log_softmax, then nll_loss, and those are listed. The CPU lists
      // it (fp32) by name.
      {"cross_entropy", L::none, L::fp32, "log_softmax"},
      {"nll_loss", L::fp32, L::fp32, ""},
      {"mse_loss", L::fp32, L::fp32, ""},
      {"binary_cross_entropy", L::banned, L::fp32, ""},
      {"binary_cross_entropy_with_logits", L::fp32, L::fp32, ""},
      {"max_pool2d", L::none, L::none, ""},
      {"avg_pool2d", L::none, L::none, ""},
      {"embedding", L::none, L::none, ""},
  };
  return rows;
}

namespace {

const AutocastRow& autocast_row(std::string_view op) {
  for (const AutocastRow& r : autocast_table())
    if (r.op == op) return r;
  (void)op_info(op);  // an unknown op: throws, naming the known ones
  throw std::logic_error("autocast_table(): no row for the known op '" + std::string(op) + "'");
}

bool is_low_precision(DType d) { return d == DType::f16 || d == DType::bf16; }

std::string dtype_list_text(const std::vector<DType>& ds) {
  std::string s;
  for (std::size_t i = 0; i < ds.size(); ++i)
    s += std::string(i == 0 ? "" : i + 1 == ds.size() ? " and " : ", ") + std::string(dtype_name(ds[i]));
  return s;
}

std::string op_where(const OpInfo& op, std::string_view path) {
  return std::string(op.name) + (path.empty() ? "" : " at " + std::string(path));
}

}  // namespace

CastList autocast_list(AutocastDevice d, std::string_view op) {
  const AutocastRow& r = autocast_row(op);
  return d == AutocastDevice::cuda ? r.cuda : r.cpu;
}

OpPrecision as_arrives(const OpInfo& op, const OpQuery& q, std::string_view why) {
  if (q.inputs.empty()) return {DType::f32, DType::f32, DType::f32};
  const DType first = q.inputs.front();
  bool mixed = false;
  for (DType d : q.inputs) mixed = mixed || d != first;
  if (!mixed) return {first, DType::f32, first};
  switch (op.kind) {
    case OpKind::matmul:
    case OpKind::lookup:
      throw std::invalid_argument(
          op_where(op, q.path) + ": its inputs arrive as " + dtype_list_text(q.inputs) + " and " +
          std::string(why) +
          "; a matrix product needs one dtype (PyTorch: \"expected both to have the same "
          "dtype\"): cast the input yourself (x.float(), x.half()) or let autocast cast it");
    case OpKind::normalization:
    case OpKind::loss: return {first, DType::f32, first};
    default: return {DType::f32, DType::f32, DType::f32};  // type promotion: f16 with bf16 or f32 gives f32
  }
}

AutocastPolicy::AutocastPolicy(AutocastDevice device, DType lower, std::vector<AutocastRegion> regions)
    : device_(device), lower_(lower), regions_(std::move(regions)) {
  if (!is_low_precision(lower_))
    throw std::invalid_argument("autocast: the low-precision dtype must be f16 or bf16, got " +
                                std::string(dtype_name(lower_)));
}

std::string AutocastPolicy::describe() const {
  std::string s =
      "autocast " + std::string(autocast_device_name(device_)) + " " + std::string(dtype_name(lower_));
  for (const AutocastRegion& r : regions_)
    s += std::string(r.enabled ? "; on at " : "; off at ") + r.pattern.text();
  return s;
}

bool AutocastPolicy::enabled_at(std::string_view path) const {
  for (std::size_t i = regions_.size(); i-- > 0;)
    if (regions_[i].pattern.covers(path)) return regions_[i].enabled;
  return true;
}

OpPrecision AutocastPolicy::decide_op(const OpInfo& op, const OpQuery& q) const {
  if (!enabled_at(q.path)) return as_arrives(op, q, "autocast is disabled there, so nothing casts them");
  //! [autocast-decide]
  const AutocastRow& row = autocast_row(op.name);
  CastList list = device_ == AutocastDevice::cuda ? row.cuda : row.cpu;
  if (device_ == AutocastDevice::cuda && !row.cuda_via.empty()) list = autocast_row(row.cuda_via).cuda;
  constexpr OpPrecision kF32{DType::f32, DType::f32, DType::f32};
  switch (list) {
    case CastList::lower_precision_fp: return {lower_, DType::f32, lower_};
    case CastList::fp32:
    case CastList::fp32_set_opt_dtype:
    case CastList::fp32_append_dtype: return kF32;
    case CastList::promote: {
      // autocast's promote_type: f32 wins over the low dtype; two different
      // low dtypes are an error.
      DType to = lower_;
      for (DType d : q.inputs) {
        if (d == DType::f32) to = DType::f32;
        else if (d != lower_)
          throw std::invalid_argument(
              op_where(op, q.path) + ": an input arrives as " + std::string(dtype_name(d)) +
              " inside autocast " + std::string(dtype_name(lower_)) +
              " (PyTorch: \"Unexpected floating ScalarType in at::autocast::prioritize\")");
      }
      return {to, DType::f32, to};
    }
    case CastList::banned:
      throw std::invalid_argument(
          op_where(op, q.path) +
          " is unsafe to autocast (PyTorch refuses torch.nn.functional.binary_cross_entropy and "
          "torch.nn.BCELoss "
          "inside autocast): a sigmoid right before it rounds probabilities near 0 and 1 in " +
          std::string(dtype_name(lower_)) +
          "; use binary_cross_entropy_with_logits (BCEWithLogitsLoss), which is safe to autocast, or disable "
          "autocast around it (PATH=autocast-off) and give it f32 inputs");
    case CastList::none: break;
  }
  return as_arrives(op, q, "it is on no autocast list, so nothing casts them");
  //! [autocast-decide]
}

DType AutocastPolicy::parameter_dtype_of(const OpInfo&, std::string_view) const { return DType::f32; }

}  // namespace mpt
