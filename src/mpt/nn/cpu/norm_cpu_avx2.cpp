// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the AVX2 loops
// of the CPU forward (norm_cpu.hpp).
// Depends on: norm_cpu.hpp, norm_math.hpp (kSumLanes). Compiled with -mavx2 -mf16c and
// -ffp-contract=off, and only called after cpuid says so.
//
// Statistics: norm_math::add_run_sums and add_run_squares keep 16 lanes of
// double sums; here they are four __m256d, value i of a run going to lane
// i mod 16 as in the portable loop. Every operation is the portable loop's
// IEEE operation on the same operands in the same order (a float widened to
// double, a subtraction, a multiplication, an addition into the lane: no
// fused multiply-add), so every lane gets the portable loop's bits.
// Normalization: norm_math::normalize and scale_shift, the same operations
// in the same order, 8 values at a time.
//
// fp16 is read and written with F16C, as the library's own conversions do
// (formats/rounding_avx2.cpp): widening is exact, and a NaN becomes the
// canonical quiet NaN with its sign, as decode() gives it; rounding is RNE
// with the NaN made canonical again, as encode() writes it. So the values
// are those of load_from and store_as, bit for bit.
//
// Nothing here calls an inline function of a shared header on floats or
// doubles: the copy the linker keeps could be this file's AVX2 one, run on
// any CPU.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "mpt/nn/cpu/norm_cpu.hpp"
#include "mpt/nn/layers/norm_math.hpp"

namespace mpt::detail {
namespace {

/// Whether any lane of v is NaN: the rare case, checked with one compare.
inline bool any_nan(__m256 v) { return _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0; }

/// NaN lanes of v made the canonical quiet NaN with their sign, as decode() gives it.
inline __m256 canonical_nan(__m256 v) {
  const __m256 quiet = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0f)),
                                    _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
  return _mm256_blendv_ps(v, quiet, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

/// Eight fp16 codes widened: exact, NaN as the canonical quiet NaN with its
/// sign (F16C keeps a NaN's payload; decode() does not).
struct LoadF16 {
  __m256 operator()(const std::uint16_t* p) const {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return any_nan(v) ? canonical_nan(v) : v;
  }
};
/// Eight fp16 codes widened, NaN payloads kept (F16C alone): where the
/// payload cannot show — in y rounded to fp16 again, where every NaN becomes
/// canonical (the operations carry a NaN's sign through unchanged).
struct LoadF16Raw {
  __m256 operator()(const std::uint16_t* p) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};
struct LoadF32 {
  __m256 operator()(const float* p) const { return _mm256_loadu_ps(p); }
};

/// Eight floats rounded to fp16 (RNE), NaN as the canonical quiet NaN with
/// its sign, as encode() writes it.
struct StoreF16 {
  void operator()(std::uint16_t* p, __m256 v) const {
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (any_nan(v)) {
      const __m256i nan_lanes = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      const __m128i nan16 =
          _mm_packs_epi32(_mm256_castsi256_si128(nan_lanes), _mm256_extracti128_si256(nan_lanes, 1));
      const __m128i canon =
          _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(static_cast<short>(0x8000))), _mm_set1_epi16(0x7e00));
      h = _mm_blendv_epi8(h, canon, nan16);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
  }
};
/// Eight floats rounded to fp16 (RNE) by F16C alone: encode()'s bits for
/// every value but a NaN with a payload (a NaN without one, such as the
/// default NaN an invalid operation gives, converts to the canonical code).
struct StoreF16Plain {
  void operator()(std::uint16_t* p, __m256 v) const {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};
struct StoreF32 {
  void operator()(float* p, __m256 v) const { _mm256_storeu_ps(p, v); }
};

/// Sixteen values from p widened to double: lanes 0-3, 4-7, 8-11, 12-15.
struct Sixteen {
  __m256d v[4];
};
template <class In, class Load>
inline Sixteen load16(const In* p, Load load) {
  const __m256 a = load(p), b = load(p + 8);
  return {{_mm256_cvtps_pd(_mm256_castps256_ps128(a)), _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)),
           _mm256_cvtps_pd(_mm256_castps256_ps128(b)), _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1))}};
}

inline void load_lanes(const double* lanes, __m256d* acc) {
  for (std::ptrdiff_t k = 0; k < 4; ++k) acc[k] = _mm256_loadu_pd(lanes + 4 * k);
}
inline void store_lanes(const __m256d* acc, double* lanes) {
  for (std::ptrdiff_t k = 0; k < 4; ++k) _mm256_storeu_pd(lanes + 4 * k, acc[k]);
}

static_assert(norm_math::kSumLanes == 16, "the loops below keep 16 lanes in four __m256d");

