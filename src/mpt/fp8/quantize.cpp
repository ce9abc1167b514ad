// Chapter 07 — FP8 training: quantize, dequantize and amax over arrays.
// Depends on: quantize.hpp, formats/explain.hpp (shortest_decimal, for messages).
#include "mpt/fp8/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "mpt/formats/explain.hpp"

namespace mpt::fp8 {

void Fp8Counts::add(Fp8Outcome o) {
  switch (o) {
    case Fp8Outcome::in_range: break;
    case Fp8Outcome::saturated: ++saturated; break;
    case Fp8Outcome::overflowed: ++overflowed; break;
    case Fp8Outcome::nan: ++nan; break;
    case Fp8Outcome::flushed: ++flushed; break;
  }
}

std::size_t Fp8Tensor::blocks_per_row() const { return block == 0 ? 1 : (cols + block - 1) / block; }

std::size_t Fp8Tensor::scale_index(std::size_t i) const {
  if (block == 0) return 0;
  return (i / cols) * blocks_per_row() + (i % cols) / block;
}

const FormatSpec& Fp8Tensor::spec() const { return fp8_spec(dtype); }

const FormatSpec& fp8_spec(DType d) {
  if (d == DType::e4m3) return formats::e4m3;
  if (d == DType::e5m2) return formats::e5m2;
  throw std::invalid_argument("FP8 quantization: dtype " + std::string(dtype_name(d)) +
                              " is not an FP8 format; valid: e4m3, e5m2");
}

float amax_of(const float* x, std::size_t n) {
  float a = 0.0f;
  for (std::size_t i = 0; i < n; ++i) a = amax_step(a, x[i]);
  return a;
}

Fp8Tensor quantize_with_scale(const float* x, std::size_t n, DType d, float scale, bool saturate) {
  const FormatSpec& f = fp8_spec(d);
  if (!(std::isfinite(scale) && scale > 0.0f))
    throw std::invalid_argument("FP8 quantization: the scale must be finite and > 0, got " +
                                shortest_decimal(scale));
  Fp8Tensor t;
  t.dtype = d;
  t.rows = 1;
  t.cols = n;
  t.saturate = saturate;
  t.scales = {scale};
  t.amax = {amax_of(x, n)};
  t.codes.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Fp8Element e = quantize_element(x[i], scale, f, saturate);
    t.codes[i] = e.code;
    t.counts.add(e.outcome);
  }
  return t;
}

Fp8Tensor quantize_mx(const float* x, std::size_t rows, std::size_t cols, DType d, MxScaleRule rule,
                      bool saturate, std::size_t block) {
  const FormatSpec& f = fp8_spec(d);
  if (block == 0) throw std::invalid_argument("MX quantization: the block size must be at least 1");
  Fp8Tensor t;
  t.dtype = d;
  t.rows = rows;
  t.cols = cols;
  t.block = block;
  t.saturate = saturate;
  t.codes.resize(rows * cols);
  const std::size_t per_row = t.blocks_per_row();
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t b = 0; b < per_row; ++b) {
      const std::size_t begin = r * cols + b * block;
      const std::size_t count = std::min(block, cols - b * block);
      const float amax = amax_of(x + begin, count);
      const std::uint8_t code = mx_scale_code(amax, f, rule);
      const float scale = e8m0_reciprocal(code);
      t.amax.push_back(amax);
      t.e8m0.push_back(code);
      t.scales.push_back(scale);
      for (std::size_t i = begin; i < begin + count; ++i) {
        const Fp8Element e = quantize_element(x[i], scale, f, saturate);
        t.codes[i] = e.code;
        t.counts.add(e.outcome);
      }
    }
  }
  return t;
}

std::vector<float> dequantize(const Fp8Tensor& t) {
  const FormatSpec& f = t.spec();
  std::vector<float> inverse(t.scales.size());
  for (std::size_t s = 0; s < t.scales.size(); ++s)
    inverse[s] = t.e8m0.empty() ? 1.0f / t.scales[s] : e8m0_to_float(t.e8m0[s]);
  std::vector<float> out(t.codes.size());
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = dequantize_element(t.codes[i], inverse[t.scale_index(i)], f);
  return out;
}

}  // namespace mpt::fp8
