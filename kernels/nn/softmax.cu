// Chapter 04 — numerically stable softmax: the fused softmax cross-entropy
// (forward and backward in one kernel) and the masked softmax of attention
// rows, fp16 in and out, FP32 in between.
// Depends on: mpt/nn/layers/softmax_math.hpp (the online (max, sum) and its merge,
// the CPU's own functions, and cross_entropy_of), mpt/nn/layers/attention_math.hpp
// (a position's score and probability, the CPU attention's functions), mpt/formats/round_element.hpp (decode,
// and the rounding of every stored result in version 1), mpt/formats/codes.hpp (Fp16Code),
// kernels/nn/nn_kernels.hpp (the host API), cuda_check.cuh, cuda_fp16.h (the hardware fp16 conversions of
// version 2).
//
// One kernel family in one file: both kernels reduce a row the same way.
// Each thread walks its share of a row with max_sum_add; the partial (max,
// sum) pairs then meet by max_sum_merge, first across the warp (shuffles,
// lane l taking lane l + offset for offset 16, 8, 4, 2, 1), then across the
// warps of the block (shared memory, in warp order). No arithmetic of the
// reduction is written here: it is softmax_math.hpp's, which the CPU tests
// cover on the host.
//
// The cross-entropy, llm.c style (its fused classifier kernel): the loss
// needs log Σ exp(z − max), the gradient softmax = exp(z − max) / sum, so
// one kernel reads each row twice — once for (max, sum), once to write the
// gradient and, with label smoothing, to add up Σ(z − max) — and the
// softmax itself is never stored. The loss is softmax_math.hpp's
// cross_entropy_of, the CPU's own formula: log(sum) − (z_y − max), never
// (max + log sum) − z_y, which rounds at the max's magnitude first. Unfused, the
// same step writes the log-probabilities (2 or 4 bytes per logit) and reads
// them back for the loss and again for the gradient. Version 1 is a block
// of 256 threads per row reading one code per load; version 2 is faster
// for the long rows of a language model's vocabulary (K = 32768 in the
// benchmark), for three reasons given with it below.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/formats/cuda_check.cuh"
#include "kernels/nn/nn_kernels.hpp"
#include "mpt/formats/codes.hpp"
#include "mpt/formats/round_element.hpp"
#include "mpt/nn/layers/attention_math.hpp"
#include "mpt/nn/layers/softmax_math.hpp"

