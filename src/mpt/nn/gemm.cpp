// Chapter 02 — loss scaling and FP32 master weights.
// Depends on: gemm.hpp, Chapter 1 (rounding.hpp, storage.hpp).
//
// Stored matrices and the GPU-style GEMM. All rounding into fp16/bf16 goes
// through Chapter 1's storage conversions, so a stored value is always
// exactly round_value(x) with the IEEE defaults.
#include "mpt/nn/gemm.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "mpt/formats/storage.hpp"

namespace mpt {

const Format& format_of(Precision p) {
  // Looked up once: format_named walks the table and throws on a typo.
  static const Format& fp32 = format_named("fp32");
  static const Format& fp16 = format_named("fp16");
  static const Format& bf16 = format_named("bf16");
  switch (p) {
    case Precision::fp16: return fp16;
    case Precision::bf16: return bf16;
    case Precision::fp32: break;
  }
  return fp32;
}

std::string_view precision_name(Precision p) { return format_of(p).name; }

Precision precision_named(std::string_view name) {
  if (name == "fp32") return Precision::fp32;
  if (name == "fp16") return Precision::fp16;
  if (name == "bf16") return Precision::bf16;
  throw std::invalid_argument("unknown precision '" + std::string(name) +
                              "'; valid: fp32, fp16, bf16");
}

std::size_t bytes_per_element(Precision p) { return p == Precision::fp32 ? 4 : 2; }

std::string shape_string(Eigen::Index rows, Eigen::Index cols) {
  return std::to_string(rows) + "x" + std::to_string(cols);
}

// --- Tensor ------------------------------------------------------------------

Tensor::Tensor(Precision p, Eigen::Index rows, Eigen::Index cols)
    : precision_(p), rows_(rows), cols_(cols) {
  // Zero is all-zero bits in all three formats. (An empty matrix has no
  // buffer at all: memset must not see its null pointer.)
  switch (p) {
    case Precision::fp32: f32_ = MatrixF::Zero(rows, cols); break;
    case Precision::fp16:
      f16_.resize(rows, cols);
      if (f16_.size() > 0)
        std::memset(static_cast<void*>(f16_.data()), 0, f16_.size() * sizeof(Eigen::half));
      break;
    case Precision::bf16:
      b16_.resize(rows, cols);
      if (b16_.size() > 0)
        std::memset(static_cast<void*>(b16_.data()), 0, b16_.size() * sizeof(Eigen::bfloat16));
      break;
  }
}

Tensor Tensor::from_fp32(const MatrixF& x, Precision p) {
  Tensor t;
  t.precision_ = p;
  t.assign(x);
  return t;
}

std::size_t Tensor::bytes() const noexcept {
  switch (precision_) {
    case Precision::fp32: return static_cast<std::size_t>(f32_.size()) * sizeof(float);
    case Precision::fp16: return static_cast<std::size_t>(f16_.size()) * sizeof(Eigen::half);
    case Precision::bf16: return static_cast<std::size_t>(b16_.size()) * sizeof(Eigen::bfloat16);
  }
  return 0;
}

MatrixF Tensor::to_fp32() const { return MatrixRef(*this).to_fp32(); }

void Tensor::assign(const MatrixF& x) {
  rows_ = x.rows();
  cols_ = x.cols();
  const auto n = static_cast<std::size_t>(x.size());
  switch (precision_) {
    case Precision::fp32: f32_ = x; break;
    case Precision::fp16:
      f16_.resize(rows_, cols_);
      to_fp16(x.data(), f16_.data(), n);
      break;
    case Precision::bf16:
      b16_.resize(rows_, cols_);
      to_bf16(x.data(), b16_.data(), n);
      break;
  }
}

float Tensor::value(Eigen::Index r, Eigen::Index c) const {
  float v = 0;
  switch (precision_) {
    case Precision::fp32: v = f32_(r, c); break;
    case Precision::fp16: from_fp16(&f16_(r, c), &v, 1); break;
    case Precision::bf16: from_bf16(&b16_(r, c), &v, 1); break;
  }
  return v;
}

namespace {
[[noreturn]] void wrong_buffer(Precision have, Precision want) {
  throw std::logic_error("Tensor holds " + std::string(precision_name(have)) +
                         " values; its " + std::string(precision_name(want)) +
                         " buffer was asked for");
}
}  // namespace

const MatrixF& Tensor::fp32() const {
  if (precision_ != Precision::fp32) wrong_buffer(precision_, Precision::fp32);
  return f32_;
}
const MatrixH& Tensor::fp16() const {
  if (precision_ != Precision::fp16) wrong_buffer(precision_, Precision::fp16);
  return f16_;
}
const MatrixB& Tensor::bf16() const {
  if (precision_ != Precision::bf16) wrong_buffer(precision_, Precision::bf16);
  return b16_;
}

// --- MatrixRef ---------------------------------------------------------------

MatrixRef::MatrixRef(const Tensor& t) : precision_(t.precision()) {
  switch (precision_) {
    case Precision::fp32: f32_ = &t.fp32(); break;
    case Precision::fp16: f16_ = &t.fp16(); break;
    case Precision::bf16: b16_ = &t.bf16(); break;
  }
}

Eigen::Index MatrixRef::rows() const noexcept {
  return f32_ ? f32_->rows() : f16_ ? f16_->rows() : b16_->rows();
}
Eigen::Index MatrixRef::cols() const noexcept {
  return f32_ ? f32_->cols() : f16_ ? f16_->cols() : b16_->cols();
}

MatrixF MatrixRef::to_fp32() const {
  if (f32_) return *f32_;
  MatrixF out(rows(), cols());
  const auto n = static_cast<std::size_t>(out.size());
  if (f16_) from_fp16(f16_->data(), out.data(), n);
  else from_bf16(b16_->data(), out.data(), n);
  return out;
}

// --- GEMM --------------------------------------------------------------------

namespace {

void require_same_precision(const MatrixRef& a, const MatrixRef& b, const char* who) {
  if (a.precision() != b.precision())
    throw std::invalid_argument(std::string(who) + ": inputs are " +
                                std::string(precision_name(a.precision())) + " and " +
                                std::string(precision_name(b.precision())) +
                                "; a GPU GEMM takes both inputs in one format — round one first");
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

Tensor gemm(MatrixRef a, Op op_a, MatrixRef b, Op op_b, Precision out) {
  require_same_precision(a, b, "gemm");
  const MatrixF c = matmul<float>(a.to_fp32(), op_a, b.to_fp32(), op_b);
  return Tensor::from_fp32(c, out);
}

Tensor gemm_bias(MatrixRef a, Op op_a, MatrixRef b, Op op_b, MatrixRef bias, Precision out) {
  require_same_precision(a, b, "gemm_bias");
  MatrixF c = matmul<float>(a.to_fp32(), op_a, b.to_fp32(), op_b);
  if (bias.rows() != 1 || bias.cols() != c.cols())
    throw std::invalid_argument("gemm_bias: bias is " + shape_string(bias.rows(), bias.cols()) +
                                " but the product is " + shape_string(c.rows(), c.cols()) +
                                "; the bias must be 1x" + std::to_string(c.cols()));
  c.rowwise() += bias.to_fp32().row(0);
  return Tensor::from_fp32(c, out);
}

Tensor gemm_fp16_accumulate(MatrixRef a, Op op_a, MatrixRef b, Op op_b) {
  if (a.precision() != Precision::fp16 || b.precision() != Precision::fp16)
    throw std::invalid_argument("gemm_fp16_accumulate: both inputs must be fp16 (got " +
                                std::string(precision_name(a.precision())) + " and " +
                                std::string(precision_name(b.precision())) + ")");
  // Widening is exact, and products of two fp16 values are exact in fp32,
  // so the only roundings are the fp16 ones this function is about.
  MatrixF af = a.to_fp32(), bf = b.to_fp32();
  if (op_a == Op::T) af.transposeInPlace();
  if (op_b == Op::T) bf.transposeInPlace();
  if (af.cols() != bf.rows())
    throw std::invalid_argument("gemm_fp16_accumulate: op(a) is " +
                                shape_string(af.rows(), af.cols()) + " but op(b) is " +
                                shape_string(bf.rows(), bf.cols()));
  const Format& f16 = format_of(Precision::fp16);
  MatrixF c(af.rows(), bf.cols());
  for (Eigen::Index i = 0; i < af.rows(); ++i)
    for (Eigen::Index j = 0; j < bf.cols(); ++j) {
      float acc = 0.0f;  // an fp16 value at all times
      for (Eigen::Index k = 0; k < af.cols(); ++k) {
        // a·b + acc is exact in double whenever the result can be a finite
        // fp16 (at most ~41 significant bits); round-to-odd makes the
        // double → float → fp16 chain a single rounding.
        const double s = static_cast<double>(af(i, k)) * static_cast<double>(bf(k, j)) +
                         static_cast<double>(acc);
        acc = round_value(round_to_odd_float(s), f16);
      }
      c(i, j) = acc;
    }
  return Tensor::from_fp32(c, Precision::fp16);  // already fp16 values: exact
}

}  // namespace mpt
