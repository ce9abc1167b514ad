// Chapter 02 — loss scaling and FP32 master weights: GEMM as a GPU does it.
// Depends on: the core tier (tensor.hpp), Eigen.
//
// Inputs stored in any dtype (both in one: a GPU GEMM takes both inputs in
// one format), widened exactly to FP32, products accumulated in FP32, the
// result rounded once into the output dtype — cuBLAS's CUBLAS_COMPUTE_32F
// with fp16/bf16 inputs. Also, named as the pitfall it is, a GEMM that
// accumulates in fp16 and rounds after every multiply-add.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include <Eigen/Core>

#include "mpt/core/tensor.hpp"

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

/// Fixes the cache sizes Eigen's blocked product plans with (once per
/// process; every call after the first does nothing). Eigen reads them from
/// the CPU at run time, and its depth blocking (how many k a block sums
/// before adding into C) follows the L1 size: on machines with different
/// caches the same product sums in different groups and rounds differently.
/// With the sizes fixed, every machine sums a product in the same order, so
/// the chapters' generated numbers do not depend on the CPU they ran on.
void fix_product_blocking();

/// c = op(a) · op(b) with Eigen, c already of the product's size (a Map) or
/// resizable (a Matrix). The one place the product is written, so the f32
/// path and the FP64 reference multiply in the same way, and in the same
/// order on every machine (fix_product_blocking).
template <class C, class A, class B>
void multiply_into(C& c, const A& a, Op op_a, const B& b, Op op_b) {
  fix_product_blocking();
  if (op_a == Op::N && op_b == Op::N) c.noalias() = a * b;
  else if (op_a == Op::N) c.noalias() = a * b.transpose();
  else if (op_b == Op::N) c.noalias() = a.transpose() * b;
  else c.noalias() = a.transpose() * b.transpose();
}

/// Throws std::invalid_argument (naming `who` and both shapes) unless the
/// inner dimensions of op(a) [ra x ca] and op(b) [rb x cb] agree.
void require_inner_match(const char* who, Eigen::Index ra, Eigen::Index ca, Op op_a, Eigen::Index rb,
                         Eigen::Index cb, Op op_b);

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
/// Eigen's blocked kernel adds the k products in a different order than a
/// GPU's tiled kernel does, so results can differ in the last fp32 bits of
/// the sum; both accumulate in fp32, which is the property that matters here.
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

}  // namespace mpt
