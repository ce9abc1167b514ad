// Chapter 02 — loss scaling and FP32 master weights: GEMM as a GPU does it.
// Depends on: gemm.hpp; Chapter 1's rounding (the fp16-accumulate pitfall),
// cpu_dispatch.hpp (the choice of the AVX2 micro-kernel), the AVX-512 one
// (gemm_avx512.cpp) where the CPU has it.
#include "mpt/nn/cpu/gemm.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <vector>

#include "mpt/formats/cpu_dispatch.hpp"
#include "mpt/formats/rounding.hpp"

namespace mpt {

void require_inner_match(const char* who, Eigen::Index ra, Eigen::Index ca, Op op_a, Eigen::Index rb,
                         Eigen::Index cb, Op op_b) {
  const Eigen::Index inner_a = op_a == Op::N ? ca : ra;
  const Eigen::Index inner_b = op_b == Op::N ? rb : cb;
  if (inner_a != inner_b)
    throw std::invalid_argument(std::string(who) + ": op(a) is " +
                                shape_string(op_a == Op::N ? ra : ca, inner_a) + " but op(b) is " +
                                shape_string(inner_b, op_b == Op::N ? cb : rb));
}

namespace {

constexpr std::int64_t kMR = kGemmMR, kNR = kGemmNR, kKC = kGemmKC, kMC = kGemmMC, kNC = kGemmNC;

/// A growing, 64-byte aligned buffer per thread for the packed panels.
template <typename T>
class PackBuffer {
 public:
  T* get(std::int64_t n) {
    const auto want = static_cast<std::size_t>(n);
    if (want > capacity_) {
      data_.reset(static_cast<T*>(std::aligned_alloc(64, (want * sizeof(T) + 63) / 64 * 64)));
      if (!data_) throw std::bad_alloc();
      capacity_ = want;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  std::size_t capacity_ = 0;
};

/// The portable micro-kernel: the tile's kMR × kNR chains in an array, one
/// std::fma per step, k in order — what gemm_micro_avx2 does in registers.
template <typename T>
void micro_portable(std::int64_t kc, const T* ap, const T* bp, T* c, std::int64_t ldc, bool load_c) {
  T acc[kMR][kNR];
  for (std::int64_t i = 0; i < kMR; ++i)
    for (std::int64_t j = 0; j < kNR; ++j) acc[i][j] = load_c ? c[i * ldc + j] : T(0);
  for (std::int64_t p = 0; p < kc; ++p, ap += kMR, bp += kNR)
    for (std::int64_t i = 0; i < kMR; ++i) {
      const T a = ap[i];
      for (std::int64_t j = 0; j < kNR; ++j) acc[i][j] = std::fma(a, bp[j], acc[i][j]);
    }
  for (std::int64_t i = 0; i < kMR; ++i)
    for (std::int64_t j = 0; j < kNR; ++j) c[i * ldc + j] = acc[i][j];
}

/// op(A) rows [i0, i0 + mc) × k [p0, p0 + kc) into panels of kMR rows, each
/// k-major (panel[p·kMR + i]); rows past mc are zeros.
template <typename T>
void pack_a(const T* a, std::int64_t lda, Op op, std::int64_t i0, std::int64_t mc, std::int64_t p0,
            std::int64_t kc, T* out) {
  for (std::int64_t r = 0; r < mc; r += kMR, out += kc * kMR) {
    const std::int64_t rows = std::min(kMR, mc - r);
    if (op == Op::T) {  // A stored [k, m]: kMR neighbours per k
      for (std::int64_t p = 0; p < kc; ++p) {
        const T* src = a + (p0 + p) * lda + i0 + r;
        T* dst = out + p * kMR;
        for (std::int64_t i = 0; i < rows; ++i) dst[i] = src[i];
        for (std::int64_t i = rows; i < kMR; ++i) dst[i] = T(0);
      }
    } else {  // A stored [m, k]: kMR rows read side by side along k
      const T* src[kMR];
      for (std::int64_t i = 0; i < kMR; ++i) src[i] = a + (i0 + r + std::min(i, rows - 1)) * lda + p0;
      for (std::int64_t p = 0; p < kc; ++p) {
        T* dst = out + p * kMR;
        for (std::int64_t i = 0; i < kMR; ++i) dst[i] = i < rows ? src[i][p] : T(0);
      }
    }
  }
}

/// op(B) k [p0, p0 + kc) × columns [j0, j0 + nc) into panels of NR
/// columns, each k-major (panel[p·NR + j]); columns past nc are zeros.
template <std::int64_t NR, typename T>
void pack_b(const T* b, std::int64_t ldb, Op op, std::int64_t p0, std::int64_t kc, std::int64_t j0,
            std::int64_t nc, T* out) {
  for (std::int64_t s = 0; s < nc; s += NR, out += kc * NR) {
    const std::int64_t cols = std::min(NR, nc - s);
    if (op == Op::N) {  // B stored [k, n]: NR neighbours per k
      for (std::int64_t p = 0; p < kc; ++p) {
        const T* src = b + (p0 + p) * ldb + j0 + s;
        T* dst = out + p * NR;
        for (std::int64_t j = 0; j < cols; ++j) dst[j] = src[j];
        for (std::int64_t j = cols; j < NR; ++j) dst[j] = T(0);
      }
    } else {  // B stored [n, k]: NR rows of B (columns of op(B)) read side by side
      const T* src[NR];
      for (std::int64_t j = 0; j < NR; ++j) src[j] = b + (j0 + s + std::min(j, cols - 1)) * ldb + p0;
      for (std::int64_t p = 0; p < kc; ++p) {
        T* dst = out + p * NR;
        for (std::int64_t j = 0; j < NR; ++j) dst[j] = j < cols ? src[j][p] : T(0);
      }
    }
  }
}

template <typename T>
using Micro = void (*)(std::int64_t, const T*, const T*, T*, std::int64_t, bool);

void check_args(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda, Op op_a, std::int64_t ldb,
                Op op_b, std::int64_t ldc) {
  if (m < 0 || n < 0 || k < 0)
    throw std::invalid_argument("gemm_fma: negative size (m=" + std::to_string(m) +
                                ", n=" + std::to_string(n) + ", k=" + std::to_string(k) + ")");
  const auto check = [](const char* name, std::int64_t ld, std::int64_t row, std::int64_t rows) {
    if (rows > 0 && ld < row)
      throw std::invalid_argument(std::string("gemm_fma: ") + name + " = " + std::to_string(ld) +
                                  " is shorter than a row (" + std::to_string(row) +
                                  " elements); it must be >= " + std::to_string(row));
  };
  check("lda", lda, op_a == Op::N ? k : m, op_a == Op::N ? m : k);
  check("ldb", ldb, op_b == Op::N ? n : k, op_b == Op::N ? k : n);
  check("ldc", ldc, n, m);
}

/// BLIS's five loops around the micro-kernel. Every tile's chains run
/// through the k blocks in order: the first block starts them at +0, every
/// later one loads them from C and continues (load_c), so the result is the
/// one chain per element whatever the block sizes. NR is the micro-kernel's
/// width (the columns of its tile and of the packed op(B) panels).
template <std::int64_t NR, typename T>
void packed_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t lda, Op op_a,
                 const T* b, std::int64_t ldb, Op op_b, T* c, std::int64_t ldc, Micro<T> micro) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // the empty sum
    for (std::int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, T(0));
    return;
  }
  thread_local PackBuffer<T> a_buffer, b_buffer;
  const std::int64_t kc_max = std::min(k, kKC);
  T* bp = b_buffer.get(kc_max * ((std::min(n, kNC) + NR - 1) / NR * NR));
  T* ap = a_buffer.get(kc_max * ((std::min(m, kMC) + kMR - 1) / kMR * kMR));
  alignas(64) T edge[kMR * NR];
  for (std::int64_t j0 = 0; j0 < n; j0 += kNC) {
    const std::int64_t nc = std::min(kNC, n - j0);
    for (std::int64_t p0 = 0; p0 < k; p0 += kKC) {
      const std::int64_t kc = std::min(kKC, k - p0);
      const bool load_c = p0 > 0;
      pack_b<NR>(b, ldb, op_b, p0, kc, j0, nc, bp);
      for (std::int64_t i0 = 0; i0 < m; i0 += kMC) {
        const std::int64_t mc = std::min(kMC, m - i0);
        pack_a(a, lda, op_a, i0, mc, p0, kc, ap);
        for (std::int64_t s = 0; s < nc; s += NR) {
          const std::int64_t cols = std::min(NR, nc - s);
          const T* bpanel = bp + s * kc;
          for (std::int64_t r = 0; r < mc; r += kMR) {
            const std::int64_t rows = std::min(kMR, mc - r);
            const T* apanel = ap + r * kc;
            T* tile = c + (i0 + r) * ldc + j0 + s;
            if (rows == kMR && cols == NR) {
              micro(kc, apanel, bpanel, tile, ldc, load_c);
            } else {  // a partial tile: through a full one, padding discarded
              if (load_c)
                for (std::int64_t i = 0; i < rows; ++i)
                  for (std::int64_t j = 0; j < cols; ++j) edge[i * NR + j] = tile[i * ldc + j];
              micro(kc, apanel, bpanel, edge, NR, load_c);
              for (std::int64_t i = 0; i < rows; ++i)
                for (std::int64_t j = 0; j < cols; ++j) tile[i * ldc + j] = edge[i * NR + j];
            }
          }
        }
      }
    }
  }
}

}  // namespace

