// Chapter 02 — loss scaling and FP32 master weights: GEMM as a GPU does it.
// Depends on: the core tier (tensor.hpp), rounding.hpp (Implementation),
// gemm_kernel.hpp (the blocking), Eigen (the matrix types).
//
// Inputs stored in any dtype (both in one: a GPU GEMM takes both inputs in
// one format), widened exactly to FP32, products accumulated in FP32, the
// result rounded once into the output dtype — cuBLAS's CUBLAS_COMPUTE_32F
// with fp16/bf16 inputs. Also, named as the pitfall it is, a GEMM that
// accumulates in fp16 and rounds after every multiply-add.
//
// One summation order on every path. Every product of the library (Linear,
// the convolutions' im2col GEMMs, Embedding's tied output layer, attention)
// computes each output element as ONE chain of fused multiply-adds in the
// order k = 0, 1, …, K−1, starting from +0:
//
//   acc = +0;  for k in 0..K−1: acc = fma(op(A)[i][k], op(B)[k][j], acc)
//
// then adds the bias, where there is one, to the finished accumulator, and
// rounds once into the output dtype. That is the contract of the CUDA
// kernels gemm_f32 and gemm_fp16 (kernels/nn/gemm_fp16.cu: "bit for bit a
// CPU loop of std::fma in the order k = 0..K−1"), so the CPU and the GPU
// give the same bits, and every x86 or ARM machine gives the same bits:
// the chapters' generated numbers do not depend on the CPU they ran on.
//
// The fast implementation is a packed, register-blocked GEMM (BLIS's
// loops): op(B) is packed in panels of kNR columns, op(A) in panels of kMR
// rows, and a micro-kernel keeps a kMR × kNR tile of C in registers and runs
// k in order. When K is split into blocks of kKC, the next block LOADS the
// tile's running sums from C and continues their chains — it never sums a
// block from zero and adds it to C, which would be another order. Three
// micro-kernels with the same bits: AVX-512 (gemm_avx512.cpp, a 6 × 32
// tile, chosen at run time where the CPU has AVX-512F), AVX2 + FMA
// (gemm_avx2.cpp, 6 × 16, where it has AVX2, FMA and F16C) and a portable
// one of std::fma calls, correct everywhere. The width of a kernel decides
// how many chains run side by side, never the order inside one. Where FMA is part of the base instruction set
// (ARM64) std::fma compiles to the instruction and the portable kernel is
// fast. On x86-64 the library is compiled for the baseline ISA, so there
// each std::fma is a call into the C library, which computes the fused
// result in software on a CPU without FMA hardware: correct, and much
// slower — the price of one order on every machine, paid only by x86 CPUs
// without AVX2 and FMA (a separate multiply and add would be fast there,
// and round twice). The FP64 reference path (matmul<double>) runs the same
// loops and the same order in double, with the portable micro-kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <Eigen/Core>

#include "mpt/core/tensor.hpp"
#include "mpt/formats/rounding.hpp"
#include "mpt/nn/cpu/gemm_kernel.hpp"

