// Chapter 02 — loss scaling and FP32 master weights: the AVX2 loops of
// unscale.hpp. Depends on: unscale.hpp. Compiled with -mavx2 and only called
// after cpuid says so. Eight lanes of scaler_math.hpp's unscale_and_check:
// the same finiteness test on the bits (exponent field all ones) and the same
// single IEEE multiply, so every element gets the bits the portable loop
// gives it, NaN payloads included (tests/cpu/test_ch02_unscale.cpp).
//
// This file calls no inline function from a shared header: an inline
// function compiled here with -mavx2 could be the copy the linker keeps for
// everyone, and then run on a CPU without AVX2. Head and tail elements go
// through masked loads and stores instead.
#include <immintrin.h>

#include <cstdint>

#include "mpt/amp/unscale.hpp"

namespace mpt::detail {
namespace {

/// All-ones lanes where x is ±inf or NaN: the exponent field is all ones.
/// (The mask is built here, not as a namespace-scope constant: a global
/// initialiser would run AVX2 code at start-up, before anyone asked cpuid.)
inline __m256i nonfinite_lanes(__m256 x) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  const __m256i e = _mm256_and_si256(_mm256_castps_si256(x), exp_mask);
  return _mm256_cmpeq_epi32(e, exp_mask);
}

/// Lanes 0..count-1 set (count <= 8).
inline __m256i first_lanes(std::size_t count) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), lane);
}

/// Elements before g + head are handled by one masked step so the vector
/// loop's accesses are 32-byte aligned (none straddles a cache line).
inline std::size_t head_to_align(const float* g, std::size_t n) {
  const std::uintptr_t mis = reinterpret_cast<std::uintptr_t>(g) % 32;
  if (mis % sizeof(float) != 0) return 0;  // can never be 32-byte aligned: run unaligned
  const std::size_t head = mis == 0 ? 0 : (32 - mis) / sizeof(float);
  return head < n ? head : n;
}

/// Up to 8 elements at g with a lane mask: masked-off lanes are neither read
/// (they load as +0, which is finite) nor written.
inline __m256i unscale_check_masked(float* g, std::size_t count, __m256 s) {
  const __m256i m = first_lanes(count);
  const __m256 x = _mm256_maskload_ps(g, m);
  _mm256_maskstore_ps(g, m, _mm256_mul_ps(x, s));
  return nonfinite_lanes(x);
}

}  // namespace

/// AVX2 version of unscale_and_check(g, n, inv_scale): same bits, same verdict.
bool unscale_and_check_avx2(float* g, std::size_t n, float inv_scale) {
  // inv_scale == 1: the per-element function writes nothing, so neither do we.
  if (inv_scale == 1.0f) return any_nonfinite_avx2(g, n);
  const __m256 s = _mm256_set1_ps(inv_scale);
  std::size_t i = head_to_align(g, n);
  __m256i bad0 = i ? unscale_check_masked(g, i, s) : _mm256_setzero_si256();
  __m256i bad1 = _mm256_setzero_si256();
  // Two vectors an iteration: two independent chains hide the load latency.
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(g + i);
    const __m256 b = _mm256_loadu_ps(g + i + 8);
    bad0 = _mm256_or_si256(bad0, nonfinite_lanes(a));
    bad1 = _mm256_or_si256(bad1, nonfinite_lanes(b));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(a, s));
    _mm256_storeu_ps(g + i + 8, _mm256_mul_ps(b, s));
  }
  if (i + 8 <= n) {
    const __m256 a = _mm256_loadu_ps(g + i);
    bad0 = _mm256_or_si256(bad0, nonfinite_lanes(a));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(a, s));
    i += 8;
  }
  if (i < n) bad1 = _mm256_or_si256(bad1, unscale_check_masked(g + i, n - i, s));
  const __m256i bad = _mm256_or_si256(bad0, bad1);
  return !_mm256_testz_si256(bad, bad);
}

/// AVX2 version of the two-pass baseline's first pass (multiply only).
void unscale_avx2(float* g, std::size_t n, float inv_scale) {
  if (inv_scale == 1.0f) return;
  const __m256 s = _mm256_set1_ps(inv_scale);
  std::size_t i = head_to_align(g, n);
  if (i) (void)unscale_check_masked(g, i, s);
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), s));
    _mm256_storeu_ps(g + i + 8, _mm256_mul_ps(_mm256_loadu_ps(g + i + 8), s));
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), s));
  if (i < n) (void)unscale_check_masked(g + i, n - i, s);
}

/// AVX2 version of the two-pass baseline's second pass (inf/NaN anywhere?).
bool any_nonfinite_avx2(const float* g, std::size_t n) {
  std::size_t i = 0;
  // Blocks of 1024 floats (4 KiB) between tests: the hot loop has no
  // data-dependent branch, and a found inf still ends the scan early.
  constexpr std::size_t kBlock = 1024;
  while (i + 32 <= n) {
    const std::size_t end = n - i < kBlock ? i + ((n - i) & ~std::size_t{31}) : i + kBlock;
    __m256i b0 = _mm256_setzero_si256(), b1 = b0, b2 = b0, b3 = b0;
    for (; i < end; i += 32) {
      b0 = _mm256_or_si256(b0, nonfinite_lanes(_mm256_loadu_ps(g + i)));
      b1 = _mm256_or_si256(b1, nonfinite_lanes(_mm256_loadu_ps(g + i + 8)));
      b2 = _mm256_or_si256(b2, nonfinite_lanes(_mm256_loadu_ps(g + i + 16)));
      b3 = _mm256_or_si256(b3, nonfinite_lanes(_mm256_loadu_ps(g + i + 24)));
    }
    const __m256i b = _mm256_or_si256(_mm256_or_si256(b0, b1), _mm256_or_si256(b2, b3));
    if (!_mm256_testz_si256(b, b)) return true;
  }
  __m256i b = _mm256_setzero_si256();
  for (; i + 8 <= n; i += 8) b = _mm256_or_si256(b, nonfinite_lanes(_mm256_loadu_ps(g + i)));
  if (i < n) b = _mm256_or_si256(b, nonfinite_lanes(_mm256_maskload_ps(g + i, first_lanes(n - i))));
  return !_mm256_testz_si256(b, b);
}

}  // namespace mpt::detail
