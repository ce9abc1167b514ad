// Chapter 04 — GPU benchmark of the fused softmax cross-entropy and the
// masked softmax kernels.
// Depends on: kernels/nn/nn_kernels.hpp and kernels/formats/formats_kernels.hpp
// (mpt::kernels), bench_inputs.hpp, cuda_timing.hpp, the CUDA runtime.
//
// Times each kernel with CUDA events (median of 21 after two warm-ups). The
// cross-entropy runs on a language model's classifier output, [4096, 32768]
// fp16 logits (a GPT-2-sized vocabulary rounded to a power of two), with the
// mean, label smoothing 0.1 and a gradient, in both versions, and forward
// only. The bytes an ideal fused kernel must move are the logits read once
// and the gradient written once (4 bytes per logit; the targets and losses
// are 8 bytes per row, negligible); forward only, the logits read once. Each
// figure is that count divided by the time, beside a device-to-device
// cudaMemcpy moving the same bytes (half of them read, half written),
// timed in the same run: memory-bound kernels cannot beat it, so the ratio
// says how close a kernel comes. Version 1 reads the row twice (the second
// read mostly from L2) and one code per load; version 2 loads 16 bytes at
// a time. The masked softmax runs causal attention rows, [32·1024, 1024]
// (32 heads of a 1024-token sequence), reading the scores once and writing
// the probabilities once, and with a boolean mask (one byte more per
// element), in both versions (version 2: 16-byte loads). Not a test:
// nothing is asserted. Exits 77 without a usable GPU.
//
//   bench_ch04_softmax_cuda [N]   N below 2^20: tiny shapes (the CTest smoke
//                                 run); otherwise, or without N, the shapes above
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_inputs.hpp"
#include "cuda_timing.hpp"
#include "kernels/formats/formats_kernels.hpp"
#include "kernels/nn/nn_kernels.hpp"

namespace {

using bench::Buffer;
using bench::check;
using bench::median_ms;

/// One timed kernel: its name, its time, its minimum traffic, and the
/// memcpy of the same bytes (half each way) for the ratio.
void report(const std::string& name, float ms, double bytes, const std::function<void()>& copy) {
  bench::report_vs_copy(name, ms, bytes, copy, 68);
}

}  // namespace

