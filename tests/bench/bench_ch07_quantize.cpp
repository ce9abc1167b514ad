// Chapter 07 — how fast does the CPU quantize to FP8: per-tensor quantize
// with the amax (and the counts) in the same pass, and MX block quantize with
// E8M0 scales, beside memcpy of the same bytes, on one core?
// Depends on: mpt/fp8/quantize_raw.hpp (quantize_into, quantize_mx_into),
// mpt/fp8/quantize_raw_impl.hpp (the AVX2 and AVX-512 loops by name),
// mpt/formats/rounding.hpp (avx2_available), bench_inputs.hpp,
// bench_support.hpp, Google Benchmark.
//
// fp32 in, FP8 E4M3 codes out, one core. Times:
//   memcpy        of 2.5 bytes per element, in the same run: it reads and
//                 writes 5 bytes per element, what a quantize must move at
//                 least (4 read, 1 written) — the roofline
//   per-tensor    quantize_into: codes of x × scale, the amax of x and the
//                 counts (saturated, NaN, flushed), one pass
//   mx-floor      quantize_mx_into, blocks of 32 along rows of --cols values:
//   mx-rceil      each block's amax, its E8M0 code by the rule, its codes and
//                 counts (E8M0 codes and block amax add 5 bytes per 32 values,
//                 not counted)
// each with every loop this CPU has — AVX-512 and AVX2 (called by name),
// and the portable one; quantize_into runs the widest. GB/s
// counts the 5 bytes per element every variant must move; "x memcpy" is
// memcpy's time over the variant's. Target: per-tensor and MX (the loop
// quantize_into runs) >= 0.5x memcpy, where x and the codes do
// not fit in the last-level cache. Each time is the fastest of
// --repetitions runs (default 3), in CPU time. Printed, never asserted: not
// a test.
//
// Why the first loops measured 0.3-0.45x memcpy, and what was done
// (src/mpt/fp8/quantize_avx512.cpp's comment has the detail): the bytes are
// counted right — 5 per element is the least a quantize moves; it moves 6
// in fact, as its codes are written through the cache (each line read
// before it is written), while glibc's memcpy streams its writes above
// its non-temporal threshold (ld.so --list-tunables:
// glibc.cpu.x86_non_temporal_threshold, 190 MiB on the Xeon above) — so the
// ratio is, if anything, unkind to the quantize. In the
// cache the AVX-512 loop ran at about memcpy's out-of-cache speed; out of
// it, its time was the sum of the arithmetic and of the waiting, not the
// larger of the two. Prefetching every line (not one in two), walking
// several streams at once, MX blocks sixteen at a time with the next
// group's loads interleaved into this group's encode, and fewer operations
// per value made them overlap. Streaming stores for the codes gained a few
// percent at most and were left out (a GEMM reads the codes next). The
// AVX2 per-tensor loop walks four streams too; the AVX2 MX loop is as it
// was (their rows carry no target).
//
// The size: by default the smallest power of two n whose 5n bytes moved
// per pass are at least twice the largest cache Google Benchmark reports,
// so that no pass finds the previous one's data in the cache; capped at
// 2^28 elements (1 GiB of input; with the codes and memcpy's target about
// 1.9 GiB in all) and at an eighth of the machine's memory. The choice and
// its reason are printed. --n= overrides it (rounded down to whole rows).
//
// The values: bench_inputs.hpp's gradient-like values (|x| in [2^-20, 2^4),
// finite, random signs), and the per-tensor scale is current scaling's,
// 448 / amax: some values saturate to nothing (amax lands on 448), many of
// the smallest flush to zero, as in training.
//
//   bench_ch07_quantize [--n=N] [--cols=4096] [--repetitions=3] [google-benchmark flags]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench_inputs.hpp"
#include "bench_support.hpp"
#include "mpt/formats/rounding.hpp"
#include "mpt/fp8/quantize_raw.hpp"
#include "mpt/fp8/quantize_raw_impl.hpp"

namespace {

std::size_t g_n = 0;  // 0: chosen from the last-level cache
std::size_t g_cols = 4096;
int g_repetitions = 3;
std::string g_size_reason;

struct Data {
  std::vector<float> x;
  std::vector<std::uint8_t> codes, e8m0, copy;
  std::vector<float> block_amax;
  float scale = 1.0f;
  std::size_t rows = 0;
  // One E8M0 code and amax per block: rows × ceil(cols / 32) (n is whole rows).
  explicit Data(std::size_t n)
      : x(n),
        codes(n),
        e8m0(n / g_cols * ((g_cols + 31) / 32)),
        copy(n * 5 / 2),
        block_amax(n / g_cols * ((g_cols + 31) / 32)) {
    bench::fill_gradients(x);
    std::memset(codes.data(), 0, codes.size());  // touch every page before timing
    std::memset(copy.data(), 0, copy.size());
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, v < 0 ? -v : v);
    scale = 448.0f / amax;
    rows = n / g_cols;
  }
};

