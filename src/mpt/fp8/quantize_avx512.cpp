// Chapter 07 — FP8 training: the AVX-512 loops of quantize_raw.hpp's fast
// path, sixteen lanes at a time. Compiled with -mavx512f and only called
// after cpuid says so (quantize_raw.cpp: widest()).
// Depends on: quantize_simd.hpp (the standard library only; see there why).
//
// Lane for lane the arithmetic of quantize_avx2.cpp, whose comment says why
// it gives quantize_element's bits; here the lane masks are mask registers.
// tests/cpu/test_ch07_quantize_raw_avx512.cpp holds every lane to the
// portable loop's bits and counts.
//
// Why it is shaped as it is (bench_ch07_quantize on a Xeon with a 480 MiB
// last-level cache, 1 GiB of input): in the cache the loop runs at about
// the speed memcpy reaches out of it, but out of the cache its time was the
// sum of its arithmetic and of waiting for memory (0.3-0.45x memcpy). What
// makes the two overlap, and the arithmetic smaller:
//  - every cache line of x is prefetched, about 2 KiB ahead (the first
//    version asked for one line in two);
//  - the per-tensor loop walks four parts of x at once: four streams keep
//    more lines in flight than one (about 0.56x memcpy with one, 0.7x with
//    four, measured side by side);
//  - MX blocks go sixteen at a time (512 values): their 16 amaxes by one
//    transposing reduction, their E8M0 codes and scales as one vector,
//    instead of a horizontal maximum and scalar code per block;
//  - the amax loads of a stream's next 16 blocks are issued while this
//    group's codes are computed (software pipelining): with the two passes
//    one after the other, the second (codes, from L1) filled the reorder
//    window and the next group's loads waited behind it (0.47x memcpy;
//    pipelined, 0.55x and more);
//  - the encode does fewer operations: |x| is computed once, for the amax
//    and the encode (|x × s| = |x| × s: IEEE multiplication is symmetric in
//    sign; the code's sign is x's, as s > 0), the counts are masked vector
//    increments, and the sign goes in by one ternary-logic operation.
// Streaming (non-temporal) stores for the codes were tried: a few percent at
// most, not worth evicting codes that a GEMM reads next.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "mpt/fp8/quantize_simd.hpp"

