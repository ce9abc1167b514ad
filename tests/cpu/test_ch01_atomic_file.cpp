// All chapters — write_file_atomically() and what it may replace: the new
// bytes or the old file, never a temporary left; a symbolic link written
// through (kept, its target updated), a dangling one creating its target; a
// directory, a FIFO and /dev/full refused and still what they were; a write
// that fails (the file size limit, as a full disk would) an error that
// leaves the old file. (Labelled ch01: `mpt range --svg` is the first option
// that writes a file.)
// Depends on: mpt/io/atomic_file.hpp; POSIX (mkdtemp, mkfifo, symlink,
// lstat, readlink, setrlimit, alarm).
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "mpt/io/atomic_file.hpp"

using namespace mpt;

namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/mpt-atomic-test-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  REQUIRE(d != nullptr);
  return d;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_plain(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// The file type bits of what is at `path` itself (links not followed); 0 when nothing.
mode_t type_at(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? (st.st_mode & S_IFMT) : 0;
}

std::string link_text(const std::string& path) {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
  return n < 0 ? std::string() : std::string(buf, static_cast<std::size_t>(n));
}

std::string error_of(const std::string& path, const std::string& bytes) {
  try {
    write_file_atomically(path, bytes);
  } catch (const FileWriteError& e) {
    return e.what();
  }
  return "";
}

std::string real_path(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) != nullptr ? std::string(buf) : std::string();
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// rm -r of a test's directory (its entries: files, links, FIFOs, one level of folders).
void remove_tree(const std::string& dir) {
  const std::string cmd = "rm -rf '" + dir + "'";
  CHECK(std::system(cmd.c_str()) == 0);
}

}  // namespace

TEST_CASE("write_file_atomically: the new bytes or the old file, never a temporary left") {
  const std::string dir = temp_dir();
  const std::string path = dir + "/f.bin";
  std::vector<AtomicWriteStage> seen;
  write_file_atomically(path, "first", [&seen](AtomicWriteStage s) { seen.push_back(s); });
  CHECK(read_file(path) == "first");
  CHECK_FALSE(exists(atomic_temp_path(path)));
  CHECK(seen == std::vector<AtomicWriteStage>{AtomicWriteStage::partly_written,
                                              AtomicWriteStage::before_fsync, AtomicWriteStage::before_rename,
                                              AtomicWriteStage::before_dir_fsync});
  // A temporary a killed run left (a regular file) is replaced.
  write_plain(atomic_temp_path(path), "half of an old wri");
  write_file_atomically(path, "second");
  CHECK(read_file(path) == "second");
  CHECK_FALSE(exists(atomic_temp_path(path)));
  // The temporary's name is taken by a directory: refused, the old file stays.
  REQUIRE(::mkdir(atomic_temp_path(path).c_str(), 0755) == 0);
  CHECK(has(error_of(path, "third"),
            "its temporary '" + atomic_temp_path(path) + "' exists and is a directory"));
  CHECK(read_file(path) == "second");
  ::rmdir(atomic_temp_path(path).c_str());
  // ... by a link: refused, nothing written through it.
  const std::string victim = dir + "/victim.txt";
  write_plain(victim, "not yours");
  REQUIRE(::symlink(victim.c_str(), atomic_temp_path(path).c_str()) == 0);
  CHECK(has(error_of(path, "third"), "exists and is a symbolic link"));
  CHECK(read_file(victim) == "not yours");
  CHECK(read_file(path) == "second");
  std::remove(atomic_temp_path(path).c_str());
  // The rename fails (a directory appears at the name just before it): the
  // temporary is removed, the directory stays.
  const std::string target = dir + "/d";
  CHECK_THROWS_WITH_AS(write_file_atomically(target, "y",
                                             [&target](AtomicWriteStage s) {
                                               if (s == AtomicWriteStage::before_rename)
                                                 REQUIRE(::mkdir(target.c_str(), 0755) == 0);
                                             }),
                       doctest::Contains("cannot rename"), FileWriteError);
  CHECK_FALSE(exists(atomic_temp_path(target)));
  CHECK(type_at(target) == S_IFDIR);
  remove_tree(dir);
}

TEST_CASE("write_file_atomically: a symbolic link is written through and stays a link") {
  const std::string dir = temp_dir();
  REQUIRE(::mkdir((dir + "/a").c_str(), 0755) == 0);
  REQUIRE(::mkdir((dir + "/b").c_str(), 0755) == 0);
  const std::string file = dir + "/b/graph.dot", link = dir + "/a/graph.dot";
  write_plain(file, "old graph");
  REQUIRE(::symlink("../b/graph.dot", link.c_str()) == 0);
  CHECK(atomic_write_target(link) == real_path(file));
  bool temp_beside_target = false, temp_beside_link = true;
  write_file_atomically(link, "new graph", [&](AtomicWriteStage s) {
    if (s != AtomicWriteStage::before_rename) return;
    temp_beside_target = exists(atomic_temp_path(file));
    temp_beside_link = exists(atomic_temp_path(link));
  });
  CHECK(type_at(link) == S_IFLNK);
  CHECK(link_text(link) == "../b/graph.dot");
  CHECK(read_file(file) == "new graph");
  CHECK(temp_beside_target);  // the rename happens in the target's directory
  CHECK_FALSE(temp_beside_link);
  CHECK_FALSE(exists(atomic_temp_path(file)));
  CHECK_FALSE(exists(atomic_temp_path(link)));

  // A dangling link (through another link): the file it names is created.
  const std::string first = dir + "/a/first", second = dir + "/a/second";
  REQUIRE(::symlink("second", first.c_str()) == 0);
  REQUIRE(::symlink("../b/made.svg", second.c_str()) == 0);
  write_file_atomically(first, "<svg/>");
  CHECK(type_at(first) == S_IFLNK);
  CHECK(type_at(second) == S_IFLNK);
  CHECK(read_file(dir + "/b/made.svg") == "<svg/>");
  CHECK_FALSE(exists(dir + "/b/made.svg.tmp"));

  // Links that loop: refused, nothing made.
  const std::string x = dir + "/x", y = dir + "/y";
  REQUIRE(::symlink("y", x.c_str()) == 0);
  REQUIRE(::symlink("x", y.c_str()) == 0);
  CHECK(has(error_of(x, "z"), "cannot write '" + x + "': its symbolic links loop"));
  CHECK(type_at(x) == S_IFLNK);
  CHECK_FALSE(exists(x + ".tmp"));
  remove_tree(dir);
}

