// All chapters — atomic file writes (see atomic_file.hpp).
// Depends on: atomic_file.hpp; POSIX (fcntl.h, unistd.h).
#include "mpt/core/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace mpt {

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  throw FileWriteError("cannot " + what + " '" + path + "': " + std::strerror(err));
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

std::string atomic_temp_path(const std::string& path) { return path + ".tmp"; }

void write_file_atomically(const std::string& path, std::string_view bytes,
                           const std::function<void(AtomicWriteStage)>& observe) {
  const auto at = [&observe](AtomicWriteStage s) {
    if (observe) observe(s);
  };
  const std::string tmp = atomic_temp_path(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("write", tmp, errno);
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
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw FileWriteError("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(err));
  }
  at(AtomicWriteStage::before_dir_fsync);
  const std::string dir = directory_of(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail("open the directory", dir, errno);
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0) fail("fsync the directory", dir, err);
}

}  // namespace mpt