namespace mpt::fp8::detail {
namespace {

/// The encode's constants as vectors (built per call, not at namespace scope:
/// a global initialiser would run AVX-512 code at start-up).
struct Consts {
  __m512i abs_mask, round_rebias, one, minus_one, min_normal, max_code, beyond_code, nan_code, inf_bits,
      magic_bits, sign_byte;
  __m512 magic;
  explicit Consts(const Fp8Encode& k, int shift) {
    abs_mask = _mm512_set1_epi32(0x7fffffff);
    round_rebias = _mm512_set1_epi32(static_cast<int>(((1u << (shift - 1)) - 1u) - (k.rebias << shift)));
    one = _mm512_set1_epi32(1);
    minus_one = _mm512_set1_epi32(-1);
    min_normal = _mm512_set1_epi32(static_cast<int>(k.min_normal));
    max_code = _mm512_set1_epi32(static_cast<int>(k.max_code));
    beyond_code = _mm512_set1_epi32(static_cast<int>(k.saturate ? k.max_code : k.overflow_code));
    nan_code = _mm512_set1_epi32(static_cast<int>(k.nan_code));
    inf_bits = _mm512_set1_epi32(0x7f800000);
    magic = _mm512_set1_ps(k.subnormal_magic);
    magic_bits = _mm512_castps_si512(magic);
    sign_byte = _mm512_set1_epi32(0x80);
  }
};

/// Lane counters of the counted outcomes (over: beyond max or NaN; beyond =
/// over − nan). A lane counts at most one value in sixteen: 32 bits hold
/// 2^36 values, more than any call here is given.
struct Counters {
  __m512i over = _mm512_setzero_si512(), nan = _mm512_setzero_si512(), flushed = _mm512_setzero_si512();
};

inline std::size_t lane_sum(__m512i v) {
  alignas(64) std::uint32_t l[16];
  _mm512_store_si512(l, v);
  std::size_t s = 0;
  for (std::uint32_t x : l) s += x;
  return s;
}

inline void add_counts(const Counters& n, RawCounts& c) {
  const std::size_t nan = lane_sum(n.nan);
  c.beyond += lane_sum(n.over) - nan;
  c.nan += nan;
  c.flushed += lane_sum(n.flushed);
}

inline __m512i abs_bits(__m512i xb, const Consts& k) { return _mm512_and_si512(xb, k.abs_mask); }

/// Sixteen codes of x × s, as bytes, from xb (the bits of x) and ax (those
/// of |x|). Shift = 23 − m.
template <int Shift>
inline __m128i encode16(__m512i ax, __m512i xb, __m512 s, const Consts& k, Counters& n) {
  const __m512i a = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(ax), s));  // |x × s|
  const __m512i last = _mm512_and_si512(_mm512_srli_epi32(a, Shift), k.one);
  const __m512i normal =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(a, k.round_rebias), last), Shift);
  const __m512i sub =
      _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), k.magic)), k.magic_bits);
  __m512i mag = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(k.min_normal, a), normal, sub);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(a, k.inf_bits);
  const __mmask16 over = _mm512_cmpgt_epi32_mask(mag, k.max_code);  // beyond max, or NaN
  mag = _mm512_mask_mov_epi32(mag, over, k.beyond_code);
  mag = _mm512_mask_mov_epi32(mag, nan, k.nan_code);
  // flushed: a zero code where x != 0 as C++ reads it (|x|'s bits not zero;
  // true for NaN, but a NaN's code is never 0)
  const __mmask16 flushed = _mm512_mask_testn_epi32_mask(_mm512_test_epi32_mask(ax, ax), mag, mag);
  n.over = _mm512_mask_sub_epi32(n.over, over, n.over, k.minus_one);
  n.nan = _mm512_mask_sub_epi32(n.nan, nan, n.nan, k.minus_one);
  n.flushed = _mm512_mask_sub_epi32(n.flushed, flushed, n.flushed, k.minus_one);
  // mag | (x's sign bit, shifted to the code's bit 7): ternary logic A | (B & C)
  return _mm512_cvtepi32_epi8(_mm512_ternarylogic_epi32(mag, _mm512_srli_epi32(xb, 24), k.sign_byte, 0xF8));
}

inline __m512i load_bits(const float* p) { return _mm512_castps_si512(_mm512_loadu_ps(p)); }

/// running raised to |x| (its bits ax) lane by lane; a NaN |x| leaves
/// running as it is (VMAXPS returns its second operand when either is NaN).
inline __m512 amax_lanes(__m512 running, __m512i ax) {
  return _mm512_max_ps(_mm512_castsi512_ps(ax), running);
}

/// Ask the cache for the two lines of the 32 floats at p (a prefetch never faults).
inline void prefetch32(const float* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(p + 16), _MM_HINT_T0);
}

/// Floats ahead that the per-tensor loop prefetches: about the memory
/// latency's worth of lines at the rate the loop consumes them.
constexpr std::size_t kPrefetch = 512;