namespace mpt::cuda {
namespace {

constexpr int kWarp = 32;
constexpr unsigned int kFullMask = 0xffffffffu;
constexpr int kThreadsV1 = 256;                    // cross-entropy version 1, and the masked softmax's block
constexpr int kThreadsV2 = 512;                    // cross-entropy version 2
constexpr int kReduceThreads = 1024;               // the loss reduction and the target count: one block
constexpr int kRowsPerBlock = kThreadsV1 / kWarp;  // masked softmax: one warp per row

// --- fp16 codes ------------------------------------------------------------------
//
// Fp16Code is a standard-layout struct whose only member is its uint16_t,
// with that integer's size and alignment (codes.hpp asserts it): an array
// of codes is an array of integers, which is what the kernels move.
static_assert(sizeof(Fp16Code) == sizeof(std::uint16_t) && alignof(Fp16Code) == alignof(std::uint16_t) &&
                  std::is_standard_layout_v<Fp16Code>,
              "Fp16Code must be exactly a uint16_t");
/// The codes as their integers (read-only).
const std::uint16_t* raw(const Fp16Code* p) { return reinterpret_cast<const std::uint16_t*>(p); }
/// The codes as their integers.
std::uint16_t* raw(Fp16Code* p) { return reinterpret_cast<std::uint16_t*>(p); }

/// fp16 as a compile-time constant for device code (device code may not read
/// the host variable formats::fp16).
struct Fp16 {
  static constexpr FormatSpec spec = formats::fp16;
};

/// The exact value of an fp16 code, by the library's decoder.
__device__ __forceinline__ float load16(std::uint16_t c) {
  constexpr FormatSpec f = Fp16::spec;
  return decode(c, f);
}

/// A float rounded once to fp16 by the library's rounding (nearest-even,
/// overflow to ±inf, subnormals kept, NaN → 0x7E00 with its sign): what
/// mpt's Tensor writes do.
__device__ __forceinline__ std::uint16_t store16(float v) {
  constexpr FormatSpec f = Fp16::spec;
  return static_cast<std::uint16_t>(encode_exact(
      round_to_format(v, f, RoundingMode::nearest_even, OverflowMode::infinity, SubnormalMode::keep), f));
}

/// The same two conversions in one instruction each (version 2): the
/// hardware's fp16 → f32 is exact and its f32 → fp16 (cvt.rn) rounds to
/// nearest-even with overflow to ±inf and subnormals kept, so every non-NaN
/// result has store16's bits; a NaN becomes the canonical 0x7FFF.
__device__ __forceinline__ float load16_hw(std::uint16_t c) { return __half2float(__ushort_as_half(c)); }
/// store16 by the hardware's cvt.rn (see load16_hw).
__device__ __forceinline__ std::uint16_t store16_hw(float v) { return __half_as_ushort(__float2half_rn(v)); }

// --- reductions ------------------------------------------------------------------

/// Lane l merges lane l + offset for offset 16, 8, 4, 2, 1: the whole warp's
/// (max, sum) lands in lane 0. A lane without elements holds {−inf, 0},
/// which max_sum_merge passes through exactly.
__device__ __forceinline__ MaxSum<float> warp_merge(MaxSum<float> s) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    MaxSum<float> o;
    o.max = __shfl_down_sync(kFullMask, s.max, offset);
    o.sum = __shfl_down_sync(kFullMask, s.sum, offset);
    s = max_sum_merge(s, o);
  }
  return s;
}

/// Lane 0's statistics, in every lane of the warp.
__device__ __forceinline__ MaxSum<float> warp_broadcast(const MaxSum<float>& s) {
  MaxSum<float> o;
  o.max = __shfl_sync(kFullMask, s.max, 0);
  o.sum = __shfl_sync(kFullMask, s.sum, 0);
  return o;
}

/// The statistics of the whole block, in every thread: each warp merges its
/// lanes, warp 0 merges the warps' results in warp order, and the result goes
/// through shared memory. Called once per kernel (the slots are not reused).
/// Shared memory holds plain arrays: a __shared__ MaxSum, whose members have
/// initializers, may not be declared.
template <int kThreads>
__device__ MaxSum<float> block_merge(MaxSum<float> s) {
  constexpr int kWarps = kThreads / kWarp;
  static_assert(kWarps <= kWarp, "warp 0 merges one warp result per lane");
  __shared__ float maxes[kWarps], sums[kWarps];
  __shared__ float total[2];
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  s = warp_merge(s);
  if (lane == 0) {
    maxes[warp] = s.max;
    sums[warp] = s.sum;
  }
  __syncthreads();
  if (warp == 0) {
    MaxSum<float> w;
    if (lane < kWarps) {
      w.max = maxes[lane];
      w.sum = sums[lane];
    }
    w = warp_merge(w);
    if (lane == 0) {
      total[0] = w.max;
      total[1] = w.sum;
    }
  }
  __syncthreads();
  MaxSum<float> r;
  r.max = total[0];
  r.sum = total[1];
  return r;
}

/// A float summed over the block, in thread 0 (the other threads hold
/// partial sums): each warp's tree as warp_merge, then warp 0 adds the
/// warps' sums in warp order. Once per kernel, as block_merge.
template <int kThreads>
__device__ float block_sum(float v) {
  constexpr int kWarps = kThreads / kWarp;
  static_assert(kWarps <= kWarp, "warp 0 adds one warp result per lane");
  __shared__ float partial[kWarps];
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_down_sync(kFullMask, v, offset);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? partial[lane] : 0.0f;
    for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_down_sync(kFullMask, v, offset);
  }
  return v;
}

