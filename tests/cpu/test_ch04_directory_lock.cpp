// Chapters 04 onwards — one writer per directory (io/directory_lock.hpp): the
// lock refuses a second holder and names it, a holder killed with SIGKILL
// leaves nothing that blocks the next one, a child process does not inherit
// it, and the lock file's name is never a way out of the directory.
// Depends on: mpt/io/directory_lock.hpp; POSIX (fork, exec, pipe, kill, mkfifo).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

#include "mpt/io/directory_lock.hpp"

using mpt::DirectoryBusy;
using mpt::DirectoryLock;

namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/mpt-lock-test-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  REQUIRE(d != nullptr);
  return d;
}

std::string contents(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Whether /proc/locks names holders here (it does on Linux; the messages
// name a PID only where it does).
bool kernel_names_holders() { return std::ifstream("/proc/locks").good(); }

// What acquire() threw as DirectoryBusy ("" when it did not throw).
std::string busy_of(const std::string& dir) {
  try {
    DirectoryLock l = DirectoryLock::acquire(dir);
  } catch (const DirectoryBusy& e) {
    return e.what();
  }
  return "";
}

// A child that takes `dir`'s lock, says so on a pipe, and waits to be
// killed. Returns its PID once it holds the lock.
pid_t child_holding(const std::string& dir) {
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(ready[0]);
    try {
      DirectoryLock held = DirectoryLock::acquire(dir);
      (void)!::write(ready[1], "y", 1);
      for (;;) ::pause();
    } catch (...) {
      ::_exit(3);
    }
  }
  ::close(ready[1]);
  char byte = 0;
  REQUIRE(::read(ready[0], &byte, 1) == 1);
  ::close(ready[0]);
  return pid;
}

}  // namespace

TEST_CASE("a second holder is refused with one line naming the directory and the holder") {
  const std::string dir = temp_dir();
  const std::string file = dir + "/" + DirectoryLock::kFileName;
  CHECK(DirectoryLock::holder(dir).empty());  // no lock file yet: nobody
  {
    DirectoryLock first = DirectoryLock::acquire(dir);
    CHECK(first.held());
    const std::string line = contents(file);
    CHECK(line.rfind("pid " + std::to_string(::getpid()) + " on ", 0) == 0);
    CHECK(line.find(" since ") != std::string::npos);
    CHECK(line.back() == '\n');
    // Another open of the file, in this process too, is another holder.
    const std::string busy = busy_of(dir);
    CHECK(busy.rfind("'" + dir + "' is in use by another run, ", 0) == 0);
    CHECK(busy.find("(it holds the lock " + file + "); wait until it ends, or give another directory") !=
          std::string::npos);
    CHECK(busy.find('\n') == std::string::npos);
    if (kernel_names_holders()) {
      CHECK(busy.find("pid " + std::to_string(::getpid()) + " on ") != std::string::npos);
      CHECK(DirectoryLock::holder(dir) == busy);  // the probe reads the same, taking nothing
    }
    CHECK(contents(file) == line);  // the refused one wrote nothing
  }
  // Released with its object: the next one takes it.
  CHECK(busy_of(dir).empty());
  CHECK(DirectoryLock::holder(dir).empty());
  DirectoryLock again = DirectoryLock::acquire(dir);
  again.release();
  CHECK_FALSE(again.held());
  CHECK_NOTHROW((void)DirectoryLock::acquire(dir));
  std::remove(file.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("a holder killed with SIGKILL leaves no lock: the next run takes the directory at once") {
  const std::string dir = temp_dir();
  const std::string file = dir + "/" + DirectoryLock::kFileName;
  const pid_t pid = child_holding(dir);
  const std::string busy = busy_of(dir);
  CHECK_FALSE(busy.empty());
  if (kernel_names_holders()) {
    // Named by the kernel's record, with the holder's own line.
    CHECK(busy.find("in use by another run, pid " + std::to_string(pid) + " on ") != std::string::npos);
  }
  REQUIRE(::kill(pid, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));
  // Its line is still in the file (stale), and blocks nothing.
  CHECK(contents(file).rfind("pid " + std::to_string(pid) + " ", 0) == 0);
  CHECK(DirectoryLock::holder(dir).empty());
  DirectoryLock next = DirectoryLock::acquire(dir);
  CHECK(contents(file).rfind("pid " + std::to_string(::getpid()) + " ", 0) == 0);
  next.release();
  std::remove(file.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("a child process does not inherit the lock (gnuplot outliving a run keeps nothing locked)") {
  const std::string dir = temp_dir();
  DirectoryLock held = DirectoryLock::acquire(dir);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::execl("/bin/sleep", "sleep", "30", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::usleep(50000);  // the exec has happened (or sleep would not matter)
  held.release();
  // The parent's descriptor is closed; a descriptor the child kept would
  // hold the lock still.
  CHECK(busy_of(dir).empty());
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  std::remove((dir + "/" + DirectoryLock::kFileName).c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("a lock file that is not a regular file, or a missing directory, is refused with one line") {
  const std::string dir = temp_dir();
  const std::string file = dir + "/" + DirectoryLock::kFileName;
  REQUIRE(::mkfifo(file.c_str(), 0644) == 0);
  CHECK_THROWS_WITH_AS(
      DirectoryLock::acquire(dir),
      ("the lock file '" + file + "' is not a regular file; move it away (mpt creates it)").c_str(),
      std::invalid_argument);
  CHECK(DirectoryLock::holder(dir).empty());
  std::remove(file.c_str());
  // A link at the lock's name is not followed out of the directory.
  const std::string outside = dir + "-outside";
  std::ofstream(outside) << "not ours\n";
  REQUIRE(::symlink(outside.c_str(), file.c_str()) == 0);
  CHECK_THROWS_WITH_AS(DirectoryLock::acquire(dir), doctest::Contains("(it is a symbolic link)"),
                       std::invalid_argument);
  CHECK(contents(outside) == "not ours\n");
  std::remove(file.c_str());
  std::remove(outside.c_str());
  ::rmdir(dir.c_str());
  CHECK_THROWS_WITH_AS(DirectoryLock::acquire(dir), doctest::Contains("cannot open the lock file"),
                       std::invalid_argument);
}
