// Chapter 02 — loss scaling and FP32 master weights: the activations.
// Depends on: activations.hpp.
#include "mpt/nn/layers/activations.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace mpt {

namespace {

// An elementwise op's matrix view of a tensor of any rank: [N, C, H, W] (a
// convolution's output) is read as [N, C·H·W], the same buffer.
Tensor as_rows(const Tensor& t) {
  if (t.dim() <= 2) return t;
  const std::int64_t n = t.size(0);
  return t.reshaped({n, n == 0 ? 0 : t.numel() / n});
}

void require_same_shape(const Tensor& dy, const Tensor& saved, const char* who) {
  if (dy.shape() != saved.shape())
    throw std::invalid_argument(std::string(who) + ": dy is " + shape_string(dy.shape()) + ", expected " +
                                shape_string(saved.shape()));
}

void require_f32_compute(const OpPrecision& q, const char* op) {
  if (q.compute != DType::f32)
    throw std::invalid_argument(std::string(op) + ": the policy asks for " +
                                std::string(dtype_name(q.compute)) + " compute; it computes in f32");
}

void trace(Context& ctx, Phase phase, const std::string& path, const char* op, const OpPrecision& q,
           std::vector<TracedValue> in, const Tensor& out, const char* out_name) {
  if (ctx.tracing()) ctx.record({phase, path, op, std::move(in), q.compute, {traced(out_name, out)}});
}

// ReLU on the codes of a 16-bit IEEE dtype (f16, bf16): exact, since each
// element is kept or becomes +0; the same bits as widening, the formulas
// and rounding back (test_ch02_layers holds every code to it), without the
// two conversions. A NaN becomes the canonical quiet NaN with its sign, as
// widening and rounding make it.
struct Codes16 {
  std::uint16_t exponent, fraction, quiet;  // the fields' masks; the sign-less canonical quiet NaN
  explicit Codes16(DType d)
      : exponent(d == DType::f16 ? 0x7c00 : 0x7f80),
        fraction(d == DType::f16 ? 0x03ff : 0x007f),
        quiet(d == DType::f16 ? 0x7e00 : 0x7fc0) {}
};

// out[i] = test[i] > 0 or NaN ? canonical(value[i]) : +0 (relu keeps a NaN;
// its backward passes dy where the output is NaN). Branch-free in 16-bit
// lanes (signs are random: a branch would mispredict half the time), over
// fresh memory (out aliases neither input), so that it vectorizes.
void relu_codes(const Codes16 k, const std::uint16_t* __restrict test, const std::uint16_t* __restrict value,
                std::uint16_t* __restrict out, std::size_t n) {
  const std::uint16_t e = k.exponent, f = k.fraction, q = k.quiet;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t t = test[i], v = value[i];
    // All ones where the condition holds, else 0.
    const auto t_nan = static_cast<std::uint16_t>(((t & e) == e && (t & f) != 0) ? 0xffff : 0);
    const auto t_positive = static_cast<std::uint16_t>((t & 0x8000) == 0 && t != 0 ? 0xffff : 0);
    const auto v_nan = static_cast<std::uint16_t>(((v & e) == e && (v & f) != 0) ? 0xffff : 0);
    const auto canon = static_cast<std::uint16_t>((v & ~v_nan) | (((v & 0x8000) | q) & v_nan));
    out[i] = static_cast<std::uint16_t>(canon & (t_positive | t_nan));
  }
}

bool is_16bit_ieee(DType d) { return d == DType::f16 || d == DType::bf16; }

}  // namespace

// --- ReLU ----------------------------------------------------------------------------

Tensor ReLU::forward_impl(const Tensor& x, Context& ctx) {
  op_ = ctx.decide("relu", path(), {x.dtype()});
  require_f32_compute(op_, "relu");
  const Tensor xi = ctx.cast(x, op_.input, path(), Phase::forward, "x");
  if (is_16bit_ieee(xi.dtype()) && op_.output == xi.dtype() && !xi.scale()) {
    const Codes16 k(xi.dtype());
    const auto* in = static_cast<const std::uint16_t*>(xi.raw());
    const auto n = static_cast<std::size_t>(xi.numel());
    y_ = Tensor::from_codes(xi.shape(), xi.dtype(), [k, in, n](void* codes) {
      relu_codes(k, in, in, static_cast<std::uint16_t*>(codes), n);
    });
  } else {
    const MatrixF y = layer_math::relu_forward<float>(as_rows(xi).to_matrix());
    y_ = Tensor::from_matrix(y, op_.output).reshaped(xi.shape());
  }
  trace(ctx, Phase::forward, path(), "relu", op_, {traced("x", xi)}, y_, "y");
  return y_;
}

Tensor ReLU::backward_impl(const Tensor& dy, Context& ctx) {
  require_same_shape(dy, y_, "relu");
  Tensor out;
  if (is_16bit_ieee(op_.input) && y_.dtype() == op_.input && dy.dtype() == op_.input && !y_.scale() &&
      !dy.scale()) {
    const Codes16 k(op_.input);
    const auto* y = static_cast<const std::uint16_t*>(y_.raw());
    const auto* g = static_cast<const std::uint16_t*>(dy.raw());
    const auto n = static_cast<std::size_t>(y_.numel());
    out = Tensor::from_codes(y_.shape(), op_.input, [k, y, g, n](void* codes) {
      relu_codes(k, y, g, static_cast<std::uint16_t*>(codes), n);
    });
  } else {
    const MatrixF dx = layer_math::relu_backward<float>(as_rows(y_).to_matrix(), as_rows(dy).to_matrix());
    out = Tensor::from_matrix(dx, op_.input).reshaped(y_.shape());
  }
  trace(ctx, Phase::backward, path(), "relu", op_, {traced("dy", dy), traced("y", y_)}, out, "dx");
  return out;
}

// --- GELU ----------------------------------------------------------------------------

Tensor GELU::forward_impl(const Tensor& x, Context& ctx) {
  op_ = ctx.decide("gelu", path(), {x.dtype()});
  require_f32_compute(op_, "gelu");
  x_ = ctx.cast(x, op_.input, path(), Phase::forward, "x");
  const MatrixF y = layer_math::gelu_forward<float>(as_rows(x_).to_matrix(), approximation_);
  Tensor out = Tensor::from_matrix(y, op_.output).reshaped(x_.shape());
  trace(ctx, Phase::forward, path(), "gelu", op_, {traced("x", x_)}, out, "y");
  return out;
}

Tensor GELU::backward_impl(const Tensor& dy, Context& ctx) {
  require_same_shape(dy, x_, "gelu");
  const MatrixF dx =
      layer_math::gelu_backward<float>(as_rows(x_).to_matrix(), as_rows(dy).to_matrix(), approximation_);
  Tensor out = Tensor::from_matrix(dx, op_.input).reshaped(x_.shape());
  trace(ctx, Phase::backward, path(), "gelu", op_, {traced("dy", dy), traced("x", x_)}, out, "dx");
  return out;
}

}  // namespace mpt
