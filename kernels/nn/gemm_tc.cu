// Chapter 06 — per-task precision policies: the tensor-core GEMM, fp16 or
// bf16 inputs with FP32 accumulation through nvcuda::wmma, the unit a
// policy's fp16 or bf16 matmul runs on (Chapter 2's GEMM uses FMA units).
// Depends on: mpt/formats/codes.hpp (Fp16Code, Bf16Code),
// kernels/nn/nn_kernels.hpp (the host API, Trans), cuda_check.cuh, mma.h
// (nvcuda::wmma), cuda_fp16.h and cuda_bf16.h (the fragments' element types).
//
// Shapes and storage are Chapter 2's (gemm_fp16.cu): row-major, contiguous,
// op(A) M x K with A stored [M, K] or, transposed, [K, M]; op(B) K x N with B
// stored [K, N] or [N, K]; C M x N in FP32.
//
// The simplest correct version first. One warp per block, one block per
// 16 x 16 tile of C, grid (ceil(N/16), ceil(M/16)). The warp walks K in
// 16-wide steps: its 32 lanes copy the 16 x 16 tile of A and the one of B
// into shared memory, then wmma::load_matrix_sync reads them into fragments
// and wmma::mma_sync adds their product (m16n16k16, FP32 accumulator) into
// the tile's accumulator. At the end the accumulator goes to shared memory
// (store_matrix_sync) and the lanes copy the part inside C to global memory.
//
// Edges: zero-padding through shared memory. Any M, N, K works: an element
// of a tile outside its operand (row >= M, k >= K, column >= N) is written
// to shared memory as +0, so the padded k terms are 0 x 0 = +0 and add
// nothing, and the padded rows and columns of the output tile are computed
// but never stored. (A padded row of op(A) or column of op(B) meets the
// other operand's values, so its outputs may be inf x 0 = NaN; they are
// never stored. A padded k is zero in both operands, so it never meets an
// inf: the stored outputs see exactly the K real terms.) The fragments always load full,
// aligned 16 x 16 tiles, which is what wmma requires (ldm 16, 32-byte aligned
// pointers), so no load needs a guard of its own.
//
// Transposes without a copy: the shared-memory tile keeps its operand's
// stored layout (element e of the tile is stored row e / 16, stored column
// e % 16), so consecutive lanes read consecutive addresses for every storage
// (coalesced) and write consecutive shared addresses (no bank conflicts);
// the fragment type says how to read it: op(A) is row_major when A is stored
// [M, K] and col_major when stored [K, M] (element (m, k) at k * 16 + m), the
// same for op(B).
//
// Numerics. A product of two fp16 or two bf16 values is exact in FP32 (at
// most 11 + 11 or 8 + 8 significand bits), but the tensor core adds each
// step's products and the accumulator in its own order and with its own
// rounding (it aligns the terms to the largest exponent and truncates; see
// Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor
// cores", PeerJ Computer Science 7:e330, 2021). So unlike Chapter 2's GEMM
// the result is not bit for bit any CPU loop for general inputs; it meets
// the order-independent bound |exact - c| <= K * 2^-23 * sum_k |a_mk b_kn|
// that tests/cuda/test_ch02_gemm.cu documents, and it is exact when the
// inputs are integers whose products and partial sums stay below 2^24 in
// magnitude (every aligned term then fits the adder's 24 bits). One FP32 addition of +0 at the
// end maps a -0 result to +0, the sign a CPU sum started at +0 gives (every
// other value, inf and NaN included, passes unchanged). inf and NaN inputs
// propagate as IEEE products and sums do: a NaN in a row of op(A) makes that
// row of C NaN, inf x 0 is NaN.
//
// What a faster version would change (not done here, on purpose):
//  - shared-memory tiling over several output tiles: a block of 4 to 8
//    warps computing, say, a 128 x 128 tile of C from 128 x 32 slices of A
//    and B, so each value loaded from global memory feeds many MMAs instead
//    of one (here every A tile is fetched once per 16 columns of C);
//  - several warps per block and several fragments per warp (a 64 x 64 warp
//    tile reuses each A fragment across the B fragments in registers);
//  - mma.sync (PTX) with ldmatrix instead of wmma: the register layout of the
//    fragments is known, so the epilogue writes straight from registers
//    (no trip through shared memory) and the shared tiles can be swizzled;
//  - double buffering with cp.async (sm_80): the next K slice is copied into
//    a second shared buffer while the tensor cores work on this one, hiding
//    the global-memory latency that this version waits out at every step;
//  - 16-byte vector loads of the codes (8 per load) where the layout and
//    alignment allow.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/formats/cuda_check.cuh"
#include "kernels/nn/nn_kernels.hpp"

