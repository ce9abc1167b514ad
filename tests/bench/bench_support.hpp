// Chapters 01 onwards — what the CPU benchmarks share: their own --flag=
// options taken out before Google Benchmark reads the rest, a memcpy
// baseline, and a console reporter that keeps every run's bandwidth for the
// ratio table printed after the runs. Depends on: Google Benchmark, POSIX
// isatty.
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

namespace bench {

/// Hand argv to Google Benchmark, less the arguments `own` consumes (own
/// returns true for an argument it has handled).
inline void initialize(int argc, char** argv, const std::function<bool(const char*)>& own) {
  static std::vector<char*> args;  // Google Benchmark may keep pointers into it
  args.clear();
  for (int i = 0; i < argc; ++i)
    if (!own(argv[i])) args.push_back(argv[i]);
  int nargs = static_cast<int>(args.size());
  benchmark::Initialize(&nargs, args.data());
}

/// initialize() for a benchmark whose one option is --n=N, the element count.
inline void initialize(int argc, char** argv, std::size_t& n) {
  initialize(argc, argv, [&n](const char* arg) {
    if (std::strncmp(arg, "--n=", 4) != 0) return false;
    n = std::stoull(arg + 4);
    return true;
  });
}

/// Time a memcpy of n floats from src to dst: the baseline the tables divide by.
inline void time_memcpy(benchmark::State& st, const float* src, float* dst, std::size_t n) {
  for (auto _ : st) {
    std::memcpy(dst, src, n * sizeof(float));
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * n * 4);
}

/// Colours only on a terminal: piped into a file for the chapter text, the
/// table stays plain (a custom reporter ignores --benchmark_color).
inline benchmark::ConsoleReporter::OutputOptions plain_unless_terminal() {
  return isatty(STDOUT_FILENO) ? benchmark::ConsoleReporter::OO_Defaults
                               : benchmark::ConsoleReporter::OO_Tabular;
}

/// Console output as usual, plus the bandwidth of every run kept for the table.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  explicit RatioReporter(OutputOptions opts = OO_Defaults) : ConsoleReporter(opts) {}
  std::map<std::string, double> gbps;  ///< GB/s by benchmark name
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      auto it = r.counters.find("bytes_per_second");
      if (it != r.counters.end()) gbps[r.benchmark_name()] = it->second.value / 1e9;
    }
  }
  /// The GB/s of the run named `name`; 0 when there was none.
  double gbps_of(const std::string& name) const {
    auto it = gbps.find(name);
    return it == gbps.end() ? 0.0 : it->second;
  }
};

/// Console output as usual, plus each benchmark's fastest time per
/// iteration over its repetitions, in ms.
class MinTimeReporter : public benchmark::ConsoleReporter {
 public:
  MinTimeReporter() : benchmark::ConsoleReporter(bench::plain_unless_terminal()) {}
  std::map<std::string, double> ms;
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs)
      if (r.run_type == Run::RT_Iteration) {
        const double t = r.GetAdjustedCPUTime() * benchmark::GetTimeUnitMultiplier(benchmark::kMillisecond) /
                         benchmark::GetTimeUnitMultiplier(r.time_unit);
        const std::string name = r.run_name.function_name;
        if (!ms.count(name) || t < ms[name]) ms[name] = t;
      }
  }
  /// The fastest time of the benchmark `name`, in ms; 0 when it did not run.
  double of(const std::string& name) const {
    auto it = ms.find(name);
    return it == ms.end() ? 0.0 : it->second;
  }
};

}  // namespace bench