/// A float sum and an integer count over one block, in thread 0 (tree order
/// as warp_merge, then the warps in order).
__device__ void block_sum_count(float& sum, long long& count) {
  constexpr int kWarps = kReduceThreads / kWarp;
  __shared__ float sums[kWarps];
  __shared__ long long counts[kWarps];
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    sum += __shfl_down_sync(kFullMask, sum, offset);
    count += __shfl_down_sync(kFullMask, count, offset);
  }
  if (lane == 0) {
    sums[warp] = sum;
    counts[warp] = count;
  }
  __syncthreads();
  if (warp == 0) {
    sum = lane < kWarps ? sums[lane] : 0.0f;
    count = lane < kWarps ? counts[lane] : 0;
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      sum += __shfl_down_sync(kFullMask, sum, offset);
      count += __shfl_down_sync(kFullMask, count, offset);
    }
  }
}

// --- cross-entropy: what both versions share -------------------------------------

/// What a row's target makes of it: counted (a class in [0, K)), ignored
/// (ignore_index), or invalid (anything else: NaN loss and gradient).
enum class Target { counted, ignored, invalid };

/// The kind of row target y makes.
__device__ __forceinline__ Target classify_target(std::int32_t y, std::int32_t ignore_index,
                                                  long long classes) {
  if (y == ignore_index) return Target::ignored;
  return (y >= 0 && y < classes) ? Target::counted : Target::invalid;
}

/// The gradient of element j of a counted row, before rounding:
/// g·(softmax_j − q_j) with q_j = (1 − ε)·[j = y] + ε/K, the smoothed target;
/// (1 − ε)(p − onehot) + ε(p − 1/K) regrouped so that p is rounded once.
__device__ __forceinline__ float grad_of(float z, const MaxSum<float>& s, long long j, std::int32_t y,
                                         float eps, float eps_over_k, float g) {
  const float p = exp_in(z - s.max) / s.sum;
  const float q = (j == y ? 1.0f - eps : 0.0f) + eps_over_k;
  return g * (p - q);
}

/// Count kernel (Reduction::mean with a gradient): one block counts the
/// rows whose target is not ignore_index and writes g = dloss / count into
/// *g_out, which the row kernel reads (it cannot know the count itself
/// without reading every target in every block).
__global__ void count_kernel(long long rows, const std::int32_t* __restrict__ targets,
                             std::int32_t ignore_index, float dloss, float* __restrict__ g_out) {
  float unused = 0.0f;
  long long count = 0;
  for (long long r = threadIdx.x; r < rows; r += kReduceThreads) count += targets[r] != ignore_index ? 1 : 0;
  block_sum_count(unused, count);
  if (threadIdx.x == 0) *g_out = dloss / static_cast<float>(count);
}

/// Reduction kernel (mean and sum): one block adds the per-row losses (0 on
/// ignored rows) in a fixed order — thread t takes rows t, t + 1024, ...,
/// then the tree — so the result has the same bits on every run (no
/// atomics), and divides by the count of non-ignored rows for the mean
/// (0/0 = NaN when there is none, as PyTorch's mean).
__global__ void reduce_kernel(long long rows, const float* __restrict__ losses,
                              const std::int32_t* __restrict__ targets, std::int32_t ignore_index, bool mean,
                              float* __restrict__ loss) {
  float sum = 0.0f;
  long long count = 0;
  for (long long r = threadIdx.x; r < rows; r += kReduceThreads) {
    sum += losses[r];
    count += targets[r] != ignore_index ? 1 : 0;
  }
  block_sum_count(sum, count);
  if (threadIdx.x == 0) *loss = mean ? sum / static_cast<float>(count) : sum;
}

