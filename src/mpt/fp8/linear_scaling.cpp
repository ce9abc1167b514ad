// Chapter 07 — FP8 training: per-Linear scaling state (see linear_scaling.hpp).
// Depends on: linear_scaling.hpp, gemm.hpp, core/fp8_policy.hpp.
#include "mpt/fp8/linear_scaling.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mpt/core/fp8_policy.hpp"
#include "mpt/fp8/gemm.hpp"
#include "mpt/fp8/quantize_raw.hpp"

namespace mpt::fp8 {

LinearRecipe linear_recipe_named(std::string_view name) {
  if (name == "delayed") return LinearRecipe::delayed;
  if (name == "current") return LinearRecipe::current;
  if (name == "mx-floor") return LinearRecipe::mx_floor;
  if (name == "mx-rceil") return LinearRecipe::mx_rceil;
  throw std::invalid_argument("fp8 recipe '" + std::string(name) +
                              "' is not one of delayed, current, mx-floor, mx-rceil");
}

namespace {

// The values of a [rows, cols] tensor, transposed: [cols, rows]. In tiles
// of 16 × 16, each written column by column, so that the lines a tile
// touches stay in L1 (row by row, the writes a row apart missed every time;
// and 32 rows of 2 KiB apart, a 512-wide weight's, fall into two L1 sets
// and evict each other: a 512 × 512 transpose takes about a tenth of the
// row-by-row time in 16 × 16 tiles, half of it in 32 × 32 ones).
std::vector<float> transposed(const std::vector<float>& v, std::int64_t rows, std::int64_t cols) {
  constexpr std::int64_t kTile = 16;
  std::vector<float> t(v.size());
  const float* src = v.data();
  float* dst = t.data();
  for (std::int64_t i0 = 0; i0 < rows; i0 += kTile)
    for (std::int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const std::int64_t i1 = std::min(i0 + kTile, rows), j1 = std::min(j0 + kTile, cols);
      for (std::int64_t j = j0; j < j1; ++j) {
        float* column = dst + j * rows;  // row j of the result
        for (std::int64_t i = i0; i < i1; ++i) column[i] = src[i * cols + j];
      }
    }
  return t;
}

std::vector<float> values_of(const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  t.to_f32(v.data());
  return v;
}

// An MX operand as the trace shows it: in its logical shape (x [B, in],
// W [out, in], dy [B, out], whichever copy a GEMM read, so the cost model
// sees the layer's shapes), its bytes those of the copies read, codes and
// E8M0 scales.
TracedValue traced_mx(std::string name, Shape logical, std::initializer_list<const Fp8Tensor*> copies) {
  std::size_t bytes = 0;
  DType d = DType::e4m3;
  for (const Fp8Tensor* q : copies) {
    bytes += q->codes.size() + q->e8m0.size();
    d = q->dtype;
  }
  return {std::move(name), d, std::move(logical), bytes};
}

}  // namespace

Fp8LinearScaling::Fp8LinearScaling(const Fp8LinearOptions& options) : options_(options) {
  if (options_.recipe == LinearRecipe::delayed)
    for (Fp8Role r : kFp8Roles) states_.emplace_back(dtype(r), options_.delayed);
}

bool Fp8LinearScaling::block_scaled() const {
  return options_.recipe == LinearRecipe::mx_floor || options_.recipe == LinearRecipe::mx_rceil;
}

DType Fp8LinearScaling::dtype(Fp8Role role) const {
  if (block_scaled()) return DType::e4m3;
  return fp8_dtype_for(options_.format, role == Fp8Role::grad_output ? Pass::backward : Pass::forward);
}

DelayedScaling& Fp8LinearScaling::state(Fp8Role role) {
  if (states_.empty()) throw std::logic_error("Fp8LinearScaling: only delayed scaling keeps a state");
  return states_[static_cast<std::size_t>(role)];
}

Tensor Fp8LinearScaling::quantize(const Tensor& x, Fp8Role role) {
  if (block_scaled()) throw std::logic_error("Fp8LinearScaling: an MX recipe has no per-tensor scale");
  std::vector<float> v = values_of(x);
  const DType d = dtype(role);
  const auto i = static_cast<std::size_t>(role);
  // The outcome counts come from quantize_into's encode, which the Tensor's
  // codes equal (quantize_raw.hpp; its vector loops, bench_ch07_fp8_step
  // says why), into a scratch buffer; delayed scaling's amax comes from the
  // same pass, current scaling needs its amax before it has a scale.
  codes_scratch_.resize(v.size());
  float scale = 0;
  if (options_.recipe == LinearRecipe::delayed) {
    DelayedScaling& s = state(role);
    scale = s.scale();
    s.record_amax(quantize_into(v.data(), v.size(), d, scale, true, codes_scratch_.data(), counts_[i]));
  } else {
    scale = current_scale(amax_vector(v.data(), v.size()), d, options_.current);
    (void)quantize_into(v.data(), v.size(), d, scale, true, codes_scratch_.data(), counts_[i]);
  }
  last_scale_[i] = scale;
  return Tensor::from_f32_scaled(v.data(), x.shape(), d, scale);
}

Fp8Tensor Fp8LinearScaling::quantize_blocks(const std::vector<float>& v, std::int64_t rows, std::int64_t cols,
                                            Fp8Role role) {
  const MxScaleRule rule =
      options_.recipe == LinearRecipe::mx_floor ? MxScaleRule::floor : MxScaleRule::rceil;
  // quantize_mx's Fp8Tensor, filled by quantize_mx_into (the same codes,
  // E8M0 codes, amaxes and counts, through the vector loops).
  Fp8Tensor q;
  q.dtype = dtype(role);
  q.rows = static_cast<std::size_t>(rows);
  q.cols = static_cast<std::size_t>(cols);
  q.block = kMxBlockSize;
  q.saturate = true;
  q.codes.resize(q.rows * q.cols);
  q.e8m0.resize(q.rows * q.blocks_per_row());
  q.amax.resize(q.e8m0.size());
  quantize_mx_into(v.data(), q.rows, q.cols, q.dtype, rule, true, q.codes.data(), q.e8m0.data(),
                   q.amax.data(), q.counts);
  q.scales.resize(q.e8m0.size());
  for (std::size_t b = 0; b < q.e8m0.size(); ++b) q.scales[b] = e8m0_reciprocal(q.e8m0[b]);
  Fp8Counts& c = counts_[static_cast<std::size_t>(role)];
  c.saturated += q.counts.saturated;
  c.overflowed += q.counts.overflowed;
  c.nan += q.counts.nan;
  c.flushed += q.counts.flushed;
  return q;
}

LinearFp8::Forward Fp8LinearScaling::forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                             DType out) {
  if (!block_scaled()) {
    x8_ = quantize(x, Fp8Role::input);
    w8_ = quantize(w, Fp8Role::weight);
    Tensor y = fp8_gemm(x8_, Op::N, w8_, Op::T, out, &bias);
    return {std::move(y), traced("x", x8_), traced("weight", w8_)};
  }
  const std::int64_t batch = x.rows(), in = x.cols(), outs = w.rows();
  const std::vector<float> xv = values_of(x), wv = values_of(w);
  const Fp8Tensor xq = quantize_blocks(xv, batch, in, Fp8Role::input);
  const Fp8Tensor wq = quantize_blocks(wv, outs, in, Fp8Role::weight);
  // The columnwise copies backward's GEMMs read: xᵀ [in, B], Wᵀ [in, out].
  xt_ = quantize_blocks(transposed(xv, batch, in), in, batch, Fp8Role::input);
  wt_ = quantize_blocks(transposed(wv, outs, in), in, outs, Fp8Role::weight);
  xt_codes_ = Tensor::borrowing(xt_.codes.data(), {in, batch}, xt_.dtype);
  wt_codes_ = Tensor::borrowing(wt_.codes.data(), {in, outs}, wt_.dtype);
  Tensor y = fp8_gemm_mx(xq, wq, out, &bias);
  return {std::move(y), traced_mx("x", {batch, in}, {&xq}), traced_mx("weight", {outs, in}, {&wq})};
}

