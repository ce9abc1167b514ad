// Chapter 02 — what one MLP training step costs in emulated mixed precision
// next to FP32, both measured in the same run: time and the activation
// memory kept for backward; and the FP32 step and its GEMMs beside
// PyTorch's and beside the core's peak, measured in the same run too.
// Depends on: mpt/nn/models/mlp.hpp, losses.hpp, gemm.hpp, mpt/optim/sgd.hpp,
// mpt/amp/grad_scaler.hpp, mpt/core/random.hpp (Rng), bench_support.hpp,
// Google Benchmark; bench_torch.hpp, bench_ch02_mlp_step_torch.py and a
// Python with torch for the PyTorch columns (optional), AVX2/FMA intrinsics
// for the peak (x86).
//
// One step is forward, softmax cross-entropy, backward, optimizer step,
// refresh of the model copies and zero_grad — with a GradScaler (scale,
// step, update) in the fp16 run, none in the FP32 and bf16 runs (as in
// PyTorch: bf16 has FP32's range). On one core. The fp16/bf16 runs *emulate*
// a GPU's mixed precision on the CPU: the GEMMs are the same FP32 GEMMs, and
// on top of them every stored value goes through the library's rounding and
// every GEMM input is widened to FP32 first. Casting is O(n^2) next to the
// GEMMs' O(n^3), so with the vectorized conversions the emulated step must
// cost at most 1.25x the FP32 step (verdict "meets target"). The activation
// bytes are real allocations (Mlp::activation_bytes): mixed / fp32 must be
// about half, at most 0.55x. Each time is the fastest of --repetitions runs
// (default 5): the one least disturbed by whatever else the machine does.
//
// Beside PyTorch: with --python=PATH (or MPT_TORCH_PYTHON=PATH) naming a
// Python that can import torch, bench_ch02_mlp_step_torch.py runs the same
// FP32 step (nn.Linear/ReLU, SGD lr 0.01 momentum 0.9, cross-entropy, the
// same batch and sizes) and the same GEMMs with torch.set_num_threads(1),
// timed the same way (CPU time, the fastest of the repetitions); the table
// gives mpt / PyTorch, target <= 1.2x for the step. Otherwise it says
// "PyTorch not importable". PyTorch is never a dependency of the project.
//
// Against the roofline: each GEMM of the step (forward x·Wᵀ "NT", dW = dyᵀ·x
// "TN", dx = dy·W "NN"; gemm_fma, the library's product) in GFLOP/s, and
// its fraction of the peak FMA throughput of this core, measured in the
// same run by a loop of 12 independent FMA chains in registers, as wide as
// the micro-kernel's (8 lanes for AVX2, 16 for AVX-512; no memory traffic:
// the most the core can do with them).
//
//   bench_ch02_mlp_step [--batch=128] [--sizes=256,512,512,10] [--repetitions=5]
//                       [--python=PATH] [--torch-min-time=0.5]
//                       [google-benchmark flags]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "bench_torch.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/core/random.hpp"
#include "mpt/formats/rounding.hpp"
#include "mpt/nn/cpu/gemm.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/sgd.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BENCH_PEAK_FMA 1
#else
#define BENCH_PEAK_FMA 0
#endif