template <int Shift>
float tensor_loop(const float* x, std::size_t n, float scale, std::uint8_t* codes, const Consts& kc,
                  RawCounts& c) {
  const Consts k = kc;  // a local copy: the byte stores to codes may alias kc
  const __m512 s = _mm512_set1_ps(scale);
  Counters cnt;
  __m512 m0 = _mm512_setzero_ps(), m1 = m0;
  // 32 values at i: their codes, their |x| into the running amaxes.
  const auto step = [&](std::size_t i) {
    prefetch32(x + i + kPrefetch);
    const __m512i x0 = load_bits(x + i), x1 = load_bits(x + i + 16);
    const __m512i a0 = abs_bits(x0, k), a1 = abs_bits(x1, k);
    m0 = amax_lanes(m0, a0);
    m1 = amax_lanes(m1, a1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), encode16<Shift>(a0, x0, s, k, cnt));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i + 16), encode16<Shift>(a1, x1, s, k, cnt));
  };
  // Four streams: x in four equal parts of whole 32-value steps, walked in
  // step; what is left over goes after, 32 at a time, then the tail.
  const std::size_t q = n / 128 * 32;
  for (std::size_t i = 0; i < q; i += 32) {
    step(i);
    step(q + i);
    step(2 * q + i);
    step(3 * q + i);
  }
  std::size_t i = 4 * q;
  for (; i + 32 <= n; i += 32) step(i);
  for (; i < n; i += 16) {
    // The tail, sixteen at a time through masked loads and stores: masked-off
    // lanes read as 0, which has code 0, counts nothing and raises no amax.
    const std::size_t m = n - i < 16 ? n - i : 16;
    const __mmask16 live = static_cast<__mmask16>((1u << m) - 1u);
    const __m512i x0 = _mm512_castps_si512(_mm512_maskz_loadu_ps(live, x + i));
    const __m512i a0 = abs_bits(x0, k);
    m0 = amax_lanes(m0, a0);
    std::uint8_t ct[16];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(ct), encode16<Shift>(a0, x0, s, k, cnt));
    std::memcpy(codes + i, ct, m);  // (byte-masked stores would need AVX-512BW)
  }
  add_counts(cnt, c);
  return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

/// mx_scale_code(amax, f, rule) from Fp8Encode's numbers, as quantize_avx2.cpp's.
inline std::uint32_t scale_code(float amax, bool floor_rule, const Fp8Encode& k) {
  std::uint32_t u;
  if (floor_rule) {
    std::memcpy(&u, &amax, 4);
    int e = static_cast<int>((u >> 23) & 0xffu) - 127 - k.emax;
    e = e < -127 ? -127 : (e > 127 ? 127 : e);
    return static_cast<std::uint32_t>(e + 127);
  }
  const float v = amax * k.max_norm_rcp;
  std::memcpy(&u, &v, 4);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return 0xFE;  // inf (NaN cannot occur)
  std::uint32_t exponent = a >> 23;
  const std::uint32_t mantissa = a & 0x7fffffu;
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
  return exponent;
}

/// e8m0_reciprocal(code) for a code that is not NaN: 2^(127 − code), exact.
inline float scale_of(std::uint32_t code) {
  const std::uint32_t c = 254 - code;
  const std::uint32_t u = c == 0 ? 0x00400000u : c << 23;
  float s;
  std::memcpy(&s, &u, 4);
  return s;
}

/// The blocks of one row from x on, one at a time (cols values, the last
/// block possibly short): what is left of a row after its whole groups of
/// sixteen blocks (mx_groups).
template <int Shift>
void mx_blocks(const float* x, std::size_t cols, bool floor_rule, std::uint8_t* codes, std::uint8_t* e8m0,
               float* block_amax, const Fp8Encode& ek, const Consts& kc, Counters& counters) {
  const Consts k = kc;  // see mx_groups
  Counters cnt = counters;
  const std::size_t blocks = (cols + 31) / 32;
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t i = 32 * b, m = cols - i < 32 ? cols - i : 32;
    const __mmask16 lo = static_cast<__mmask16>(m >= 16 ? 0xffffu : (1u << m) - 1u);
    const __mmask16 hi = static_cast<__mmask16>(m >= 32 ? 0xffffu : (m > 16 ? (1u << (m - 16)) - 1u : 0u));
    const __m512i x0 = _mm512_castps_si512(_mm512_maskz_loadu_ps(lo, x + i));
    const __m512i x1 = _mm512_castps_si512(_mm512_maskz_loadu_ps(hi, x + i + 16));
    const __m512i a0 = abs_bits(x0, k), a1 = abs_bits(x1, k);
    const float amax = _mm512_reduce_max_ps(amax_lanes(amax_lanes(_mm512_setzero_ps(), a0), a1));
    const std::uint32_t code = scale_code(amax, floor_rule, ek);
    e8m0[b] = static_cast<std::uint8_t>(code);
    if (block_amax != nullptr) block_amax[b] = amax;
    const __m512 s = _mm512_set1_ps(scale_of(code));
    std::uint8_t ct[32];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(ct), encode16<Shift>(a0, x0, s, k, cnt));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(ct + 16), encode16<Shift>(a1, x1, s, k, cnt));
    std::memcpy(codes + i, ct, m);  // (byte-masked stores would need AVX-512BW)
  }
  counters = cnt;
}