template <class In, class Load>
std::int64_t sums(const In* x, std::int64_t n, double* lanes, Load load) {
  __m256d acc[4];
  load_lanes(lanes, acc);
  const std::int64_t end = n - n % 16;
  for (std::int64_t i = 0; i < end; i += 16) {
    const Sixteen v = load16(x + i, load);
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_add_pd(acc[k], v.v[k]);
  }
  store_lanes(acc, lanes);
  return end;
}

template <class In, class Load>
std::int64_t squares(const In* x, std::int64_t n, double mean, double* lanes, Load load) {
  __m256d acc[4];
  load_lanes(lanes, acc);
  const __m256d m = _mm256_set1_pd(mean);
  const std::int64_t end = n - n % 16;
  for (std::int64_t i = 0; i < end; i += 16) {
    const Sixteen v = load16(x + i, load);
    for (int k = 0; k < 4; ++k) {
      const __m256d d = _mm256_sub_pd(v.v[k], m);
      acc[k] = _mm256_add_pd(acc[k], _mm256_mul_pd(d, d));
    }
  }
  store_lanes(acc, lanes);
  return end;
}

template <class In, class Out, class Load, class Store>
std::int64_t normalize(const In* x, Out* y, std::int64_t n, const NormalizeRun& r, Load load, Store store) {
  // x̂ = (x − mean)·invstd, y = x̂·γ + β: two roundings each, as the portable
  // loop. One loop per kind of weight, the run's values copied out first
  // (y's stores cannot then be taken to change them).
  const __m256 mean = _mm256_set1_ps(r.mean), invstd = _mm256_set1_ps(r.invstd);
  const float *weight = r.weight, *bias = r.bias;
  const std::int64_t end = n - n % 8;
  if (weight && bias) {
    for (std::int64_t i = 0; i < end; i += 8) {
      const __m256 xhat = _mm256_mul_ps(_mm256_sub_ps(load(x + i), mean), invstd);
      store(y + i,
            _mm256_add_ps(_mm256_mul_ps(xhat, _mm256_loadu_ps(weight + i)), _mm256_loadu_ps(bias + i)));
    }
  } else if (!weight && !bias) {
    const __m256 w = _mm256_set1_ps(r.weight_all), b = _mm256_set1_ps(r.bias_all);
    for (std::int64_t i = 0; i < end; i += 8) {
      const __m256 xhat = _mm256_mul_ps(_mm256_sub_ps(load(x + i), mean), invstd);
      store(y + i, _mm256_add_ps(_mm256_mul_ps(xhat, w), b));
    }
  } else {
    const __m256 w1 = _mm256_set1_ps(r.weight_all), b1 = _mm256_set1_ps(r.bias_all);
    for (std::int64_t i = 0; i < end; i += 8) {
      const __m256 xhat = _mm256_mul_ps(_mm256_sub_ps(load(x + i), mean), invstd);
      const __m256 w = weight ? _mm256_loadu_ps(weight + i) : w1, b = bias ? _mm256_loadu_ps(bias + i) : b1;
      store(y + i, _mm256_add_ps(_mm256_mul_ps(xhat, w), b));
    }
  }
  return end;
}

}  // namespace

std::int64_t add_run_sums_avx2(const float* x, std::int64_t n, double* lanes) {
  return sums(x, n, lanes, LoadF32{});
}
std::int64_t add_run_sums_avx2(const std::uint16_t* x, std::int64_t n, double* lanes) {
  // A NaN's payload would survive into the sums: read as decode() reads.
  return sums(x, n, lanes, LoadF16{});
}
std::int64_t add_run_squares_avx2(const float* x, std::int64_t n, double mean, double* lanes) {
  return squares(x, n, mean, lanes, LoadF32{});
}
std::int64_t add_run_squares_avx2(const std::uint16_t* x, std::int64_t n, double mean, double* lanes) {
  return squares(x, n, mean, lanes, LoadF16{});
}

std::int64_t normalize_run_avx2(const float* x, float* y, std::int64_t n, const NormalizeRun& r) {
  return normalize(x, y, n, r, LoadF32{}, StoreF32{});
}
std::int64_t normalize_run_avx2(const float* x, std::uint16_t* y, std::int64_t n, const NormalizeRun& r) {
  if (!r.nan_payloads) return normalize(x, y, n, r, LoadF32{}, StoreF16Plain{});
  return normalize(x, y, n, r, LoadF32{}, StoreF16{});
}
std::int64_t normalize_run_avx2(const std::uint16_t* x, float* y, std::int64_t n, const NormalizeRun& r) {
  return normalize(x, y, n, r, LoadF16{}, StoreF32{});
}
std::int64_t normalize_run_avx2(const std::uint16_t* x, std::uint16_t* y, std::int64_t n,
                                const NormalizeRun& r) {
  if (!r.nan_payloads) return normalize(x, y, n, r, LoadF16Raw{}, StoreF16Plain{});
  return normalize(x, y, n, r, LoadF16Raw{}, StoreF16{});
}

}  // namespace mpt::detail