LinearFp8::Backward Fp8LinearScaling::backward(const Tensor& dy, bool need_dx, DType dx_dtype) {
  Backward g;
  if (!block_scaled()) {
    const Tensor dy8 = quantize(dy, Fp8Role::grad_output);
    const Tensor dw = fp8_gemm(dy8, Op::T, x8_, Op::N, DType::f32);
    g.dw.assign(dw.f32_data(), dw.f32_data() + dw.numel());
    if (need_dx) g.dx = fp8_gemm(dy8, Op::N, w8_, Op::N, dx_dtype);
    g.dy = traced("dy", dy8);
    g.x = traced("x", x8_);
    g.weight = traced("weight", w8_);
    return g;
  }
  const std::int64_t batch = dy.rows(), outs = dy.cols();
  const std::vector<float> dyv = values_of(dy);
  // dW [out, in] = dyᵀ·x: k = B, so dyᵀ [out, B] against xᵀ [in, B].
  const Fp8Tensor dyt = quantize_blocks(transposed(dyv, batch, outs), outs, batch, Fp8Role::grad_output);
  const Tensor dw = fp8_gemm_mx(dyt, xt_, DType::f32);
  g.dw.assign(dw.f32_data(), dw.f32_data() + dw.numel());
  g.dy = traced_mx("dy", {batch, outs}, {&dyt});
  if (need_dx) {  // dx [B, in] = dy·W: k = out, so dy [B, out] against Wᵀ [in, out]
    const Fp8Tensor dyq = quantize_blocks(dyv, batch, outs, Fp8Role::grad_output);
    g.dx = fp8_gemm_mx(dyq, wt_, dx_dtype);
    g.dy = traced_mx("dy", {batch, outs}, {&dyt, &dyq});
  }
  const auto in = static_cast<std::int64_t>(xt_.rows);
  g.x = traced_mx("x", {batch, in}, {&xt_});
  g.weight = traced_mx("weight", {outs, in}, {&wt_});
  return g;
}