int main(int argc, char** argv) {
  bench::program_name = "bench_ch04_softmax_cuda";
  std::string why;
  if (!mpt::cuda::device_available(&why)) {
    std::printf("SKIPPED bench_ch04_softmax_cuda: %s\n", why.c_str());
    return 77;
  }
  const std::size_t scale = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 0;
  const bool small = scale > 0 && scale < (std::size_t{1} << 20);  // the CTest smoke run
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");

  const std::int64_t rows = small ? 8 : 4096, classes = small ? 4104 : 32768;
  const std::int64_t seq = small ? 40 : 1024, heads = small ? 2 : 32;
  const std::int64_t att_rows = heads * seq;
  const auto n = static_cast<std::size_t>(rows * classes), na = static_cast<std::size_t>(att_rows * seq);
  const std::size_t most = std::max(n, na);

  // Inputs: gradient-like values (bench_inputs.hpp: |z| < 32, magnitudes
  // spread over 24 binades) as logits, rounded to fp16 on the device;
  // targets spread over the classes.
  std::vector<float> host(most);
  bench::fill_gradients(host);
  Buffer x32(most * 4), logits(most * 2), grad(most * 2), probs(most * 2);
  Buffer targets(static_cast<std::size_t>(rows) * 4), losses(static_cast<std::size_t>(rows) * 4), loss(4);
  Buffer source(most * 4), copy(most * 4);
  check(cudaMemcpy(x32.p, host.data(), most * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  mpt::cuda::cast_fp32_to_fp16(x32.as<float>(), logits.as<mpt::Fp16Code>(), most);
  std::vector<std::int32_t> t(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<std::int32_t>((i * 7919) % static_cast<std::size_t>(classes));
  check(cudaMemcpy(targets.p, t.data(), t.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemset(source.p, 0x3c, most * 4), "cudaMemset");
  check(cudaDeviceSynchronize(), "inputs");

  std::printf("device %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  std::printf("each GB/s counts the bytes an ideal kernel moves; x memcpy: against a device-to-device\n");
  std::printf("cudaMemcpy of the same bytes, timed in this run\n\n");
  std::printf("%-68s %9s %9s %9s\n", "kernel", "ms", "GB/s", "x memcpy");
  auto copy_bytes = [&](std::size_t bytes) {
    return [&, bytes] { check(cudaMemcpy(copy.p, source.p, bytes, cudaMemcpyDeviceToDevice), "memcpy"); };
  };
  mpt::cuda::CrossEntropyOptions opt;
  opt.label_smoothing = 0.1f;
  const std::string shape = "[" + std::to_string(rows) + ", " + std::to_string(classes) + "]";
  for (const auto v : {mpt::cuda::SoftmaxCeVersion::block_per_row, mpt::cuda::SoftmaxCeVersion::vectorized}) {
    const std::string tag = std::string(v == mpt::cuda::SoftmaxCeVersion::block_per_row ? " v1" : " v2");
    const float fused_ms = median_ms([&] {
      mpt::cuda::softmax_cross_entropy(rows, classes, logits.as<mpt::Fp16Code>(), targets.as<std::int32_t>(),
                                       1.0f, opt, losses.as<float>(), loss.as<float>(),
                                       grad.as<mpt::Fp16Code>(), v);
    });
    // Logits in, gradient out: 2 + 2 bytes per logit; the memcpy moves n·2 bytes each way.
    report("softmax_cross_entropy fwd+bwd f16 " + shape + tag, fused_ms, 4.0 * static_cast<double>(n),
           copy_bytes(2 * n));
    const float fwd_ms = median_ms([&] {
      mpt::cuda::softmax_cross_entropy(rows, classes, logits.as<mpt::Fp16Code>(), targets.as<std::int32_t>(),
                                       1.0f, opt, losses.as<float>(), loss.as<float>(), nullptr, v);
    });
    report("softmax_cross_entropy forward only f16 " + shape + tag, fwd_ms, 2.0 * static_cast<double>(n),
           copy_bytes(n));
  }
  // A padding-style boolean mask (every 7th column masked), bytes of 0 and 1.
  Buffer mask(na);
  std::vector<unsigned char> m(na);
  for (std::size_t i = 0; i < na; ++i) m[i] = i % 7 == 3 ? 0 : 1;
  check(cudaMemcpy(mask.p, m.data(), na, cudaMemcpyHostToDevice), "cudaMemcpy");
  const std::string att_shape = "[" + std::to_string(att_rows) + ", " + std::to_string(seq) + "]";
  for (const auto v :
       {mpt::cuda::MaskedSoftmaxVersion::warp_per_row, mpt::cuda::MaskedSoftmaxVersion::vectorized}) {
    const std::string tag = v == mpt::cuda::MaskedSoftmaxVersion::warp_per_row ? " v1" : " v2";
    const float causal_ms = median_ms([&] {
      mpt::cuda::masked_softmax(att_rows, seq, logits.as<mpt::Fp16Code>(), nullptr, true,
                                probs.as<mpt::Fp16Code>(), v);
    });
    // Scores in, probabilities out: 2 + 2 bytes per element.
    report("masked_softmax causal f16 " + att_shape + tag, causal_ms, 4.0 * static_cast<double>(na),
           copy_bytes(2 * na));
    const float mask_ms = median_ms([&] {
      mpt::cuda::masked_softmax(att_rows, seq, logits.as<mpt::Fp16Code>(), mask.as<bool>(), false,
                                probs.as<mpt::Fp16Code>(), v);
    });
    // And one mask byte per element read: 5 bytes; the memcpy moves 2.5 each way.
    report("masked_softmax boolean mask f16 " + att_shape + tag, mask_ms, 5.0 * static_cast<double>(na),
           copy_bytes(5 * na / 2));
  }
  check(cudaDeviceSynchronize(), "kernels");
  return 0;
}