/// Values in a group: sixteen whole MX blocks.
constexpr std::size_t kGroup = 512;

/// One block's 32 values as 16 lane maxima of |x|, NaN ignored (so from 0:
/// VMAXPS gives its second operand, the running maximum, when either is NaN).
inline __m512 block_lanes(const float* p, const Consts& k) {
  return amax_lanes(amax_lanes(_mm512_setzero_ps(), abs_bits(load_bits(p), k)),
                    abs_bits(load_bits(p + 16), k));
}

template <int I, int J>
inline __m512 max_of_f32x4(__m512 a, __m512 b) {
  return _mm512_max_ps(_mm512_shuffle_f32x4(a, b, I), _mm512_shuffle_f32x4(a, b, J));
}
template <int I, int J>
inline __m512 max_of_ps(__m512 a, __m512 b) {
  return _mm512_max_ps(_mm512_shuffle_ps(a, b, I), _mm512_shuffle_ps(a, b, J));
}

/// The sixteen blocks' amaxes, in order, from their lane maxima m[0..16):
/// a transposing reduction (each level halves the lanes a block holds and
/// doubles the blocks a vector holds; 15 maxima in all), then one
/// permutation into block order. No value is NaN, so the order of the
/// maxima does not matter.
inline __m512 group_amax(const __m512* m, __m512i order) {
  __m512 p[8], q[4], r[2];
  for (std::size_t j = 0; j < 8; ++j)
    p[j] = max_of_f32x4<0x44, 0xEE>(m[2 * j], m[2 * j + 1]);  // 8 lanes a block
  for (std::size_t j = 0; j < 4; ++j) q[j] = max_of_f32x4<0x88, 0xDD>(p[2 * j], p[2 * j + 1]);  // 4 lanes
  for (std::size_t j = 0; j < 2; ++j) r[j] = max_of_ps<0x44, 0xEE>(q[2 * j], q[2 * j + 1]);     // 2 lanes
  // lane 4·l + i of the last level holds block 4·i + l
  return _mm512_permutexvar_ps(order, max_of_ps<0x88, 0xDD>(r[0], r[1]));
}

/// scale_code for sixteen amaxes (none NaN, none negative).
inline __m512i scale_codes(__m512 amax, bool floor_rule, const Fp8Encode& e, const Consts& k) {
  if (floor_rule) {
    // the exponent field − emax, clamped to [0, 254] (e + 127, e in [-127, 127])
    const __m512i field = _mm512_srli_epi32(_mm512_castps_si512(amax), 23);
    return _mm512_min_epi32(
        _mm512_max_epi32(_mm512_sub_epi32(field, _mm512_set1_epi32(e.emax)), _mm512_setzero_si512()),
        _mm512_set1_epi32(254));
  }
  const __m512i a = _mm512_castps_si512(_mm512_mul_ps(amax, _mm512_set1_ps(e.max_norm_rcp)));
  const __m512i exponent = _mm512_srli_epi32(a, 23),
                mantissa = _mm512_and_si512(a, _mm512_set1_epi32(0x7fffff));
  const __mmask16 up =
      _mm512_test_epi32_mask(mantissa, mantissa) &
      _mm512_cmpneq_epi32_mask(exponent, _mm512_set1_epi32(0xFE)) &
      static_cast<__mmask16>(~(_mm512_cmpeq_epi32_mask(exponent, _mm512_setzero_si512()) &
                               _mm512_cmple_epi32_mask(mantissa, _mm512_set1_epi32(0x400000))));
  const __m512i code = _mm512_mask_add_epi32(exponent, up, exponent, k.one);
  return _mm512_mask_mov_epi32(code, _mm512_cmpge_epi32_mask(a, k.inf_bits), _mm512_set1_epi32(0xFE));
}