std::vector<const Tensor*> Fp8LinearScaling::saved() const {
  if (block_scaled()) return {&xt_codes_, &wt_codes_};
  return {&x8_, &w8_};
}

void Fp8LinearScaling::update() {
  for (DelayedScaling& s : states_) s.update();
}

Fp8Training::Fp8Training(Module& model, const Fp8LinearOptions& options) : options_(options) {
  model.visit([this](Module& m) {
    if (auto* linear = dynamic_cast<Linear*>(&m)) {
      auto s = std::make_shared<Fp8LinearScaling>(options_);
      linear->fp8 = s;
      layers_.push_back({linear->path(), std::move(s)});
    }
  });
  if (layers_.empty()) throw std::invalid_argument("fp8: the model has no Linear layer to run in FP8");
}

void Fp8Training::update() {
  for (Layer& l : layers_) l.fp8->update();
}

std::vector<float> Fp8Training::pending_amaxes() const {
  std::vector<float> out;
  if (options_.recipe != LinearRecipe::delayed) return out;
  out.reserve(layers_.size() * kFp8Roles.size());
  for (const Layer& l : layers_)
    for (const Fp8Role r : kFp8Roles) out.push_back(l.fp8->state(r).pending_amax());
  return out;
}

void Fp8Training::set_pending_amaxes(const std::vector<float>& amaxes) {
  const std::size_t want = options_.recipe == LinearRecipe::delayed ? layers_.size() * kFp8Roles.size() : 0;
  if (amaxes.size() != want)
    throw std::invalid_argument("Fp8Training: " + std::to_string(amaxes.size()) + " pending amaxes for " +
                                std::to_string(want) +
                                " delayed states (3 per Linear under delayed scaling)");
  for (const float a : amaxes)
    if (!(a >= 0.0f))
      throw std::invalid_argument("Fp8Training: a pending amax of " + std::to_string(a) +
                                  "; an amax is >= 0 (not NaN)");
  std::size_t i = 0;
  for (Layer& l : layers_)
    for (const Fp8Role r : kFp8Roles) l.fp8->state(r).set_pending_amax(amaxes[i++]);
}

std::unique_ptr<Fp8Training> attach_fp8(Module& model, const std::string& canonical_policy) {
  if (fp8_recipe_of_policy(canonical_policy).empty()) return nullptr;
  static_assert(kFp8PolicyMaxMargin == kMaxMargin && kFp8PolicyMaxHistory == kMaxAmaxHistoryLen,
                "the policy text's option ranges are the recipes' (core/fp8_policy.hpp, recipes.hpp)");
  const Fp8Recipe r = fp8_recipe_and_options_of_policy(canonical_policy);
  Fp8LinearOptions o;
  o.recipe = linear_recipe_named(r.name);
  o.delayed.margin = r.options.margin;
  o.delayed.amax_history_len = r.options.history;
  o.delayed.algo = r.options.most_recent ? AmaxComputeAlgo::most_recent : AmaxComputeAlgo::max;
  o.current.margin = r.options.margin;
  return std::make_unique<Fp8Training>(model, o);
}

}  // namespace mpt::fp8