namespace mpt::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTile = 16;  // the wmma shape m16n16k16: 16 x 16 tiles of A, B and C
constexpr int kWarp = 32;  // one warp per block

// The one place where the typed codes become std::uint16_t: the kernels read
// raw binary16 or bfloat16 codes. Safe because each code is a
// standard-layout struct whose only member is a uint16_t, with its size and
// alignment (codes.hpp asserts it): a pointer to the code is a pointer to its
// member, and an array of codes is an array of uint16_t.
static_assert(sizeof(Fp16Code) == sizeof(std::uint16_t) && alignof(Fp16Code) == alignof(std::uint16_t) &&
                  std::is_standard_layout_v<Fp16Code>,
              "Fp16Code must be exactly a uint16_t");
static_assert(sizeof(Bf16Code) == sizeof(std::uint16_t) && alignof(Bf16Code) == alignof(std::uint16_t) &&
                  std::is_standard_layout_v<Bf16Code>,
              "Bf16Code must be exactly a uint16_t");
const std::uint16_t* raw(const Fp16Code* p) { return reinterpret_cast<const std::uint16_t*>(p); }
const std::uint16_t* raw(const Bf16Code* p) { return reinterpret_cast<const std::uint16_t*>(p); }

// The device code needs sm_80 (bf16 fragments). The project builds sm_80
// and newer; for an older target the kernel compiles empty (see below) and
// these helpers are left out, so that no unused function is compiled.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
constexpr int kTileElems = kTile * kTile;  // 256 elements, 8 per lane

// A code as the fragments' element type (a reinterpretation of the bits).
template <class T>
__device__ __forceinline__ T from_code(std::uint16_t code);
template <>
__device__ __forceinline__ __half from_code<__half>(std::uint16_t code) {
  return __ushort_as_half(code);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_code<__nv_bfloat16>(std::uint16_t code) {
  return __ushort_as_bfloat16(code);
}

// The 16 x 16 tile at stored (r0, c0) of a row-major rows x cols array of
// codes into s[16 * 16], same layout (s[e] = g[r0 + e / 16][c0 + e % 16]),
// +0 outside the array. Lane l copies elements l, l + 32, ..., l + 224:
// consecutive lanes read consecutive addresses of a stored row. Offsets in
// 64 bits.
template <class T>
__device__ __forceinline__ void load_tile(T* __restrict__ s, const std::uint16_t* __restrict__ g,
                                          long long r0, long long c0, int rows, int cols, int lane) {
#pragma unroll
  for (int j = 0; j < kTileElems / kWarp; ++j) {
    const int e = lane + j * kWarp;
    const long long r = r0 + e / kTile, c = c0 + e % kTile;
    const bool inside = r < rows && c < cols;
    s[e] = from_code<T>(
        inside ? g[static_cast<std::size_t>(r) * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c)]
               : std::uint16_t{0});
  }
}
#endif

// The kernel: block (32), grid (ceil(N/16), ceil(M/16)); the block computes
// C[m0 .. m0+15][n0 .. n0+15] with m0 = 16 * blockIdx.y, n0 = 16 * blockIdx.x.
// T is __half or __nv_bfloat16. The body needs sm_80 (bf16 fragments; the
// project builds sm_80 and newer); for an older target it compiles to an
// empty kernel, which the host never launches (it checks the device first).
template <class T, bool kTransA, bool kTransB>
__global__ void __launch_bounds__(kWarp)
    gemm_wmma(const std::uint16_t* __restrict__ a, const std::uint16_t* __restrict__ b, float* __restrict__ c,
              int M, int N, int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using LayoutA = std::conditional_t<kTransA, wmma::col_major, wmma::row_major>;
  using LayoutB = std::conditional_t<kTransB, wmma::col_major, wmma::row_major>;
  // Tiles in their operand's stored layout (see the header comment); wmma
  // wants 256-bit aligned pointers.
  __shared__ __align__(32) T as[kTileElems];
  __shared__ __align__(32) T bs[kTileElems];
  __shared__ __align__(32) float cs[kTileElems];  // the accumulator, row-major, for the guarded store

  const int lane = static_cast<int>(threadIdx.x);
  // Tile origins in 64 bits: n0 + 15 may pass INT_MAX (as in gemm_fp16.cu).
  const long long m0 = static_cast<long long>(blockIdx.y) * kTile,
                  n0 = static_cast<long long>(blockIdx.x) * kTile;

  wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, T, LayoutA> fa;
  wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, T, LayoutB> fb;
  wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float> acc;
  wmma::fill_fragment(acc, 0.0f);

  // Counted in tiles, not k0 += 16 while k0 < K: that last step would
  // overflow an int for K within 15 of INT_MAX (as in gemm_fp16.cu).
  const int tiles = K / kTile + (K % kTile != 0 ? 1 : 0);
  //! [wmma-k-loop]
  for (int t = 0; t < tiles; ++t) {
    const long long k0 = static_cast<long long>(t) * kTile;
    if (kTransA) load_tile(as, a, k0, m0, K, M, lane);  // A stored [K, M]
    else load_tile(as, a, m0, k0, M, K, lane);          // A stored [M, K]
    if (kTransB) load_tile(bs, b, n0, k0, N, K, lane);  // B stored [N, K]
    else load_tile(bs, b, k0, n0, K, N, lane);          // B stored [K, N]
    // Every lane's writes are visible to the whole warp before wmma reads.
    __syncwarp();
    wmma::load_matrix_sync(fa, as, kTile);
    wmma::load_matrix_sync(fb, bs, kTile);
    wmma::mma_sync(acc, fa, fb, acc);
    __syncwarp();  // the tiles are read before the next step overwrites them
  }
  //! [wmma-k-loop]

  wmma::store_matrix_sync(cs, acc, kTile, wmma::mem_row_major);
  __syncwarp();
#pragma unroll
  for (int j = 0; j < kTileElems / kWarp; ++j) {
    const int e = lane + j * kWarp;
    const long long m = m0 + e / kTile, n = n0 + e % kTile;
    // + 0.0f: -0 becomes +0 (the CPU's sign for a sum started at +0); every
    // other value is unchanged (no fast-math here, so it is not folded away).
    if (m < M && n < N)
      c[static_cast<std::size_t>(m) * static_cast<std::size_t>(N) + static_cast<std::size_t>(n)] =
          cs[e] + 0.0f;
  }
#else
  (void)a, (void)b, (void)c, (void)M, (void)N, (void)K;
#endif
}

