// Chapter 02 — the GPU side of the PyTorch comparison in tools/gpu_report.sh:
// runs this project's kernels on deterministic inputs and writes inputs,
// outputs and kernel times to a folder, for tools/gpu_torch_compare.py to
// run the same operations through PyTorch and compare bits and times.
// Depends on: the kernels' host-only headers (formats, nn, amp),
// bench_inputs.hpp, cuda_timing.hpp, the CUDA runtime.
//
//   gpu_ops_dump DIR [N]     N elements for the casts and the unscale (default 2^24)
//
// Files (raw little-endian arrays; meta.json says what is where):
//   x.f32             the cast inputs: specials first, then fill_wide_range
//   fp16.u16 bf16.u16 e4m3.u8 e5m2.u8   our casts of x (FP8 saturating)
//   grads.f32         the unscale input (an inf at index 1000003 % N)
//   unscaled.f32      our unscale_and_check of grads by inv_scale, in place
//   scale.f32 tracker.i32   update_scale after each step of meta's flags
//   a.u16 b.u16       fp16 GEMM operands [M, K] and [K, N]
//   c32.f32 c16.u16   our tiled gemm_fp16: FP32 and fp16 outputs
//   meta.json         sizes, parameters, found_inf, and our times in ms
// Exits 77 without a usable GPU, like the GPU tests.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "bench_inputs.hpp"
#include "cuda_timing.hpp"
#include "kernels/amp/amp_kernels.hpp"
#include "kernels/formats/formats_kernels.hpp"
#include "kernels/nn/nn_kernels.hpp"

namespace {

using bench::check;
using bench::median_ms;

template <class T>
void write_file(const std::string& path, const std::vector<T>& v) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(v.data(), sizeof(T), v.size(), f) != v.size()) {
    std::fprintf(stderr, "gpu_ops_dump: cannot write %s\n", path.c_str());
    std::exit(1);
  }
  std::fclose(f);
}