void gemm_fma(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda, Op op_a,
              const float* b, std::int64_t ldb, Op op_b, float* c, std::int64_t ldc, Implementation impl) {
  check_args(m, n, k, lda, op_a, ldb, op_b, ldc);
  const bool avx2 =
      detail::use_avx2(impl,
                       "gemm_fma: the AVX2 path was asked for, but this CPU or build has no AVX2, "
                       "FMA and F16C; use Implementation::portable or automatic");
  // automatic: the widest kernel this CPU has; Implementation::avx2 asks
  // for the AVX2 one by name (its tests compare it with the others).
  gemm_fma(m, n, k, a, lda, op_a, b, ldb, op_b, c, ldc,
           impl == Implementation::portable ? GemmKernel::portable
           : impl == Implementation::avx2   ? GemmKernel::avx2
           : gemm_avx512_available()        ? GemmKernel::avx512
           : avx2                           ? GemmKernel::avx2
                                            : GemmKernel::portable);
}

bool gemm_avx512_available() {
#if defined(MPT_HAVE_AVX512_PATH)
  // libgcc's __builtin_cpu_supports("avx512f") also asks XGETBV whether the
  // operating system saves the zmm and mask registers.
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
#else
  return false;
#endif
}

void gemm_fma(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda, Op op_a,
              const float* b, std::int64_t ldb, Op op_b, float* c, std::int64_t ldc, GemmKernel kernel) {
  check_args(m, n, k, lda, op_a, ldb, op_b, ldc);
  switch (kernel) {
    case GemmKernel::portable: break;
    case GemmKernel::avx2:
      if (!avx2_available())
        throw std::invalid_argument(
            "gemm_fma: the AVX2 kernel was asked for, but this CPU or build has no AVX2, FMA and F16C; use "
            "GemmKernel::portable");
#if defined(MPT_HAVE_AVX2_PATH)
      packed_gemm<kNR>(m, n, k, a, lda, op_a, b, ldb, op_b, c, ldc, detail::gemm_micro_avx2);
      return;
#else
      break;
#endif
    case GemmKernel::avx512:
      if (!gemm_avx512_available())
        throw std::invalid_argument(
            "gemm_fma: the AVX-512 kernel was asked for, but this CPU or build has no AVX-512F; use "
            "GemmKernel::avx2 or portable");
#if defined(MPT_HAVE_AVX512_PATH)
      packed_gemm<kGemmNR512>(m, n, k, a, lda, op_a, b, ldb, op_b, c, ldc, detail::gemm_micro_avx512);
      return;
#else
      break;
#endif
  }
  packed_gemm<kNR>(m, n, k, a, lda, op_a, b, ldb, op_b, c, ldc, micro_portable<float>);
}

