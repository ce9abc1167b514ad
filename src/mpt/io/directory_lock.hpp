// Chapters 04 onwards — one writer per directory: an advisory lock on a lock
// file in the directory, which the kernel releases when its holder ends,
// however it ends (exit, exception, kill -9).
// Depends on: the standard library and POSIX (open, flock(2), fstat; Linux's
// /proc/locks and /proc/PID/cmdline to name a holder) only.
//
// `mpt train --checkpoint DIR` takes DIR's lock before it trains and holds it
// to the end, so that two runs cannot write one directory (each would
// overwrite and prune the other's checkpoints). The lock is flock(2) on
// DIR/.mpt-lock, taken without waiting:
//
//   - flock locks belong to the open file description, so the kernel drops
//     the lock when the holder's last descriptor closes, which process exit
//     does, SIGKILL included: a killed run leaves no stale lock, only the
//     (empty or outdated) lock file, which the next run takes at once. A
//     lock that a live process holds cannot be broken by looking at a PID
//     in a file and guessing that it is dead.
//   - The file is opened O_CLOEXEC, so a child (gnuplot for --plot) does not
//     inherit it and keep the directory locked after the run.
//   - The holder writes one line into the file once it holds the lock: its
//     PID, host, start time and command line. A refused run names the
//     holder by the kernel's record of who holds the lock (/proc/locks: the
//     PID; then the file's line where it is that PID's, else the PID's
//     command line), never by the file alone, which a holder killed earlier
//     may have left.
//   - The lock file is never deleted: unlinking it while another process
//     has it open would let two processes hold locks on two files of one
//     name.
//   - Advisory: it keeps out every program that asks (every mpt), not one
//     that writes into the directory without asking.
#pragma once

#include <stdexcept>
#include <string>

namespace mpt {

/// The directory is locked by another process. what() is one line: the
/// directory, who holds it (PID and what it runs, where known), and what to
/// do.
class DirectoryBusy : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A held lock on a directory (see the file comment). Move-only; the lock
/// is released when the object is destroyed or the process ends.
class DirectoryLock {
 public:
  /// The lock file's name inside the directory.
  static constexpr const char* kFileName = ".mpt-lock";

  /// Take `dir`'s lock without waiting and write this process's line into
  /// the lock file. The directory must exist.
  /// \throws DirectoryBusy when another open of the lock file holds it
  ///         (another process, or another DirectoryLock of this one).
  /// \throws std::invalid_argument (one line naming the path) when the lock
  ///         file cannot be opened or created, or is not a regular file.
  static DirectoryLock acquire(const std::string& dir);

  /// No lock held.
  DirectoryLock() = default;
  /// Takes over `other`'s lock; `other` holds none after.
  DirectoryLock(DirectoryLock&& other) noexcept;
  /// Releases this object's lock, then takes over `other`'s.
  DirectoryLock& operator=(DirectoryLock&& other) noexcept;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  /// Releases the lock.
  ~DirectoryLock();

  /// Who holds `dir`'s lock now, read without taking it or writing
  /// anything (the kernel's table of locks): "" when nobody does, when there
  /// is no lock file, or where /proc/locks cannot tell; else the message
  /// acquire() would throw. For a check before a run starts, in every
  /// process of a multi-process run; acquire() stays the authority.
  static std::string holder(const std::string& dir);

  /// Whether this object holds a lock.
  bool held() const { return fd_ >= 0; }
  /// Release the lock now (nothing when none is held).
  void release();

 private:
  explicit DirectoryLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

/// The line a holder writes into the lock file: "pid P on HOST since
/// YYYY-MM-DDTHH:MM:SSZ: COMMAND LINE" (the command line's arguments joined
/// by spaces, cut at 200 bytes, control bytes as '?').
std::string lock_holder_line();

}  // namespace mpt