/// scale_of for sixteen codes.
inline __m512 scales_of(__m512i code) {
  const __m512i c = _mm512_sub_epi32(_mm512_set1_epi32(254), code);
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(_mm512_slli_epi32(c, 23),
                                                   _mm512_cmpeq_epi32_mask(c, _mm512_setzero_si512()),
                                                   _mm512_set1_epi32(0x00400000)));
}

/// Floats ahead that the group loop prefetches: two groups.
constexpr std::size_t kGroupPrefetch = 2 * kGroup;

/// NS streams of q whole groups each, stream s starting at group s·q of x
/// (codes, e8m0 and block_amax at the matching places), walked in step.
/// Software-pipelined: while a group's codes are computed, the loads of the
/// same stream's next group give its lane maxima.
template <int Shift, int NS>
void mx_groups(const float* x, std::size_t q, bool floor_rule, std::uint8_t* codes, std::uint8_t* e8m0,
               float* block_amax, const Fp8Encode& ek, const Consts& kc, Counters& counters) {
  // Local copies: the byte stores to codes may alias anything reached by
  // reference, which would send the constants and the counters through
  // memory at every store.
  const Consts k = kc;
  const Fp8Encode e = ek;
  Counters cnt = counters;
  alignas(64) std::int32_t order_lanes[16];
  for (int j = 0; j < 16; ++j) order_lanes[j] = 4 * (j % 4) + j / 4;
  const __m512i order = _mm512_load_si512(order_lanes);
  __m512 m[NS][16];  // each stream's next group: lane maxima of its blocks
  for (int s = 0; s < NS; ++s)
    for (std::size_t b = 0; b < 16; ++b) m[s][b] = block_lanes(x + s * q * kGroup + 32 * b, k);
  for (std::size_t g = 0; g < q; ++g)
    for (int s = 0; s < NS; ++s) {
      const std::size_t at = s * q + g;  // the group
      const float* xg = x + at * kGroup;
      std::uint8_t* cg = codes + at * kGroup;
      const __m512 amax = group_amax(m[s], order);
      const __m512i code = scale_codes(amax, floor_rule, e, k);
      alignas(64) float scale[16];
      _mm512_store_ps(scale, scales_of(code));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(e8m0 + 16 * at), _mm512_cvtepi32_epi8(code));
      if (block_amax != nullptr) _mm512_storeu_ps(block_amax + 16 * at, amax);
      const bool next = g + 1 < q;
      for (std::size_t b = 0; b < 16; ++b) {
        prefetch32(xg + 32 * b + kGroupPrefetch);
        if (next) m[s][b] = block_lanes(xg + kGroup + 32 * b, k);
        const __m512 sb = _mm512_set1_ps(scale[b]);
        const __m512i x0 = load_bits(xg + 32 * b), x1 = load_bits(xg + 32 * b + 16);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(cg + 32 * b),
                         encode16<Shift>(abs_bits(x0, k), x0, sb, k, cnt));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(cg + 32 * b + 16),
                         encode16<Shift>(abs_bits(x1, k), x1, sb, k, cnt));
      }
    }
  counters = cnt;
}