void gemm_fma(std::int64_t m, std::int64_t n, std::int64_t k, const double* a, std::int64_t lda, Op op_a,
              const double* b, std::int64_t ldb, Op op_b, double* c, std::int64_t ldc, Implementation impl) {
  check_args(m, n, k, lda, op_a, ldb, op_b, ldc);
  if (impl == Implementation::avx2)
    throw std::invalid_argument(
        "gemm_fma: the FP64 reference has only the portable implementation; use "
        "Implementation::portable or automatic");
  packed_gemm<kNR>(m, n, k, a, lda, op_a, b, ldb, op_b, c, ldc, micro_portable<double>);
}

namespace detail {
namespace {
struct Buffer {
  std::unique_ptr<float[]> data;
  std::size_t capacity;
};
// The free buffers of this thread, at most a few: a step widens at most
// three operands at once.
std::vector<Buffer>& free_buffers() {
  thread_local std::vector<Buffer> buffers;
  return buffers;
}
}  // namespace

Scratch::Scratch(std::size_t n) {
  std::vector<Buffer>& free = free_buffers();
  for (std::size_t i = 0; i < free.size(); ++i)
    if (free[i].capacity >= n) {
      data_ = std::move(free[i].data);
      capacity_ = free[i].capacity;
      free.erase(free.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  data_.reset(new float[n == 0 ? 1 : n]);
  capacity_ = n;
}

Scratch::~Scratch() {
  std::vector<Buffer>& free = free_buffers();
  if (free.size() < 8) free.push_back({std::move(data_), capacity_});
}
}  // namespace detail

F32Matrix::F32Matrix(const Tensor& t) : rows_(t.rows()), cols_(t.cols()) {
  if (t.dtype() == DType::f32 && !t.scale()) {
    data_ = t.f32_data();
  } else {
    copy_ = std::make_unique<detail::Scratch>(static_cast<std::size_t>(t.numel()));
    t.to_f32(copy_->data());
    data_ = copy_->data();
  }
}

namespace {

void require_same_dtype(const Tensor& a, const Tensor& b, const char* who) {
  if (a.dtype() != b.dtype())
    throw std::invalid_argument(std::string(who) + ": inputs are " + std::string(dtype_name(a.dtype())) +
                                " and " + std::string(dtype_name(b.dtype())) +
                                "; a GPU GEMM takes both inputs in one format — cast one first");
}

// Round a double to float, but toward the odd neighbour when inexact
// (round-to-odd). Rounding that float to fp16 with round-to-nearest-even
// then gives the correctly rounded fp16 of the double: 24 bits keep at least
// two more than fp16's 11, and the odd last bit remembers "not exactly a tie".
float round_to_odd_float(double s) {
  float f = static_cast<float>(s);
  if (static_cast<double>(f) != s && std::isfinite(f)) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 1u) == 0)
      f = std::nextafter(f, s > static_cast<double>(f) ? std::numeric_limits<float>::infinity()
                                                       : -std::numeric_limits<float>::infinity());
  }
  return f;
}

}  // namespace

