// Chapter 06 — GPU benchmark: what each precision preset's training step of
// the tiny Transformer costs on the GPU, measured, beside the cost model's
// estimate for the same step (program `bench_ch06_presets_cuda`).
// Depends on: the core tier (policy strings, presets, the trace, the cost
// model: op_products, estimate_cost), the nn tier (TinyTransformer,
// trace_step), kernels/nn/nn_kernels.hpp (gemm_tc, gemm_f32), cuda_timing.hpp,
// the CUDA runtime.
//
// The step is not run on the GPU: the library's layers run on the CPU. It
// is *replayed*. The CPU traces one training step under the preset (what
// `mpt trace --model transformer --policy P` prints); then, in trace order,
// every matrix product of the trace (cost_model.hpp's op_products: linear's
// y, dx, dW; attention's six per head) runs as a GEMM of its shape on the
// unit the cost model puts it on — fp16 or bf16 multiplicands on the tensor
// cores (gemm_tc, kernels/nn/gemm_tc.cu), f32 on the CUDA cores (gemm_f32,
// kernels/nn/gemm_fp16.cu) — and every other op (norms, GELU, softmax
// cross-entropy, adds, casts) as a device-to-device copy of the bytes it
// reads and writes (half of them each way). A cached cast moves nothing.
// The product's output is FP32 (gemm_tc writes FP32 only), so a product
// the trace stores in f16 writes 2 bytes more per element here.
//
// What the table shows, per preset: the launches of the replay, the time of
// its products alone and of the whole step (median of 21 CUDA-event timings
// after two warm-ups), each beside the cost model's roofline estimate for
// the same ops on this GPU's spec (h200-sxm on an H200, h100-sxm on an
// H100; any other GPU is compared with the H200's figures, and the header
// says so), and the floor: the launches times the time of one 4-byte copy,
// measured in the same run. The chapter's Transformer (batch 4 x 8 tokens)
// is launch-bound: its step is near the floor, far above the roofline, and
// the presets barely differ. The wider one (D 256, batch 8 x 128 tokens)
// is where the products' unit shows. The GEMMs are the chapters' simplest
// correct kernels, not cuBLAS: the ratios between presets are this
// project's, and a library GEMM would be several times faster on both units.
// Not a test: nothing is asserted. Exits 77 without a usable GPU.
//
//   bench_ch06_presets_cuda [N]   N below 2^20: the chapter's Transformer
//                                 only, two presets (the CTest smoke run);
//                                 otherwise, or without N, both models and
//                                 every preset
//   bench_ch06_presets_cuda --plan   no GPU needed: what each replay would
//                                 launch (copies, GEMMs by unit), and the
//                                 cost model's estimates, for both models
//                                 and every preset (a CTest check runs it)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_timing.hpp"
#include "kernels/formats/formats_kernels.hpp"
#include "kernels/nn/nn_kernels.hpp"
#include "mpt/core/cost_model.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/nn/model.hpp"
#include "mpt/nn/models/transformer.hpp"

