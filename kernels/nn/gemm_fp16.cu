// Chapter 02 — loss scaling and FP32 master weights: the GEMM of the MLP in
// mixed precision, fp16 inputs with FP32 accumulation (tensor cores come in
// Chapter 6; these kernels use plain FMA units); Chapter 06 adds gemm_f32,
// the same kernels with FP32 inputs.
// Depends on: mpt/round_element.hpp (fp32 -> fp16 for the fp16 output, the
// CPU's rounding), mpt/codes.hpp (Fp16Code), kernels/nn/nn_kernels.hpp, cuda_check.cuh, cuda_fp16.h (fp16 ->
// fp32, exact).
//
// Shapes (row-major, contiguous): op(A) M x K, op(B) K x N, C M x N; A is
// stored [M, K] or, transposed, [K, M]; B is stored [K, N] or [N, K].
// Both versions sum each output's products in the order k = 0..K-1 with one
// fmaf each. fp16 x fp16 fits in FP32 exactly (11 + 11 significand bits, the
// exponents well inside FP32's range), so fmaf(a, b, acc) rounds exactly once
// like the CPU's acc += a * b: the results are bit-exact against a same-order
// CPU loop, which is what tests/cuda/test_ch02_gemm.cu checks (besides the
// order-independent error bound a future split-K or tensor-core version
// would be held to).
//
// gemm_f32 (Chapter 6) is the same two kernels with FP32 inputs: the matmul
// a policy keeps in f32 runs on the CUDA cores (PyTorch's default,
// torch.backends.cuda.matmul.allow_tf32 = False), and the replay of a
// preset's step (tests/bench/bench_ch06_presets_cuda.cpp) times it beside
// the tensor-core GEMM. A product of two floats is not exact in FP32, so
// there the FMA differs from acc += a * b: the GPU test holds it bit for bit
// to a CPU loop acc = std::fma(a, b, acc) in the order k = 0..K-1.
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/formats/cuda_check.cuh"
#include "kernels/nn/nn_kernels.hpp"
#include "mpt/formats/round_element.hpp"

