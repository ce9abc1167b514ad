// Chapter 02 — loss scaling and FP32 master weights: GEMM as a GPU does it.
// Depends on: gemm.hpp; Chapter 1's rounding (the fp16-accumulate pitfall).
#include "mpt/nn/cpu/gemm.hpp"

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

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

void fix_product_blocking() {
  // 32 KiB of L1, 1 MiB of L2, 32 MiB of L3: a common server core's caches.
  // Only the order of the sums depends on them, never the result's accuracy.
  static const bool fixed = [] {
    Eigen::setCpuCacheSizes(std::ptrdiff_t{32} * 1024, std::ptrdiff_t{1024} * 1024,
                            std::ptrdiff_t{32} * 1024 * 1024);
    return true;
  }();
  (void)fixed;
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