template <class T>
T* device_copy(const std::vector<T>& host) {
  T* d = nullptr;
  check(cudaMalloc(&d, host.size() * sizeof(T)), "cudaMalloc");
  check(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return d;
}

template <class T>
std::vector<T> host_copy(const T* d, std::size_t n) {
  std::vector<T> host(n);
  check(cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
  return host;
}

/// The raw codes of a typed code buffer.
template <class Raw, class Code>
std::vector<Raw> raw_codes(const Code* d, std::size_t n) {
  static_assert(sizeof(Raw) == sizeof(Code), "one code, one raw integer");
  std::vector<Raw> out(n);
  check(cudaMemcpy(out.data(), d, n * sizeof(Code), cudaMemcpyDeviceToHost), "download codes");
  return out;
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  bench::program_name = "gpu_ops_dump";
  if (argc < 2) {
    std::fprintf(stderr, "usage: gpu_ops_dump DIR [N]\n");
    return 2;
  }
  std::string why;
  if (!mpt::cuda::device_available(&why)) {
    std::printf("SKIPPED gpu_ops_dump: %s\n", why.c_str());
    return 77;
  }
  const std::string dir = argv[1];
  std::error_code made;
  std::filesystem::create_directories(dir, made);
  if (made) {
    std::fprintf(stderr, "gpu_ops_dump: cannot create %s: %s\n", dir.c_str(), made.message().c_str());
    return 2;
  }
  const std::size_t n = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (std::size_t{1} << 24);
  if (n < 64) {
    std::fprintf(stderr, "gpu_ops_dump: N must be at least 64\n");
    return 2;
  }
  using V = mpt::cuda::KernelVersion;
  std::string times;  // "name": ms, ... for meta.json
  const auto timed = [&](const char* name, const std::function<void()>& f) {
    const float ms = median_ms(f);
    times += std::string(times.empty() ? "" : ", ") + "\"" + name + "\": " + num(ms);
  };

  // --- casts ------------------------------------------------------------------
  std::vector<float> x(n);
  bench::fill_wide_range(x);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {0.0f,     -0.0f,    inf,      -inf,     nan,      -nan,      65504.0f, 65519.0f,
                            65520.0f, 448.0f,   464.0f,   57344.0f, 61440.0f, 0x1p-24f,  0x1p-25f, 0x1.8p-25f,
                            0x1p-9f,  0x1p-10f, 0x1p-17f, 1e30f,    -1e30f,   0x1p-149f, 3.0e38f,  1.0f};
  for (std::size_t i = 0; i < sizeof specials / sizeof specials[0]; ++i) x[i] = specials[i];
  write_file(dir + "/x.f32", x);
  float* d_x = device_copy(x);
  mpt::Fp16Code* d_h = nullptr;
  mpt::Bf16Code* d_b = nullptr;
  mpt::Fp8E4M3* d_e4 = nullptr;
  mpt::Fp8E5M2* d_e5 = nullptr;
  check(cudaMalloc(&d_h, n * 2), "cudaMalloc");
  check(cudaMalloc(&d_b, n * 2), "cudaMalloc");
  check(cudaMalloc(&d_e4, n), "cudaMalloc");
  check(cudaMalloc(&d_e5, n), "cudaMalloc");
  timed("fp32_to_fp16", [&] { mpt::cuda::cast_fp32_to_fp16(d_x, d_h, n, V::vectorized); });
  timed("fp32_to_bf16", [&] { mpt::cuda::cast_fp32_to_bf16(d_x, d_b, n, V::vectorized); });
  timed("fp32_to_e4m3", [&] { mpt::cuda::cast_fp32_to_e4m3_sat(d_x, d_e4, n, V::vectorized); });
  timed("fp32_to_e5m2", [&] { mpt::cuda::cast_fp32_to_e5m2_sat(d_x, d_e5, n, V::vectorized); });
  write_file(dir + "/fp16.u16", raw_codes<std::uint16_t>(d_h, n));
  write_file(dir + "/bf16.u16", raw_codes<std::uint16_t>(d_b, n));
  write_file(dir + "/e4m3.u8", raw_codes<std::uint8_t>(d_e4, n));
  write_file(dir + "/e5m2.u8", raw_codes<std::uint8_t>(d_e5, n));

  // --- unscale_and_check ---------------------------------------------------------
  std::vector<float> g(n);
  bench::fill_gradients(g);
  g[1000003 % n] = inf;
  write_file(dir + "/grads.f32", g);
  const float scale = 65536.0f;
  const float inv_scale = static_cast<float>(1.0 / static_cast<double>(scale));
  float* d_g = device_copy(g);
  float* d_params = device_copy(std::vector<float>{inv_scale, 0.0f, 1.0f});  // inv, found, identity
  const mpt::cuda::DeviceTensorList list(std::vector<mpt::cuda::DeviceTensor>{{d_g, n}});
  mpt::cuda::reset_found_inf(d_params + 1);
  mpt::cuda::unscale_and_check(list, d_params, d_params + 1);  // the one run whose bits are compared
  write_file(dir + "/unscaled.f32", host_copy(d_g, n));
  const float found_inf = host_copy(d_params + 1, 1)[0];
  // Timed with an inverse scale of 1 (the kernel still reads, checks and
  // writes every element), so the data stays what was compared.
  timed("unscale_and_check", [&] { mpt::cuda::unscale_and_check(list, d_params + 2, d_params + 1); });

  // --- update_scale ------------------------------------------------------------------
  const double growth = 1.7, backoff = 0.3;  // not FP32 values: a float on the way would show
  const int interval = 3;
  const float init = 65536.0f;
  std::vector<float> flags;
  for (int s = 0; s < 40; ++s) flags.push_back((s % 7 == 2 || s % 11 == 5) ? 1.0f : 0.0f);
  float* d_flags = device_copy(flags);
  float* d_scale = device_copy(std::vector<float>{init});
  std::int32_t* d_tracker = device_copy(std::vector<std::int32_t>{0});
  std::vector<float> scales;
  std::vector<std::int32_t> trackers;
  for (std::size_t s = 0; s < flags.size(); ++s) {
    mpt::cuda::update_scale(d_scale, d_tracker, d_flags + s, growth, backoff, interval);
    scales.push_back(host_copy(d_scale, 1)[0]);
    trackers.push_back(host_copy(d_tracker, 1)[0]);
  }
  write_file(dir + "/scale.f32", scales);
  write_file(dir + "/tracker.i32", trackers);
  float* d_scratch_scale = device_copy(std::vector<float>{init});
  std::int32_t* d_scratch_tracker = device_copy(std::vector<std::int32_t>{0});
  timed("update_scale", [&] {
    mpt::cuda::update_scale(d_scratch_scale, d_scratch_tracker, d_flags, growth, backoff, interval);
  });

  // --- gemm_fp16 --------------------------------------------------------------------------
  const int M = 512, N = 384, K = 640;
  std::vector<float> af(static_cast<std::size_t>(M) * K), bf(static_cast<std::size_t>(K) * N);
  bench::fill_gradients(af);  // |x| in [2^-20, 2^4): the fp16 values below are all finite
  bench::fill_gradients(bf);
  for (float& v : bf) v = std::ldexp(v, 2);
  float* d_af = device_copy(af);
  float* d_bf = device_copy(bf);
  mpt::Fp16Code *d_a = nullptr, *d_bb = nullptr;
  check(cudaMalloc(&d_a, af.size() * 2), "cudaMalloc");
  check(cudaMalloc(&d_bb, bf.size() * 2), "cudaMalloc");
  mpt::cuda::cast_fp32_to_fp16(d_af, d_a, af.size());
  mpt::cuda::cast_fp32_to_fp16(d_bf, d_bb, bf.size());
  write_file(dir + "/a.u16", raw_codes<std::uint16_t>(d_a, af.size()));
  write_file(dir + "/b.u16", raw_codes<std::uint16_t>(d_bb, bf.size()));
  float* d_c32 = nullptr;
  mpt::Fp16Code* d_c16 = nullptr;
  const std::size_t mn = static_cast<std::size_t>(M) * N;
  check(cudaMalloc(&d_c32, mn * 4), "cudaMalloc");
  check(cudaMalloc(&d_c16, mn * 2), "cudaMalloc");
  using mpt::cuda::Trans;
  mpt::cuda::gemm_fp16(Trans::no, Trans::no, M, N, K, d_a, d_bb, d_c32, mpt::cuda::GemmVersion::tiled);
  mpt::cuda::gemm_fp16(Trans::no, Trans::no, M, N, K, d_a, d_bb, d_c16, mpt::cuda::GemmVersion::tiled);
  write_file(dir + "/c32.f32", host_copy(d_c32, mn));
  write_file(dir + "/c16.u16", raw_codes<std::uint16_t>(d_c16, mn));
  timed("gemm_fp16_tiled", [&] {
    mpt::cuda::gemm_fp16(Trans::no, Trans::no, M, N, K, d_a, d_bb, d_c16, mpt::cuda::GemmVersion::tiled);
  });

  // --- meta.json ----------------------------------------------------------------------------------
  std::string flag_list;
  for (float f : flags) flag_list += std::string(flag_list.empty() ? "" : ", ") + (f != 0 ? "1" : "0");
  const std::string meta =
      "{\n  \"n\": " + std::to_string(n) + ",\n  \"inv_scale\": " + num(inv_scale) +
      ",\n  \"found_inf\": " + num(found_inf) + ",\n  \"init_scale\": " + num(init) +
      ",\n  \"growth_factor\": " + num(growth) + ",\n  \"backoff_factor\": " + num(backoff) +
      ",\n  \"growth_interval\": " + std::to_string(interval) + ",\n  \"flags\": [" + flag_list +
      "],\n  \"gemm\": {\"M\": " + std::to_string(M) + ", \"N\": " + std::to_string(N) +
      ", \"K\": " + std::to_string(K) + "},\n  \"ours_ms\": {" + times + "}\n}\n";
  std::FILE* f = std::fopen((dir + "/meta.json").c_str(), "w");
  if (!f || std::fputs(meta.c_str(), f) < 0) {
    std::fprintf(stderr, "gpu_ops_dump: cannot write %s/meta.json\n", dir.c_str());
    return 1;
  }
  std::fclose(f);
  for (void* p :
       {static_cast<void*>(d_x), static_cast<void*>(d_h), static_cast<void*>(d_b), static_cast<void*>(d_e4),
        static_cast<void*>(d_e5), static_cast<void*>(d_g), static_cast<void*>(d_params),
        static_cast<void*>(d_flags), static_cast<void*>(d_scale), static_cast<void*>(d_tracker),
        static_cast<void*>(d_scratch_scale), static_cast<void*>(d_scratch_tracker), static_cast<void*>(d_af),
        static_cast<void*>(d_bf), static_cast<void*>(d_a), static_cast<void*>(d_bb),
        static_cast<void*>(d_c32), static_cast<void*>(d_c16)})
    cudaFree(p);
  std::printf("gpu_ops_dump: wrote %s (n = %zu, found_inf %g)\n", dir.c_str(), n, found_inf);
  return 0;
}
