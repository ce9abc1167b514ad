// Chapter 02 — loss scaling and FP32 master weights.
// Depends on: Chapter 1 (format.hpp, rounding.hpp, storage.hpp) and
// parameter.hpp (the MatrixF/H/B storage types), Eigen.
//
// Matrices stored in a run's compute format (Tensor, 2 bytes an element for
// fp16/bf16, really allocated) and GEMM as a GPU does it:
// inputs stored in fp16/bf16, products accumulated in FP32, the result
// rounded once into the output format. Also, named as the pitfall it is,
// a GEMM that accumulates in fp16 and rounds after every multiply-add.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include <Eigen/Core>

#include "mpt/formats/format.hpp"
#include "mpt/nn/parameter.hpp"
#include "mpt/formats/rounding.hpp"

namespace mpt {

/// The precision of a training run: the format its activations, activation
/// gradients and model copies are stored in. Arithmetic is FP32 in all three.
enum class Precision : std::uint8_t {
  fp32,  ///< the baseline: 4-byte storage, no rounding beyond FP32's own
  fp16,  ///< IEEE binary16 storage, 2 bytes (Eigen::half)
  bf16,  ///< bfloat16 storage, 2 bytes (Eigen::bfloat16)
};

/// The Chapter 1 format descriptor of a run precision (the rounding target).
const Format& format_of(Precision p);
/// "fp32", "fp16" or "bf16".
std::string_view precision_name(Precision p);
/// Parse "fp32" | "fp16" | "bf16"; throws std::invalid_argument naming the choices.
Precision precision_named(std::string_view name);
/// Bytes one stored element occupies: 4, 2 or 2.
std::size_t bytes_per_element(Precision p);

/// Row-major matrix of any scalar: the layer math is written once over it
/// and runs in float (training) and double (the finite-difference checks).
template <typename T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// A row-major matrix stored in one run precision. Exactly one of the three
/// Eigen buffers is allocated, so bytes() is the memory the values occupy.
/// Every value written into it goes through the library's rounding
/// (round-to-nearest-even, overflow to inf, subnormals kept).
class Tensor {
 public:
  /// An empty fp32 tensor (0 x 0).
  Tensor() = default;
  /// A zero-filled rows x cols tensor stored in precision p.
  Tensor(Precision p, Eigen::Index rows, Eigen::Index cols);
  /// Round an fp32 matrix into precision p (exact copy for fp32).
  static Tensor from_fp32(const MatrixF& x, Precision p);

  /// The storage precision.
  Precision precision() const noexcept { return precision_; }
  /// Number of rows.
  Eigen::Index rows() const noexcept { return rows_; }
  /// Number of columns.
  Eigen::Index cols() const noexcept { return cols_; }
  /// rows() * cols().
  Eigen::Index size() const noexcept { return rows_ * cols_; }
  /// Bytes of the allocated element buffer: size() * bytes_per_element().
  std::size_t bytes() const noexcept;

  /// The values widened to fp32 (exact: every fp16/bf16 value is an fp32 value).
  MatrixF to_fp32() const;
  /// Replace the contents by x rounded into this tensor's precision (resizes).
  void assign(const MatrixF& x);
  /// One element, widened to fp32.
  float value(Eigen::Index r, Eigen::Index c) const;

  /// The fp32 buffer; throws std::logic_error unless precision() is fp32.
  const MatrixF& fp32() const;
  /// The fp16 buffer; throws std::logic_error unless precision() is fp16.
  const MatrixH& fp16() const;
  /// The bf16 buffer; throws std::logic_error unless precision() is bf16.
  const MatrixB& bf16() const;

 private:
  Precision precision_ = Precision::fp32;
  Eigen::Index rows_ = 0, cols_ = 0;
  MatrixF f32_;
  MatrixH f16_;
  MatrixB b16_;
};

/// A read-only view of a stored matrix in any run precision: a Tensor, or a
/// Parameter's master (fp32) or model copy (fp16/bf16). GEMM operands are
/// taken as views so a weight's model copy is read where it lives.
class MatrixRef {
 public:
  /// View of a tensor (in its own precision).
  MatrixRef(const Tensor& t);  // NOLINT(google-explicit-constructor): views convert implicitly
  /// View of an fp32 matrix.
  MatrixRef(const MatrixF& m) : precision_(Precision::fp32), f32_(&m) {}  // NOLINT
  /// View of an fp16 matrix (a model copy).
  MatrixRef(const MatrixH& m) : precision_(Precision::fp16), f16_(&m) {}  // NOLINT
  /// View of a bf16 matrix (a model copy).
  MatrixRef(const MatrixB& m) : precision_(Precision::bf16), b16_(&m) {}  // NOLINT