namespace mpt::cuda {
namespace {

constexpr int kTile = 16;  // 16 x 16 outputs per block, one per thread

// fp16 as a compile-time constant for device code (a host variable is not
// addressable on the device; see casts.cu).
struct Fp16 {
  static constexpr FormatSpec spec = formats::fp16;
};

// The one place where Fp16Code becomes std::uint16_t, for both entry points
// below: the kernels read and write raw binary16 codes. Safe because
// Fp16Code is a standard-layout struct whose only member is a uint16_t, with
// its size and alignment (codes.hpp asserts it): a pointer to the code is a
// pointer to its member, and an array of codes is an array of uint16_t.
static_assert(sizeof(Fp16Code) == sizeof(std::uint16_t) && alignof(Fp16Code) == alignof(std::uint16_t) &&
                  std::is_standard_layout_v<Fp16Code>,
              "Fp16Code must be exactly a uint16_t");
const std::uint16_t* raw(const Fp16Code* p) { return reinterpret_cast<const std::uint16_t*>(p); }
std::uint16_t* raw(Fp16Code* p) { return reinterpret_cast<std::uint16_t*>(p); }
float* raw(float* p) { return p; }

// An input element widened to FP32: an fp16 code exactly, a float as it is.
__device__ __forceinline__ float widen(std::uint16_t code) { return __half2float(__ushort_as_half(code)); }
__device__ __forceinline__ float widen(float x) { return x; }

// op(A)[m][k] and op(B)[k][n] for either storage.
template <bool kTransA, class In>
__device__ __forceinline__ float a_at(const In* __restrict__ a, int m, int k, int M, int K) {
  return widen(kTransA ? a[static_cast<std::size_t>(k) * M + m] : a[static_cast<std::size_t>(m) * K + k]);
}
template <bool kTransB, class In>
__device__ __forceinline__ float b_at(const In* __restrict__ b, int k, int n, int K, int N) {
  return widen(kTransB ? b[static_cast<std::size_t>(n) * K + k] : b[static_cast<std::size_t>(k) * N + n]);
}

__device__ __forceinline__ void store(float* c, std::size_t i, float v) { c[i] = v; }
__device__ __forceinline__ void store(std::uint16_t* c, std::size_t i, float v) {
  constexpr FormatSpec f = Fp16::spec;
  c[i] = static_cast<std::uint16_t>(encode_exact(
      round_to_format(v, f, RoundingMode::nearest_even, OverflowMode::infinity, SubnormalMode::keep), f));
}

// Version 1. Block (16, 16) threads, grid (ceil(N/16), ceil(M/16)); thread
// (tx, ty) computes C[m][n] with m = 16*by + ty, n = 16*bx + tx, reading its
// row of op(A) and column of op(B) straight from global memory.
// The output index is computed in 64 bits: for N within 15 of INT_MAX the
// last column block reaches past INT_MAX, which in int would wrap negative
// and pass the bounds check.
template <bool kTransA, bool kTransB, class In, class Out>
__global__ void gemm_naive(const In* __restrict__ a, const In* __restrict__ b, Out* __restrict__ c, int M,
                           int N, int K) {
  const long long n64 = static_cast<long long>(blockIdx.x) * kTile + threadIdx.x;
  const long long m64 = static_cast<long long>(blockIdx.y) * kTile + threadIdx.y;
  if (m64 >= M || n64 >= N) return;
  const int m = static_cast<int>(m64), n = static_cast<int>(n64);
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc = fmaf(a_at<kTransA>(a, m, k, M, K), b_at<kTransB>(b, k, n, K, N), acc);
  store(c, static_cast<std::size_t>(m) * N + n, acc);
}

// Version 2. Same grid and thread -> output map. The K dimension is walked in
// 16-wide steps: the block first copies a 16 x 16 tile of op(A) and one of
// op(B) into shared memory (decoded to fp32), then every thread takes its 16
// products from there. Faster because each fp16 value is fetched from global
// memory once per block instead of once per output that needs it (16x less
// traffic); the naive kernel is bound by those repeated loads.
// Loads are coalesced for every storage: consecutive threads (tx) read
// consecutive addresses — along k for A [M,K] and B [N,K], along m or n for
// A [K,M] and B [K,N] — and the +1 column of padding keeps the transposed
// shared-memory writes free of bank conflicts. Out-of-range entries of A
// are loaded as +0 and of B as -0, so past k = K-1 the extra terms are
// fmaf(+0, -0, acc): the exact product is -0, and acc + (-0) is acc for every
// acc, -0 included (an FP32 sum can reach -0: a product of two floats that
// underflows to -0 is summed from +0 as -0; with fp16 inputs it cannot).
// The sum order stays k = 0..K-1: the same bits as version 1.
template <bool kTransA, bool kTransB, class In, class Out>
__global__ void gemm_tiled(const In* __restrict__ a, const In* __restrict__ b, Out* __restrict__ c, int M,
                           int N, int K) {
  __shared__ float as[kTile][kTile + 1];  // as[i][kk] = op(A)[m0 + i][k0 + kk]
  __shared__ float bs[kTile][kTile + 1];  // bs[kk][j] = op(B)[k0 + kk][n0 + j]
  const int tx = threadIdx.x, ty = threadIdx.y;
  // Tile origins in 64 bits, as in version 1: n0 + 15 may pass INT_MAX.
  const long long m0 = static_cast<long long>(blockIdx.y) * kTile,
                  n0 = static_cast<long long>(blockIdx.x) * kTile;
  float acc = 0.0f;
  // Counted in tiles, not k0 += kTile while k0 < K: for K within 15 of
  // INT_MAX that last step overflows int (undefined behaviour; in practice
  // k0 wraps negative, the loop runs on and reads before the operands).
  // k0 + kk stays <= INT_MAX: k0 <= K - 1 rounded down to a multiple of 16.
  const int tiles = K / kTile + (K % kTile != 0 ? 1 : 0);
  for (int t = 0; t < tiles; ++t) {
    const int k0 = t * kTile;
    {  // A tile: A [M,K] walks k with tx; A [K,M] walks m with tx.
      const int i = kTransA ? tx : ty, kk = kTransA ? ty : tx;
      const long long m = m0 + i;
      const int k = k0 + kk;
      as[i][kk] = (m < M && k < K) ? a_at<kTransA>(a, static_cast<int>(m), k, M, K) : 0.0f;
    }
    {  // B tile: B [K,N] walks n with tx; B [N,K] walks k with tx.
      const int kk = kTransB ? tx : ty, j = kTransB ? ty : tx;
      const int k = k0 + kk;
      const long long n = n0 + j;
      bs[kk][j] = (k < K && n < N) ? b_at<kTransB>(b, k, static_cast<int>(n), K, N) : -0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTile; ++kk) acc = fmaf(as[ty][kk], bs[kk][tx], acc);
    __syncthreads();
  }
  const long long m = m0 + ty, n = n0 + tx;
  if (m < M && n < N) store(c, static_cast<std::size_t>(m) * N + static_cast<std::size_t>(n), acc);
}

template <class In, class Out>
void launch(const char* where, Trans ta, Trans tb, int M, int N, int K, const In* d_a, const In* d_b,
            Out* d_c, GemmVersion v) {
  const std::string name = std::string("mpt::cuda::") + where;
  if (M < 0 || N < 0 || K < 0)
    throw std::invalid_argument(name + ": negative size (M=" + std::to_string(M) +
                                ", N=" + std::to_string(N) + ", K=" + std::to_string(K) + ")");
  if (v != GemmVersion::naive && v != GemmVersion::tiled)
    throw std::invalid_argument(name + ": unknown GemmVersion (choices: naive, tiled)");
  if ((ta != Trans::no && ta != Trans::yes) || (tb != Trans::no && tb != Trans::yes))
    throw std::invalid_argument(name + ": unknown Trans (choices: no, yes)");
  if (M == 0 || N == 0) return;
  // Block counts in 64 bits: M + kTile - 1 in int overflows for M (or N)
  // within 15 of INT_MAX. 2^31 / 16 = 2^27 column blocks fit grid x easily.
  const long long gx = (static_cast<long long>(N) + kTile - 1) / kTile;
  const long long gy = (static_cast<long long>(M) + kTile - 1) / kTile;
  if (gy > 65535)
    throw std::length_error(name + ": M=" + std::to_string(M) + " needs more than 65535 row blocks");
  const dim3 grid(static_cast<unsigned int>(gx), static_cast<unsigned int>(gy));
  const dim3 block(kTile, kTile);
  const bool tA = ta == Trans::yes, tB = tb == Trans::yes;
  auto go = [&](auto kernel) { kernel<<<grid, block>>>(d_a, d_b, d_c, M, N, K); };
  if (v == GemmVersion::naive) {
    if (!tA && !tB) go(gemm_naive<false, false, In, Out>);
    else if (!tA && tB) go(gemm_naive<false, true, In, Out>);
    else if (tA && !tB) go(gemm_naive<true, false, In, Out>);
    else go(gemm_naive<true, true, In, Out>);
  } else {
    if (!tA && !tB) go(gemm_tiled<false, false, In, Out>);
    else if (!tA && tB) go(gemm_tiled<false, true, In, Out>);
    else if (tA && !tB) go(gemm_tiled<true, false, In, Out>);
    else go(gemm_tiled<true, true, In, Out>);
  }
  detail::check_launch(where);
}

}  // namespace

void gemm_fp16(Trans ta, Trans tb, int M, int N, int K, const Fp16Code* d_a, const Fp16Code* d_b, float* d_c,
               GemmVersion v) {
  launch("gemm_fp16", ta, tb, M, N, K, raw(d_a), raw(d_b), raw(d_c), v);
}

void gemm_fp16(Trans ta, Trans tb, int M, int N, int K, const Fp16Code* d_a, const Fp16Code* d_b,
               Fp16Code* d_c, GemmVersion v) {
  launch("gemm_fp16", ta, tb, M, N, K, raw(d_a), raw(d_b), raw(d_c), v);
}

void gemm_f32(Trans ta, Trans tb, int M, int N, int K, const float* d_a, const float* d_b, float* d_c,
              GemmVersion v) {
  launch("gemm_f32", ta, tb, M, N, K, d_a, d_b, d_c, v);
}

}  // namespace mpt::cuda
