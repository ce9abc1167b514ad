// Chapter 04 — numerically stable softmax and cross-entropy: the fused CPU
// softmax cross-entropy (loss and fp16 gradient of fp16 logits in one call,
// src/mpt/nn/cpu/softmax_cpu.hpp) against memcpy of the bytes it must move and
// against the same computation as separate passes, one core.
// Depends on: Google Benchmark, bench_support.hpp, mpt/nn/cpu/softmax_cpu.hpp;
// bench_torch.hpp, bench_ch04_softmax_ce_torch.py and a Python with torch
// for the PyTorch columns (optional).
//
// Rows of K = 32768 fp16 logits (a vocabulary of that size), targets at
// random. The fused kernel must read every logit once and write its
// gradient once: 4 bytes per logit, what the table's GB/s counts; memcpy
// copies the logits into a buffer of the gradient's size in the same run
// (it too reads 2 and writes 2 bytes per logit). The unfused passes write
// FP32 log-probabilities and read them back twice (12 bytes per logit).
// Targets: fused >= 0.5x memcpy, and >= 1.5x faster than the unfused passes.
//
// Beside PyTorch: with --python=PATH (or MPT_TORCH_PYTHON=PATH) naming a
// Python that can import torch, bench_ch04_softmax_ce_torch.py times
// F.cross_entropy and the logits' gradient (torch.autograd.grad) on the same
// shapes with torch.set_num_threads(1), timed the same way (CPU time, the
// fastest of the repetitions; glibc keeps PyTorch's freed blocks, so that
// its outputs, allocated on every call, cost no page faults: the fused
// call's are allocated once), three ways: FP32 logits; fp16 logits under
// torch.autocast("cpu", dtype=torch.float16); bf16 logits under
// torch.autocast("cpu", dtype=torch.bfloat16). Autocast runs cross-entropy
// in FP32 (it is on the CPU autocast's fp32 list, KERNEL_CPU(
// cross_entropy_loss, fp32) in PyTorch's aten/src/ATen/autocast_mode.cpp):
// the logits are widened, the loss is FP32, the gradient is rounded back to
// the logits' dtype. The last table sets the library's fused fp16 call
// beside each; without such a Python its torch columns are "-" and its
// header says "PyTorch not importable". PyTorch is never a dependency of
// the project.
//
//   bench_ch04_softmax_ce [--rows=R1,R2,...] [--classes=K] [--repetitions=N]
//                         [--python=PATH] [--torch-min-time=0.5] [Google Benchmark flags]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench_support.hpp"
#include "bench_torch.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/nn/cpu/softmax_cpu.hpp"