namespace {

int g_batch = 128;
int g_repetitions = 5;
std::vector<int> g_sizes = {256, 512, 512, 10};
bench::TorchOptions g_torch;  // --python=, --torch-min-time=

/// One model, its optimizer, its scaler and a fixed batch.
struct Trainer {
  mpt::Mlp mlp;
  mpt::SGD opt;
  mpt::GradScaler scaler;
  mpt::MatrixF x;
  std::vector<int> labels;
  bool use_scaler;
  Trainer(mpt::DType p, bool scaled)
      : mlp(mpt::MlpConfig{g_sizes, mpt::Activation::relu, p, mpt::MasterWeights::fp32, 1}),
        opt(mlp.parameters(), mpt::SGD::Options{0.01, 0.9}),
        scaler(mpt::GradScaler::Options{65536.0f, 2.0f, 0.5f, 2000, scaled}),
        x(g_batch, g_sizes.front()),
        labels(static_cast<std::size_t>(g_batch)),
        use_scaler(scaled) {
    mpt::Rng rng(7);
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(rng.normal());
    for (int& y : labels) y = static_cast<int>(rng.below(static_cast<std::uint64_t>(g_sizes.back())));
  }
  /// One training step; returns the loss.
  float step() {
    const mpt::Tensor& logits = mlp.forward(x);
    const float loss = mpt::cross_entropy_loss(logits, labels);
    // Backward starts from the scaled loss: d(scale * loss) / dloss = scale.
    float dloss = 1.0f;
    if (use_scaler) {
      (void)scaler.scale(loss);
      dloss = scaler.get_scale();
    }
    mlp.backward(mpt::cross_entropy_backward(logits, labels, dloss));
    if (use_scaler) {
      scaler.step(opt);
      scaler.update();
    } else {
      opt.step();
    }
    mlp.refresh_model_copies();
    opt.zero_grad();
    return loss;
  }
};

std::map<std::string, double> g_activation_bytes;

void BM_step(benchmark::State& st, mpt::DType p, bool scaled, const char* name) {
  Trainer r(p, scaled);
  r.step();  // the first step allocates the activation buffers
  g_activation_bytes[name] = static_cast<double>(r.mlp.activation_bytes());
  float loss = 0;
  for (auto _ : st) loss += r.step();
  benchmark::DoNotOptimize(loss);
  st.counters["act_bytes"] = g_activation_bytes[name];
  st.counters["steps/s"] =
      benchmark::Counter(static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
}

/// One GEMM of the step: C [m, n] = op(A) · op(B) through gemm_fma.
struct GemmShape {
  std::int64_t m, n, k;
  mpt::Op op_a, op_b;
  std::string name() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " " +
           (op_a == mpt::Op::N ? "N" : "T") + (op_b == mpt::Op::N ? "N" : "T");
  }
  double flops() const {
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  }
};

/// The step's GEMMs: per layer (in → out) the forward x·Wᵀ, dW = dyᵀ·x and,
/// except for the first layer (its input is data), dx = dy·W.
std::vector<GemmShape> step_gemms() {
  std::vector<GemmShape> g;
  const std::int64_t b = g_batch;
  for (std::size_t l = 0; l + 1 < g_sizes.size(); ++l) {
    const std::int64_t in = g_sizes[l], out = g_sizes[l + 1];
    g.push_back({b, out, in, mpt::Op::N, mpt::Op::T});
    g.push_back({out, in, b, mpt::Op::T, mpt::Op::N});
    if (l > 0) g.push_back({b, in, out, mpt::Op::N, mpt::Op::N});
  }
  return g;
}

void BM_gemm(benchmark::State& st, GemmShape s) {
  mpt::Rng rng(3);
  const std::int64_t ra = s.op_a == mpt::Op::N ? s.m : s.k, ca = s.op_a == mpt::Op::N ? s.k : s.m;
  const std::int64_t rb = s.op_b == mpt::Op::N ? s.k : s.n, cb = s.op_b == mpt::Op::N ? s.n : s.k;
  std::vector<float> a(static_cast<std::size_t>(ra * ca)), b(static_cast<std::size_t>(rb * cb)),
      c(static_cast<std::size_t>(s.m * s.n));
  for (float& v : a) v = static_cast<float>(rng.normal());
  for (float& v : b) v = static_cast<float>(rng.normal());
  for (auto _ : st) {
    mpt::gemm_fma(s.m, s.n, s.k, a.data(), ca, s.op_a, b.data(), cb, s.op_b, c.data(), s.n);
    benchmark::ClobberMemory();
  }
  st.counters["GFLOP/s"] =
      benchmark::Counter(s.flops() * static_cast<double>(st.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

constexpr int kPeakChains = 12;
constexpr std::int64_t kPeakSteps = 1 << 16;

#if BENCH_PEAK_FMA

/// kPeakChains independent chains of 8-lane FMAs, kPeakSteps each: enough
/// chains to cover the FMA latency on every core we know, nothing but
/// registers (twelve named variables: an array would live in memory).
/// Returns a sum so that nothing is optimized away.
__attribute__((target("avx2,fma"))) float peak_loop(float seed) {
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f), s = _mm256_set1_ps(seed);
  __m256 c0 = s, c1 = s, c2 = s, c3 = s, c4 = s, c5 = s, c6 = s, c7 = s, c8 = s, c9 = s, c10 = s, c11 = s;
  for (std::int64_t k = 0; k < kPeakSteps; ++k) {
    // Opaque to the compiler, so it cannot see that the twelve chains are
    // one and compute it once.
    __asm__(""
            : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5), "+x"(c6), "+x"(c7), "+x"(c8),
              "+x"(c9), "+x"(c10), "+x"(c11));
    c0 = _mm256_fmadd_ps(c0, a, b), c1 = _mm256_fmadd_ps(c1, a, b), c2 = _mm256_fmadd_ps(c2, a, b);
    c3 = _mm256_fmadd_ps(c3, a, b), c4 = _mm256_fmadd_ps(c4, a, b), c5 = _mm256_fmadd_ps(c5, a, b);
    c6 = _mm256_fmadd_ps(c6, a, b), c7 = _mm256_fmadd_ps(c7, a, b), c8 = _mm256_fmadd_ps(c8, a, b);
    c9 = _mm256_fmadd_ps(c9, a, b), c10 = _mm256_fmadd_ps(c10, a, b), c11 = _mm256_fmadd_ps(c11, a, b);
  }
  const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                                                 _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7))),
                                   _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
  return _mm256_cvtss_f32(sum);
}