// Throws std::runtime_error unless the current device has tensor cores with
// bf16 support (compute capability 8.0, sm_80, or newer).
void require_sm80(const char* where) {
  int device = 0, major = 0, minor = 0;
  detail::check(cudaGetDevice(&device), where);
  detail::check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), where);
  detail::check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), where);
  if (major < 8)
    throw std::runtime_error(std::string("mpt::cuda::") + where +
                             ": needs compute capability 8.0 (sm_80) or newer, the device has " +
                             std::to_string(major) + "." + std::to_string(minor));
}

template <class T>
void launch(const char* where, Trans ta, Trans tb, int M, int N, int K, const std::uint16_t* d_a,
            const std::uint16_t* d_b, float* d_c) {
  const std::string name = std::string("mpt::cuda::") + where;
  if (M < 0 || N < 0 || K < 0)
    throw std::invalid_argument(name + ": negative size (M=" + std::to_string(M) +
                                ", N=" + std::to_string(N) + ", K=" + std::to_string(K) + ")");
  if ((ta != Trans::no && ta != Trans::yes) || (tb != Trans::no && tb != Trans::yes))
    throw std::invalid_argument(name + ": unknown Trans (choices: no, yes)");
  if (M == 0 || N == 0) return;
  if (d_c == nullptr || (K > 0 && (d_a == nullptr || d_b == nullptr)))
    throw std::invalid_argument(name + ": null device pointer");
  // Block counts in 64 bits: M + 15 in int overflows for M near INT_MAX.
  const long long gx = (static_cast<long long>(N) + kTile - 1) / kTile;
  const long long gy = (static_cast<long long>(M) + kTile - 1) / kTile;
  if (gy > 65535)
    throw std::length_error(name + ": M=" + std::to_string(M) + " needs more than 65535 row blocks");
  require_sm80(where);
  const dim3 grid(static_cast<unsigned int>(gx), static_cast<unsigned int>(gy));
  const dim3 block(kWarp);
  const bool tA = ta == Trans::yes, tB = tb == Trans::yes;
  auto go = [&](auto kernel) { kernel<<<grid, block>>>(d_a, d_b, d_c, M, N, K); };
  if (!tA && !tB) go(gemm_wmma<T, false, false>);
  else if (!tA && tB) go(gemm_wmma<T, false, true>);
  else if (tA && !tB) go(gemm_wmma<T, true, false>);
  else go(gemm_wmma<T, true, true>);
  detail::check_launch(where);
}

}  // namespace

void gemm_tc(Trans ta, Trans tb, int M, int N, int K, const Fp16Code* d_a, const Fp16Code* d_b, float* d_c) {
  launch<__half>("gemm_tc (fp16)", ta, tb, M, N, K, raw(d_a), raw(d_b), d_c);
}

void gemm_tc(Trans ta, Trans tb, int M, int N, int K, const Bf16Code* d_a, const Bf16Code* d_b, float* d_c) {
  launch<__nv_bfloat16>("gemm_tc (bf16)", ta, tb, M, N, K, raw(d_a), raw(d_b), d_c);
}

}  // namespace mpt::cuda