namespace {

using bench::Buffer;
using bench::check;
using bench::median_ms;

/// One model of the table: its Transformer and the batch it is traced on.
struct Model {
  const char* name;
  mpt::TransformerConfig config;
  int batch, tokens;
};

/// One traced step of `m` under `policy` (seeded batch, as ch06_numbers does).
mpt::Trace traced_step(const Model& m, const std::string& policy) {
  mpt::TransformerConfig c = m.config;
  c.policy = mpt::parse_policy_string(policy).make();
  c.seed = 1;
  mpt::TinyTransformer net(c);
  mpt::Rng rng(1);
  mpt::MatrixF ids(m.batch, m.tokens);
  for (Eigen::Index i = 0; i < ids.size(); ++i)
    ids.data()[i] = static_cast<float>(rng.below(static_cast<std::uint64_t>(c.vocab_size)));
  std::vector<int> labels(static_cast<std::size_t>(m.batch * m.tokens));
  for (int& y : labels) y = static_cast<int>(rng.below(static_cast<std::uint64_t>(c.vocab_size)));
  return mpt::trace_step(net, ids, labels);
}

/// What the replay runs, in trace order: a GEMM (a product of op_products)
/// or a copy of `bytes` bytes.
struct Launch {
  bool gemm = false;
  mpt::MatrixProduct product;
  std::size_t bytes = 0;
};

/// The replay of a trace, and the cost model's estimate of the same ops.
struct Replay {
  std::vector<Launch> launches;   ///< every launch of the step
  double model_products_s = 0;    ///< the estimate of the matrix products' ops
  double model_step_s = 0;        ///< the estimate of every op
  std::size_t products = 0;       ///< GEMM launches
  std::size_t gemm_elements = 0;  ///< the largest operand or result, in elements
  std::size_t copy_bytes = 0;     ///< the largest copy
};

Replay replay_of(const mpt::Trace& t, const mpt::GpuSpec& gpu) {
  Replay r;
  const mpt::StepCost cost = mpt::estimate_cost(t, gpu);
  for (std::size_t i = 0; i < t.entries().size(); ++i) {
    const mpt::TraceEntry& e = t.entries()[i];
    r.model_step_s += cost.ops[i].seconds;
    if (e.op == "cached_cast") continue;
    const std::vector<mpt::MatrixProduct> ps = mpt::op_products(e);
    if (ps.empty()) {
      Launch l;
      l.bytes = static_cast<std::size_t>(mpt::op_bytes(e) / 2);
      r.copy_bytes = std::max(r.copy_bytes, l.bytes);
      r.launches.push_back(l);
      continue;
    }
    r.model_products_s += cost.ops[i].seconds;
    for (const mpt::MatrixProduct& p : ps) {
      if (p.dtype != mpt::DType::f16 && p.dtype != mpt::DType::bf16 && p.dtype != mpt::DType::f32)
        throw std::runtime_error(e.path + " " + e.op + ": no GEMM for " +
                                 std::string(mpt::dtype_name(p.dtype)) +
                                 " multiplicands here (FP8 is Chapter 7's)");
      for (double c = 0; c < p.count; ++c) {
        Launch l;
        l.gemm = true;
        l.product = p;
        r.launches.push_back(l);
        ++r.products;
      }
      r.gemm_elements = std::max({r.gemm_elements, static_cast<std::size_t>(p.m * p.k),
                                  static_cast<std::size_t>(p.k * p.n), static_cast<std::size_t>(p.m * p.n)});
    }
  }
  return r;
}

/// Device operands for every launch of the replays (filled with 0x3c bytes:
/// 1.06 as fp16, 0.0115 as bf16 and f32, finite everywhere).
struct Operands {
  Buffer a, b, c, src, dst;
  Operands(std::size_t gemm_elements, std::size_t copy_bytes)
      : a(gemm_elements * 4), b(gemm_elements * 4), c(gemm_elements * 4), src(copy_bytes), dst(copy_bytes) {
    check(cudaMemset(a.p, 0x3c, gemm_elements * 4), "cudaMemset");
    check(cudaMemset(b.p, 0x3c, gemm_elements * 4), "cudaMemset");
    check(cudaMemset(src.p, 0x3c, copy_bytes ? copy_bytes : 1), "cudaMemset");
  }
};

mpt::cuda::Trans trans(bool t) { return t ? mpt::cuda::Trans::yes : mpt::cuda::Trans::no; }

/// Runs the launches (all, or the GEMMs only), queued on the default stream.
void run(const Replay& r, const Operands& o, bool products_only) {
  for (const Launch& l : r.launches) {
    if (!l.gemm) {
      if (!products_only && l.bytes > 0)
        check(cudaMemcpyAsync(o.dst.p, o.src.p, l.bytes, cudaMemcpyDeviceToDevice), "memcpy");
      continue;
    }
    const mpt::MatrixProduct& p = l.product;
    const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
    float* c = static_cast<float*>(o.c.p);
    if (p.dtype == mpt::DType::f16)
      mpt::cuda::gemm_tc(trans(p.a_transposed), trans(p.b_transposed), m, n, k,
                         static_cast<const mpt::Fp16Code*>(o.a.p), static_cast<const mpt::Fp16Code*>(o.b.p),
                         c);
    else if (p.dtype == mpt::DType::bf16)
      mpt::cuda::gemm_tc(trans(p.a_transposed), trans(p.b_transposed), m, n, k,
                         static_cast<const mpt::Bf16Code*>(o.a.p), static_cast<const mpt::Bf16Code*>(o.b.p),
                         c);
    else
      mpt::cuda::gemm_f32(trans(p.a_transposed), trans(p.b_transposed), m, n, k,
                          static_cast<const float*>(o.a.p), static_cast<const float*>(o.b.p), c);
  }
}

/// The models of the table: the chapter's Transformer, and (unless small)
/// the wider one.
std::vector<Model> models_of(bool small) {
  std::vector<Model> models;
  // As `mpt trace --model transformer` and ch06_numbers build it.
  models.push_back(
      {"the chapter's Transformer (V 96, D 64, 4 heads, 2 blocks), batch 4 x 8 tokens", {}, 4, 8});
  if (!small) {
    Model wide{"a wider Transformer (V 2048, D 256, 4 heads, 2 blocks), batch 8 x 128 tokens", {}, 8, 128};
    wide.config.vocab_size = 2048;
    wide.config.d_model = 256;
    wide.config.context = 128;
    models.push_back(wide);
  }
  return models;
}

std::vector<std::string> presets_of(bool small) {
  if (small) return {"O0", "O1"};
  return {"O0",
          "O1",
          "O2",
          "O3",
          "mixed_float16",
          "mixed_bfloat16",
          "autocast:cuda:f16",
          "autocast:cuda:bf16",
          "jmp:half"};
}

/// --plan: each replay's launches by kind, and the estimates, on the CPU.
int plan() {
  const mpt::GpuSpec& gpu = mpt::gpu_spec("h200-sxm");
  std::printf("the replay of each preset's traced step, and the cost model's estimate on %s\n",
              std::string(gpu.name).c_str());
  for (const Model& m : models_of(false)) {
    std::printf("\n%s\n%-20s %8s %8s %8s %8s %12s %12s\n", m.name, "preset", "copies", "f32 GEMM", "f16 GEMM",
                "bf16 GEMM", "products us", "step us");
    for (const std::string& p : presets_of(false)) {
      const Replay r = replay_of(traced_step(m, p), gpu);
      std::size_t copies = 0, f32 = 0, f16 = 0, bf16 = 0;
      for (const Launch& l : r.launches) {
        if (!l.gemm) ++copies;
        else if (l.product.dtype == mpt::DType::f16) ++f16;
        else if (l.product.dtype == mpt::DType::bf16) ++bf16;
        else ++f32;
      }
      std::printf("%-20s %8zu %8zu %8zu %8zu %12.2f %12.2f\n", p.c_str(), copies, f32, f16, bf16,
                  r.model_products_s * 1e6, r.model_step_s * 1e6);
    }
  }
  return 0;
}

int run_bench(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--plan") return plan();
  std::string why;
  if (!mpt::cuda::device_available(&why)) {
    std::printf("SKIPPED bench_ch06_presets_cuda: %s\n", why.c_str());
    return 77;
  }
  const std::size_t scale = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 0;
  const bool small = scale > 0 && scale < (std::size_t{1} << 20);  // the CTest smoke run
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  if (prop.major < 8) {
    std::printf("SKIPPED bench_ch06_presets_cuda: %s is sm_%d%d; the tensor-core GEMM needs sm_80\n",
                prop.name, prop.major, prop.minor);
    return 77;
  }
  const std::string device = prop.name;
  const bool h100 = device.find("H100") != std::string::npos;
  const bool h200 = device.find("H200") != std::string::npos;
  const mpt::GpuSpec& gpu = mpt::gpu_spec(h100 ? "h100-sxm" : "h200-sxm");
  std::printf("device %s (sm_%d%d, %d SMs); the cost model's figures: %s%s\n", prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, std::string(gpu.name).c_str(),
              h100 || h200 ? "" : " (not this GPU: no published figures for it in the cost model)");
  std::printf(
      "each step is the CPU's trace replayed: every matrix product a GEMM of its shape (fp16/bf16 on the\n"
      "tensor cores with gemm_tc, f32 on the CUDA cores with gemm_f32), every other op a device copy of\n"
      "its bytes; ms measured here (median of 21), us the cost model's roofline for the same ops;\n"
      "floor = launches x one 4-byte copy, measured in this run\n");

  const std::vector<Model> models = models_of(small);
  const std::vector<std::string> presets = presets_of(small);

  for (const Model& m : models) {
    std::vector<Replay> replays;
    std::size_t gemm_elements = 0, copy_bytes = 4;
    for (const std::string& p : presets) {
      replays.push_back(replay_of(traced_step(m, p), gpu));
      gemm_elements = std::max(gemm_elements, replays.back().gemm_elements);
      copy_bytes = std::max(copy_bytes, replays.back().copy_bytes);
    }
    const Operands o(gemm_elements, copy_bytes);
    check(cudaDeviceSynchronize(), "operands");
    const float one_copy_ms =
        median_ms([&] { check(cudaMemcpyAsync(o.dst.p, o.src.p, 4, cudaMemcpyDeviceToDevice), "memcpy"); });
    std::printf("\n%s\n", m.name);
    std::printf("%-20s %8s %8s | %11s %10s %8s | %9s %10s %8s %9s\n", "preset", "launches", "GEMMs",
                "products ms", "model us", "x model", "step ms", "model us", "x model", "floor ms");
    for (std::size_t i = 0; i < presets.size(); ++i) {
      const Replay& r = replays[i];
      const float products_ms = median_ms([&] { run(r, o, true); });
      const float step_ms = median_ms([&] { run(r, o, false); });
      const double mp = r.model_products_s * 1e6, ms = r.model_step_s * 1e6;
      std::printf("%-20s %8zu %8zu | %11.3f %10.2f %8.1f | %9.3f %10.2f %8.1f %9.3f\n", presets[i].c_str(),
                  r.launches.size(), r.products, products_ms, mp, products_ms * 1e3 / mp, step_ms, ms,
                  step_ms * 1e3 / ms, one_copy_ms * static_cast<double>(r.launches.size()));
    }
  }
  check(cudaDeviceSynchronize(), "kernels");
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  bench::program_name = "bench_ch06_presets_cuda";
  try {
    return run_bench(argc, argv);
  } catch (const std::exception& e) {  // a policy or trace the replay cannot run: one line
    std::fprintf(stderr, "bench_ch06_presets_cuda: %s\n", e.what());
    return 1;
  }
}
