// Chapters 02 onwards — the PyTorch columns of the CPU benchmarks: the
// options that name a Python (--python=PATH or MPT_TORCH_PYTHON=PATH, and
// --torch-min-time=S), and one run of a benchmark's companion script
// (tests/bench/bench_chNN_*_torch.py) with that Python, read back.
// Depends on: POSIX popen/pclose and <sys/wait.h>; PyTorch only at run time
// and only if the Python named has it (never a dependency of the project:
// without it the status says why and the torch columns stay empty).
//
// What a companion script prints, one result per line:
//   torch <version> <cpu capability>             its first line, the status
//   PyTorch not importable (<why>)               instead, when import fails
//   <name words...> <ms>                         a time: the words before the
//                                                last are its name
// Any other line (a warning, a traceback) is kept only to say why a script
// that printed no time failed.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>

#ifndef MPT_BENCH_SOURCE_DIR
#define MPT_BENCH_SOURCE_DIR "tests/bench"
#endif

namespace bench {

/// The options of the PyTorch comparison, taken out of argv by the
/// benchmark's own option parser (bench::initialize).
struct TorchOptions {
  std::string python;     ///< empty: no PyTorch comparison
  double min_time = 0.5;  ///< seconds each repetition of each PyTorch op runs at least

  /// Take --python=PATH or --torch-min-time=S; false for any other argument.
  bool parse(const char* arg) {
    if (std::strncmp(arg, "--python=", 9) == 0) {
      python = arg + 9;
    } else if (std::strncmp(arg, "--torch-min-time=", 17) == 0) {
      min_time = std::stod(arg + 17);
    } else {
      return false;
    }
    return true;
  }
  /// MPT_TORCH_PYTHON when no --python= was given.
  void from_environment() {
    const char* env = std::getenv("MPT_TORCH_PYTHON");
    if (python.empty() && env) python = env;
  }
};

/// What a companion script printed: its status line and its times.
struct TorchResult {
  std::string status;                ///< "torch VERSION CAPABILITY", or "PyTorch not importable: why"
  std::map<std::string, double> ms;  ///< each time by its name (the words before it, single-spaced)
  /// The time named `name`, in ms; 0 when the script printed none.
  double of(const std::string& name) const {
    auto it = ms.find(name);
    return it == ms.end() ? 0.0 : it->second;
  }
};

/// A line's words and, when its last word is a whole number, that number:
/// name = the words before it joined by one space. False for anything else.
inline bool parse_time_line(const std::string& line, std::string& name, double& value) {
  std::istringstream in(line);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  if (words.size() < 2) return false;
  const std::string& last = words.back();
  char* end = nullptr;
  value = std::strtod(last.c_str(), &end);
  if (end == last.c_str() || *end != '\0') return false;
  name.clear();
  for (std::size_t i = 0; i + 1 < words.size(); ++i) name += (i ? " " : "") + words[i];
  return true;
}

/// How glibc's malloc treats the Python process's large blocks.
enum class TorchMalloc {
  as_is,       ///< glibc's defaults: a block over the mmap threshold is
               ///< returned to the kernel when freed, and faulted in afresh
  keep_freed,  ///< keep freed blocks (the settings a benchmark that calls
               ///< mallopt(M_MMAP_THRESHOLD and M_TRIM_THRESHOLD, 1 << 30)
               ///< runs with), so that its times count no page faults either
};

/// Run MPT_BENCH_SOURCE_DIR/SCRIPT with the Python of `opts`, the arguments
/// `args` (words already quoted for the shell, or none) and
/// --min-time=opts.min_time, and read what it prints. Without a Python, or
/// when it fails before printing a time, the status starts with "PyTorch not
/// importable: " and says why.
inline TorchResult run_torch_script(const TorchOptions& opts, const std::string& script,
                                    const std::string& args, TorchMalloc malloc = TorchMalloc::as_is) {
  TorchResult r;
  if (opts.python.empty()) {
    r.status = "PyTorch not importable: no Python named (--python=PATH or MPT_TORCH_PYTHON=PATH)";
    return r;
  }
  // -B: the script imports bench_torch_support.py beside it; write no
  // __pycache__ into the source tree.
  // glibc reads MALLOC_*_ from the environment when the process starts.
  const std::string env = malloc == TorchMalloc::keep_freed
                              ? "MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824 "
                              : "";
  const std::string cmd = env + "'" + opts.python + "' -B '" MPT_BENCH_SOURCE_DIR "/" + script + "' " + args +
                          " --min-time=" + std::to_string(opts.min_time) + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    r.status = "PyTorch not importable: could not run " + opts.python;
    return r;
  }
  char buf[512];
  std::string last;
  while (std::fgets(buf, sizeof buf, p)) {
    std::string l(buf);
    while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.pop_back();
    std::string name;
    double value = 0;
    if (l.rfind("torch ", 0) == 0 || l.rfind("PyTorch not importable", 0) == 0) {
      if (r.status.empty()) r.status = l;
    } else if (!r.status.empty() && parse_time_line(l, name, value)) {
      r.ms[name] = value;
    } else if (!l.empty()) {
      last = l;  // a warning, or the error that ended the script
    }
  }
  const int wait_status = pclose(p);
  const int rc = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
  if (r.status.empty() || (rc != 0 && r.ms.empty()))
    r.status = "PyTorch not importable: " + opts.python + " failed (exit status " + std::to_string(rc) +
               "): " + last;
  return r;
}

}  // namespace bench