Tensor gemm(const Tensor& a, Op op_a, const Tensor& b, Op op_b, DType out, const Tensor* bias) {
  require_same_dtype(a, b, bias ? "gemm_bias" : "gemm");
  const F32Matrix A(a), B(b);
  return gemm(A, op_a, B, op_b, out, bias);
}

Tensor gemm(const F32Matrix& A, Op op_a, const F32Matrix& B, Op op_b, DType out, const Tensor* bias) {
  require_inner_match(bias ? "gemm_bias" : "gemm", A.rows(), A.cols(), op_a, B.rows(), B.cols(), op_b);
  const Eigen::Index m = op_a == Op::N ? A.rows() : A.cols();
  const Eigen::Index n = op_b == Op::N ? B.cols() : B.rows();
  if (bias && bias->numel() != n)
    throw std::invalid_argument("gemm_bias: bias is " + shape_string(bias->shape()) + " but the product is " +
                                shape_string(m, n) + "; the bias must have " + std::to_string(n) +
                                " elements");
  // The fp32 accumulator: the output itself when it is f32, else scratch
  // that is rounded once at the end.
  Tensor c;
  std::unique_ptr<detail::Scratch> scratch;
  float* acc_data = nullptr;
  if (out == DType::f32) {
    c = Tensor::uninitialized(DType::f32, {m, n});
    acc_data = c.f32_data();
  } else {
    scratch = std::make_unique<detail::Scratch>(static_cast<std::size_t>(m * n));
    acc_data = scratch->data();
  }
  MatrixMapF acc(acc_data, m, n);
  multiply_into(acc, A.map(), op_a, B.map(), op_b);
  if (bias) {
    const F32Matrix bv(bias->reshaped({1, n}));
    acc.rowwise() += bv.map().row(0);
  }
  if (out == DType::f32) return c;
  return Tensor::from_f32(acc_data, {m, n}, out);
}

Tensor gemm_fp16_accumulate(const Tensor& a, Op op_a, const Tensor& b, Op op_b) {
  if (a.dtype() != DType::f16 || b.dtype() != DType::f16)
    throw std::invalid_argument("gemm_fp16_accumulate: both inputs must be f16 (got " +
                                std::string(dtype_name(a.dtype())) + " and " +
                                std::string(dtype_name(b.dtype())) + ")");
  // Widening is exact, and products of two fp16 values are exact in fp32,
  // so the only roundings are the fp16 ones this function is about.
  MatrixF af = a.to_matrix(), bf = b.to_matrix();
  if (op_a == Op::T) af.transposeInPlace();
  if (op_b == Op::T) bf.transposeInPlace();
  if (af.cols() != bf.rows())
    throw std::invalid_argument("gemm_fp16_accumulate: op(a) is " + shape_string(af.rows(), af.cols()) +
                                " but op(b) is " + shape_string(bf.rows(), bf.cols()));
  const Format& f16 = format_of(DType::f16);
  MatrixF c(af.rows(), bf.cols());
  for (Eigen::Index i = 0; i < af.rows(); ++i)
    for (Eigen::Index j = 0; j < bf.cols(); ++j) {
      float acc = 0.0f;  // an fp16 value at all times
      for (Eigen::Index k = 0; k < af.cols(); ++k) {
        // a·b + acc is exact in double whenever the result can be a finite
        // fp16 (at most ~41 significant bits); round-to-odd makes the
        // double → float → fp16 chain a single rounding.
        const double s =
            static_cast<double>(af(i, k)) * static_cast<double>(bf(k, j)) + static_cast<double>(acc);
        acc = round_value(round_to_odd_float(s), f16);
      }
      c(i, j) = acc;
    }
  return Tensor::from_matrix(c, DType::f16);  // already fp16 values: exact
}

}  // namespace mpt
