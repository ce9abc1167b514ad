// Chapter 02 — loss scaling and FP32 master weights: the Parameter.
// Depends on: parameter.hpp; Chapter 1's format descriptors (what a code means)
// and rounding (a gradient rounded into its model dtype).
#include "mpt/nn/parameter.hpp"

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mpt/formats/rounding.hpp"

namespace mpt {

RefreshStats& RefreshStats::operator+=(const RefreshStats& o) {
  elements += o.elements;
  changed += o.changed;
  lost += o.lost;
  return *this;
}

Parameter::Parameter(std::string name_, Tensor init, DType model_dtype)
    : name(std::move(name_)), master(std::move(init)) {
  if (master.dtype() != DType::f32)
    throw std::invalid_argument("Parameter " + name + ": the master must be f32, got " +
                                std::string(dtype_name(master.dtype())));
  grad = Tensor(DType::f32, master.shape());
  set_model_dtype(model_dtype);
}

void Parameter::set_model_dtype(DType d) {
  model_dtype_ = d;
  model_ = d == DType::f32 ? Tensor() : master.to(d);
}

namespace {

// Whether forward reads a different value after the refresh: codes compared
// with float semantics (+0 and -0 are one value; a NaN never equals itself),
// from the bits alone so that the loop over every weight stays cheap.
template <typename Code>
struct CodeCompare {
  unsigned magnitude, exponent, fraction;
  bool ieee;
  explicit CodeCompare(const FormatSpec& spec)
      : magnitude((1u << (spec.exponent_bits + spec.mantissa_bits)) - 1u),
        exponent(((1u << spec.exponent_bits) - 1u) << spec.mantissa_bits),
        fraction((1u << spec.mantissa_bits) - 1u),
        ieee(spec.special == SpecialEncoding::ieee) {}
  unsigned is_nan(unsigned c) const {
    return ieee ? static_cast<unsigned>((c & exponent) == exponent) &
                      static_cast<unsigned>((c & fraction) != 0)
                : static_cast<unsigned>((c & magnitude) == magnitude);
  }
  /// 1 when the value changed: different codes that are not both zeros, or
  /// a NaN kept. Branch-free, so the loop over the weights vectorizes.
  unsigned changed(Code before, Code after) const {
    const unsigned b = before, a = after;
    const unsigned differ = b != a, nonzero = ((b | a) & magnitude) != 0;
    return (differ & nonzero) | ((differ ^ 1u) & is_nan(b));
  }
};

template <typename Code>
RefreshStats refresh_codes(Tensor& master, Tensor& model, DType d, MasterWeights mode) {
  RefreshStats st;
  const auto n = static_cast<std::size_t>(master.numel());
  st.elements = n;
  const CodeCompare<Code> cmp(format_of(d).spec);
  const Tensor before = model;
  model = Tensor::uninitialized(d, master.shape());
  model.assign(std::as_const(master).f32_data(), master.numel());
  const auto* old_codes = static_cast<const Code*>(before.raw());
  const auto* new_codes = static_cast<const Code*>(model.raw());
  for (std::size_t i = 0; i < n; ++i) st.changed += cmp.changed(old_codes[i], new_codes[i]);
  if (mode == MasterWeights::none) {
    // The weights are the rounded copy: an update that rounded back to the
    // old value is gone. "Moved" compares the master with what forward read.
    std::vector<float> old_values(n);
    before.to_f32(old_values.data());
    const float* m = std::as_const(master).f32_data();
    for (std::size_t i = 0; i < n; ++i)
      st.lost += m[i] != old_values[i] && !cmp.changed(old_codes[i], new_codes[i]);
    model.to_f32(master.f32_data());
  }
  return st;
}

}  // namespace

Tensor Parameter::read(DType d, Context& ctx, std::string_view path, Phase phase, const std::string& role) {
  const Tensor& w = weights();
  if (w.dtype() == d && !w.scale()) return w;
  // PyTorch's cached_cast caches lower-precision casts of fp32 leaf weights only.
  const bool cacheable = w.dtype() == DType::f32 && (d == DType::f16 || d == DType::bf16) && !w.scale();
  if (!cacheable) return ctx.cast(w, d, path, phase, role);
  //! [weight-cast-cache]
  for (CachedCast& c : cast_cache_) {
    if (c.dtype != d) continue;
    if (c.source_version == w.version()) {
      ctx.note_cached_cast(c.cast, path, phase, role);
      return c.cast;
    }
    c.cast = ctx.cast(w, d, path, phase, role);  // the weights changed: cast again
    c.source_version = w.version();
    return c.cast;
  }
  cast_cache_.push_back({d, w.version(), ctx.cast(w, d, path, phase, role)});
  //! [weight-cast-cache]
  return cast_cache_.back().cast;
}

void Parameter::accumulate_grad(float* g, std::int64_t n, DType d) {
  if (n != grad.numel())
    throw std::invalid_argument(name + ": a gradient of " + std::to_string(n) + " elements for " +
                                std::to_string(grad.numel()) + " weights");
  if (d != DType::f32) round_array(g, g, static_cast<std::size_t>(n), format_of(d));
  if ((model_dtype_ == DType::f16 || model_dtype_ == DType::bf16) && model_dtype_ != d)
    round_array(g, g, static_cast<std::size_t>(n), format_of(model_dtype_));
  float* out = grad.f32_data();
  if (grad_factor == 1.0f && grad_carry == 1.0f) {
    for (std::int64_t i = 0; i < n; ++i) out[i] += g[i];
  } else {
    const float f = grad_factor, c = grad_carry;
    for (std::int64_t i = 0; i < n; ++i) out[i] = out[i] * c + g[i] * f;
    grad_carry = 1.0f;
  }
  if (grad_hook) grad_hook(*this);
}

RefreshStats Parameter::refresh(MasterWeights mode) {
  switch (model_dtype_) {
    case DType::f32: {
      RefreshStats st;
      st.elements = static_cast<std::size_t>(master.numel());
      return st;
    }
    case DType::bf16:
    case DType::f16: return refresh_codes<std::uint16_t>(master, model_, model_dtype_, mode);
    case DType::e4m3:
    case DType::e5m2: return refresh_codes<std::uint8_t>(master, model_, model_dtype_, mode);
  }
  return {};
}

Parameter make_parameter(std::string name, const MatrixF& init, DType d) {
  return Parameter(std::move(name), Tensor::from_matrix(init, DType::f32), d);
}

Tensor uniform_f32(Shape shape, double bound, Rng& rng) {
  Tensor t(DType::f32, std::move(shape));
  float* p = t.f32_data();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(rng.uniform(-bound, bound));
  return t;
}

}  // namespace mpt
