// Chapter 05 — loss scaling across ranks: the MPI backend (OpenMPI).
// Depends on: communicator.hpp; the .cpp on MPI (the optional target
// mpt::dist_mpi, built where CMake finds MPI; this header does not include
// <mpi.h>, so a program that links the target needs no MPI flags of its own).
//
// One process per rank, started by `mpiexec -n N program` (the same program
// across machines with a hostfile). Every collective is MPI's non-blocking
// call (MPI_Iallreduce, MPI_Ibcast, MPI_Iallgather, MPI_Ibarrier) waited for
// with a deadline, so that ranks which disagree end with a message instead
// of a hang; f16 and bf16 reductions are user-defined MPI_Ops that apply
// mpt::dist::combine(). With `check_calls`, every rank first shares a
// fingerprint of the call it is about to make (its sequence number, kind,
// dtype, op, count, root) and a mismatch is reported naming both ranks and
// both calls — what PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL does before
// each collective.
#pragma once

#include <functional>
#include <memory>

#include "mpt/dist/communicator.hpp"

namespace mpt::dist {

/// MPI_COMM_WORLD as a Communicator. MPI is initialised by the first one
/// made and finalised at exit; one per process.
class MpiCommunicator final : public Communicator {
 public:
  /// How collectives are waited for and checked.
  struct Options {
    /// A collective not complete after this many seconds throws (naming the
    /// rank, the call and its sequence number). > 0.
    double timeout_seconds = 60;
    /// Exchange a fingerprint of each call first, and throw on a mismatch.
    bool check_calls = true;
  };
  /// Initialise MPI (MPI_THREAD_FUNNELED) if needed and wrap MPI_COMM_WORLD.
  /// Throws std::runtime_error if MPI cannot start, std::invalid_argument
  /// for a timeout that is not a finite number > 0.
  explicit MpiCommunicator(const Options& options);
  MpiCommunicator();
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  const char* backend() const override { return "mpi"; }
  void all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op) override;
  std::unique_ptr<PendingAllReduce> start_all_reduce(void* data, std::int64_t count, DType dtype,
                                                     ReduceOp op) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void all_gather(const void* send, void* recv, std::size_t bytes) override;
  void barrier() override;
  /// Collective calls made so far (each fingerprinted under this number).
  std::int64_t calls() const;
  /// The options in force.
  const Options& options() const;

  /// End every rank of the job now (MPI_Abort) with exit status `code`,
  /// after this rank has printed its message. What a rank does when it
  /// cannot go on: mpiexec then stops the others, so none is left waiting.
  [[noreturn]] static void abort_job(int code);

  struct Impl;  ///< the .cpp's (MPI handles, the call counter)

 private:
  std::unique_ptr<Impl> impl_;
};

/// Run `body` on this rank; if it throws, print "mpt: rank R of N: <what>"
/// on stderr and end the whole job (MpiCommunicator::abort_job) with
/// `error_code`; otherwise return body's value. The entry point of every
/// multi-rank program here.
int run_rank(MpiCommunicator& comm, const std::function<int()>& body, int error_code = 1);

}  // namespace mpt::dist
