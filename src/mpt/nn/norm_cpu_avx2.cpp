// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the AVX2 loops
// of the CPU forward (norm_cpu.hpp).
// Depends on: norm_cpu.hpp, norm_math.hpp (lane_block_statistics),
// welford.hpp (welford_add, welford_merge). Compiled with -mavx2 -mf16c and
// -ffp-contract=off, and only called after cpuid says so.
//
// Statistics: norm_math::run_lane_statistics keeps 8 lanes of Welford
// statistics; here the 8 lanes are the 8 floats of one __m256, and the very
// templates of welford.hpp and norm_math.hpp run on it. Lanes is a type
// with the operators they use, one IEEE operation per lane each (no fused
// multiply-add: the portable loop has none), so every lane gets the bits the
// portable loop gives it. All lanes see the same counts, which Welford keeps
// once. Normalization: norm_math::normalize and scale_shift, the same
// operations in the same order, 8 values at a time.
//
// fp16 is read and written with F16C, as the library's own conversions do
// (formats/rounding_avx2.cpp): widening is exact, and a NaN becomes the
// canonical quiet NaN with its sign, as decode() gives it; rounding is RNE
// with the NaN made canonical again, as encode() writes it. So the values
// are those of load_from and store_as, bit for bit.
//
// The templates are instantiated here only with this file's own types:
// those copies cannot be the ones the linker keeps for float elsewhere
// (which would run AVX2 code on any CPU). For the same reason nothing here
// constructs a Welford<float> or calls an inline function of a shared header
// on floats; the lanes are written out field by field.
#include <immintrin.h>

#include <cstdint>

#include "mpt/nn/norm_cpu.hpp"
#include "mpt/nn/norm_math.hpp"
#include "mpt/nn/welford.hpp"

namespace mpt::detail {
namespace {

/// Eight floats, one per lane of norm_math::run_lane_statistics.
struct Lanes {
  __m256 v;
  explicit Lanes(__m256 x) : v(x) {}
  /// A count (or 0) in every lane, converted as static_cast<float> does.
  explicit Lanes(std::int64_t n) : v(_mm256_set1_ps(static_cast<float>(n))) {}
};

inline Lanes operator+(Lanes a, Lanes b) { return Lanes(_mm256_add_ps(a.v, b.v)); }
inline Lanes operator-(Lanes a, Lanes b) { return Lanes(_mm256_sub_ps(a.v, b.v)); }
inline Lanes operator*(Lanes a, Lanes b) { return Lanes(_mm256_mul_ps(a.v, b.v)); }
inline Lanes operator/(Lanes a, Lanes b) { return Lanes(_mm256_div_ps(a.v, b.v)); }
inline Lanes& operator+=(Lanes& a, Lanes b) { return a = a + b; }

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
/// canonical (the operations carry a NaN's sign through unchanged), and in
/// statistics that are read again when a NaN turns up.
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

template <class In, class Load>
Welford<Lanes> lane_statistics(const In* x, std::int64_t blocks, Load load) {
  Welford<Lanes> acc;
  for (std::int64_t b = 0; b < blocks; ++b) {
    const In* p = x + b * norm_math::kRunBlock;
    // Vector t holds x[64·b + 8·t + k] in lane k: lane k's t-th value.
    acc = welford_merge(acc, norm_math::lane_block_statistics<Lanes>([p, load](std::int64_t t) {
                          return Lanes(load(p + t * norm_math::kRunLanes));
                        }));
  }
  return acc;
}

void store_lanes(const Welford<Lanes>& acc, Welford<float>* lanes) {
  alignas(32) float mean[norm_math::kRunLanes], m2[norm_math::kRunLanes];
  _mm256_store_ps(mean, acc.mean.v);
  _mm256_store_ps(m2, acc.m2.v);
  for (int k = 0; k < norm_math::kRunLanes; ++k) {
    lanes[k].count = acc.count;
    lanes[k].mean = mean[k];
    lanes[k].m2 = m2[k];
  }
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

void run_lane_statistics_avx2(const float* x, std::int64_t blocks, Welford<float>* lanes) {
  store_lanes(lane_statistics(x, blocks, LoadF32{}), lanes);
}

void run_lane_statistics_avx2(const std::uint16_t* x, std::int64_t blocks, Welford<float>* lanes) {
  // A NaN read from x stays in its lane's mean to the end, and nothing else
  // in the result depends on which NaN it was. So the loop reads with F16C
  // alone, and only a run that ends with a NaN lane is read again with
  // every NaN made canonical, as decode() gives it: its bits then are the
  // portable loop's too.
  Welford<Lanes> acc = lane_statistics(x, blocks, LoadF16Raw{});
  if (any_nan(acc.mean.v) || any_nan(acc.m2.v)) acc = lane_statistics(x, blocks, LoadF16{});
  store_lanes(acc, lanes);
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
