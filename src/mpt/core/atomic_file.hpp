// All chapters — writing a file so that a reader, or a run killed halfway,
// sees either the old file or the new one, never part of one.
// Depends on: the standard library only (POSIX open/write/fsync/rename in the .cpp).
//
// The recipe (rename(2) and fsync(2), and the ext4 and XFS notes on
// renaming over a file): write the bytes to a temporary file in the same
// directory (a rename across file systems is not atomic), fsync it so its
// data is on disk before its name is, rename it over the target, then fsync
// the directory so the rename itself survives a crash. Until the rename the
// old file is untouched; a crash before it leaves at most the temporary.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace mpt {

/// A file could not be written (the message names the path and the reason).
class FileWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The stages of write_file_atomically(), in order, at which an observer
/// is called (tests use them to stop a process at a precise point).
enum class AtomicWriteStage {
  partly_written,    ///< about half the bytes are in the temporary file
  before_fsync,      ///< every byte is written, the temporary is not yet fsynced
  before_rename,     ///< the temporary is on disk under its own name
  before_dir_fsync,  ///< renamed over the target; the directory not yet fsynced
};

/// The name of a stage as the test hooks spell it: "partial",
/// "before-fsync", "before-rename", "before-dir-fsync".
const char* atomic_write_stage_name(AtomicWriteStage s);

/// The temporary file write_file_atomically(path, ...) writes first: `path`
/// with ".tmp" appended, in the same directory.
std::string atomic_temp_path(const std::string& path);

/// Write `bytes` to `path` atomically (see the file comment), calling
/// `observe` (when set) at each stage. On failure the temporary is removed,
/// the old file at `path` is left as it was, and FileWriteError says which
/// call failed on which path.
void write_file_atomically(const std::string& path, std::string_view bytes,
                           const std::function<void(AtomicWriteStage)>& observe = {});

}  // namespace mpt