/// peak_loop with 16-lane FMAs: the peak of the AVX-512 micro-kernel.
__attribute__((target("avx512f"))) float peak_loop512(float seed) {
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f), s = _mm512_set1_ps(seed);
  __m512 c0 = s, c1 = s, c2 = s, c3 = s, c4 = s, c5 = s, c6 = s, c7 = s, c8 = s, c9 = s, c10 = s, c11 = s;
  for (std::int64_t k = 0; k < kPeakSteps; ++k) {
    __asm__(""
            : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6), "+v"(c7), "+v"(c8),
              "+v"(c9), "+v"(c10), "+v"(c11));
    c0 = _mm512_fmadd_ps(c0, a, b), c1 = _mm512_fmadd_ps(c1, a, b), c2 = _mm512_fmadd_ps(c2, a, b);
    c3 = _mm512_fmadd_ps(c3, a, b), c4 = _mm512_fmadd_ps(c4, a, b), c5 = _mm512_fmadd_ps(c5, a, b);
    c6 = _mm512_fmadd_ps(c6, a, b), c7 = _mm512_fmadd_ps(c7, a, b), c8 = _mm512_fmadd_ps(c8, a, b);
    c9 = _mm512_fmadd_ps(c9, a, b), c10 = _mm512_fmadd_ps(c10, a, b), c11 = _mm512_fmadd_ps(c11, a, b);
  }
  const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                                                 _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7))),
                                   _mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)));
  return _mm512_reduce_add_ps(sum);
}

/// The lanes of the FMAs the peak loop runs: those of the GEMM's kernel.
int peak_lanes() { return mpt::gemm_avx512_available() ? 16 : 8; }

void BM_peak(benchmark::State& st) {
  float sink = 0;
  const bool wide = peak_lanes() == 16;
  for (auto _ : st) sink += wide ? peak_loop512(sink) : peak_loop(sink);
  benchmark::DoNotOptimize(sink);
  st.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * peak_lanes() * kPeakChains * static_cast<double>(kPeakSteps) *
                             static_cast<double>(st.iterations()) / 1e9,
                         benchmark::Counter::kIsRate);
}
#else
int peak_lanes() { return 8; }
#endif

