// Chapter 02 — precision as data: the precision trace.
// Depends on: tensor.hpp (Shape, DType).
//
// On request (a Context with a Trace attached), every op of a forward and a
// backward pass records what it read, in which dtype it computed, and what
// it wrote, in which dtype and how many bytes; every cast at an op boundary
// is recorded too. The pictures of where each value is FP16 or FP32 (the
// docs, `mpt trace`, Chapter 6's "show me my model's precision") are drawn
// from it, never by hand.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "mpt/core/tensor.hpp"

namespace mpt {

/// Which pass an entry belongs to.
enum class Phase {
  forward,   ///< forward pass
  backward,  ///< backward pass
};
/// "forward" or "backward".
const char* phase_name(Phase p);

/// One tensor an op read or wrote.
struct TracedValue {
  std::string name;   ///< role: "x", "weight", "y", "dx", "weight.grad"
  DType dtype;        ///< its storage dtype
  Shape shape;        ///< its shape
  std::size_t bytes;  ///< bytes of its buffer
};
/// TracedValue of tensor t in the role `name`.
TracedValue traced(std::string name, const Tensor& t);

/// One op, or one cast at an op boundary (op "cast").
struct TraceEntry {
  Phase phase = Phase::forward;      ///< forward or backward
  std::string path;                  ///< the layer's path, e.g. "fc1"
  std::string op;                    ///< PyTorch's op name, or "cast"
  std::vector<TracedValue> inputs;   ///< what it read, as it read it
  DType compute = DType::f32;        ///< the dtype it computed in
  std::vector<TracedValue> outputs;  ///< what it wrote
  /// Sum of the outputs' bytes.
  std::size_t bytes_written() const;
};

/// The entries of one or more passes, in the order they ran.
class Trace {
 public:
  /// Append one entry.
  void add(TraceEntry e) { entries_.push_back(std::move(e)); }
  /// Every entry, in order.
  const std::vector<TraceEntry>& entries() const { return entries_; }
  /// Forget every entry.
  void clear() { entries_.clear(); }
  /// Entries with op "cast".
  std::size_t casts() const;
  /// Bytes written by the casts.
  std::size_t cast_bytes() const;
  /// Entries with op "cached_cast": casts the weight cast cache saved (Chapter 6).
  std::size_t cached_casts() const;

 private:
  std::vector<TraceEntry> entries_;
};

/// A table, one line per entry: phase, path, op, inputs, compute, outputs,
/// bytes; then the cast count. Every dtype and byte count comes from the trace.
std::string render_text(const Trace& trace);
/// {"entries": [{"phase", "path", "op", "inputs": [{"name", "dtype",
/// "shape", "bytes"}], "compute", "outputs": [...], "bytes_written"}],
/// "casts", "cast_bytes"}, two-space indented.
std::string render_json(const Trace& trace);
/// A Graphviz graph of the forward entries, left to right: one box per op
/// (its path, op and compute dtype), one diamond per cast, edges labelled
/// with the dtype and shape of the value that flows, filled by dtype (f32
/// blue, bf16 green, f16 orange, FP8 red). Byte-stable for one trace.
std::string render_dot(const Trace& trace, const std::string& title);

}  // namespace mpt
