// Chapter 01 — how fast can a CPU simulate low precision?
// Depends on: mpt/rounding.hpp, mpt/storage.hpp, bench_support.hpp, Google
// Benchmark.
//
// Rounds N floats (default 16M = 64 MiB) to every format and rounding mode,
// fp32 in → fp32 out and fp32 in → storage type out, on one core. Each
// figure is printed beside a plain memcpy of the same input buffer measured
// in the same run. GB/s counts the fp32 input consumed per second (memcpy:
// the bytes it copies), so "x memcpy" is memcpy's time over ours: 1.0 means
// rounding costs no more than copying the data once. Not a test: the
// chapter's targets are printed, never asserted.
//
//   bench_ch01_round [--n=16777216] [google-benchmark flags]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_inputs.hpp"
#include "bench_support.hpp"
#include "mpt/formats/rounding.hpp"
#include "mpt/formats/storage.hpp"

namespace {

std::size_t g_n = std::size_t{1} << 24;

struct Buffers {
  std::vector<float> in, out;
  std::vector<Eigen::half> h;
  std::vector<Eigen::bfloat16> b;
  std::vector<mpt::Fp8E4M3> e4;
  std::vector<mpt::Fp8E5M2> e5;
  explicit Buffers(std::size_t n) : in(n), out(n), h(n), b(n), e4(n), e5(n) {
    bench::fill_wide_range(in);                     // every branch of the rounding is exercised
    std::memset(out.data(), 0, n * sizeof(float));  // touch pages before timing
    std::memset(h.data(), 0, n * 2);
    std::memset(b.data(), 0, n * 2);
    std::memset(e4.data(), 0, n);
    std::memset(e5.data(), 0, n);
  }
};

Buffers& buffers() {
  static Buffers b(g_n);
  return b;
}

void BM_memcpy(benchmark::State& st) {
  Buffers& b = buffers();
  bench::time_memcpy(st, b.in.data(), b.out.data(), g_n);
}

void round_f32(benchmark::State& st, const char* fmt, mpt::RoundingMode mode) {
  Buffers& b = buffers();
  mpt::RoundingOptions o;
  o.mode = mode;
  o.seed = 1;
  const mpt::Format& f = mpt::format_named(fmt);
  for (auto _ : st) {
    mpt::round_array(b.in.data(), b.out.data(), g_n, f, o);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * g_n * 4);
}

void round_store(benchmark::State& st, const char* fmt, mpt::RoundingMode mode) {
  Buffers& b = buffers();
  mpt::RoundingOptions o;
  o.mode = mode;
  o.seed = 1;
  const std::string f = fmt;
  const std::size_t out_bytes = (f == "fp16" || f == "bf16") ? 2 : 1;
  for (auto _ : st) {
    if (f == "fp16") mpt::to_fp16(b.in.data(), b.h.data(), g_n, o);
    else if (f == "bf16") mpt::to_bf16(b.in.data(), b.b.data(), g_n, o);
    else if (f == "e4m3") mpt::to_e4m3(b.in.data(), b.e4.data(), g_n, o);
    else mpt::to_e5m2(b.in.data(), b.e5.data(), g_n, o);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * g_n * 4);
  st.counters["out_bytes"] = static_cast<double>(out_bytes);
}

/// The chapter's targets, as fractions of memcpy.
double target_for(const std::string& fmt, const std::string& mode) {
  if (mode == "sr") return 0.25;
  if (mode != "rne") return 0.0;
  return (fmt == "fp16" || fmt == "bf16") ? 0.8 : 0.4;
}

}  // namespace

int main(int argc, char** argv) {
  bench::initialize(argc, argv, g_n);

  const char* fmts[] = {"fp16", "bf16", "e4m3", "e5m2", "tf32"};
  const std::pair<const char*, mpt::RoundingMode> modes[] = {{"rne", mpt::RoundingMode::nearest_even},
                                                             {"rtz", mpt::RoundingMode::toward_zero},
                                                             {"sr", mpt::RoundingMode::stochastic}};
  benchmark::RegisterBenchmark("memcpy", BM_memcpy)->Unit(benchmark::kMillisecond);
  for (const char* f : fmts)
    for (const auto& [mname, mode] : modes) {
      benchmark::RegisterBenchmark((std::string("round/") + f + "/" + mname + "/f32").c_str(), round_f32, f,
                                   mode)
          ->Unit(benchmark::kMillisecond);
      if (std::string(f) != "tf32")
        benchmark::RegisterBenchmark((std::string("round/") + f + "/" + mname + "/store").c_str(),
                                     round_store, f, mode)
            ->Unit(benchmark::kMillisecond);
    }
  bench::RatioReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);

  const double memcpy_gbps = rep.gbps_of("memcpy");
  std::printf("\nn = %zu floats, one core, AVX2 path %s\n", g_n,
              mpt::avx2_available() ? "on" : "off (portable loop)");
  std::printf("memcpy of the same input: %.2f GB/s of input copied\n\n", memcpy_gbps);
  std::printf("%-6s %-4s %-6s %9s %9s %8s  %s\n", "format", "mode", "output", "GB/s", "x memcpy", "target",
              "verdict");
  for (const auto& [name, g] : rep.gbps) {
    if (name == "memcpy" || memcpy_gbps <= 0) continue;
    // name: round/FMT/MODE/OUT
    const std::string rest = name.substr(6);
    const std::string fmt = rest.substr(0, rest.find('/'));
    const std::string tail = rest.substr(fmt.size() + 1);
    const std::string mode = tail.substr(0, tail.find('/'));
    const std::string out = tail.substr(mode.size() + 1);
    const double ratio = g / memcpy_gbps, target = target_for(fmt, mode);
    std::printf("%-6s %-4s %-6s %9.2f %9.2f %8s  %s\n", fmt.c_str(), mode.c_str(), out.c_str(), g, ratio,
                target > 0 ? (std::to_string(target).substr(0, 4) + "x").c_str() : "-",
                target <= 0 ? "" : (ratio >= target ? "meets target" : "BELOW target"));
  }
  benchmark::Shutdown();
  return 0;
}