Data& data() {
  static Data d(g_n);
  return d;
}

void BM_memcpy(benchmark::State& st) {
  Data& d = data();
  for (auto _ : st) {
    std::memcpy(d.copy.data(), d.x.data(), d.copy.size());
    benchmark::ClobberMemory();
  }
}

/// Which loop a variant runs: the portable one, or a vector one by name.
enum class Loop { portable, avx2, avx512 };

mpt::fp8::detail::SimdWidth width_of(Loop l) {
  return l == Loop::avx512 ? mpt::fp8::detail::SimdWidth::avx512 : mpt::fp8::detail::SimdWidth::avx2;
}

void BM_per_tensor(benchmark::State& st, Loop loop) {
  Data& d = data();
  mpt::fp8::Fp8Counts counts;
  float amax = 0;
  for (auto _ : st) {
    amax = loop == Loop::portable
               ? mpt::fp8::quantize_into(d.x.data(), d.x.size(), mpt::DType::e4m3, d.scale, true,
                                         d.codes.data(), counts, mpt::Implementation::portable)
               : mpt::fp8::detail::quantize_into_simd(d.x.data(), d.x.size(), mpt::formats::e4m3, d.scale,
                                                      true, d.codes.data(), counts, width_of(loop));
    benchmark::ClobberMemory();
  }
  benchmark::DoNotOptimize(amax);
  st.counters["flushed/iter"] = static_cast<double>(counts.flushed) / static_cast<double>(st.iterations());
}

void BM_mx(benchmark::State& st, mpt::fp8::MxScaleRule rule, Loop loop) {
  Data& d = data();
  mpt::fp8::Fp8Counts counts;
  for (auto _ : st) {
    if (loop == Loop::portable) {
      mpt::fp8::quantize_mx_into(d.x.data(), d.rows, g_cols, mpt::DType::e4m3, rule, true, d.codes.data(),
                                 d.e8m0.data(), d.block_amax.data(), counts, mpt::Implementation::portable);
    } else {
      mpt::fp8::detail::quantize_mx_into_simd(d.x.data(), d.rows, g_cols, mpt::formats::e4m3, rule, true,
                                              d.codes.data(), d.e8m0.data(), d.block_amax.data(), counts,
                                              width_of(loop));
    }
    benchmark::ClobberMemory();
  }
  st.counters["saturated/iter"] =
      static_cast<double>(counts.saturated) / static_cast<double>(st.iterations());
}

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

/// The default n (see the file comment) and why.
std::size_t choose_n(double llc) {
  constexpr std::size_t kCap = std::size_t{1} << 28;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const double ram = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
  std::size_t n = std::size_t{1} << 20;
  char why[400];
  if (llc <= 0) {
    n = std::size_t{1} << 26;
    std::snprintf(why, sizeof why, "no cache size reported: 2^26 elements (320 MiB moved per pass)");
  } else {
    while (5.0 * static_cast<double>(n) < 2.0 * llc && n < kCap) n *= 2;
    std::snprintf(
        why, sizeof why,
        "the smallest power of two whose 5 bytes/element moved are >= 2x the %.0f MiB last-level cache%s",
        mib(llc), 5.0 * static_cast<double>(n) < 2.0 * llc ? ", capped at 2^28 elements" : "");
  }
  std::string reason = why;
  // x, the codes and memcpy's target: 7.5 bytes per element; keep to an eighth of the memory.
  while (ram > 0 && 7.5 * static_cast<double>(n) > ram / 8 && n > (std::size_t{1} << 20)) {
    n /= 2;
    reason = "halved to stay within an eighth of this machine's " +
             std::to_string(static_cast<long>(mib(ram))) + " MiB of memory (from: " + std::string(why) + ")";
  }
  g_size_reason = reason;
  return n;
}

const char* verdict(bool ok) { return ok ? "meets target" : "BELOW target"; }

}  // namespace

