// Chapter 02 — precision as data: the Context every op runs in.
// Depends on: policy.hpp, tensor.hpp, trace.hpp.
//
// A forward or backward pass carries one Context: the Policy its ops ask,
// the counter of the casts they made at their boundaries, and, when someone
// asked for one, the Trace they record into. Casts happen only here, so
// "every cast happens at an op boundary and is counted" is true by
// construction.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mpt/core/policy.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/core/trace.hpp"

namespace mpt {

/// What the casts of a pass cost.
struct CastCount {
  std::size_t casts = 0;     ///< tensors converted to another dtype
  std::size_t elements = 0;  ///< elements converted
  std::size_t bytes = 0;     ///< bytes written by the conversions
  /// Chapter 6: casts the weight cast cache saved — an op read a weight in a
  /// dtype it had already been cast to since the master last changed
  /// (Parameter::read), so nothing was converted or written.
  std::size_t cached = 0;
};

/// The policy, the cast counter and the optional trace of a pass.
class Context {
 public:
  /// A context asking `policy` (not null: std::invalid_argument).
  explicit Context(std::shared_ptr<const Policy> policy);
  /// The policy ops ask.
  const Policy& policy() const { return *policy_; }
  /// The policy, shared.
  const std::shared_ptr<const Policy>& shared_policy() const { return policy_; }
  /// The precision of one op call (Policy::decide).
  OpPrecision decide(std::string_view op, std::string_view path, std::vector<DType> inputs) const;
  /// Chapter 7: the same, for a GEMM that can run in FP8 (OpQuery::fp8_gemm).
  OpPrecision decide_fp8_gemm(std::string_view op, std::string_view path, std::vector<DType> inputs) const;

  /// `x` in dtype d at the boundary of the op at `path`: x itself (no copy)
  /// when it already is d, else x rounded into d — counted, and traced as
  /// an entry with op "cast" that reads `name` and writes it.
  Tensor cast(const Tensor& x, DType d, std::string_view path, Phase phase, const std::string& name);

  /// Chapter 6: record that the op at `path` reused `cached`, a cast of a
  /// weight made earlier (the weight cast cache): counted in casts().cached,
  /// traced as an entry with op "cached_cast" that reads `name` and writes
  /// nothing.
  void note_cached_cast(const Tensor& cached, std::string_view path, Phase phase, const std::string& name);

  /// The casts made so far.
  const CastCount& casts() const { return casts_; }
  /// Start counting again from zero.
  void reset_casts() { casts_ = {}; }

  /// Record into `trace` from now on (nullptr: stop recording). Not owned.
  void set_trace(Trace* trace) { trace_ = trace; }
  /// The trace being recorded, or nullptr.
  Trace* trace() const { return trace_; }
  /// True when a trace is attached (ops skip building entries otherwise).
  bool tracing() const { return trace_ != nullptr; }
  /// Append an entry to the trace, if there is one.
  void record(TraceEntry entry);

 private:
  std::shared_ptr<const Policy> policy_;
  CastCount casts_;
  Trace* trace_ = nullptr;
};

}  // namespace mpt