// --- cross-entropy, version 1: a block per row --------------------------------------
//
// Block b handles row b with 256 threads; thread t reads elements t,
// t + 256, ... (neighbouring threads, neighbouring codes: coalesced).
// Pass 1 adds each logit to the thread's (max, sum); block_merge gives
// every thread the row's; pass 2 reads the row again, writes the gradient
// and, with label smoothing, adds up Σ(z − max) (block_sum); thread 0
// then writes the loss, cross_entropy_of (softmax_math.hpp). Without a
// gradient and without smoothing there is no pass 2. g is *g_ptr when g_ptr
// is not null (the mean's dloss / count, from count_kernel), g_value
// otherwise. Ignored rows write loss 0 and a zero gradient without reading
// a logit.

/// Version 1 of the fused cross-entropy: the row blockIdx.x, as described above.
__global__ void ce_block_kernel(long long classes, const std::uint16_t* __restrict__ logits,
                                const std::int32_t* __restrict__ targets, std::int32_t ignore_index,
                                float eps, const float* __restrict__ g_ptr, float g_value,
                                float* __restrict__ losses, std::uint16_t* __restrict__ dlogits) {
  const long long row = blockIdx.x;
  const long long base = row * classes;
  const std::int32_t y = targets[row];
  const Target kind = classify_target(y, ignore_index, classes);
  if (kind == Target::ignored) {  // the same for every thread of the block: no barrier is skipped
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (dlogits != nullptr)
      for (long long j = threadIdx.x; j < classes; j += kThreadsV1) dlogits[base + j] = 0;
    return;
  }
  MaxSum<float> s;
  for (long long j = threadIdx.x; j < classes; j += kThreadsV1) max_sum_add(s, load16(logits[base + j]));
  s = block_merge<kThreadsV1>(s);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const bool smooth = kind == Target::counted && eps > 0.0f;  // the same for the whole block
  float shifted = 0.0f;                                       // Σ(z − max), for smoothing
  if (dlogits != nullptr || smooth) {
    const float g = dlogits == nullptr ? 0.0f : g_ptr != nullptr ? *g_ptr : g_value;
    const float eps_over_k = eps / static_cast<float>(classes);
    for (long long j = threadIdx.x; j < classes; j += kThreadsV1) {
      const float z = load16(logits[base + j]);
      if (smooth) shifted += z - s.max;
      if (dlogits != nullptr)
        dlogits[base + j] = store16(kind == Target::counted ? grad_of(z, s, j, y, eps, eps_over_k, g) : nan);
    }
    if (smooth) shifted = block_sum<kThreadsV1>(shifted);
  }
  if (threadIdx.x == 0)
    losses[row] =
        kind == Target::counted ? cross_entropy_of(s, load16(logits[base + y]), shifted, classes, eps) : nan;
}

// --- cross-entropy, version 2: 16-byte loads and stores ------------------------------
//
// Why it is faster on long rows:
//  1. Each load moves 16 bytes (8 codes, one uint4) instead of 2: an eighth
//     of the load instructions and address computations, and full 128-byte
//     lines per warp access in one instruction — the loop is then limited
//     by DRAM, not by issuing loads. Requires classes % 8 == 0 and 16-byte
//     aligned rows (the host checks and otherwise runs version 1).
//  2. The hardware fp16 conversions (one instruction each) replace the
//     library's bit-level decode and rounding, which at 8 codes per load
//     would make the kernel compute-bound; their results are the same for
//     every non-NaN value (see store16_hw).
//  3. The second read of the row and the gradient's writes are streaming
//     accesses (__ldcs, __stcs: evict-first): the row was just read, so
//     the second read mostly hits L2 (a row of 32768 codes is 64 KiB; the
//     rows in flight on all SMs fit in the H200's L2), and marking it last
//     use keeps the gradient's writes from pushing other rows out before
//     their second read.
// 512 threads: at K = 32768 each thread then owns 8 uint4 per pass.

