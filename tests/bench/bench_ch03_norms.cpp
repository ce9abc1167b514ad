// Chapter 03 — how fast are BatchNorm and LayerNorm forward with fp16 input
// and output on one CPU core, and what do FP32 statistics cost next to naive
// FP16 ones?
// Depends on: mpt/nn/layers/batch_norm.hpp, mpt/nn/layers/layer_norm.hpp, mpt/nn/layers/norm_math.hpp
// (the layout), mpt/core/context.hpp, mpt/core/policy.hpp, mpt/core/random.hpp,
// mpt/formats/rounding.hpp (avx2_available), bench_support.hpp, Google
// Benchmark; F16C/AVX2 intrinsics for the naive baseline (x86 only); glibc's
// mallopt where there is one; bench_torch.hpp, bench_ch03_norms_torch.py
// and a Python with torch for the PyTorch columns (optional).
//
// Times, on one core, with fp16 input and output, for each shape given:
//   forward    the library's layer: BatchNorm in training on [N, C, H, W]
//              (FP32 Welford statistics per channel, the running update,
//              y = x̂·γ + β) or LayerNorm on [R, D] (the same per row)
//   memcpy     of x's bytes into a buffer of y's size, in the same run: the
//              roofline. It reads x once and writes y once, what a norm must
//              move at least (γ, β and running estimates are a few hundred
//              bytes more)
//   naive-f16  this file's baseline, not the library's: one pass of Σx and
//              Σx² in fp16 accumulators, then E[x²] − E[x]², every
//              intermediate stored in fp16, followed by the library's FP32
//              normalization and one rounding. The statistics Chapter 3
//              warns against, as fast as this file can make them: 32 fp16
//              partial sums per channel (as GPU threads would keep them),
//              F16C conversions, no division, the library's memory order
// The default shapes are the chapter's, BatchNorm [64, 64, 32, 32] and
// LayerNorm [4096, 1024] (x and y 8 MiB each), and each with four times the
// batch (32 MiB each): where the last-level cache holds 16 MiB, the first
// pair races the cache's bandwidth and the second memory's, which is where
// a training step's activations live.
//
// GB/s counts the bytes a norm must move: x read once, y written once, γ and
// β read, BatchNorm's running mean and variance read and written. The
// library reads x twice (statistics, then normalization; a LayerNorm row is
// read again from the L1 cache, a BatchNorm tensor from wherever it fits),
// which the figure does not count. memcpy's GB/s counts the bytes it reads
// and writes, so "x memcpy" is memcpy's time over the norm's for the same
// traffic. Targets: each forward >= 0.5x memcpy, and the FP32-statistics
// forward at most 1.3x the time of the naive FP16 one. On a GPU fp16
// arithmetic is native and the naive statistics are the cheap ones; a CPU
// emulates fp16 with a conversion after every operation, so here the
// baseline may well be the slower. Each time is the fastest of
// --repetitions runs (default 5). Printed, never asserted: not a test.
//
// Beside PyTorch: with --python=PATH (or MPT_TORCH_PYTHON=PATH) naming a
// Python that can import torch, bench_ch03_norms_torch.py times the same
// forward on the same shapes with torch.set_num_threads(1), timed the same
// way (CPU time, the fastest of the repetitions, glibc keeping freed blocks
// as in this process): torch.nn.BatchNorm1d/2d
// in training and torch.nn.LayerNorm, each converted with .half(), on an
// fp16 input. The last table gives mpt / PyTorch; without such a Python its
// torch columns are "-" and its header says "PyTorch not importable".
// PyTorch is never a dependency of the project.
//
//   bench_ch03_norms [--bn=N,C,H,W[:N,C,H,W...]] [--ln=R,D[:R,D...]]
//                    [--repetitions=5] [--python=PATH] [--torch-min-time=0.5]
//                    [google-benchmark flags]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "bench_support.hpp"
#include "bench_torch.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/formats/rounding.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/layer_norm.hpp"
#include "mpt/nn/layers/norm_math.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BENCH_NAIVE_F16C 1
#else
#define BENCH_NAIVE_F16C 0
#endif

