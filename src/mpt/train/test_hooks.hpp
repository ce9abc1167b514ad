// Chapters 04 onwards — THE TEST HOOK of `mpt train`: stop the process with
// SIGKILL at a precise point, so a test can prove that a run killed anywhere
// resumes to the same bits. Not for users; nothing happens unless the
// environment variable is set.
// Depends on: the core tier (atomic_file.hpp: the stages of an atomic write).
//
// MPT_TRAIN_KILL_AT (kKillAtVariable) takes one of
//
//   step:N                    after step N's record, before its checkpoint (if any)
//   checkpoint:N:partial      while writing the checkpoint of step N, with
//                             about half of it in the temporary file
//   checkpoint:N:before-fsync      all of it written, not yet fsynced
//   checkpoint:N:before-rename     fsynced, not yet renamed into place
//   checkpoint:N:before-dir-fsync  renamed, the directory not yet fsynced
//
// and the process raise(SIGKILL)s itself there: no destructor, no flush,
// exit status 137 in a shell, exactly as a kill -9 from outside.
#pragma once

#include <cstdint>
#include <string>

#include "mpt/io/atomic_file.hpp"

namespace mpt::train {

/// The environment variable the hook reads: "MPT_TRAIN_KILL_AT".
inline constexpr const char* kKillAtVariable = "MPT_TRAIN_KILL_AT";

/// Where to die (see the file comment).
struct KillPoint {
  /// What the point is.
  enum class Kind {
    none,        ///< never
    step,        ///< after a step
    checkpoint,  ///< inside a checkpoint's atomic write
  };
  Kind kind = Kind::none;                                   ///< none, step or checkpoint
  std::int64_t step = 0;                                    ///< N
  AtomicWriteStage stage = AtomicWriteStage::before_fsync;  ///< for Kind::checkpoint
};

/// Parse a value of MPT_TRAIN_KILL_AT; "" is Kind::none. Anything else that
/// is not one of the forms above: std::invalid_argument naming the forms.
KillPoint parse_kill_point(const std::string& text);

/// parse_kill_point() of the environment variable (none when unset).
KillPoint kill_point_from_environment();

/// raise(SIGKILL) if `k` is the point after step `step`.
void maybe_kill_after_step(const KillPoint& k, std::int64_t step);

/// raise(SIGKILL) if `k` is stage `s` of the checkpoint of step `step`.
void maybe_kill_in_checkpoint(const KillPoint& k, std::int64_t step, AtomicWriteStage s);

}  // namespace mpt::train