/// The micro-kernel gemm_fma runs here, for the table's heading.
const char* gemm_kernel_name() {
  return mpt::gemm_avx512_available() ? "AVX-512 micro-kernel"
         : mpt::avx2_available()      ? "AVX2 + FMA micro-kernel"
                                      : "portable";
}

/// bench_ch02_mlp_step_torch.py's times of the same FP32 step and GEMMs:
/// "step_ms" and "gemm_ms <GemmShape::name()>".
bench::TorchResult run_torch() {
  std::string sizes;
  for (int s : g_sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(s);
  return bench::run_torch_script(g_torch, "bench_ch02_mlp_step_torch.py",
                                 "--batch=" + std::to_string(g_batch) + " --sizes=" + sizes +
                                     " --repetitions=" + std::to_string(g_repetitions),
                                 bench::TorchMalloc::keep_freed);
}

/// Each benchmark's fastest CPU time per step over its repetitions, in ms.
using TimeReporter = bench::MinTimeReporter;

std::vector<int> parse_sizes(const char* s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoi(item));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  bench::initialize(argc, argv, [](const char* arg) {
    if (std::strncmp(arg, "--batch=", 8) == 0) g_batch = std::stoi(arg + 8);
    else if (std::strncmp(arg, "--sizes=", 8) == 0) g_sizes = parse_sizes(arg + 8);
    else if (std::strncmp(arg, "--repetitions=", 14) == 0) g_repetitions = std::stoi(arg + 14);
    else return g_torch.parse(arg);
    return true;
  });
  g_torch.from_environment();
#if defined(__GLIBC__)
  // Every layer returns new tensors, several over glibc's mmap threshold
  // (a 128 x 512 activation is 256 KiB), which glibc serves from fresh
  // pages that the kernel faults in and zeroes on every step; a training
  // framework keeps freed blocks instead (PyTorch's caching allocators).
  // Keep them here too, and in PyTorch's process (run_torch), so that both
  // times are the step's and not the page faults'.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif

  benchmark::RegisterBenchmark("step/fp32", BM_step, mpt::DType::f32, false, "step/fp32")
      ->Unit(benchmark::kMillisecond)
      ->Repetitions(g_repetitions);
  benchmark::RegisterBenchmark("step/fp16+scaler", BM_step, mpt::DType::f16, true, "step/fp16+scaler")
      ->Unit(benchmark::kMillisecond)
      ->Repetitions(g_repetitions);
  benchmark::RegisterBenchmark("step/bf16", BM_step, mpt::DType::bf16, false, "step/bf16")
      ->Unit(benchmark::kMillisecond)
      ->Repetitions(g_repetitions);
  const std::vector<GemmShape> gemms = step_gemms();
  for (const GemmShape& g : gemms)
    benchmark::RegisterBenchmark(("gemm/" + g.name()).c_str(), BM_gemm, g)
        ->Unit(benchmark::kMillisecond)
        ->Repetitions(g_repetitions);
  const bool peak = BENCH_PEAK_FMA && mpt::avx2_available();
#if BENCH_PEAK_FMA
  if (peak)
    benchmark::RegisterBenchmark("peak/fma", BM_peak)
        ->Unit(benchmark::kMillisecond)
        ->Repetitions(g_repetitions);
#endif
  TimeReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  const bench::TorchResult torch = run_torch();

  std::string sizes;
  for (int s : g_sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(s);
  std::printf(
      "\nMLP %s (ReLU), batch %d, SGD momentum 0.9, one core; time: the fastest of the repetitions\n\n",
      sizes.c_str(), g_batch);
  std::printf("%-12s %9s %8s %8s  %-13s %11s %8s %8s  %s\n", "run", "ms/step", "x fp32", "target", "verdict",
              "act. bytes", "x fp32", "target", "verdict");
  const double t32 = rep.ms.count("step/fp32") ? rep.ms["step/fp32"] : 0.0;
  const double b32 = g_activation_bytes.count("step/fp32") ? g_activation_bytes["step/fp32"] : 0.0;
  for (const char* name : {"step/fp32", "step/fp16+scaler", "step/bf16"}) {
    if (!rep.ms.count(name) || t32 <= 0 || b32 <= 0) continue;
    const double tr = rep.ms[name] / t32, br = g_activation_bytes[name] / b32;
    const bool baseline = std::string(name) == "step/fp32";
    std::printf("%-12s %9.3f %8.2f %8s  %-13s %11.0f %8.3f %8s  %s\n", name + 5, rep.ms[name], tr,
                baseline ? "-" : "<=1.25x", baseline ? "" : (tr <= 1.25 ? "meets target" : "BELOW target"),
                g_activation_bytes[name], br, baseline ? "-" : "<=0.55x",
                baseline ? "" : (br <= 0.55 ? "meets target" : "BELOW target"));
  }

  // The FP32 step beside PyTorch's.
  std::printf("\nFP32 step beside PyTorch's (one thread, the same step and shapes); %s\n\n",
              torch.status.c_str());
  std::printf("%-12s %9s %9s %8s %8s  %s\n", "step", "mpt ms", "torch ms", "x torch", "target", "verdict");
  const double torch_step_ms = torch.of("step_ms");
  if (t32 > 0 && torch_step_ms > 0) {
    const double r = t32 / torch_step_ms;
    std::printf("%-12s %9.3f %9.3f %8.2f %8s  %s\n", "fp32", t32, torch_step_ms, r, "<=1.2x",
                r <= 1.2 ? "meets target" : "BELOW target");
  } else {
    std::printf("%-12s %9.3f %9s %8s %8s  %s\n", "fp32", t32, "-", "-", "<=1.2x", "not compared");
  }

  // The GEMMs against the core's peak (and PyTorch's, where it ran).
  const double peak_gflops = rep.ms.count("peak/fma")
                                 ? 2.0 * peak_lanes() * kPeakChains * static_cast<double>(kPeakSteps) /
                                       (rep.ms["peak/fma"] * 1e-3) / 1e9
                                 : 0.0;
  if (peak)
    std::printf(
        "\nThe step's GEMMs (gemm_fma, %s): peak of this core %.1f GFLOP/s "
        "(12 register-only %d-lane FMA chains)\n\n",
        gemm_kernel_name(), peak_gflops, peak_lanes());
  else
    std::printf("\nThe step's GEMMs (gemm_fma, %s): no peak measured (needs x86 AVX2 + FMA)\n\n",
                gemm_kernel_name());
  std::printf("%-16s %9s %9s %8s %9s %8s\n", "gemm m x n x k", "ms/call", "GFLOP/s", "x peak", "torch ms",
              "x torch");
  for (const GemmShape& g : gemms) {
    const std::string name = "gemm/" + g.name();
    if (!rep.ms.count(name)) continue;
    const double ms = rep.ms[name], gf = g.flops() / (ms * 1e-3) / 1e9;
    const double tm = torch.of("gemm_ms " + g.name());
    char xpeak[16] = "-", tms[16] = "-", xt[16] = "-";
    if (peak_gflops > 0) std::snprintf(xpeak, sizeof xpeak, "%.2f", gf / peak_gflops);
    if (tm > 0) {
      std::snprintf(tms, sizeof tms, "%.3f", tm);
      std::snprintf(xt, sizeof xt, "%.2f", ms / tm);
    }
    std::printf("%-16s %9.3f %9.1f %8s %9s %8s\n", g.name().c_str(), ms, gf, xpeak, tms, xt);
  }
  benchmark::Shutdown();
  return 0;
}