namespace mpt {

/// Whether a GEMM operand is used as stored or transposed (cuBLAS's N / T).
enum class Op : std::uint8_t {
  N,  ///< as stored
  T,  ///< transposed
};

/// "3x4" — for error messages.
inline std::string shape_string(Eigen::Index rows, Eigen::Index cols) {
  return shape_string(Shape{rows, cols});
}

/// c [m × n] = op(a) · op(b), row-major, each element the fused
/// multiply-add chain over k = 0..k−1 from +0 (see the top of the file).
/// op(a) is m × k: a is stored [m, k] (Op::N) or [k, m] (Op::T) with rows
/// lda apart; op(b) is k × n: b stored [k, n] or [n, k], rows ldb apart; c's
/// rows are ldc apart. k = 0 gives +0 everywhere. c must not overlap a or b.
/// Implementation::avx2 on a CPU or build without AVX2 and FMA, a negative
/// size or a leading dimension shorter than its row: std::invalid_argument.
void gemm_fma(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda, Op op_a,
              const float* b, std::int64_t ldb, Op op_b, float* c, std::int64_t ldc,
              Implementation impl = Implementation::automatic);

/// The micro-kernels of the FP32 GEMM, by name (for the tests that hold
/// them to each other, and the benchmarks that time one).
enum class GemmKernel {
  portable,  ///< std::fma, kGemmMR × kGemmNR, everywhere
  avx2,      ///< AVX2 + FMA, kGemmMR × kGemmNR
  avx512,    ///< AVX-512F, kGemmMR × kGemmNR512
};

/// True when this CPU and build can run GemmKernel::avx512 (AVX-512F, and
/// an operating system that saves its registers).
bool gemm_avx512_available();

/// gemm_fma with the named micro-kernel: the same bits whichever runs.
/// A kernel this CPU or build cannot run: std::invalid_argument naming it.
/// (The Implementation overload picks: portable → portable, avx2 → avx2,
/// automatic → avx512 where available, else avx2, else portable.)
void gemm_fma(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda, Op op_a,
              const float* b, std::int64_t ldb, Op op_b, float* c, std::int64_t ldc, GemmKernel kernel);

/// The FP64 reference: the same loops and order in double (portable).
void gemm_fma(std::int64_t m, std::int64_t n, std::int64_t k, const double* a, std::int64_t lda, Op op_a,
              const double* b, std::int64_t ldb, Op op_b, double* c, std::int64_t ldc,
              Implementation impl = Implementation::automatic);

/// Throws std::invalid_argument (naming `who` and both shapes) unless the
/// inner dimensions of op(a) [ra x ca] and op(b) [rb x cb] agree.
void require_inner_match(const char* who, Eigen::Index ra, Eigen::Index ca, Op op_a, Eigen::Index rb,
                         Eigen::Index cb, Op op_b);

/// c = op(a) · op(b) through gemm_fma, for row-major Eigen matrices and
/// maps of one scalar type (float or double): c already of the product's
/// size (a Map) or resizable (a Matrix). The one place the library's
/// products are written, so the f32 path and the FP64 reference multiply in
/// the same order. Throws std::invalid_argument when the inner dimensions
/// differ.
template <class C, class A, class B>
void multiply_into(C& c, const A& a, Op op_a, const B& b, Op op_b,
                   Implementation impl = Implementation::automatic) {
  using T = typename C::Scalar;
  static_assert(std::is_same_v<T, typename A::Scalar> && std::is_same_v<T, typename B::Scalar>,
                "multiply_into: one scalar type for a, b and c");
  static_assert(bool(C::IsRowMajor) && bool(A::IsRowMajor) && bool(B::IsRowMajor),
                "multiply_into: row-major matrices");
  static_assert(C::InnerStrideAtCompileTime == 1 && A::InnerStrideAtCompileTime == 1 &&
                    B::InnerStrideAtCompileTime == 1,
                "multiply_into: contiguous rows");
  require_inner_match("multiply_into", a.rows(), a.cols(), op_a, b.rows(), b.cols(), op_b);
  const Eigen::Index m = op_a == Op::N ? a.rows() : a.cols(), k = op_a == Op::N ? a.cols() : a.rows();
  const Eigen::Index n = op_b == Op::N ? b.cols() : b.rows();
  c.resize(m, n);  // a Map: only checks the size
  gemm_fma(m, n, k, a.data(), a.outerStride(), op_a, b.data(), b.outerStride(), op_b, c.data(),
           c.outerStride(), impl);
}

/// op(a) · op(b) with every product and sum in T: the arithmetic core of
/// gemm() (T = float) and of the FP64 reference path (T = double). Throws
/// std::invalid_argument when the inner dimensions differ.
template <typename T>
Mat<T> matmul(const Mat<T>& a, Op op_a, const Mat<T>& b, Op op_b) {
  require_inner_match("matmul", a.rows(), a.cols(), op_a, b.rows(), b.cols(), op_b);
  Mat<T> c;
  multiply_into(c, a, op_a, b, op_b);
  return c;
}

/// C = op(A) · op(B) [+ bias], rounded into dtype `out`: a GPU GEMM with
/// FP32 accumulation. A and B (1-D or 2-D) must share one dtype. Their
/// values are widened exactly to fp32 (f32 operands are read in place),
/// multiplied and summed in fp32, the bias (any dtype, `cols` elements) is
/// added in fp32 to the accumulator (a cuBLASLt bias epilogue), and the fp32
/// result is rounded once, with the library's rounding, into `out`.
///
/// The products are summed as gemm_fma sums them: one fused multiply-add
/// chain per output in the order k = 0..K−1, the order of the GPU kernels
/// (kernels/nn/gemm_fp16.cu), so CPU and GPU agree bit for bit.
Tensor gemm(const Tensor& a, Op op_a, const Tensor& b, Op op_b, DType out, const Tensor* bias = nullptr);

/// THE PITFALL "accumulate in fp16": C = op(A) · op(B) with f16 inputs and an
/// fp16 accumulator, rounded to fp16 after every multiply-add (each step is
/// one fused HFMA: acc = fp16(a·b + acc), one rounding). Once the running sum
/// is large, small products fall below half an ulp of it and are lost. A
/// naive triple loop: slow, for small matrices in demos and tests only.
/// Throws std::invalid_argument unless both inputs are f16.
Tensor gemm_fp16_accumulate(const Tensor& a, Op op_a, const Tensor& b, Op op_b);

namespace detail {
/// FP32 scratch for the emulation: buffers taken and given back on one
/// thread, so that widening a step's operands does not allocate and free
/// megabytes every step (a GPU run has its workspace for the same reason).
/// Contents are undefined when taken.
class Scratch {
 public:
  /// At least n floats.
  explicit Scratch(std::size_t n);
  ~Scratch();
  Scratch(const Scratch&) = delete;             ///< one owner at a time
  Scratch& operator=(const Scratch&) = delete;  ///< one owner at a time
  /// The first float.
  float* data() const { return data_.get(); }

 private:
  std::unique_ptr<float[]> data_;
  std::size_t capacity_ = 0;
};

}  // namespace detail

/// An f32 view of a tensor's matrix: in place for f32, widened (exactly)
/// into scratch otherwise — how compute reads a stored tensor.
class F32Matrix {
 public:
  /// The view of t (1-D or 2-D).
  explicit F32Matrix(const Tensor& t);
  /// The values as a read-only Eigen matrix.
  ConstMatrixMap<float> map() const { return {data_, rows_, cols_}; }
  /// Rows.
  Eigen::Index rows() const { return rows_; }
  /// Columns.
  Eigen::Index cols() const { return cols_; }

 private:
  std::unique_ptr<detail::Scratch> copy_;
  const float* data_ = nullptr;
  Eigen::Index rows_ = 0, cols_ = 0;
};

/// gemm() on operands already widened (a layer that reads one operand in
/// two GEMMs widens it once): the same products, bias and rounding, the
/// same bits. Both must have been widened from tensors of one dtype.
Tensor gemm(const F32Matrix& a, Op op_a, const F32Matrix& b, Op op_b, DType out,
            const Tensor* bias = nullptr);

}  // namespace mpt
