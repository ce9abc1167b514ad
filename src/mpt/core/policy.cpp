// Chapter 02 — precision as data: the Policy.
// Depends on: policy.hpp.
#include "mpt/core/policy.hpp"

#include <stdexcept>
#include <utility>

namespace mpt {

OpPrecision Policy::decide(const OpQuery& q) const { return decide_op(op_info(q.op), q); }

DType Policy::parameter_dtype(std::string_view op, std::string_view path) const {
  return parameter_dtype_of(op_info(op), path);
}

// --- UniformPolicy ----------------------------------------------------------------

std::string UniformPolicy::describe() const { return "uniform " + std::string(dtype_name(dtype_)); }

OpPrecision UniformPolicy::decide_op(const OpInfo& op, const OpQuery& q) const {
  // A loss reads its input as it arrives (it widens to FP32 inside, so a
  // cast to d first could only lose bits) and returns the loss in FP32.
  if (op.kind == OpKind::loss) return {q.inputs.empty() ? dtype_ : q.inputs.front(), DType::f32, DType::f32};
  return {dtype_, DType::f32, dtype_};
}

DType UniformPolicy::parameter_dtype_of(const OpInfo&, std::string_view) const { return dtype_; }

std::shared_ptr<const Policy> uniform_policy(DType d) { return std::make_shared<UniformPolicy>(d); }

// --- KeepF32Policy -----------------------------------------------------------------

KeepF32Policy::KeepF32Policy(std::shared_ptr<const Policy> base, std::vector<std::string> paths,
                             std::vector<std::string> ops)
    : base_(std::move(base)), paths_(std::move(paths)), ops_(std::move(ops)) {
  if (!base_) throw std::invalid_argument("KeepF32Policy: no base policy");
  for (const std::string& p : paths_)
    if (p.empty()) throw std::invalid_argument("KeepF32Policy: an empty layer path");
  for (const std::string& o : ops_) (void)op_info(o);  // throws, naming the known ops
}

bool KeepF32Policy::keeps(std::string_view op, std::string_view path) const {
  for (const std::string& o : ops_)
    if (o == op) return true;
  for (const std::string& p : paths_) {
    if (path == p) return true;
    if (path.size() > p.size() && path.substr(0, p.size()) == p && path[p.size()] == '.') return true;
  }
  return false;
}

std::string KeepF32Policy::describe() const {
  std::string s = base_->describe();
  if (!paths_.empty()) {
    s += "; f32 at ";
    for (std::size_t i = 0; i < paths_.size(); ++i) s += (i ? ", " : "") + paths_[i];
  }
  if (!ops_.empty()) {
    s += "; f32 for ";
    for (std::size_t i = 0; i < ops_.size(); ++i) s += (i ? ", " : "") + ops_[i];
  }
  return s;
}

OpPrecision KeepF32Policy::decide_op(const OpInfo& op, const OpQuery& q) const {
  if (keeps(op.name, q.path)) return {DType::f32, DType::f32, DType::f32};
  return base_->decide(q);
}

DType KeepF32Policy::parameter_dtype_of(const OpInfo& op, std::string_view path) const {
  return keeps(op.name, path) ? DType::f32 : base_->parameter_dtype(op.name, path);
}

// --- FloatParamsPolicy (Chapter 6: apex O2's batch norms) ---------------------------------

FloatParamsPolicy::FloatParamsPolicy(std::shared_ptr<const Policy> base, std::vector<std::string> ops)
    : base_(std::move(base)), ops_(std::move(ops)) {
  if (!base_) throw std::invalid_argument("FloatParamsPolicy: no base policy");
  for (const std::string& o : ops_) (void)op_info(o);  // throws, naming the known ops
}

bool FloatParamsPolicy::names(std::string_view op) const {
  for (const std::string& o : ops_)
    if (o == op) return true;
  return false;
}

std::string FloatParamsPolicy::describe() const {
  std::string s = base_->describe();
  for (const std::string& o : ops_) s += "; " + o + " with f32 parameters and compute, in its input's dtype";
  return s;
}

OpPrecision FloatParamsPolicy::decide_op(const OpInfo& op, const OpQuery& q) const {
  if (!names(op.name)) return base_->decide(q);
  const DType arriving = q.inputs.empty() ? DType::f32 : q.inputs.front();
  return {arriving, DType::f32, arriving};
}

DType FloatParamsPolicy::parameter_dtype_of(const OpInfo& op, std::string_view path) const {
  return names(op.name) ? DType::f32 : base_->parameter_dtype(op.name, path);
}

// --- PathRulePolicy (Chapter 6) ---------------------------------------------------------

PathRulePolicy::PathRulePolicy(std::shared_ptr<const Policy> base, std::vector<PathRule> rules,
                               std::vector<std::string> ops)
    : base_(std::move(base)), rules_(std::move(rules)), ops_(std::move(ops)) {
  if (!base_) throw std::invalid_argument("PathRulePolicy: no base policy");
  for (const std::string& o : ops_) (void)op_info(o);  // throws, naming the known ops
  for (const PathRule& r : rules_) uniform_.push_back(uniform_policy(r.dtype));
}

const PathRule* PathRulePolicy::rule_for(std::string_view path) const {
  for (std::size_t i = rules_.size(); i-- > 0;)
    if (rules_[i].pattern.covers(path)) return &rules_[i];
  return nullptr;
}

std::string PathRulePolicy::describe() const {
  std::string s = base_->describe();
  for (const PathRule& r : rules_) s += "; " + r.pattern.text() + "=" + std::string(dtype_name(r.dtype));
  if (!ops_.empty()) {
    s += "; f32 for ";
    for (std::size_t i = 0; i < ops_.size(); ++i) s += (i ? ", " : "") + ops_[i];
  }
  return s;
}

OpPrecision PathRulePolicy::decide_op(const OpInfo& op, const OpQuery& q) const {
  for (const std::string& o : ops_)
    if (o == op.name) return {DType::f32, DType::f32, DType::f32};
  const PathRule* r = rule_for(q.path);
  if (r == nullptr) return base_->decide(q);
  if (r->dtype == DType::f32) return {DType::f32, DType::f32, DType::f32};
  return uniform_[static_cast<std::size_t>(r - rules_.data())]->decide(q);
}

DType PathRulePolicy::parameter_dtype_of(const OpInfo& op, std::string_view path) const {
  for (const std::string& o : ops_)
    if (o == op.name) return DType::f32;
  const PathRule* r = rule_for(path);
  return r == nullptr ? base_->parameter_dtype(op.name, path) : r->dtype;
}

}  // namespace mpt