/// groups whole groups from x on: two streams, and the one group an odd
/// count leaves over.
template <int Shift>
void mx_group_run(const float* x, std::size_t groups, bool floor_rule, std::uint8_t* codes,
                  std::uint8_t* e8m0, float* block_amax, const Fp8Encode& e, const Consts& k, Counters& cnt) {
  const std::size_t q = groups / 2, done = 2 * q;
  if (q > 0) mx_groups<Shift, 2>(x, q, floor_rule, codes, e8m0, block_amax, e, k, cnt);
  if (done < groups)
    mx_groups<Shift, 1>(x + done * kGroup, groups - done, floor_rule, codes + done * kGroup, e8m0 + 16 * done,
                        block_amax != nullptr ? block_amax + 16 * done : nullptr, e, k, cnt);
}

template <int Shift>
void mx_matrix(const float* x, std::size_t rows, std::size_t cols, bool floor_rule, std::uint8_t* codes,
               std::uint8_t* e8m0, float* block_amax, const Fp8Encode& ek, const Consts& kc, RawCounts& c) {
  const Consts k = kc;  // see tensor_loop
  const Fp8Encode e = ek;
  Counters cnt;
  const std::size_t per_row = (cols + 31) / 32;
  if (cols % kGroup == 0) {
    // Rows of whole groups lie end to end: one run of groups over them all.
    mx_group_run<Shift>(x, rows * (cols / kGroup), floor_rule, codes, e8m0, block_amax, e, k, cnt);
  } else {
    const std::size_t whole = cols / kGroup;
    for (std::size_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      std::uint8_t* cr = codes + r * cols;
      std::uint8_t* er = e8m0 + r * per_row;
      float* ar = block_amax != nullptr ? block_amax + r * per_row : nullptr;
      mx_group_run<Shift>(xr, whole, floor_rule, cr, er, ar, e, k, cnt);
      const std::size_t at = whole * kGroup;
      mx_blocks<Shift>(xr + at, cols - at, floor_rule, cr + at, er + 16 * whole,
                       ar != nullptr ? ar + 16 * whole : nullptr, e, k, cnt);
    }
  }
  add_counts(cnt, c);
}

}  // namespace

float amax_avx512(const float* x, std::size_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const auto abs_of = [abs_mask](__m512 v) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), abs_mask));
  };
  // Four independent chains; VMAXPS(|x|, running) keeps running when |x| is NaN.
  __m512 m0 = _mm512_setzero_ps(), m1 = m0, m2 = m0, m3 = m0;
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    m0 = _mm512_max_ps(abs_of(_mm512_loadu_ps(x + i)), m0);
    m1 = _mm512_max_ps(abs_of(_mm512_loadu_ps(x + i + 16)), m1);
    m2 = _mm512_max_ps(abs_of(_mm512_loadu_ps(x + i + 32)), m2);
    m3 = _mm512_max_ps(abs_of(_mm512_loadu_ps(x + i + 48)), m3);
  }
  for (; i < n; i += 16) {  // masked-off lanes read as 0, which raises nothing
    const std::size_t m = n - i < 16 ? n - i : 16;
    m0 = _mm512_max_ps(abs_of(_mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << m) - 1u), x + i)), m0);
  }
  return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
}

float quantize_tensor_avx512(const float* x, std::size_t n, float scale, std::uint8_t* codes,
                             const Fp8Encode& k, RawCounts& c) {
  const Consts v(k, 23 - k.mantissa_bits);
  return k.mantissa_bits == 3 ? tensor_loop<20>(x, n, scale, codes, v, c)
                              : tensor_loop<21>(x, n, scale, codes, v, c);
}

void quantize_mx_avx512(const float* x, std::size_t rows, std::size_t cols, bool floor_rule,
                        std::uint8_t* codes, std::uint8_t* e8m0, float* block_amax, const Fp8Encode& k,
                        RawCounts& c) {
  const Consts v(k, 23 - k.mantissa_bits);
  if (k.mantissa_bits == 3) {
    mx_matrix<20>(x, rows, cols, floor_rule, codes, e8m0, block_amax, k, v, c);
  } else {
    mx_matrix<21>(x, rows, cols, floor_rule, codes, e8m0, block_amax, k, v, c);
  }
}

}  // namespace mpt::fp8::detail