int main(int argc, char** argv) {
  bench::initialize(argc, argv, [](const char* arg) {
    if (std::strncmp(arg, "--n=", 4) == 0) return g_n = std::stoull(arg + 4), true;
    if (std::strncmp(arg, "--cols=", 7) == 0) return g_cols = std::stoull(arg + 7), true;
    if (std::strncmp(arg, "--repetitions=", 14) == 0) return g_repetitions = std::stoi(arg + 14), true;
    return false;
  });
  double llc = 0;  // the largest cache Google Benchmark reports, in bytes
  for (const auto& c : benchmark::CPUInfo::Get().caches) llc = std::max(llc, static_cast<double>(c.size));
  if (g_n == 0) {
    g_n = choose_n(llc);
  } else {
    g_size_reason = "given with --n=";
  }
  if (g_cols == 0 || g_n == 0 || g_repetitions < 1) {
    std::fprintf(stderr, "bench_ch07_quantize: --n, --cols and --repetitions must be at least 1\n");
    return 2;
  }
  if (g_cols > g_n) g_cols = g_n;
  g_n = g_n / g_cols * g_cols;  // whole rows

  // The loops this CPU has, the one quantize_into runs first (the widest).
  std::vector<std::pair<const char*, Loop>> impls{{"portable", Loop::portable}};
  if (mpt::avx2_available()) impls.insert(impls.begin(), {"avx2", Loop::avx2});
  if (mpt::avx2_available() && mpt::fp8::detail::widest() == mpt::fp8::detail::SimdWidth::avx512)
    impls.insert(impls.begin(), {"avx512", Loop::avx512});
  benchmark::RegisterBenchmark("memcpy", BM_memcpy)
      ->Unit(benchmark::kMillisecond)
      ->Repetitions(g_repetitions);
  for (const auto& [name, impl] : impls) {
    benchmark::RegisterBenchmark((std::string("per-tensor/") + name).c_str(), BM_per_tensor, impl)
        ->Unit(benchmark::kMillisecond)
        ->Repetitions(g_repetitions);
    benchmark::RegisterBenchmark((std::string("mx-floor/") + name).c_str(), BM_mx,
                                 mpt::fp8::MxScaleRule::floor, impl)
        ->Unit(benchmark::kMillisecond)
        ->Repetitions(g_repetitions);
    benchmark::RegisterBenchmark((std::string("mx-rceil/") + name).c_str(), BM_mx,
                                 mpt::fp8::MxScaleRule::rceil, impl)
        ->Unit(benchmark::kMillisecond)
        ->Repetitions(g_repetitions);
  }
  bench::MinTimeReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);

  constexpr double kTarget = 0.5;
  const double moved = 5.0 * static_cast<double>(g_n);  // bytes every variant must move: 4 read, 1 written
  // No count of repetitions here: a quick rerun with one prints the same header.
  std::printf(
      "\nFP8 E4M3 quantize, fp32 in, codes out; one core; time: the fastest of the repetitions (CPU time)\n");
  std::printf("n = %zu elements (%zu rows of %zu for MX): %s\n", g_n, g_n / g_cols, g_cols,
              g_size_reason.c_str());
  std::printf(
      "moved per pass: %.0f MiB (x %.0f MiB read, codes %.0f MiB written); last-level cache: %.0f MiB (%s)\n",
      mib(moved), mib(4.0 * static_cast<double>(g_n)), mib(static_cast<double>(g_n)), mib(llc),
      moved > llc ? "the tensors do not fit" : "the tensors FIT: the ratios are the cache's, not memory's");
  std::printf(
      "memcpy: %.0f MiB copied (the same %.0f MiB read and written); quantize_into runs the %s loop\n\n",
      mib(moved / 2), mib(moved), impls.front().first);
  const double tm = rep.of("memcpy");
  std::printf("%-22s %9s %8s %9s %7s  %s\n", "variant", "ms", "GB/s", "x memcpy", "target", "verdict");
  if (tm > 0) std::printf("%-22s %9.3f %8.2f %9s %7s\n", "memcpy", tm, moved / tm / 1e6, "1.00", "-");
  for (const auto& [name, impl] : impls) {
    (void)impl;
    for (const char* variant : {"per-tensor", "mx-floor", "mx-rceil"}) {
      const std::string key = std::string(variant) + "/" + name;
      const double t = rep.of(key);
      if (t <= 0 || tm <= 0) continue;
      // The target is the fast path's: the loop quantize_into runs here.
      const bool targeted = std::string(name) == impls.front().first;
      std::printf("%-22s %9.3f %8.2f %9.2f %7s  %s\n", key.c_str(), t, moved / t / 1e6, tm / t,
                  targeted ? "0.50x" : "-", targeted ? verdict(tm / t >= kTarget) : "");
    }
  }
  benchmark::Shutdown();
  return 0;
}
