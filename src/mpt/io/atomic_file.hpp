// All chapters — writing a file so that a reader, or a run killed halfway,
// sees either the old file or the new one, never part of one.
// Depends on: the standard library only (POSIX open/write/fsync/rename,
// stat/lstat/readlink/realpath in the .cpp).
//
// The recipe (rename(2) and fsync(2), and the ext4 and XFS notes on
// renaming over a file): write the bytes to a temporary file in the same
// directory (a rename across file systems is not atomic), fsync it so its
// data is on disk before its name is, rename it over the target, then fsync
// the directory so the rename itself survives a crash. Until the rename the
// old file is untouched; a crash before it leaves at most the temporary.
//
// What the rename may replace. It puts a new regular file where the name
// was, so it may only ever replace a regular file: anything else at that
// name would be destroyed, not updated (as root, `--dot /dev/null` would
// have replaced /dev/null). atomic_write_target() decides, for what the
// path names, following symbolic links as open(2) would:
//
//   nothing             the file is created; its directory must exist.
//   a regular file      replaced atomically, as above.
//   a symbolic link     followed to the file it ends in (realpath(3); a
//                       dangling link: its chain of links followed by hand,
//                       at most 40, to the name it ends in), and that file
//                       is written atomically in its own directory: the
//                       temporary beside it, the rename there. The link
//                       stays a link and shows the new bytes. A link to
//                       anything but a regular file or nothing is refused
//                       as that thing is.
//   a directory         refused: "... is a directory; give a file path".
//   a character or block device, a FIFO, a socket
//                       refused: one line naming the path, what it is, and
//                       that a regular file path is what is valid.
//
// Why refuse devices and FIFOs rather than write into them directly, as cp
// and tee do. A direct write is not atomic, which is this file's one
// promise: a reader of a FIFO gets part of a graph when the run dies. A
// FIFO nobody reads blocks the run at open(2). /dev/full fails only after
// the work is done, so a long `mpt train --plot /dev/full` would lose its
// picture at the end; refused, the path can be checked before any work
// (mpt train and mpt tour call atomic_write_target() while they check their
// input; trace, range and scaler write their file before their first line
// of output), one line and exit status 2 at no cost. And one rule serves
// every option: --dot, --svg, --plot, the tour's reports and checkpoints
// behave alike. The case a direct write would serve is /dev/stdout
// (`mpt trace --dot /dev/stdout | dot -Tsvg`, refused as the pipe or
// terminal it leads to): those commands print their own text on stdout,
// so a graph mixed into it would not be what `dot` reads either; write a
// file and read it. (Where stdout is redirected to a regular file,
// /dev/stdout leads to that file, and it is replaced like any other.)
//
// The temporary is created anew (O_CREAT | O_EXCL | O_NOFOLLOW): a regular
// file already at its name is what a killed run left and is removed first;
// anything else there (a link, a FIFO, a directory) is refused, so the
// temporary is never written through a link or blocks on a FIFO. Every
// failed call (open, write — ENOSPC, EFBIG —, fsync, close, rename, the
// directory's fsync) is a FileWriteError naming the call, the path and the
// reason; up to the rename the temporary is removed and the old file is as
// it was. The kind of the target is checked before the temporary is
// written, not atomically with the rename: a FIFO made at that name in
// between is still replaced (a race this teaching code does not close).
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

/// The file write_file_atomically(path, ...) renames its temporary to (see
/// the file comment): `path` itself when it names a regular file or
/// nothing; the file a symbolic link ends in (an absolute path from
/// realpath(3) when that file exists; the last link's target, made
/// relative to its link's directory, when it does not). Nothing is
/// created or changed.
/// \throws FileWriteError, one line naming `path`, what it is and what is
///         valid, when it is empty or ends in '/', or it (or the file its
///         links end in) is a directory, a device, a FIFO or a socket, or
///         its links loop; or naming the reason when it cannot be examined
///         (EACCES, ENOTDIR, ...).
std::string atomic_write_target(const std::string& path);

/// What is at `path`, in words: "a regular file", "a directory", "a
/// character device", "a block device", "a FIFO (named pipe)", "a socket",
/// "a symbolic link" (only when `follow_links` is false); "" when nothing is
/// there or it cannot be examined. For the checks of callers that refuse
/// what write_file_atomically() would refuse, in their own words.
std::string file_kind(const std::string& path, bool follow_links = true);

/// The temporary file write_file_atomically(path, ...) writes first when
/// `path` is its target (atomic_write_target(path) == path): `path` with
/// ".tmp" appended, in the same directory.
std::string atomic_temp_path(const std::string& path);

/// Write `bytes` to atomic_write_target(path) atomically (see the file
/// comment), calling `observe` (when set) at each stage. On failure the
/// temporary is removed, the old file is left as it was (a failure after
/// the rename, of the directory's fsync, leaves the complete new file), and
/// FileWriteError says which call failed on which path, or why the path is
/// refused.
void write_file_atomically(const std::string& path, std::string_view bytes,
                           const std::function<void(AtomicWriteStage)>& observe = {});

}  // namespace mpt