namespace {

/// One shape: logits, targets and the gradient buffer.
struct Case {
  std::int64_t rows = 0, classes = 0;
  std::vector<std::uint16_t> logits, grad;
  std::vector<int> targets;
  std::string key;  // "512x32768"
};

std::vector<std::int64_t> g_rows = {128, 512};
std::int64_t g_classes = 32768;
int g_repetitions = 5;
bench::TorchOptions g_torch;  // --python=, --torch-min-time=
std::vector<std::unique_ptr<Case>> g_cases;

std::unique_ptr<Case> make_case(std::int64_t rows, std::int64_t classes, std::uint64_t seed) {
  auto c = std::make_unique<Case>();
  c->rows = rows;
  c->classes = classes;
  c->key = std::to_string(rows) + "x" + std::to_string(classes);
  mpt::Rng rng(seed);
  std::vector<float> v(static_cast<std::size_t>(rows * classes));
  for (float& f : v) f = static_cast<float>(rng.normal() * 3.0);
  c->logits.resize(v.size());
  mpt::store_as(mpt::DType::f16, v.data(), c->logits.data(), v.size());
  c->grad.assign(v.size(), 0);
  for (std::int64_t i = 0; i < rows; ++i)
    c->targets.push_back(static_cast<int>(rng.below(static_cast<std::uint64_t>(classes))));
  return c;
}

void BM_memcpy(benchmark::State& st, Case* c) {
  for (auto _ : st) {
    std::memcpy(c->grad.data(), c->logits.data(), c->logits.size() * 2);
    benchmark::ClobberMemory();
  }
}

void BM_fused(benchmark::State& st, Case* c) {
  for (auto _ : st) {
    const float loss = mpt::softmax_cpu::fused_cross_entropy_f16(c->logits.data(), c->rows, c->classes,
                                                                 c->targets.data(), {}, c->grad.data());
    benchmark::DoNotOptimize(loss);
    benchmark::ClobberMemory();
  }
}

void BM_unfused(benchmark::State& st, Case* c) {
  for (auto _ : st) {
    const float loss = mpt::softmax_cpu::unfused_cross_entropy_f16(c->logits.data(), c->rows, c->classes,
                                                                   c->targets.data(), {}, c->grad.data());
    benchmark::DoNotOptimize(loss);
    benchmark::ClobberMemory();
  }
}

/// "128,512" into row counts >= 1; exits with status 2 on anything else.
std::vector<std::int64_t> parse_rows(const char* s) {
  std::vector<std::int64_t> rows;
  std::stringstream all(s);
  std::string item;
  while (std::getline(all, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1) {
      std::fprintf(stderr, "bench_ch04_softmax_ce: --rows='%s': row counts >= 1 separated by ','\n", s);
      std::exit(2);
    }
    rows.push_back(v);
  }
  if (rows.empty()) {
    std::fprintf(stderr, "bench_ch04_softmax_ce: --rows='%s': row counts >= 1 separated by ','\n", s);
    std::exit(2);
  }
  return rows;
}

const char* verdict(bool ok) { return ok ? "meets target" : "BELOW target"; }
double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  bench::initialize(argc, argv, [](const char* arg) {
    if (std::strncmp(arg, "--rows=", 7) == 0) {
      g_rows = parse_rows(arg + 7);
    } else if (std::strncmp(arg, "--classes=", 10) == 0) {
      g_classes = std::atoll(arg + 10);
      if (g_classes < 1) {
        std::fprintf(stderr, "bench_ch04_softmax_ce: --classes='%s': a class count >= 1\n", arg + 10);
        std::exit(2);
      }
    } else if (std::strncmp(arg, "--repetitions=", 14) == 0) {
      g_repetitions = std::max(1, std::atoi(arg + 14));
    } else {
      return g_torch.parse(arg);
    }
    return true;
  });
  g_torch.from_environment();
  std::uint64_t seed = 3;
  for (std::int64_t r : g_rows) g_cases.push_back(make_case(r, g_classes, seed += 10));
  for (const auto& c : g_cases) {
    using Fn = void (*)(benchmark::State&, Case*);
    const std::pair<const char*, Fn> runs[] = {
        {"memcpy/", BM_memcpy}, {"fused/", BM_fused}, {"unfused/", BM_unfused}};
    for (const auto& [name, fn] : runs)
      benchmark::RegisterBenchmark((name + c->key).c_str(), fn, c.get())
          ->Unit(benchmark::kMillisecond)
          ->Repetitions(g_repetitions);
  }
  bench::MinTimeReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);

  double llc = 0;  // the largest cache Google Benchmark reports, in bytes
  for (const auto& c : benchmark::CPUInfo::Get().caches) llc = std::max(llc, static_cast<double>(c.size));
  constexpr double kTargetMemcpy = 0.5, kTargetUnfused = 1.5;
  std::printf(
      "\nsoftmax cross-entropy forward+backward, fp16 logits and gradient, FP32 loss; one core;\n"
      "time: the fastest of the repetitions. bytes: what it must move (logits read once,\n"
      "gradient written once, 4 per logit); memcpy copies the logits into the gradient's buffer\n");
  std::printf("last-level cache of this CPU: %.0f MiB, to set beside column MiB (logits and gradient)\n\n",
              mib(llc));
  std::printf("%-12s %10s %8s %9s %8s %11s %9s %7s  %s\n", "shape", "bytes", "MiB", "fused ms", "GB/s",
              "memcpy GB/s", "x memcpy", "target", "verdict");
  for (const auto& c : g_cases) {
    const double t = rep.of("fused/" + c->key), tm = rep.of("memcpy/" + c->key);
    if (t <= 0 || tm <= 0) continue;
    const double bytes = 4.0 * static_cast<double>(c->logits.size());
    const double g = bytes / t / 1e6, gm = bytes / tm / 1e6;
    std::printf("%-12s %10.0f %8.1f %9.3f %8.2f %11.2f %9.2f %7s  %s\n", c->key.c_str(), bytes, mib(bytes), t,
                g, gm, g / gm, "0.50x", verdict(g / gm >= kTargetMemcpy));
  }
  std::printf("\n%-12s %9s %11s %16s %7s  %s\n", "shape", "fused ms", "unfused ms", "unfused / fused",
              "target", "verdict");
  for (const auto& c : g_cases) {
    const double t = rep.of("fused/" + c->key), tu = rep.of("unfused/" + c->key);
    if (t <= 0 || tu <= 0) continue;
    std::printf("%-12s %9.3f %11.3f %15.2fx %7s  %s\n", c->key.c_str(), t, tu, tu / t, ">=1.50x",
                verdict(tu / t >= kTargetUnfused));
  }

  // The same loss and gradient beside PyTorch's: "ce_ms <key> <run> <ms>".
  // The fused call writes into buffers allocated once; PyTorch allocates its
  // gradient and intermediates on every call, so its process keeps freed
  // blocks (glibc would return each to the kernel and fault it in afresh):
  // the time is the op's, not the page faults'.
  std::string rows;
  for (std::int64_t r : g_rows) rows += (rows.empty() ? "" : ",") + std::to_string(r);
  const bench::TorchResult torch =
      bench::run_torch_script(g_torch, "bench_ch04_softmax_ce_torch.py",
                              "--rows=" + rows + " --classes=" + std::to_string(g_classes) +
                                  " --repetitions=" + std::to_string(g_repetitions),
                              bench::TorchMalloc::keep_freed);
  std::printf(
      "\nsoftmax cross-entropy beside PyTorch's: one thread, the same shapes; mpt: the fused call on fp16\n"
      "logits (fp16 gradient, FP32 loss) in every row; torch: F.cross_entropy and the logits' gradient\n"
      "with FP32 logits, and with fp16 or bf16 logits under torch.autocast (cross-entropy in FP32, the\n"
      "gradient in the logits' dtype); time: the fastest of the repetitions\n"
      "%s\n\n",
      torch.status.c_str());
  std::printf("%-12s %-14s %9s %9s %8s\n", "shape", "torch run", "mpt ms", "torch ms", "x torch");
  for (const auto& c : g_cases) {
    const double t = rep.of("fused/" + c->key);
    for (const char* run : {"fp32", "autocast-f16", "autocast-bf16"}) {
      const double tt = torch.of("ce_ms " + c->key + " " + run);
      char ms[16] = "-", tms[16] = "-", xt[16] = "-";
      if (t > 0) std::snprintf(ms, sizeof ms, "%.3f", t);
      if (tt > 0) std::snprintf(tms, sizeof tms, "%.3f", tt);
      if (t > 0 && tt > 0) std::snprintf(xt, sizeof xt, "%.2f", t / tt);
      std::printf("%-12s %-14s %9s %9s %8s\n", c->key.c_str(), run, ms, tms, xt);
    }
  }
  benchmark::Shutdown();
  return 0;
}
