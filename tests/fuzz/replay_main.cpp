// All chapters — the replay program of a fuzz target: every file of its
// committed corpus fed to the target's LLVMFuzzerTestOneInput, so that each
// input ever kept is a regression test in every build, fuzzer or not.
// Depends on: the target's source (linked in), the C++ standard library.
//
// Usage: fuzz_replay_<target> PATH...; a PATH is a file or a folder (its
// files, in name order). Exit 0 when every input ran, 1 when there was none
// (an empty corpus is a mistake, not a pass), 2 for a path that cannot be
// read. A property that fails aborts the program (fuzz_check.hpp).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace fs = std::filesystem;

bool replay(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz replay: cannot read '%s'\n", file.c_str());
    return false;
  }
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::fprintf(stderr, "replaying %s (%zu bytes)\n", file.c_str(), bytes.size());
  // A copy of exactly the file's size, so ASan catches a read past its end.
  std::vector<std::uint8_t> data(bytes.begin(), bytes.end());
  LLVMFuzzerTestOneInput(data.data(), data.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t count = 0;
  for (int i = 1; i < argc; ++i) {
    const fs::path path = argv[i];
    std::error_code ec;
    std::vector<fs::path> files;
    if (fs::is_directory(path, ec)) {
      for (const fs::directory_entry& e : fs::directory_iterator(path, ec))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(path);
    }
    if (ec) {
      std::fprintf(stderr, "fuzz replay: cannot list '%s': %s\n", path.c_str(), ec.message().c_str());
      return 2;
    }
    for (const fs::path& f : files) {
      if (!replay(f)) return 2;
      ++count;
    }
  }
  if (count == 0) {
    std::fprintf(stderr, "fuzz replay: no inputs (give the corpus folder)\n");
    return 1;
  }
  std::printf("fuzz replay: %zu inputs, every property held\n", count);
  return 0;
}
