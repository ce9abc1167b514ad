// All chapters — atomic file writes (see atomic_file.hpp).
// Depends on: atomic_file.hpp; POSIX (fcntl.h, unistd.h, sys/stat.h, limits.h, stdlib.h).
#include "mpt/io/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace mpt {

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  throw FileWriteError("cannot " + what + " '" + path + "': " + std::strerror(err));
}

// What a file of this mode is, in words (for a refusal).
std::string kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a file of another kind";
}

// The refusal of `path`, which is (or whose links end in) a file of `mode`.
[[noreturn]] void refuse(const std::string& path, bool through_link, mode_t mode) {
  const std::string what = (through_link ? "it is a symbolic link to " : "it is ") + kind_of(mode);
  if (S_ISDIR(mode)) throw FileWriteError("cannot write '" + path + "': " + what + "; give a file path");
  throw FileWriteError("cannot write '" + path + "': " + what +
                       ", not a regular file; give a regular file path (a new name, or an existing file to "
                       "replace)");
}

[[noreturn]] void looping(const std::string& path) {
  throw FileWriteError("cannot write '" + path + "': its symbolic links loop (" + std::strerror(ELOOP) +
                       "); give a regular file path");
}

// write(2) until every byte is out (it may write fewer than asked).
bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

std::string directory_of(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

bool is_symlink(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

// The target of the link at `link`, as the kernel reads it: an absolute
// path, or one relative to the link's directory (made relative to ours).
std::string link_target(const std::string& link) {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof buf);
  if (n < 0) fail("read the symbolic link", link, errno);
  if (static_cast<std::size_t>(n) == sizeof buf) fail("read the symbolic link", link, ENAMETOOLONG);
  std::string t(buf, static_cast<std::size_t>(n));
  if (t.empty() || t[0] == '/') return t;
  return directory_of(link) + "/" + t;
}

// Create the temporary anew: never through a link, never opening a FIFO.
// A regular file already there is a killed run's temporary and goes first.
int create_temporary(const std::string& tmp, const std::string& path) {
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(tmp.c_str(), flags, 0644);
  if (fd < 0 && errno == EEXIST) {
    struct stat st {};
    if (::lstat(tmp.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      throw FileWriteError("cannot write '" + path + "': its temporary '" + tmp + "' exists and is " +
                           kind_of(st.st_mode) + ", not a file a killed run left; remove it");
    if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) fail("remove the old temporary", tmp, errno);
    fd = ::open(tmp.c_str(), flags, 0644);
  }
  if (fd < 0) fail("write", tmp, errno);
  return fd;
}

}  // namespace

const char* atomic_write_stage_name(AtomicWriteStage s) {
  switch (s) {
    case AtomicWriteStage::partly_written: return "partial";
    case AtomicWriteStage::before_fsync: return "before-fsync";
    case AtomicWriteStage::before_rename: return "before-rename";
    case AtomicWriteStage::before_dir_fsync: return "before-dir-fsync";
  }
  return "?";
}

std::string file_kind(const std::string& path, bool follow_links) {
  struct stat st {};
  const int rc = follow_links ? ::stat(path.c_str(), &st) : ::lstat(path.c_str(), &st);
  return rc == 0 ? kind_of(st.st_mode) : std::string();
}

std::string atomic_write_target(const std::string& path) {
  if (path.empty()) throw FileWriteError("cannot write '': the path is empty; give a file path");
  if (path.back() == '/')
    throw FileWriteError("cannot write '" + path +
                         "': it ends in '/', so it names a directory; give a file path");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {  // something is there (links followed)
    const bool link = is_symlink(path);
    if (!S_ISREG(st.st_mode)) refuse(path, link, st.st_mode);
    if (!link) return path;
    const std::unique_ptr<char, decltype(&std::free)> real(::realpath(path.c_str(), nullptr), &std::free);
    if (real == nullptr) fail("resolve the symbolic link", path, errno);
    return real.get();
  }
  if (errno == ELOOP) looping(path);
  if (errno != ENOENT) fail("write", path, errno);  // EACCES, ENOTDIR, ENAMETOOLONG
  // Nothing there, or a dangling link: follow its links to the name they end in.
  std::string p = path;
  for (int hops = 0; hops <= 40; ++hops) {
    struct stat ls {};
    if (::lstat(p.c_str(), &ls) != 0) return p;  // the name to create (a missing directory fails at open)
    if (!S_ISLNK(ls.st_mode)) {
      if (!S_ISREG(ls.st_mode)) refuse(path, true, ls.st_mode);  // made there since the stat
      return p;
    }
    p = link_target(p);
  }
  looping(path);
}

std::string atomic_temp_path(const std::string& path) { return path + ".tmp"; }

void write_file_atomically(const std::string& path, std::string_view bytes,
                           const std::function<void(AtomicWriteStage)>& observe) {
  const auto at = [&observe](AtomicWriteStage s) {
    if (observe) observe(s);
  };
  const std::string target = atomic_write_target(path);
  const std::string tmp = atomic_temp_path(target);
  const int fd = create_temporary(tmp, path);
  const auto give_up = [&](const std::string& what, int err) {
    ::close(fd);
    std::remove(tmp.c_str());
    fail(what, tmp, err);
  };
  const std::size_t half = bytes.size() / 2;
  if (!write_all(fd, bytes.data(), half)) give_up("write", errno);
  at(AtomicWriteStage::partly_written);
  if (!write_all(fd, bytes.data() + half, bytes.size() - half)) give_up("write", errno);
  at(AtomicWriteStage::before_fsync);
  if (::fsync(fd) != 0) give_up("fsync", errno);
  if (::close(fd) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fail("close", tmp, err);
  }
  at(AtomicWriteStage::before_rename);
  if (std::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw FileWriteError("cannot rename '" + tmp + "' to '" + target + "': " + std::strerror(err));
  }
  at(AtomicWriteStage::before_dir_fsync);
  const std::string dir = directory_of(target);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail("open the directory", dir, errno);
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0) fail("fsync the directory", dir, err);
}

}  // namespace mpt
