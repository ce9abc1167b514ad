// Chapter 01 — floating-point formats and their limits: fp32 ⇄ fp16, bf16,
// E4M3, E5M2 casts on the GPU.
// Depends on: mpt/round_element.hpp (the per-element math, shared with the
// CPU reference), mpt/codes.hpp (the typed codes of the API),
// kernels/formats/formats_kernels.hpp (the host API), cuda_check.cuh.
//
// These kernels contain no rounding logic of their own: each element goes
// through mpt::round_to_format + mpt::encode_exact (or mpt::decode), the very
// functions the CPU tests cover, so GPU and CPU agree bit for bit by
// construction and the GPU test checks that nothing got lost on the way.
#include <algorithm>
#include <stdexcept>
#include <type_traits>

#include "kernels/formats/cuda_check.cuh"
#include "kernels/formats/formats_kernels.hpp"
#include "mpt/formats/round_element.hpp"

namespace mpt::cuda {
namespace {

constexpr unsigned int kThreads = 256;

// The cast targets: which format, what overflow does, the code's typed C++
// type at the API (codes.hpp) and the raw integer the kernels move.
// The specs are copied out of mpt::formats so device code can read them as
// compile-time constants (a host variable is not addressable on the device).
struct ToFp16 {
  using Code = Fp16Code;
  using Raw = std::uint16_t;
  static constexpr FormatSpec spec = formats::fp16;
  static constexpr OverflowMode overflow = OverflowMode::infinity;
};
struct ToBf16 {
  using Code = Bf16Code;
  using Raw = std::uint16_t;
  static constexpr FormatSpec spec = formats::bf16;
  static constexpr OverflowMode overflow = OverflowMode::infinity;
};
struct ToE4m3Sat {
  using Code = Fp8E4M3;
  using Raw = std::uint8_t;
  static constexpr FormatSpec spec = formats::e4m3;
  static constexpr OverflowMode overflow = OverflowMode::saturate;
};
struct ToE5m2Sat {
  using Code = Fp8E5M2;
  using Raw = std::uint8_t;
  static constexpr FormatSpec spec = formats::e5m2;
  static constexpr OverflowMode overflow = OverflowMode::saturate;
};

// The one place where typed codes become raw integers, for every cast of
// this file: the host entry points (encode, decode_all below) hand the
// kernels T::Raw pointers. Safe because each code type is a standard-layout
// struct whose only member is that integer, with the integer's size and
// alignment (codes.hpp asserts it, and so does this): a pointer to the code
// is a pointer to its member, and an array of codes is laid out as an array
// of integers. The kernels then need no knowledge of the wrappers.
template <class T>
constexpr bool code_is_raw() {
  using C = typename T::Code;
  using R = typename T::Raw;
  return sizeof(C) == sizeof(R) && alignof(C) == alignof(R) && std::is_standard_layout_v<C> &&
         std::is_trivially_copyable_v<C>;
}
static_assert(code_is_raw<ToFp16>() && code_is_raw<ToBf16>() && code_is_raw<ToE4m3Sat>() &&
                  code_is_raw<ToE5m2Sat>(),
              "a typed code must be exactly its raw integer");

template <class T>
__device__ __forceinline__ typename T::Raw encode_one(float x) {
  constexpr FormatSpec f = T::spec;
  const float r = round_to_format(x, f, RoundingMode::nearest_even, T::overflow, SubnormalMode::keep);
  return static_cast<typename T::Raw>(encode_exact(r, f));
}

template <class T>
__device__ __forceinline__ float decode_one(typename T::Raw c) {
  constexpr FormatSpec f = T::spec;
  return decode(c, f);
}

// Four codes travel as one word: 8 bytes for 16-bit codes, 4 for 8-bit.
// Little-endian, so code j sits at bits [j*w, (j+1)*w) like in memory.
template <class Raw>
struct Pack4;
template <>
struct Pack4<std::uint16_t> {
  using Word = uint2;
  __device__ static Word pack(std::uint16_t a, std::uint16_t b, std::uint16_t c, std::uint16_t d) {
    return make_uint2(a | (static_cast<unsigned int>(b) << 16), c | (static_cast<unsigned int>(d) << 16));
  }
  __device__ static std::uint16_t get(Word w, int j) {
    const unsigned int half = j < 2 ? w.x : w.y;
    return static_cast<std::uint16_t>(half >> (16 * (j & 1)));
  }
};
template <>
struct Pack4<std::uint8_t> {
  using Word = unsigned int;
  __device__ static Word pack(std::uint8_t a, std::uint8_t b, std::uint8_t c, std::uint8_t d) {
    return a | (static_cast<unsigned int>(b) << 8) | (static_cast<unsigned int>(c) << 16) |
           (static_cast<unsigned int>(d) << 24);
  }
  __device__ static std::uint8_t get(Word w, int j) { return static_cast<std::uint8_t>(w >> (8 * j)); }
};

// --- fp32 → codes ----------------------------------------------------------

// Version 1. in: (n,) fp32, out: (n,) codes. Thread i converts element i.
template <class T>
__global__ void encode_simple(const float* __restrict__ in, typename T::Raw* __restrict__ out,
                              std::size_t n) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = encode_one<T>(in[i]);
}

// Version 2. in: (n,) fp32 as (n/4,) float4 + a tail of n%4; out likewise.
// Thread i converts elements 4i..4i+3; threads 0..n%4-1 also take one tail
// element each. Faster because the cast is purely bandwidth-bound and one
// 16-byte load + one 8-byte (or 4-byte) store replaces four of each.
template <class T>
__global__ void encode_vec4(const float* __restrict__ in, typename T::Raw* __restrict__ out, std::size_t n) {
  using P = Pack4<typename T::Raw>;
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t n4 = n / 4;
  if (i < n4) {
    const float4 v = reinterpret_cast<const float4*>(in)[i];
    reinterpret_cast<typename P::Word*>(out)[i] =
        P::pack(encode_one<T>(v.x), encode_one<T>(v.y), encode_one<T>(v.z), encode_one<T>(v.w));
  }
  if (i < n - 4 * n4) out[4 * n4 + i] = encode_one<T>(in[4 * n4 + i]);
}

// --- codes → fp32 ----------------------------------------------------------

// Version 1. in: (n,) codes, out: (n,) fp32. Thread i decodes element i.
template <class T>
__global__ void decode_simple(const typename T::Raw* __restrict__ in, float* __restrict__ out,
                              std::size_t n) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = decode_one<T>(in[i]);
}