/// The 8 fp16 codes of a 16-byte load, widened (little-endian: the low half first).
__device__ __forceinline__ void unpack8(const uint4& v, float (&z)[8]) {
  const unsigned int w[4] = {v.x, v.y, v.z, v.w};
  for (int k = 0; k < 4; ++k) {
    z[2 * k] = load16_hw(static_cast<std::uint16_t>(w[k] & 0xffffu));  // little-endian: low half first
    z[2 * k + 1] = load16_hw(static_cast<std::uint16_t>(w[k] >> 16));
  }
}

/// 8 floats rounded to fp16 codes, packed for one 16-byte store.
__device__ __forceinline__ uint4 pack8(const float (&d)[8]) {
  unsigned int w[4];
  for (int k = 0; k < 4; ++k)
    w[k] = static_cast<unsigned int>(store16_hw(d[2 * k])) |
           (static_cast<unsigned int>(store16_hw(d[2 * k + 1])) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

/// Version 2 of the fused cross-entropy: the row blockIdx.x, ce_block_kernel's
/// steps with 16-byte accesses.
__global__ void ce_vector_kernel(long long classes, const std::uint16_t* __restrict__ logits,
                                 const std::int32_t* __restrict__ targets, std::int32_t ignore_index,
                                 float eps, const float* __restrict__ g_ptr, float g_value,
                                 float* __restrict__ losses, std::uint16_t* __restrict__ dlogits) {
  const long long row = blockIdx.x;
  const long long base = row * classes;
  const long long vectors = classes / 8;
  const auto* in = reinterpret_cast<const uint4*>(logits + base);
  auto* out = reinterpret_cast<uint4*>(dlogits + base);  // not dereferenced when dlogits is null
  const std::int32_t y = targets[row];
  const Target kind = classify_target(y, ignore_index, classes);
  if (kind == Target::ignored) {
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (dlogits != nullptr)
      for (long long v = threadIdx.x; v < vectors; v += kThreadsV2) __stcs(out + v, make_uint4(0, 0, 0, 0));
    return;
  }
  MaxSum<float> s;
  for (long long v = threadIdx.x; v < vectors; v += kThreadsV2) {
    float z[8];
    unpack8(in[v], z);
    for (float zk : z) max_sum_add(s, zk);
  }
  s = block_merge<kThreadsV2>(s);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const bool smooth = kind == Target::counted && eps > 0.0f;  // the same for the whole block
  float shifted = 0.0f;                                       // Σ(z − max), for smoothing
  if (dlogits != nullptr || smooth) {
    const float g = dlogits == nullptr ? 0.0f : g_ptr != nullptr ? *g_ptr : g_value;
    const float eps_over_k = eps / static_cast<float>(classes);
    for (long long v = threadIdx.x; v < vectors; v += kThreadsV2) {
      float z[8], d[8];
      unpack8(__ldcs(in + v), z);
      for (int k = 0; k < 8; ++k) {
        if (smooth) shifted += z[k] - s.max;
        if (dlogits != nullptr)
          d[k] = kind == Target::counted ? grad_of(z[k], s, 8 * v + k, y, eps, eps_over_k, g) : nan;
      }
      if (dlogits != nullptr) __stcs(out + v, pack8(d));
    }
    if (smooth) shifted = block_sum<kThreadsV2>(shifted);
  }
  if (threadIdx.x == 0)
    losses[row] = kind == Target::counted
                      ? cross_entropy_of(s, load16_hw(logits[base + y]), shifted, classes, eps)
                      : nan;
}

// --- masked softmax: a warp per row ----------------------------------------------------
//
// Attention rows are short (a sequence length, often 64 to 2048), so a
// warp per row keeps all 32 lanes busy without a block-wide barrier: the
// reduction is warp_merge and a broadcast, nothing in shared memory. Lane l
// reads columns l, l + 32, ... twice: (max, sum) over the kept ones, then
// the probabilities.
//
// The arithmetic of a position is the CPU attention's, by the same
// functions (attention_math.hpp): its score is attention_math::score — −inf
// where it does not take part, whatever is stored there — and its
// probability attention_math::row_prob: 0 everywhere in a row where nothing
// takes part (sum 0), and NaN everywhere, masked positions included, in a
// row whose kept scores hold a NaN or a +inf (sum NaN). That is PyTorch's
// answer: the math backend of scaled_dot_product_attention adds −inf at
// masked positions and calls at::_safe_softmax, which is softmax (NaN in
// every position of such a row: aten/src/ATen/native/cpu/SoftmaxKernel.cpp,
// max, exp(x − max), sum, times 1/sum) with only the rows of all −inf set
// to 0 (aten/src/ATen/native/transformers/attention.cpp, _safe_softmax and
// _scaled_dot_product_attention_math).

/// Whether column col of row row (element offset) takes part in the softmax.
__device__ __forceinline__ bool kept(const bool* __restrict__ mask, bool causal, long long row, long long col,
                                     long long cols, long long offset) {
  if (mask != nullptr && !mask[offset]) return false;
  return !causal || col <= row % cols;
}

/// The score of a position as the CPU attention forms it: the stored score
/// where it takes part (the scale is in it already, and there is no
/// additive mask), −inf where it does not. A masked code is not read.
__device__ __forceinline__ float score_of(const std::uint16_t* __restrict__ scores, bool keep,
                                          long long offset) {
  return attention_math::score(keep ? load16(scores[offset]) : 0.0f, 1.0f, keep, 0.0f);
}

/// The masked softmax: warp threadIdx.x / 32 of the block takes row
/// blockIdx.x·8 + that warp.
__global__ void masked_softmax_kernel(long long rows, long long cols,
                                      const std::uint16_t* __restrict__ scores, const bool* __restrict__ mask,
                                      bool causal, std::uint16_t* __restrict__ probs) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const long long r = static_cast<long long>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;  // whole warps leave together: the shuffles below see full warps
  const long long base = r * cols;
  MaxSum<float> s;
  for (long long c = lane; c < cols; c += kWarp)
    max_sum_add(s,
                score_of(scores, kept(mask, causal, r, c, cols, base + c), base + c));  // −inf adds nothing
  const MaxSum<float> t = warp_broadcast(warp_merge(s));
  for (long long c = lane; c < cols; c += kWarp)
    probs[base + c] = store16(
        attention_math::row_prob(t, score_of(scores, kept(mask, causal, r, c, cols, base + c), base + c)));
}

// --- masked softmax, version 2: 16-byte loads, hardware conversions -------------------
//
// The same warp per row and the same functions per position, but lane l
// takes the vectors l, l + 32, ... of 8 columns: one 16-byte load brings 8
// scores (and one 8-byte load their 8 mask bytes), converted by the
// hardware (load16_hw, store16_hw: store16's bits for every non-NaN value;
// a NaN probability is stored as 0x7FFF instead of 0x7E00), and the 8
// probabilities leave in one 16-byte store. Why faster: version 1 issues
// a 2-byte load, a 1-byte load and a software decode per column, so it is
// bound by instructions; at L = 1024 a lane here issues 4 loads per pass
// instead of 32. Requires cols % 8 == 0, scores and probs 16-byte aligned
// and the mask 8-byte aligned (the host runs version 1 otherwise). The
// row's (max, sum) is merged in another order than version 1's.

/// Whether each of the 8 columns first, first + 1, ... of row r takes part
/// (mask: the row's mask bytes as 8-byte words, or nullptr; causal: up to
/// column r mod cols).
__device__ __forceinline__ void keep8(const uint2* __restrict__ mask, long long v, bool causal,
                                      long long last, long long first, bool (&keep)[8]) {
  unsigned int m[2] = {0x01010101u, 0x01010101u};
  if (mask != nullptr) {
    const uint2 w = mask[v];
    m[0] = w.x;
    m[1] = w.y;
  }
  for (int k = 0; k < 8; ++k)
    keep[k] = ((m[k / 4] >> (8 * (k % 4))) & 0xffu) != 0 && (!causal || first + k <= last);
}

/// Version 2 of the masked softmax: the row blockIdx.x·8 + warp, with
/// vectors of 8 columns.
__global__ void masked_softmax_vec_kernel(long long rows, long long cols,
                                          const std::uint16_t* __restrict__ scores,
                                          const bool* __restrict__ mask, bool causal,
                                          std::uint16_t* __restrict__ probs) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const long long r = static_cast<long long>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;  // whole warps leave together: the shuffles below see full warps
  const long long base = r * cols, vectors = cols / 8, last = r % cols;
  const auto* in = reinterpret_cast<const uint4*>(scores + base);
  const auto* mk = mask != nullptr ? reinterpret_cast<const uint2*>(mask + base) : nullptr;
  auto* out = reinterpret_cast<uint4*>(probs + base);
  MaxSum<float> s;
  for (long long v = lane; v < vectors; v += kWarp) {
    float z[8];
    bool keep[8];
    unpack8(in[v], z);
    keep8(mk, v, causal, last, 8 * v, keep);
    for (int k = 0; k < 8; ++k) max_sum_add(s, attention_math::score(z[k], 1.0f, keep[k], 0.0f));
  }
  const MaxSum<float> t = warp_broadcast(warp_merge(s));
  for (long long v = lane; v < vectors; v += kWarp) {
    float z[8], p[8];
    bool keep[8];
    unpack8(in[v], z);
    keep8(mk, v, causal, last, 8 * v, keep);
    for (int k = 0; k < 8; ++k)
      p[k] = attention_math::row_prob(t, attention_math::score(z[k], 1.0f, keep[k], 0.0f));
    out[v] = pack8(p);
  }
}

