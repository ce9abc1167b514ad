// Chapter 02 — precision as data: the Context.
// Depends on: context.hpp.
#include "mpt/core/context.hpp"

#include <stdexcept>
#include <utility>

namespace mpt {

Context::Context(std::shared_ptr<const Policy> policy) : policy_(std::move(policy)) {
  if (!policy_) throw std::invalid_argument("Context: no policy");
}

OpPrecision Context::decide(std::string_view op, std::string_view path, std::vector<DType> inputs) const {
  return policy_->decide(OpQuery{op, path, std::move(inputs)});
}

Tensor Context::cast(const Tensor& x, DType d, std::string_view path, Phase phase, const std::string& name) {
  if (x.dtype() == d && !x.scale()) return x;
  Tensor y = x.to(d);
  ++casts_.casts;
  casts_.elements += static_cast<std::size_t>(y.numel());
  casts_.bytes += y.bytes();
  if (trace_) {
    TraceEntry e;
    e.phase = phase;
    e.path = std::string(path);
    e.op = "cast";
    e.inputs = {traced(name, x)};
    e.compute = d;
    e.outputs = {traced(name, y)};
    trace_->add(std::move(e));
  }
  return y;
}

void Context::note_cached_cast(const Tensor& cached, std::string_view path, Phase phase,
                               const std::string& name) {
  ++casts_.cached;
  if (trace_) {
    TraceEntry e;
    e.phase = phase;
    e.path = std::string(path);
    e.op = "cached_cast";
    e.inputs = {traced(name, cached)};
    e.compute = cached.dtype();
    trace_->add(std::move(e));
  }
}

void Context::record(TraceEntry entry) {
  if (trace_) trace_->add(std::move(entry));
}

}  // namespace mpt