  /// Precision of the viewed values.
  Precision precision() const noexcept { return precision_; }
  /// Number of rows.
  Eigen::Index rows() const noexcept;
  /// Number of columns.
  Eigen::Index cols() const noexcept;
  /// The values widened to fp32 (exact).
  MatrixF to_fp32() const;

 private:
  Precision precision_;
  const MatrixF* f32_ = nullptr;
  const MatrixH* f16_ = nullptr;
  const MatrixB* b16_ = nullptr;
};

/// Whether a GEMM operand is used as stored or transposed (cuBLAS's N / T).
enum class Op : std::uint8_t {
  N,  ///< as stored
  T,  ///< transposed
};

/// "3x4" — for error messages.
std::string shape_string(Eigen::Index rows, Eigen::Index cols);

/// op(a) · op(b) with every product and sum in T: the arithmetic core of
/// gemm() (T = float) and of the FP64 reference path (T = double). Throws
/// std::invalid_argument when the inner dimensions differ.
template <typename T>
Mat<T> matmul(const Mat<T>& a, Op op_a, const Mat<T>& b, Op op_b) {
  const Eigen::Index inner_a = op_a == Op::N ? a.cols() : a.rows();
  const Eigen::Index inner_b = op_b == Op::N ? b.rows() : b.cols();
  if (inner_a != inner_b)
    throw std::invalid_argument("matmul: op(a) is " +
                                shape_string(op_a == Op::N ? a.rows() : a.cols(), inner_a) +
                                " but op(b) is " +
                                shape_string(inner_b, op_b == Op::N ? b.cols() : b.rows()));
  Mat<T> c;
  if (op_a == Op::N && op_b == Op::N) c.noalias() = a * b;
  else if (op_a == Op::N) c.noalias() = a * b.transpose();
  else if (op_b == Op::N) c.noalias() = a.transpose() * b;
  else c.noalias() = a.transpose() * b.transpose();
  return c;
}

/// C = op(A) · op(B), rounded into precision `out` — a GPU GEMM with FP32
/// accumulation (cuBLAS's CUBLAS_COMPUTE_32F with fp16/bf16 inputs).
/// A and B must share one precision, as a GPU GEMM's inputs do. Their
/// values are widened exactly to fp32, multiplied and summed in fp32, and
/// the fp32 result is rounded once, with the library's rounding, into `out`.
///
/// Eigen's blocked kernel adds the k products in a different order than a
/// GPU's tiled kernel does, so results can differ in the last fp32 bits of
/// the sum; both accumulate in fp32, which is the property that matters here.
Tensor gemm(MatrixRef a, Op op_a, MatrixRef b, Op op_b, Precision out);

/// C = op(A) · op(B) + 1·bias, the bias (a 1 x N row) added in fp32 to the
/// fp32 accumulator before the single rounding into `out` (a cuBLASLt bias
/// epilogue). The bias may be stored in any precision.
Tensor gemm_bias(MatrixRef a, Op op_a, MatrixRef b, Op op_b, MatrixRef bias, Precision out);

/// THE PITFALL "accumulate in fp16": C = op(A) · op(B) with fp16 inputs and
/// an fp16 accumulator, rounded to fp16 after every multiply-add (each step
/// is one fused HFMA: acc = fp16(a·b + acc), one rounding). Once the running
/// sum is large, small products fall below half an ulp of it and are lost.
/// A naive triple loop: slow, for small matrices in demos and tests only.
/// Throws std::invalid_argument unless both inputs are fp16.
Tensor gemm_fp16_accumulate(MatrixRef a, Op op_a, MatrixRef b, Op op_b);

}  // namespace mpt