// Version 2. Thread i decodes codes 4i..4i+3 read as one word and writes one
// float4; same reason as encode_vec4 (fewer, wider memory transactions).
template <class T>
__global__ void decode_vec4(const typename T::Raw* __restrict__ in, float* __restrict__ out, std::size_t n) {
  using P = Pack4<typename T::Raw>;
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t n4 = n / 4;
  if (i < n4) {
    const typename P::Word w = reinterpret_cast<const typename P::Word*>(in)[i];
    reinterpret_cast<float4*>(out)[i] = make_float4(decode_one<T>(P::get(w, 0)), decode_one<T>(P::get(w, 1)),
                                                    decode_one<T>(P::get(w, 2)), decode_one<T>(P::get(w, 3)));
  }
  if (i < n - 4 * n4) out[4 * n4 + i] = decode_one<T>(in[4 * n4 + i]);
}

// --- host dispatch ---------------------------------------------------------

void check_version(KernelVersion v, const char* where) {
  if (v != KernelVersion::simple && v != KernelVersion::vectorized) {
    throw std::invalid_argument(std::string("mpt::cuda::") + where +
                                ": unknown KernelVersion (choices: simple, vectorized)");
  }
}

template <class T>
void encode(const float* d_in, typename T::Code* d_codes, std::size_t n, KernelVersion v, const char* where) {
  check_version(v, where);
  if (n == 0) return;
  using Raw = typename T::Raw;
  Raw* d_out = reinterpret_cast<Raw*>(d_codes);  // safe: see code_is_raw
  if (v == KernelVersion::vectorized && detail::aligned(d_in, sizeof(float4)) &&
      detail::aligned(d_out, 4 * sizeof(Raw))) {
    const std::size_t threads = std::max(n / 4, n % 4);
    encode_vec4<T><<<detail::blocks_for(threads, kThreads, where), kThreads>>>(d_in, d_out, n);
  } else {
    encode_simple<T><<<detail::blocks_for(n, kThreads, where), kThreads>>>(d_in, d_out, n);
  }
  detail::check_launch(where);
}

template <class T>
void decode_all(const typename T::Code* d_codes, float* d_out, std::size_t n, KernelVersion v,
                const char* where) {
  check_version(v, where);
  if (n == 0) return;
  using Raw = typename T::Raw;
  const Raw* d_in = reinterpret_cast<const Raw*>(d_codes);  // safe: see code_is_raw
  if (v == KernelVersion::vectorized && detail::aligned(d_in, 4 * sizeof(Raw)) &&
      detail::aligned(d_out, sizeof(float4))) {
    const std::size_t threads = std::max(n / 4, n % 4);
    decode_vec4<T><<<detail::blocks_for(threads, kThreads, where), kThreads>>>(d_in, d_out, n);
  } else {
    decode_simple<T><<<detail::blocks_for(n, kThreads, where), kThreads>>>(d_in, d_out, n);
  }
  detail::check_launch(where);
}

}  // namespace

void cast_fp32_to_fp16(const float* d_in, Fp16Code* d_out, std::size_t n, KernelVersion v) {
  encode<ToFp16>(d_in, d_out, n, v, "cast_fp32_to_fp16");
}
void cast_fp16_to_fp32(const Fp16Code* d_in, float* d_out, std::size_t n, KernelVersion v) {
  decode_all<ToFp16>(d_in, d_out, n, v, "cast_fp16_to_fp32");
}
void cast_fp32_to_bf16(const float* d_in, Bf16Code* d_out, std::size_t n, KernelVersion v) {
  encode<ToBf16>(d_in, d_out, n, v, "cast_fp32_to_bf16");
}
void cast_bf16_to_fp32(const Bf16Code* d_in, float* d_out, std::size_t n, KernelVersion v) {
  decode_all<ToBf16>(d_in, d_out, n, v, "cast_bf16_to_fp32");
}
void cast_fp32_to_e4m3_sat(const float* d_in, Fp8E4M3* d_out, std::size_t n, KernelVersion v) {
  encode<ToE4m3Sat>(d_in, d_out, n, v, "cast_fp32_to_e4m3_sat");
}
void cast_e4m3_to_fp32(const Fp8E4M3* d_in, float* d_out, std::size_t n, KernelVersion v) {
  decode_all<ToE4m3Sat>(d_in, d_out, n, v, "cast_e4m3_to_fp32");
}
void cast_fp32_to_e5m2_sat(const float* d_in, Fp8E5M2* d_out, std::size_t n, KernelVersion v) {
  encode<ToE5m2Sat>(d_in, d_out, n, v, "cast_fp32_to_e5m2_sat");
}
void cast_e5m2_to_fp32(const Fp8E5M2* d_in, float* d_out, std::size_t n, KernelVersion v) {
  decode_all<ToE5m2Sat>(d_in, d_out, n, v, "cast_e5m2_to_fp32");
}

}  // namespace mpt::cuda