// --- host-side checks -------------------------------------------------------------------

/// Throw std::invalid_argument naming the function and what was wrong.
[[noreturn]] void bad(const char* where, const std::string& what) {
  throw std::invalid_argument(std::string("mpt::cuda::") + where + ": " + what);
}

/// bad(where, what) unless ok.
void require(bool ok, const char* where, const std::string& what) {
  if (!ok) bad(where, what);
}

/// rows >= 0 and cols >= 1 with rows·cols within 64-bit offsets.
void check_sizes(std::int64_t rows, std::int64_t cols, const char* where, const char* cols_name) {
  require(rows >= 0 && cols >= 1, where,
          std::string("rows must be >= 0 and ") + cols_name + " >= 1, got rows = " + std::to_string(rows) +
              ", " + cols_name + " = " + std::to_string(cols));
  if (rows > 0 && rows > INT64_MAX / cols)
    throw std::length_error(std::string("mpt::cuda::") + where + ": " + std::to_string(rows) + " x " +
                            std::to_string(cols) + " has more elements than 64-bit offsets hold");
}

/// A 1-D grid of `blocks` blocks, or std::length_error when it does not fit.
unsigned int grid_of(std::int64_t blocks, const char* where) {
  if (blocks > 0x7fffffffLL)
    throw std::length_error(std::string("mpt::cuda::") + where + ": " + std::to_string(blocks) +
                            " blocks are more than a 1-D grid holds (2^31 - 1)");
  return static_cast<unsigned int>(blocks);
}

}  // namespace

