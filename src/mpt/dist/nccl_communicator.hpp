// Chapter 05 — loss scaling across ranks: the NCCL backend (GPU buffers).
// Depends on: communicator.hpp; the .cpp on the CUDA runtime and on nccl.h
// for its types only (the optional target mpt::dist_nccl, built where
// MPT_CUDA is on and nccl.h is found). libnccl itself is never linked: it is
// about 200 MB, so it is opened at run time (dlopen) from MPT_NCCL_LIBRARY,
// or found as libnccl.so.2 by the loader's ordinary search.
//
// Every pointer handed to this communicator is CUDA device memory on the
// communicator's device (device()); a host pointer is refused by NCCL, and
// the error names the call. The collectives run on the communicator's own
// stream, created as a blocking stream: work queued on the legacy default
// stream before a call is finished before NCCL reads the buffer, and
// all_reduce(), broadcast(), all_gather() and barrier() return once their
// result is in device memory. Sums are NCCL's own (for f16 and bf16: as
// combine() describes for two ranks; for more, NCCL's ring or tree order);
// max is ncclMax. Host-side helpers that touch the data
// (all_reduce_fixed_order, DDP's host buckets) do not apply to this backend.
#pragma once

#include <array>
#include <memory>
#include <stdexcept>
#include <string>

#include "mpt/dist/communicator.hpp"

namespace mpt::dist {

/// Thrown when libnccl.so.2 cannot be opened: the message starts with
/// "NCCL not found" and names the path tried and the loader's reason.
class NcclNotFound : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Open libnccl.so.2 (once per process; MPT_NCCL_LIBRARY if set, else the
/// loader's search) and return the path it was opened by. Throws
/// NcclNotFound if it cannot be opened, std::runtime_error naming the
/// symbol if the library lacks a function this backend calls.
std::string nccl_library();

/// The opened library's version, "2.28.3" (opens it first, as nccl_library()).
std::string nccl_version();

/// ncclUniqueId's 128 bytes: made by one rank, given to every rank.
using NcclUniqueId = std::array<char, 128>;

/// A new unique id (ncclGetUniqueId).
NcclUniqueId nccl_unique_id();

/// Collective over `bootstrap` (host memory; no GPU needed): rank 0 makes a
/// new unique id and broadcasts it, and every rank returns that id. What
/// NcclCommunicator(bootstrap) joins with.
NcclUniqueId nccl_unique_id(Communicator& bootstrap);

/// A group of GPU ranks over NCCL: one rank per process (or per thread),
/// one device per rank.
class NcclCommunicator final : public Communicator {
 public:
  /// Which device, and how long a collective may take.
  struct Options {
    /// The CUDA device of this rank; -1: rank modulo the number of devices.
    int device = -1;
    /// A collective not complete after this many seconds aborts the NCCL
    /// communicator and throws (naming the call): a rank that never makes
    /// the call would otherwise hang the others for ever. > 0.
    double timeout_seconds = 60;
  };
  /// A world of one rank on the chosen device.
  explicit NcclCommunicator(const Options& options);
  /// A world of one rank, with the default Options.
  NcclCommunicator();
  /// The ranks of `bootstrap` (an MpiCommunicator: one process per rank):
  /// rank 0 makes the unique id and broadcasts it through `bootstrap`,
  /// which is used for nothing else.
  NcclCommunicator(Communicator& bootstrap, const Options& options);
  /// As above, with the default Options.
  explicit NcclCommunicator(Communicator& bootstrap);
  /// Rank `rank` of `size` joining the group of `id` (ncclCommInitRank,
  /// which returns once every rank has joined): for ranks that are threads
  /// of one process, or that share the id another way.
  NcclCommunicator(const NcclUniqueId& id, int rank, int size, const Options& options);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  const char* backend() const override { return "nccl"; }
  /// In place on `count` elements of device memory.
  void all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op) override;
  /// Queued on this communicator's stream; wait() blocks until done.
  std::unique_ptr<PendingAllReduce> start_all_reduce(void* data, std::int64_t count, DType dtype,
                                                     ReduceOp op) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void all_gather(const void* send, void* recv, std::size_t bytes) override;
  /// An all-reduce of one float in a scratch buffer of this communicator.
  void barrier() override;
  /// This rank's CUDA device.
  int device() const;
  /// The cudaStream_t the collectives run on.
  void* stream() const;

  struct Impl;  ///< the .cpp's (library, communicator, stream)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mpt::dist