namespace {

using mpt::norm_math::AffineAxis;
using mpt::norm_math::Layout;

std::vector<mpt::Shape> g_bn_shapes{{64, 64, 32, 32}, {256, 64, 32, 32}};
std::vector<mpt::Shape> g_ln_shapes{{4096, 1024}, {16384, 1024}};
int g_repetitions = 5;
bench::TorchOptions g_torch;  // --python=, --torch-min-time=
// The shapes as given ("64,64,32,32:256,64,32,32"), for the PyTorch script.
std::string g_bn_arg = "64,64,32,32:256,64,32,32", g_ln_arg = "4096,1024:16384,1024";

constexpr float kEps = 1e-5f;

std::vector<float> normal(std::size_t n, std::uint64_t seed, double mean, double sd) {
  mpt::Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(mean + sd * rng.normal());
  return v;
}

#if BENCH_NAIVE_F16C
/// One channel's naive sums: Σx and Σx² in 32 fp16 partial sums (4
/// registers of 8 lanes, so that four additions are in flight), and the
/// partial sums of the values a run leaves over (fewer than 8).
struct NaiveSums {
  float s[32], q[32];  // fp16 values, 4 registers of 8 lanes each
  float ts, tq;
};
#endif

/// One norm at one shape: its input, its layer, and what the memcpy and the
/// naive baseline write into.
struct Case {
  std::string norm;  // "BatchNorm" or "LayerNorm"
  std::string key;   // "bn/64x64x32x32": the benchmarks' names end with it
  mpt::Shape shape;
  mpt::Tensor x;
  std::unique_ptr<mpt::Module> layer;
  mpt::Context ctx{mpt::uniform_policy(mpt::DType::f16)};
  Layout layout;
  AffineAxis axis = AffineAxis::channel;
  std::vector<std::uint16_t> gamma, beta;  // f16 codes of γ and β (the naive baseline's)
  std::vector<std::uint16_t> out;          // where memcpy and the baseline write
#if BENCH_NAIVE_F16C
  std::vector<NaiveSums> sums;  // the baseline's per-channel sums
#endif
  std::vector<float> mean, invstd;  // the baseline's statistics
  double must_move = 0;             // bytes: x, y, γ, β (and BatchNorm's running estimates)
};

/// The f16 codes of a tensor's elements.
std::vector<std::uint16_t> codes(const mpt::Tensor& t) {
  std::vector<std::uint16_t> c(static_cast<std::size_t>(t.numel()));
  if (!c.empty()) std::memcpy(c.data(), t.raw(), c.size() * 2);
  return c;
}

/// A norm of `norm` ("BatchNorm" or "LayerNorm") over x of `shape`, x ~ N(1, 1)
/// and γ ~ N(1, 0.1), β ~ N(0, 0.1), all rounded to fp16.
std::unique_ptr<Case> make_case(const std::string& norm, const mpt::Shape& shape, std::uint64_t seed) {
  auto c = std::make_unique<Case>();
  c->norm = norm;
  c->shape = shape;
  c->key = (norm == "BatchNorm" ? "bn/" : "ln/") + mpt::shape_string(shape);
  const auto n = static_cast<std::size_t>(mpt::numel(shape));
  const std::vector<float> xv = normal(n, seed, 1.0, 1.0);
  c->x = mpt::Tensor::from_f32(xv.data(), shape, mpt::DType::f16);
  const auto f16 = mpt::uniform_policy(mpt::DType::f16);
  std::int64_t params = 0;  // elements of γ (and of β)
  if (norm == "BatchNorm") {
    params = shape[1];
    auto bn = std::make_unique<mpt::BatchNorm>(static_cast<int>(params));
    const std::vector<float> g = normal(static_cast<std::size_t>(params), seed + 1, 1.0, 0.1),
                             b = normal(static_cast<std::size_t>(params), seed + 2, 0.0, 0.1);
    bn->weight = mpt::Parameter("weight", mpt::Tensor::from_f32(g.data(), {params}, mpt::DType::f32));
    bn->bias = mpt::Parameter("bias", mpt::Tensor::from_f32(b.data(), {params}, mpt::DType::f32));
    bn->apply_policy(*f16);
    c->gamma = codes(bn->weight.weights());
    c->beta = codes(bn->bias.weights());
    c->layout.outer = shape[0];
    c->layout.channels = shape[1];
    for (std::size_t d = 2; d < shape.size(); ++d) c->layout.inner *= shape[d];
    c->axis = AffineAxis::channel;
    c->layer = std::move(bn);
    // x, y; γ, β read; the running mean and variance read and written.
    c->must_move = 2.0 * static_cast<double>(n) * 2 + 2.0 * static_cast<double>(params) * (2 + 4);
  } else {
    params = shape.back();
    auto ln = std::make_unique<mpt::LayerNorm>(mpt::Shape{params});
    const std::vector<float> g = normal(static_cast<std::size_t>(params), seed + 1, 1.0, 0.1),
                             b = normal(static_cast<std::size_t>(params), seed + 2, 0.0, 0.1);
    ln->weight = mpt::Parameter("weight", mpt::Tensor::from_f32(g.data(), {params}, mpt::DType::f32));
    ln->bias = mpt::Parameter("bias", mpt::Tensor::from_f32(b.data(), {params}, mpt::DType::f32));
    ln->apply_policy(*f16);
    c->gamma = codes(ln->weight.weights());
    c->beta = codes(ln->bias.weights());
    c->layout = Layout{1, static_cast<std::int64_t>(n) / params, params};
    c->axis = AffineAxis::inner;
    c->layer = std::move(ln);
    // x, y; γ, β read.
    c->must_move = 2.0 * static_cast<double>(n) * 2 + 2.0 * static_cast<double>(params) * 2;
  }
  c->out.assign(n, 0);  // touches the pages before timing
  const auto ch = static_cast<std::size_t>(c->layout.channels);
#if BENCH_NAIVE_F16C
  c->sums.resize(ch);
#endif
  c->mean.resize(ch);
  c->invstd.resize(ch);
  return c;
}

std::vector<std::unique_ptr<Case>> g_cases;

// --- the naive FP16 baseline ------------------------------------------------------

#if BENCH_NAIVE_F16C
/// v rounded to fp16 and widened back: an fp16 register.
__attribute__((target("avx2,f16c"))) inline __m256 f16(__m256 v) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("avx2,f16c"))) inline float f16(float v) {
  return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
/// Register k of 4 partial sums kept as 32 floats.
__attribute__((target("avx2,f16c"))) inline __m256 part(const float* v, std::ptrdiff_t k) {
  return _mm256_loadu_ps(v + 8 * k);
}
__attribute__((target("avx2,f16c"))) inline __m256 load8(const std::uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

/// Add one run of n values to a channel's sums: each x² and each sum
/// rounded to fp16, as fp16 arithmetic does.
__attribute__((target("avx2,f16c"))) void naive_add(NaiveSums& a, const std::uint16_t* p, std::int64_t n) {
  __m256 s[4], q[4];
  for (std::ptrdiff_t k = 0; k < 4; ++k) {
    s[k] = _mm256_loadu_ps(a.s + 8 * k);
    q[k] = _mm256_loadu_ps(a.q + 8 * k);
  }
  std::int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (std::ptrdiff_t k = 0; k < 4; ++k) {
      const __m256 v = load8(p + i + 8 * k);
      s[k] = f16(_mm256_add_ps(s[k], v));
      q[k] = f16(_mm256_add_ps(q[k], f16(_mm256_mul_ps(v, v))));
    }
  for (; i + 8 <= n; i += 8) {
    const __m256 v = load8(p + i);
    s[0] = f16(_mm256_add_ps(s[0], v));
    q[0] = f16(_mm256_add_ps(q[0], f16(_mm256_mul_ps(v, v))));
  }
  for (; i < n; ++i) {
    const float v = _cvtsh_ss(p[i]);
    a.ts = f16(a.ts + v);
    a.tq = f16(a.tq + f16(v * v));
  }
  for (std::ptrdiff_t k = 0; k < 4; ++k) {
    _mm256_storeu_ps(a.s + 8 * k, s[k]);
    _mm256_storeu_ps(a.q + 8 * k, q[k]);
  }
}

/// The naive statistics from a channel's sums over m values: the partial
/// sums added in fp16, mean = Σx/m, E[x²] = Σx²/m, var = E[x²] − mean²,
/// invstd = 1/√(var + eps), each stored in fp16. The pitfall Chapter 3 warns
/// about: Σx² overflows fp16 and E[x²] − mean² cancels; only its speed is
/// used here.
__attribute__((target("avx2,f16c"))) void naive_finish(const NaiveSums& a, std::int64_t m, float& mean,
                                                       float& invstd) {
  const __m256 s4 = f16(_mm256_add_ps(f16(_mm256_add_ps(part(a.s, 0), part(a.s, 1))),
                                      f16(_mm256_add_ps(part(a.s, 2), part(a.s, 3)))));
  const __m256 q4 = f16(_mm256_add_ps(f16(_mm256_add_ps(part(a.q, 0), part(a.q, 1))),
                                      f16(_mm256_add_ps(part(a.q, 2), part(a.q, 3)))));
  alignas(32) float sl[8], ql[8];
  _mm256_store_ps(sl, s4);
  _mm256_store_ps(ql, q4);
  float sum = a.ts, sumsq = a.tq;
  for (int k = 0; k < 8; ++k) {
    sum = f16(sum + sl[k]);
    sumsq = f16(sumsq + ql[k]);
  }
  const auto mf = static_cast<float>(m);
  mean = f16(sum / mf);
  const float var = f16(f16(sumsq / mf) - f16(mean * mean));
  invstd = f16(1.0f / std::sqrt(f16(var + kEps)));
}

/// One run of y = (x − mean)·invstd·γ + β in FP32 and one rounding into
/// fp16, as the library's forward normalizes: only the statistics differ.
__attribute__((target("avx2,f16c"))) void naive_normalize(const std::uint16_t* x, std::int64_t n, float mean,
                                                          float invstd, const std::uint16_t* gamma,
                                                          const std::uint16_t* beta, std::int64_t c,
                                                          AffineAxis axis, std::uint16_t* y) {
  const __m256 vm = _mm256_set1_ps(mean), vs = _mm256_set1_ps(invstd);
  const bool per_channel = axis == AffineAxis::channel;
  const float gc = per_channel ? _cvtsh_ss(gamma[c]) : 0.0f, bc = per_channel ? _cvtsh_ss(beta[c]) : 0.0f;
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = per_channel ? _mm256_set1_ps(gc) : load8(gamma + i);
    const __m256 b = per_channel ? _mm256_set1_ps(bc) : load8(beta + i);
    const __m256 xhat = _mm256_mul_ps(_mm256_sub_ps(load8(x + i), vm), vs);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_add_ps(_mm256_mul_ps(xhat, g), b),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) {
    const float g = per_channel ? gc : _cvtsh_ss(gamma[i]), b = per_channel ? bc : _cvtsh_ss(beta[i]);
    y[i] =
        _cvtss_sh((_cvtsh_ss(x[i]) - mean) * invstd * g + b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
}

/// The whole naive forward, in the library's memory order: with N > 1 (a
/// BatchNorm) every run's sums, then every run's normalization; with one
/// run per channel (a LayerNorm row) its sums and then its normalization.
void naive_forward(Case& k) {
  const auto* x = static_cast<const std::uint16_t*>(k.x.raw());
  const Layout& l = k.layout;
  std::vector<NaiveSums>& sums = k.sums;
  std::vector<float>& mean = k.mean;
  std::vector<float>& invstd = k.invstd;
  for (NaiveSums& a : sums) std::memset(&a, 0, sizeof a);
  if (l.outer > 1) {
    for (std::int64_t n = 0; n < l.outer; ++n)
      for (std::int64_t c = 0; c < l.channels; ++c)
        naive_add(sums[static_cast<std::size_t>(c)], x + l.offset(n, c, 0), l.inner);
    for (std::int64_t c = 0; c < l.channels; ++c) {
      const auto j = static_cast<std::size_t>(c);
      naive_finish(sums[j], l.count(), mean[j], invstd[j]);
    }
  }
  for (std::int64_t n = 0; n < l.outer; ++n)
    for (std::int64_t c = 0; c < l.channels; ++c) {
      const auto j = static_cast<std::size_t>(c);
      if (l.outer == 1) {
        naive_add(sums[j], x + l.offset(n, c, 0), l.inner);
        naive_finish(sums[j], l.count(), mean[j], invstd[j]);
      }
      naive_normalize(x + l.offset(n, c, 0), l.inner, mean[j], invstd[j], k.gamma.data(), k.beta.data(), c,
                      k.axis, k.out.data() + l.offset(n, c, 0));
    }
}
#endif

// --- the timed runs -----------------------------------------------------------------

void BM_memcpy(benchmark::State& st, Case* k) {
  for (auto _ : st) {
    std::memcpy(k->out.data(), k->x.raw(), k->x.bytes());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(2 * k->x.bytes()));
}

void BM_forward(benchmark::State& st, Case* k) {
  k->layer->train();
  for (auto _ : st) {
    mpt::Tensor y = k->layer->forward(k->x, k->ctx);
    benchmark::DoNotOptimize(y.raw());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(static_cast<double>(st.iterations()) * k->must_move));
}

#if BENCH_NAIVE_F16C
void BM_naive(benchmark::State& st, Case* k) {
  for (auto _ : st) {
    naive_forward(*k);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(static_cast<double>(st.iterations()) * k->must_move));
}
#endif

/// "64,64,32,32:256,64,32,32": shapes separated by ':', sizes by ','.
/// Exits with status 2 on anything else.
std::vector<mpt::Shape> parse_shapes(const char* s, const char* flag, std::size_t min_dims,
                                     std::size_t max_dims) {
  std::vector<mpt::Shape> shapes;
  std::stringstream all(s);
  std::string one;
  while (std::getline(all, one, ':')) {
    mpt::Shape shape;
    std::stringstream ss(one);
    std::string item;
    bool sizes_ok = true;
    while (std::getline(ss, item, ',')) {
      char* end = nullptr;
      const long long v = std::strtoll(item.c_str(), &end, 10);
      sizes_ok = sizes_ok && !item.empty() && *end == '\0' && v >= 1;
      shape.push_back(v);
    }
    const bool ok = sizes_ok && shape.size() >= min_dims && shape.size() <= max_dims;
    if (!ok) {
      const std::string sizes = min_dims == max_dims
                                    ? std::to_string(min_dims)
                                    : std::to_string(min_dims) + " to " + std::to_string(max_dims);
      std::fprintf(stderr,
                   "bench_ch03_norms: %s='%s': each shape needs %s sizes >= 1, separated by ','; shapes "
                   "separated by ':'\n",
                   flag, s, sizes.c_str());
      std::exit(2);
    }
    shapes.push_back(shape);
  }
  return shapes;
}

const char* verdict(bool ok) { return ok ? "meets target" : "BELOW target"; }

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  bench::initialize(argc, argv, [](const char* arg) {
    if (std::strncmp(arg, "--bn=", 5) == 0) {
      g_bn_shapes = parse_shapes(arg + 5, "--bn", 2, 4);
      g_bn_arg = arg + 5;
    } else if (std::strncmp(arg, "--ln=", 5) == 0) {
      g_ln_shapes = parse_shapes(arg + 5, "--ln", 2, 2);
      g_ln_arg = arg + 5;
    } else if (std::strncmp(arg, "--repetitions=", 14) == 0) {
      g_repetitions = std::max(1, std::atoi(arg + 14));
    } else {
      return g_torch.parse(arg);
    }
    return true;
  });
  g_torch.from_environment();
#if defined(__GLIBC__)
  // Every forward returns a new tensor of x's size. glibc serves a block
  // over its mmap threshold (at most 32 MiB) from fresh pages, which the
  // kernel faults in and zeroes on every call; a training framework keeps
  // freed blocks instead (PyTorch's caching allocators). Keep them here
  // too, so that the time is the norm's and not the page faults'.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  std::uint64_t seed = 1;
  for (const mpt::Shape& s : g_bn_shapes) g_cases.push_back(make_case("BatchNorm", s, seed += 10));
  for (const mpt::Shape& s : g_ln_shapes) g_cases.push_back(make_case("LayerNorm", s, seed += 10));
  const bool naive = BENCH_NAIVE_F16C && mpt::avx2_available();
  for (const auto& k : g_cases) {
    benchmark::RegisterBenchmark(("memcpy/" + k->key).c_str(), BM_memcpy, k.get())
        ->Unit(benchmark::kMillisecond)
        ->Repetitions(g_repetitions);
    benchmark::RegisterBenchmark(("forward/" + k->key).c_str(), BM_forward, k.get())
        ->Unit(benchmark::kMillisecond)
        ->Repetitions(g_repetitions);
#if BENCH_NAIVE_F16C
    if (naive)
      benchmark::RegisterBenchmark(("naive-f16/" + k->key).c_str(), BM_naive, k.get())
          ->Unit(benchmark::kMillisecond)
          ->Repetitions(g_repetitions);
#endif
  }
  bench::MinTimeReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);

  double llc = 0;  // the largest cache Google Benchmark reports, in bytes
  for (const auto& c : benchmark::CPUInfo::Get().caches) llc = std::max(llc, static_cast<double>(c.size));
  constexpr double kTargetMemcpy = 0.5, kTargetNaive = 1.3;
  std::printf(
      "\nnorms forward, fp16 x and y, FP32 statistics; one core; time: the fastest of the repetitions\n");
  std::printf(
      "bytes: what a norm must move (x read once, y written once, gamma and beta read; BatchNorm's\n"
      "running estimates read and written); memcpy copies x into a y-sized buffer in the same run\n");
  std::printf("last-level cache of this CPU: %.0f MiB, to set beside column x+y (x and y together)\n\n",
              mib(llc));
  std::printf("%-9s %-16s %10s %8s %8s %8s %11s %9s %7s  %s\n", "norm", "shape", "bytes", "x+y MiB", "ms",
              "GB/s", "memcpy GB/s", "x memcpy", "target", "verdict");
  for (const auto& k : g_cases) {
    const double t = rep.of("forward/" + k->key), tm = rep.of("memcpy/" + k->key);
    if (t <= 0 || tm <= 0) continue;
    const double g = k->must_move / t / 1e6, gm = 2.0 * static_cast<double>(k->x.bytes()) / tm / 1e6;
    std::printf("%-9s %-16s %10.0f %8.1f %8.3f %8.2f %11.2f %9.2f %7s  %s\n", k->norm.c_str(),
                mpt::shape_string(k->shape).c_str(), k->must_move,
                mib(2.0 * static_cast<double>(k->x.bytes())), t, g, gm, g / gm, "0.50x",
                verdict(g / gm >= kTargetMemcpy));
  }
  std::printf("\n%-9s %-16s %9s %12s %13s %7s  %s\n", "norm", "shape", "fp32 ms", "naive f16 ms",
              "fp32 / naive", "target", "verdict");
  for (const auto& k : g_cases) {
    const double t = rep.of("forward/" + k->key), tn = rep.of("naive-f16/" + k->key);
    if (t <= 0) continue;
    if (tn <= 0) {
      std::printf("%-9s %-16s %9.3f %12s %13s %7s  %s\n", k->norm.c_str(),
                  mpt::shape_string(k->shape).c_str(), t, "-", "-", "<=1.30x",
                  "baseline not run (no F16C, or filtered out)");
      continue;
    }
    std::printf("%-9s %-16s %9.3f %12.3f %12.2fx %7s  %s\n", k->norm.c_str(),
                mpt::shape_string(k->shape).c_str(), t, tn, t / tn, "<=1.30x",
                verdict(t / tn <= kTargetNaive));
  }

  // The same forward beside PyTorch's: the script reads the shapes as given
  // (validated above: digits, ',' and ':', perhaps a sign or blanks, all
  // safe in single quotes) and prints "forward_ms <key> <ms>" per shape.
  // Its process keeps freed blocks as this one does (mallopt above): each
  // module call allocates its output too.
  const bench::TorchResult torch = bench::run_torch_script(
      g_torch, "bench_ch03_norms_torch.py",
      "'--bn=" + g_bn_arg + "' '--ln=" + g_ln_arg + "' --repetitions=" + std::to_string(g_repetitions),
      bench::TorchMalloc::keep_freed);
  std::printf(
      "\nnorms forward beside PyTorch's: one thread, the same shapes, fp16 x and y; torch: the module\n"
      "converted with .half() on an fp16 input, BatchNorm in training; time: the fastest of the repetitions\n"
      "%s\n\n",
      torch.status.c_str());
  std::printf("%-9s %-16s %9s %9s %8s\n", "norm", "shape", "mpt ms", "torch ms", "x torch");
  for (const auto& k : g_cases) {
    const double t = rep.of("forward/" + k->key), tt = torch.of("forward_ms " + k->key);
    char ms[16] = "-", tms[16] = "-", xt[16] = "-";
    if (t > 0) std::snprintf(ms, sizeof ms, "%.3f", t);
    if (tt > 0) std::snprintf(tms, sizeof tms, "%.3f", tt);
    if (t > 0 && tt > 0) std::snprintf(xt, sizeof xt, "%.2f", t / tt);
    std::printf("%-9s %-16s %9s %9s %8s\n", k->norm.c_str(), mpt::shape_string(k->shape).c_str(), ms, tms,
                xt);
  }
  (void)naive;
  benchmark::Shutdown();
  return 0;
}