// --- host API ----------------------------------------------------------------------------

void softmax_cross_entropy(std::int64_t rows, std::int64_t classes, const Fp16Code* d_logits,
                           const std::int32_t* d_targets, float dloss, const CrossEntropyOptions& options,
                           float* d_losses, float* d_loss, Fp16Code* d_dlogits, SoftmaxCeVersion v) {
  const char* where = "softmax_cross_entropy";
  check_sizes(rows, classes, where, "classes");
  const float eps = options.label_smoothing;
  require(eps >= 0.0f && eps <= 1.0f, where, "label_smoothing must be in [0, 1], got " + std::to_string(eps));
  const Reduction red = options.reduction;
  require(red == Reduction::none || red == Reduction::mean || red == Reduction::sum, where,
          "reduction must be Reduction::none, mean or sum, got " + std::to_string(static_cast<int>(red)));
  require(v == SoftmaxCeVersion::block_per_row || v == SoftmaxCeVersion::vectorized, where,
          "version must be SoftmaxCeVersion::block_per_row or vectorized, got " +
              std::to_string(static_cast<int>(v)));
  require(red == Reduction::none || d_loss != nullptr, where,
          "Reduction::mean and sum write the loss: d_loss must be a device pointer, not nullptr");
  require(rows == 0 || (d_logits != nullptr && d_targets != nullptr && d_losses != nullptr), where,
          "logits, targets and losses must be device pointers, not nullptr");
  const unsigned int grid = grid_of(rows, where);
  const bool mean = red == Reduction::mean;
  if (grid > 0) {
    const float* g_ptr = nullptr;
    if (mean && d_dlogits != nullptr) {
      count_kernel<<<1, kReduceThreads>>>(rows, d_targets, options.ignore_index, dloss, d_loss);
      detail::check_launch(where);
      g_ptr = d_loss;
    }
    const bool vector_ok = classes % 8 == 0 && detail::aligned(d_logits, 16) &&
                           (d_dlogits == nullptr || detail::aligned(d_dlogits, 16));
    if (v == SoftmaxCeVersion::vectorized && vector_ok)
      ce_vector_kernel<<<grid, kThreadsV2>>>(classes, raw(d_logits), d_targets, options.ignore_index, eps,
                                             g_ptr, dloss, d_losses,
                                             d_dlogits != nullptr ? raw(d_dlogits) : nullptr);
    else
      ce_block_kernel<<<grid, kThreadsV1>>>(classes, raw(d_logits), d_targets, options.ignore_index, eps,
                                            g_ptr, dloss, d_losses,
                                            d_dlogits != nullptr ? raw(d_dlogits) : nullptr);
    detail::check_launch(where);
  }
  if (red != Reduction::none) {
    reduce_kernel<<<1, kReduceThreads>>>(rows, d_losses, d_targets, options.ignore_index, mean, d_loss);
    detail::check_launch(where);
  }
}

