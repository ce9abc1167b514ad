// Chapter 07 — FP8 training: the FP8 GEMM (see gemm.hpp).
// Depends on: gemm.hpp, quantize.hpp (fp8_spec), fp8_math.hpp (decode), e8m0.hpp.
//
// Speed (bench_ch07_fp8_step): the operands are decoded through a table of
// the 256 codes' values per format, built once from decode() — the same
// floats, read instead of computed — and MX operands by block, each
// block's 2^e read once: decoding element by element was about a third of
// an FP8 step, more than its GEMMs.
#include "mpt/fp8/gemm.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/fp8/e8m0.hpp"
#include "mpt/fp8/quantize.hpp"

namespace mpt::fp8 {

float descale_of(const Tensor& t) {
  const std::optional<float> s = t.scale();
  return s ? 1.0f / *s : 1.0f;
}

namespace {

/// decode(c, f) for every code c of an FP8 dtype (e4m3 or e5m2).
const std::array<float, 256>& decode_table(DType d) {
  static const auto build = [](DType dt) {
    std::array<float, 256> t{};
    const FormatSpec& f = fp8_spec(dt);
    for (std::uint32_t c = 0; c < 256; ++c) t[c] = decode(c, f);
    return t;
  };
  static const std::array<float, 256> e4m3 = build(DType::e4m3), e5m2 = build(DType::e5m2);
  return d == DType::e4m3 ? e4m3 : e5m2;
}

/// dequantize(t) (quantize.hpp): each code's value times its scale's
/// reciprocal, dequantize_element's product, block by block.
std::vector<float> dequantize_by_table(const Fp8Tensor& t) {
  const std::array<float, 256>& table = decode_table(t.dtype);
  std::vector<float> out(t.codes.size());
  if (t.block == 0) {
    const float inverse = t.e8m0.empty() ? 1.0f / t.scales[0] : e8m0_to_float(t.e8m0[0]);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = table[t.codes[i]] * inverse;
    return out;
  }
  const std::size_t per_row = t.blocks_per_row();
  for (std::size_t r = 0; r < t.rows; ++r)
    for (std::size_t b = 0; b < per_row; ++b) {
      const std::size_t s = r * per_row + b, begin = r * t.cols + b * t.block;
      const std::size_t end = begin + std::min(t.block, t.cols - b * t.block);
      const float inverse = t.e8m0.empty() ? 1.0f / t.scales[s] : e8m0_to_float(t.e8m0[s]);
      for (std::size_t i = begin; i < end; ++i) out[i] = table[t.codes[i]] * inverse;
    }
  return out;
}

}  // namespace

std::vector<float> decode_codes(const Tensor& t) {
  if (!is_fp8(t.dtype()))
    throw std::invalid_argument("fp8 GEMM: an operand is " + std::string(dtype_name(t.dtype())) +
                                "; valid: e4m3, e5m2");
  const std::array<float, 256>& table = decode_table(t.dtype());
  const auto* codes = static_cast<const std::uint8_t*>(t.raw());
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = table[codes[i]];
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
  const auto cols = static_cast<std::size_t>(n);
  for (std::size_t at = 0; at < c.size(); at += cols)  // row by row: the bias by column, no i % n
    for (std::size_t j = 0; j < cols; ++j) {
      float v = c[at + j] * d;
      if (bias != nullptr) v += bf[j];
      c[at + j] = v;
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
  const std::vector<float> av = dequantize_by_table(a), bv = dequantize_by_table(b);
  std::vector<float> c(static_cast<std::size_t>(m) * static_cast<std::size_t>(n));
  gemm_fma(m, n, k, av.data(), k, Op::N, bv.data(), k, Op::T, c.data(), n);
  if (bias != nullptr)
    for (std::size_t at = 0; at < c.size(); at += static_cast<std::size_t>(n))
      for (std::size_t j = 0; j < static_cast<std::size_t>(n); ++j) c[at + j] += bf[j];
  return Tensor::from_f32(c.data(), {m, n}, out);
}

}  // namespace mpt::fp8