TEST_CASE("write_file_atomically: a directory is refused, never replaced") {
  const std::string dir = temp_dir();
  const std::string sub = dir + "/sub";
  REQUIRE(::mkdir(sub.c_str(), 0755) == 0);
  CHECK(error_of(sub, "x") == "cannot write '" + sub + "': it is a directory; give a file path");
  CHECK(type_at(sub) == S_IFDIR);
  CHECK_FALSE(exists(sub + ".tmp"));
  const std::string link = dir + "/to-sub";
  REQUIRE(::symlink("sub", link.c_str()) == 0);
  CHECK(error_of(link, "x") ==
        "cannot write '" + link + "': it is a symbolic link to a directory; give a file path");
  CHECK(type_at(link) == S_IFLNK);
  CHECK(has(error_of(dir + "/new/", "x"), "it ends in '/', so it names a directory; give a file path"));
  CHECK_FALSE(exists(dir + "/new"));
  remove_tree(dir);
}

TEST_CASE("write_file_atomically: a FIFO is refused without blocking, never replaced") {
  const std::string dir = temp_dir();
  const std::string fifo = dir + "/pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  ::alarm(10);  // an open(2) of the FIFO for writing would wait for a reader forever: end the test instead
  CHECK(error_of(fifo, "x") ==
        "cannot write '" + fifo +
            "': it is a FIFO (named pipe), not a regular file; give a regular file path "
            "(a new name, or an existing file to replace)");
  CHECK(type_at(fifo) == S_IFIFO);
  CHECK_FALSE(exists(fifo + ".tmp"));
  const std::string link = dir + "/to-pipe";
  REQUIRE(::symlink("pipe", link.c_str()) == 0);
  CHECK(has(error_of(link, "x"), "it is a symbolic link to a FIFO (named pipe), not a regular file"));
  CHECK(type_at(link) == S_IFLNK);
  CHECK(type_at(fifo) == S_IFIFO);
  // A FIFO at the temporary's name is not opened either.
  const std::string path = dir + "/out.dot";
  REQUIRE(::mkfifo(atomic_temp_path(path).c_str(), 0644) == 0);
  CHECK(has(error_of(path, "x"), "exists and is a FIFO (named pipe)"));
  CHECK(type_at(atomic_temp_path(path)) == S_IFIFO);
  CHECK_FALSE(exists(path));
  ::alarm(0);
  remove_tree(dir);
}

TEST_CASE("write_file_atomically: /dev/full is refused and stays a character device") {
  if (type_at("/dev/full") != S_IFCHR) {
    MESSAGE("no /dev/full here: nothing to check");
    return;
  }
  // The check alone first: should it ever pass, the write below (as root,
  // a rename over /dev/full) is not tried.
  REQUIRE_THROWS_WITH_AS((void)atomic_write_target("/dev/full"),
                         doctest::Contains("it is a character device, not a regular file"), FileWriteError);
  CHECK(error_of("/dev/full", "x") ==
        "cannot write '/dev/full': it is a character device, not a regular file; give a regular file path (a "
        "new name, or an existing file to replace)");
  CHECK(type_at("/dev/full") == S_IFCHR);
  CHECK_FALSE(exists("/dev/full.tmp"));
  // Through a link: refused, the link kept.
  const std::string dir = temp_dir();
  const std::string link = dir + "/full";
  REQUIRE(::symlink("/dev/full", link.c_str()) == 0);
  CHECK(has(error_of(link, "x"), "it is a symbolic link to a character device"));
  CHECK(type_at(link) == S_IFLNK);
  CHECK(type_at("/dev/full") == S_IFCHR);
  remove_tree(dir);
}

TEST_CASE("write_file_atomically: a write that fails is an error, the old file intact") {
  // The file size limit makes write(2) fail (EFBIG) as a full disk does
  // (ENOSPC), on any machine and without root: the same path through the code.
  const std::string dir = temp_dir();
  const std::string path = dir + "/plot.svg";
  write_plain(path, "the old plot");
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // write(2) returns EFBIG instead of a signal
  rlimit small = old;
  small.rlim_cur = 8;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  const std::string err = error_of(path, std::string(64, 'x'));
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
  std::signal(SIGXFSZ, old_handler);
  CHECK(err == "cannot write '" + atomic_temp_path(path) + "': File too large");
  CHECK(read_file(path) == "the old plot");
  CHECK_FALSE(exists(atomic_temp_path(path)));
  remove_tree(dir);
}