void masked_softmax(std::int64_t rows, std::int64_t cols, const Fp16Code* d_scores, const bool* d_mask,
                    bool causal, Fp16Code* d_probs, MaskedSoftmaxVersion v) {
  const char* where = "masked_softmax";
  require(v == MaskedSoftmaxVersion::warp_per_row || v == MaskedSoftmaxVersion::vectorized, where,
          "version must be MaskedSoftmaxVersion::warp_per_row or vectorized, got " +
              std::to_string(static_cast<int>(v)));
  check_sizes(rows, cols, where, "cols");
  require(!causal || rows % cols == 0, where,
          "causal rows are stacked [cols, cols] blocks: rows must be a multiple of cols, got rows = " +
              std::to_string(rows) + ", cols = " + std::to_string(cols));
  if (rows == 0) return;
  require(d_scores != nullptr && d_probs != nullptr, where,
          "scores and probs must be device pointers, not nullptr (mask may be)");
  const unsigned int grid = grid_of(rows / kRowsPerBlock + (rows % kRowsPerBlock != 0 ? 1 : 0), where);
  const bool vector_ok = cols % 8 == 0 && detail::aligned(d_scores, 16) && detail::aligned(d_probs, 16) &&
                         (d_mask == nullptr || detail::aligned(d_mask, 8));
  if (v == MaskedSoftmaxVersion::vectorized && vector_ok)
    masked_softmax_vec_kernel<<<grid, kThreadsV1>>>(rows, cols, raw(d_scores), d_mask, causal, raw(d_probs));
  else masked_softmax_kernel<<<grid, kThreadsV1>>>(rows, cols, raw(d_scores), d_mask, causal, raw(d_probs));
  detail::check_launch(where);
}

}  // namespace mpt::cuda
