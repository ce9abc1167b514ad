// Chapter 05 — loss scaling across ranks: the Communicator.
// Depends on: the core tier (dtype.hpp); the .cpp also on the formats tier
// (storage.hpp: the f16/bf16 conversions a reduction rounds through).
//
// The few collective calls data-parallel training needs — all-reduce (sum
// or max) of f32, f16 and bf16 buffers, blocking or started and waited for
// later, broadcast, all-gather, barrier — behind one interface with a
// backend per engine: LocalCommunicator here (a world of one process),
// ThreadWorld (thread_world.hpp: N ranks as threads of one process, for the
// pitfalls, the notebook and the unit tests), MpiCommunicator (mpi_communicator.hpp,
// OpenMPI, the optional target mpt::dist_mpi) for CPU ranks. No transport
// of our own between processes: those backends only forward to their
// engine (ThreadWorld's ranks share memory, and copy).
//
// What every backend computes is fixed here, not by the engine: combine()
// is the one elementwise reduction (for f16 and bf16: both operands to
// float, combined in float, rounded back to nearest-even — one rounding per
// pairwise combination, as NCCL reduces half-precision buffers), and
// all_reduce_fixed_order() combines the ranks' buffers in rank order, so its
// bits do not depend on the engine's reduction algorithm.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "mpt/core/dtype.hpp"

namespace mpt::dist {

/// The reductions an all-reduce can apply.
enum class ReduceOp : std::uint8_t {
  sum,  ///< x0 + x1 + ... (gradients)
  max,  ///< the largest (the found-inf flag: any rank's 1 wins)
};
/// "sum" or "max".
const char* reduce_op_name(ReduceOp op);

/// Bytes of one element of a buffer the communicator moves in `dtype`: 4
/// for f32, 2 for f16 and bf16. Throws std::invalid_argument (one line,
/// naming the dtype and the valid ones) for e4m3 and e5m2, which no
/// collective here reduces.
std::size_t element_bytes(DType dtype);

/// dst[i] = dst[i] op src[i] for i < count, both buffers in `dtype`'s
/// storage (float, or 16-bit codes). For f16 and bf16 each pair is decoded
/// to float, combined, and rounded back to nearest-even: a sum overflows to
/// inf as soon as a partial sum passes the format's largest finite value.
/// NaN propagates through both ops.
void combine(void* dst, const void* src, std::int64_t count, DType dtype, ReduceOp op);

/// A started all-reduce: the buffer belongs to the communicator until
/// wait() returns. Destroying an unfinished one waits for it.
class PendingAllReduce {
 public:
  virtual ~PendingAllReduce() = default;
  /// Block until the reduction is complete in the caller's buffer. A second
  /// call returns at once.
  virtual void wait() = 0;
  /// Let the engine move the data on without blocking (MPI progresses a
  /// non-blocking collective only inside MPI calls); true once complete.
  virtual bool progress() = 0;
};

/// A handle whose reduction is already complete (wait() and progress()
/// return at once): what a backend that reduces at once returns from
/// start_all_reduce().
std::unique_ptr<PendingAllReduce> finished_all_reduce();

/// One process's view of a group of ranks. Every call is collective: every
/// rank makes the same calls in the same order with the same counts and
/// dtypes (a backend may check this and throw naming the rank and the call).
class Communicator {
 public:
  virtual ~Communicator() = default;
  /// This process's rank, 0 .. size() − 1.
  virtual int rank() const = 0;
  /// The number of ranks.
  virtual int size() const = 0;
  /// "local", "mpi", ...
  virtual const char* backend() const = 0;
  /// In place: every rank's `count` elements become the reduction of all
  /// ranks' (in an order the engine chooses: the bits of a sum may depend on
  /// the world size; see all_reduce_fixed_order).
  virtual void all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op) = 0;
  /// all_reduce(), started and returned at once: the communication runs while
  /// the caller computes (DDP overlaps it with the rest of backward).
  virtual std::unique_ptr<PendingAllReduce> start_all_reduce(void* data, std::int64_t count, DType dtype,
                                                             ReduceOp op) = 0;
  /// Rank `root`'s `bytes` bytes into every rank's `data`.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  /// Every rank's `bytes` bytes of `send` into every rank's `recv` (size() ×
  /// bytes), rank r's at offset r × bytes.
  virtual void all_gather(const void* send, void* recv, std::size_t bytes) = 0;
  /// Return once every rank has called it.
  virtual void barrier() = 0;

  /// A number attached to the calls that follow (DDP sets the step): where
  /// the backend checks calls, ranks whose tags differ are reported as
  /// disagreeing, with both tags in the message.
  void set_tag(std::int64_t tag) { tag_ = tag; }
  /// See set_tag() (0 until set).
  std::int64_t tag() const { return tag_; }

 private:
  std::int64_t tag_ = 0;
};

/// The all-reduce whose bits do not depend on the engine: every rank's
/// buffer is gathered and combined on every rank in rank order,
/// ((x0 op x1) op x2) op ... — the same result on every rank and from any
/// backend, and the result a single process gets by adding the ranks'
/// contributions one after another. Costs size() × the buffer in memory and
/// an all-gather's traffic (not a reduce-scatter's).
void all_reduce_fixed_order(Communicator& comm, void* data, std::int64_t count, DType dtype, ReduceOp op);

/// The world of one process: every collective returns its input (an
/// all-reduce of one buffer is that buffer). What the notebooks and the
/// one-process tests run data-parallel code with.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "local"; }
  void all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op) override;
  std::unique_ptr<PendingAllReduce> start_all_reduce(void* data, std::int64_t count, DType dtype,
                                                     ReduceOp op) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void all_gather(const void* send, void* recv, std::size_t bytes) override;
  void barrier() override {}
};

/// One collective call as a rank is about to make it: what a backend that
/// checks calls compares across ranks (every field must agree), and how its
/// messages name the call.
struct CollectiveCall {
  /// The collectives.
  enum class Kind : std::int64_t { all_reduce = 1, broadcast = 2, all_gather = 3, barrier = 4 };
  std::int64_t seq = 0;         ///< this rank's count of collectives so far, this one included
  std::int64_t tag = 0;         ///< Communicator::tag() when it was made
  Kind kind = Kind::barrier;    ///< which call
  DType dtype = DType::f32;     ///< all_reduce's element type (f32 for the others)
  ReduceOp op = ReduceOp::sum;  ///< all_reduce's op (sum for the others)
  std::int64_t count = 0;       ///< all_reduce: elements; broadcast, all_gather: bytes
  std::int64_t root = 0;        ///< broadcast's root (0 for the others)
  /// The fields as seven integers (what MPI exchanges).
  std::array<std::int64_t, 7> fields() const;
  /// The inverse of fields().
  static CollectiveCall from_fields(const std::int64_t* v);
  /// "all_reduce(f32 x 1, max) as collective #12 (tag 3)".
  std::string describe() const;
};

/// Throws std::invalid_argument naming `who` unless count >= 0 and the
/// dtype is one a collective moves: the backends' shared argument check.
void check_buffer(const char* who, std::int64_t count, DType dtype);

}  // namespace mpt::dist
