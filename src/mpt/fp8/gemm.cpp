// Chapter 07 — FP8 training: the FP8 GEMM (see gemm.hpp).
// Depends on: gemm.hpp, quantize.hpp (fp8_spec), fp8_math.hpp (decode).
#include "mpt/fp8/gemm.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/fp8/quantize.hpp"

namespace mpt::fp8 {

float descale_of(const Tensor& t) {
  const std::optional<float> s = t.scale();
  return s ? 1.0f / *s : 1.0f;
}

std::vector<float> decode_codes(const Tensor& t) {
  if (!is_fp8(t.dtype()))
    throw std::invalid_argument("fp8 GEMM: an operand is " + std::string(dtype_name(t.dtype())) +
                                "; valid: e4m3, e5m2");
  const FormatSpec& f = fp8_spec(t.dtype());
  const auto* codes = static_cast<const std::uint8_t*>(t.raw());
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = decode(codes[i], f);
  return v;
}

Tensor fp8_gemm(const Tensor& a, Op op_a, const Tensor& b, Op op_b, DType out, const Tensor* bias) {
  if (a.dim() < 1 || a.dim() > 2 || b.dim() < 1 || b.dim() > 2)
    throw std::invalid_argument("fp8 GEMM: operands must be 1-D or 2-D, got " + shape_string(a.shape()) +
                                " and " + shape_string(b.shape()));
  const std::vector<float> av = decode_codes(a), bv = decode_codes(b);
  require_inner_match("fp8 GEMM", a.rows(), a.cols(), op_a, b.rows(), b.cols(), op_b);
  const std::int64_t m = op_a == Op::N ? a.rows() : a.cols(), k = op_a == Op::N ? a.cols() : a.rows();
  const std::int64_t n = op_b == Op::N ? b.cols() : b.rows();
  std::vector<float> bf;
  if (bias != nullptr) {
    if (bias->numel() != n)
      throw std::invalid_argument("fp8 GEMM: the bias has " + std::to_string(bias->numel()) +
                                  " elements, the product " + std::to_string(n) + " columns");
    bf.resize(static_cast<std::size_t>(n));
    bias->to_f32(bf.data());
  }
  std::vector<float> c(static_cast<std::size_t>(m) * static_cast<std::size_t>(n));
  //! [fp8-gemm-descale]
  gemm_fma(m, n, k, av.data(), a.cols(), op_a, bv.data(), b.cols(), op_b, c.data(), n);
  const float d = descale_of(a) * descale_of(b);
  for (std::size_t i = 0; i < c.size(); ++i) {
    float v = c[i] * d;
    if (bias != nullptr) v += bf[i % static_cast<std::size_t>(n)];
    c[i] = v;
  }
  //! [fp8-gemm-descale]
  return Tensor::from_f32(c.data(), {m, n}, out);
}

Tensor fp8_gemm_mx(const Fp8Tensor& a, const Fp8Tensor& b, DType out, const Tensor* bias) {
  if (a.block == 0 || b.block == 0)
    throw std::invalid_argument("MX GEMM: both operands need block scales (quantize_mx)");
  if (a.cols != b.cols || a.block != b.block)
    throw std::invalid_argument("MX GEMM: A is " + std::to_string(a.rows) + "x" + std::to_string(a.cols) +
                                " in blocks of " + std::to_string(a.block) + ", B " + std::to_string(b.rows) +
                                "x" + std::to_string(b.cols) + " in blocks of " + std::to_string(b.block) +
                                "; C = A·Bᵀ needs one k and one block size");
  const auto m = static_cast<std::int64_t>(a.rows), n = static_cast<std::int64_t>(b.rows),
             k = static_cast<std::int64_t>(a.cols);
  std::vector<float> bf;
  if (bias != nullptr) {
    if (bias->numel() != n)
      throw std::invalid_argument("MX GEMM: the bias has " + std::to_string(bias->numel()) +
                                  " elements, the product " + std::to_string(n) + " columns");
    bf.resize(static_cast<std::size_t>(n));
    bias->to_f32(bf.data());
  }
  const std::vector<float> av = dequantize(a), bv = dequantize(b);
  std::vector<float> c(static_cast<std::size_t>(m) * static_cast<std::size_t>(n));
  gemm_fma(m, n, k, av.data(), k, Op::N, bv.data(), k, Op::T, c.data(), n);
  if (bias != nullptr)
    for (std::size_t i = 0; i < c.size(); ++i) c[i] += bf[i % static_cast<std::size_t>(n)];
  return Tensor::from_f32(c.data(), {m, n}, out);
}

}  // namespace mpt::fp8
