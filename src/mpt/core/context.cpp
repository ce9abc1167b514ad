// Chapter 02 — precision as data: the Context.
// Depends on: context.hpp.
#include "mpt/core/context.hpp"

#include <stdexcept>
#include <utility>

namespace mpt {

namespace {

// The trace entry of a cast ("cast") or of a reuse of one ("cached_cast").
TraceEntry cast_entry(const char* op, std::string_view path, Phase phase, TracedValue in, DType to,
                      std::vector<TracedValue> out) {
  TraceEntry e;
  e.phase = phase;
  e.path = std::string(path);
  e.op = op;
  e.inputs = {std::move(in)};
  e.compute = to;
  e.outputs = std::move(out);
  return e;
}

}  // namespace

Context::Context(std::shared_ptr<const Policy> policy) : policy_(std::move(policy)) {
  if (!policy_) throw std::invalid_argument("Context: no policy");
}

OpPrecision Context::decide(std::string_view op, std::string_view path, std::vector<DType> inputs) const {
  return policy_->decide(OpQuery{op, path, std::move(inputs)});
}

OpPrecision Context::decide_fp8_gemm(std::string_view op, std::string_view path,
                                     std::vector<DType> inputs) const {
  return policy_->decide(OpQuery{op, path, std::move(inputs), true});
}

Tensor Context::cast(const Tensor& x, DType d, std::string_view path, Phase phase, const std::string& name) {
  if (x.dtype() == d && !x.scale()) return x;
  Tensor y = x.to(d);
  ++casts_.casts;
  casts_.elements += static_cast<std::size_t>(y.numel());
  casts_.bytes += y.bytes();
  if (trace_) trace_->add(cast_entry("cast", path, phase, traced(name, x), d, {traced(name, y)}));
  return y;
}

void Context::note_cached_cast(const Tensor& cached, std::string_view path, Phase phase,
                               const std::string& name) {
  ++casts_.cached;
  if (trace_) trace_->add(cast_entry("cached_cast", path, phase, traced(name, cached), cached.dtype(), {}));
}

void Context::record(TraceEntry entry) {
  if (trace_) trace_->add(std::move(entry));
}

}  // namespace mpt
