// Chapter 02 — how fast can the CPU unscale gradients and look for inf/NaN?
// Depends on: mpt/unscale.hpp, bench_support.hpp, Google Benchmark.
//
// N floats (default 16M = 64 MiB, past the last-level cache) split into
// gradient tensors of mixed sizes — big weight matrices, small biases, odd
// sizes that misalign the next tensor — laid out back to back in one buffer.
// On one core it times:
//   fused    unscale_and_check over the list: one read and one write per element
//   two-pass unscale_then_check: unscale every tensor, then check every
//            tensor — the data is read twice
//   memcpy   of the same N floats into another buffer, in the same run
// each with the AVX2 loop and the portable loop. GB/s counts the fp32 input
// consumed per second (memcpy: the bytes it copies), so "x memcpy" is
// memcpy's time over ours, as in bench_ch01_round. Targets: fused
// >= 0.6x memcpy, and fused >= 1.5x faster than two-pass. Printed, never
// asserted: not a test.
//
// The inverse scale alternates between 2^-10 and 2^+10 from one iteration to
// the next: the data returns to its starting values (powers of two are exact
// here), so no iteration drifts into slow subnormal arithmetic, and the data
// stays finite, the common case in which neither version can stop early.
//
//   bench_ch02_unscale [--n=16777216] [google-benchmark flags]
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench_inputs.hpp"
#include "bench_support.hpp"
#include "mpt/amp/unscale.hpp"

namespace {

std::size_t g_n = std::size_t{1} << 24;

struct Buffers {
  std::vector<float> grads, out;
  mpt::TensorList list;
  explicit Buffers(std::size_t n) : grads(n), out(n) {
    bench::fill_gradients(grads);                   // finite, |x| in [2^-20, 2^4)
    std::memset(out.data(), 0, n * sizeof(float));  // touch pages before timing
    // An MLP-like mix of sizes (weights, biases, odd shapes).
    std::size_t at = 0;
    for (std::size_t size : bench::mixed_tensor_sizes(n)) {
      list.emplace_back(grads.data() + at, size);
      at += size;
    }
  }
};

Buffers& buffers() {
  static Buffers b(g_n);
  return b;
}

void BM_memcpy(benchmark::State& st) {
  Buffers& b = buffers();
  bench::time_memcpy(st, b.grads.data(), b.out.data(), g_n);
}

template <bool kFused>
void BM_unscale(benchmark::State& st, mpt::Implementation impl) {
  Buffers& b = buffers();
  bool flip = false, found = false;
  for (auto _ : st) {
    const float inv = flip ? 0x1p+10f : 0x1p-10f;
    flip = !flip;
    found |= kFused ? mpt::unscale_and_check(b.list, inv, impl) : mpt::unscale_then_check(b.list, inv, impl);
    benchmark::ClobberMemory();
  }
  benchmark::DoNotOptimize(found);
  if (found) st.SkipWithError("found an inf in finite data");
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * g_n * 4);
  st.counters["tensors"] = static_cast<double>(b.list.size());
}

const char* verdict(double ratio, double target) { return ratio >= target ? "meets target" : "BELOW target"; }

}  // namespace

int main(int argc, char** argv) {
  bench::initialize(argc, argv, g_n);

  std::vector<std::pair<const char*, mpt::Implementation>> impls{{"portable", mpt::Implementation::portable}};
  if (mpt::avx2_available()) impls.insert(impls.begin(), {"avx2", mpt::Implementation::avx2});
  benchmark::RegisterBenchmark("memcpy", BM_memcpy)->Unit(benchmark::kMillisecond);
  for (const auto& [name, impl] : impls) {
    benchmark::RegisterBenchmark((std::string("fused/") + name).c_str(), BM_unscale<true>, impl)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("two-pass/") + name).c_str(), BM_unscale<false>, impl)
        ->Unit(benchmark::kMillisecond);
  }
  bench::RatioReporter rep(bench::plain_unless_terminal());
  benchmark::RunSpecifiedBenchmarks(&rep);

  constexpr double kTargetMemcpy = 0.6, kTargetTwoPass = 1.5;
  const double memcpy_gbps = rep.gbps_of("memcpy");
  std::printf("\nn = %zu floats in %zu tensors of mixed sizes, one core, AVX2 path %s\n", g_n,
              buffers().list.size(), mpt::avx2_available() ? "on" : "off (portable loop)");
  std::printf("memcpy of the same input: %.2f GB/s of input copied\n\n", memcpy_gbps);
  std::printf("%-9s %-9s %8s %9s %8s  %s\n", "variant", "impl", "GB/s", "x memcpy", "target", "verdict");
  for (const auto& [name, impl] : impls) {
    (void)impl;
    for (const char* variant : {"fused", "two-pass"}) {
      const std::string key = std::string(variant) + "/" + name;
      if (!rep.gbps.count(key) || memcpy_gbps <= 0) continue;
      const double g = rep.gbps[key], ratio = g / memcpy_gbps;
      const bool fused = std::string(variant) == "fused";
      std::printf("%-9s %-9s %8.2f %9.2f %8s  %s\n", variant, name, g, ratio, fused ? "0.60x" : "-",
                  fused ? verdict(ratio, kTargetMemcpy) : "");
    }
  }
  std::printf("\n%-9s %-30s %8s  %s\n", "impl", "fused vs two-pass (time ratio)", "target", "verdict");
  for (const auto& [name, impl] : impls) {
    (void)impl;
    const std::string f = std::string("fused/") + name, t = std::string("two-pass/") + name;
    if (!rep.gbps.count(f) || !rep.gbps.count(t) || rep.gbps[t] <= 0) continue;
    const double speedup = rep.gbps[f] / rep.gbps[t];  // = two-pass time / fused time
    std::printf("%-9s %29.2fx %8s  %s\n", name, speedup, "1.50x", verdict(speedup, kTargetTwoPass));
  }
  benchmark::Shutdown();
  return 0;
}
