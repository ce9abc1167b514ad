// Chapters 04 onwards — one writer per directory (see directory_lock.hpp).
// Depends on: directory_lock.hpp; POSIX and Linux's /proc.
#include "mpt/io/directory_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

namespace mpt {

namespace {

// `text` on one line: control bytes as '?', at most `limit` bytes.
std::string printable(const std::string& text, std::size_t limit) {
  std::string out;
  for (const char ch : text) {
    if (out.size() >= limit) break;
    const auto u = static_cast<unsigned char>(ch);
    out += (u < 0x20 || u == 0x7f) ? '?' : ch;
  }
  return out;
}

// The command line of process `pid` ("" where /proc cannot tell).
std::string command_line_of(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!all.empty() && all.back() == '\0') all.pop_back();
  for (char& ch : all)
    if (ch == '\0') ch = ' ';
  return printable(all, 200);
}

// The PID that holds a flock on the file of `st`, from the kernel's table
// of locks (/proc/locks), or -1. Lines of waiters ("->") are skipped.
long holder_pid(const struct stat& st) {
  std::ifstream in("/proc/locks");
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("->") != std::string::npos || line.find("FLOCK") == std::string::npos) continue;
    std::istringstream fields(line);
    std::string ordinal, kind, mode, access, where;
    long pid = -1;
    if (!(fields >> ordinal >> kind >> mode >> access >> pid >> where)) continue;
    unsigned major_id = 0, minor_id = 0;
    unsigned long inode = 0;
    if (std::sscanf(where.c_str(), "%x:%x:%lu", &major_id, &minor_id, &inode) != 3) continue;
    if (major_id == major(st.st_dev) && minor_id == minor(st.st_dev) && inode == st.st_ino) return pid;
  }
  return -1;
}

// The first line of the lock file open at `fd`.
std::string first_line(int fd) {
  char buffer[512];
  const ssize_t got = ::pread(fd, buffer, sizeof buffer - 1, 0);
  if (got <= 0) return "";
  buffer[got] = '\0';
  std::string text(buffer);
  const std::size_t end = text.find('\n');
  return printable(end == std::string::npos ? text : text.substr(0, end), 400);
}

// Who holds the lock of the file open at `fd` (PID `pid`, from the
// kernel's table, or -1), as a phrase.
std::string describe_holder(int fd, long pid) {
  if (pid <= 0) return "another process (the kernel's table of locks does not say which)";
  std::string line = first_line(fd);
  const std::string mine = "pid " + std::to_string(pid) + " ";
  if (line.rfind(mine, 0) == 0) return line;  // the holder's own line
  const std::string command = command_line_of(pid);
  return "pid " + std::to_string(pid) + (command.empty() ? "" : ": " + command);
}

std::string busy_message(const std::string& dir, const std::string& path, const std::string& who) {
  return "'" + dir + "' is in use by another run, " + who + " (it holds the lock " + path +
         "); wait until it ends, or give another directory";
}

}  // namespace

std::string lock_holder_line() {
  char host[256] = "unknown host";
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown host");
  host[sizeof host - 1] = '\0';
  char since[32] = "?";
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  if (::gmtime_r(&now, &utc) != nullptr) std::strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return "pid " + std::to_string(::getpid()) + " on " + printable(host, 64) + " since " + since + ": " +
         command_line_of(::getpid());
}

DirectoryLock DirectoryLock::acquire(const std::string& dir) {
  const std::string path = dir + "/" + kFileName;
  // O_NOFOLLOW: a link at the lock's name is refused, not followed out of
  // the directory; O_NONBLOCK: a FIFO there does not block the open.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) {
    const int e = errno;
    throw std::invalid_argument("cannot open the lock file '" + path + "': " + std::strerror(e) +
                                (e == ELOOP ? " (it is a symbolic link)" : "") +
                                "; give a directory this user can write, with no '" + kFileName +
                                "' in it other than a regular file");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::invalid_argument("the lock file '" + path +
                                "' is not a regular file; move it away (mpt creates it)");
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e != EWOULDBLOCK) {
      ::close(fd);
      throw std::invalid_argument("cannot lock '" + path + "': " + std::strerror(e));
    }
    const std::string who = describe_holder(fd, holder_pid(st));
    ::close(fd);
    throw DirectoryBusy(busy_message(dir, path, who));
  }
  // Ours now: say who we are (best effort; the lock holds without it).
  const std::string line = lock_holder_line() + "\n";
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, line.data(), line.size(), 0);
  return DirectoryLock(fd);
}

std::string DirectoryLock::holder(const std::string& dir) {
  const std::string path = dir + "/" + kFileName;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return "";
  struct stat st {};
  std::string message;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    const long pid = holder_pid(st);
    if (pid > 0) message = busy_message(dir, path, describe_holder(fd, pid));
  }
  ::close(fd);
  return message;
}

DirectoryLock::DirectoryLock(DirectoryLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

DirectoryLock& DirectoryLock::operator=(DirectoryLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

DirectoryLock::~DirectoryLock() { release(); }

void DirectoryLock::release() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor drops the lock
  fd_ = -1;
}

}  // namespace mpt
