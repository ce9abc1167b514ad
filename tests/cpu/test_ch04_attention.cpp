// Chapter 04 — numerically stable attention: scaled dot-product attention and
// the multi-head self-attention layer. An FP64 attention written out here
// (scores, softmax, output) is the reference for the float op; the FP64 row
// backward (attention_math<double>) against central finite differences of
// it; masks (causal, boolean, additive, −inf, fully masked rows); the f16
// overflow of unscaled scores; the module's backward through its Linear
// layers against finite differences of an FP64 model; the trace; the errors.
// Depends on: mpt/nn/layers/attention.hpp, attention_math.hpp, the core tier
// (Context, policies, Trace, Rng).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "layer_test_support.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/nn/layers/attention.hpp"
#include "mpt/nn/layers/attention_math.hpp"

using namespace mpt;
using VecD = std::vector<double>;
using VecF = std::vector<float>;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Normal values rounded to float, so the f32 op and the FP64 reference read
// the same numbers.
VecD randn(std::size_t n, std::uint64_t seed, double sd = 1.0) {
  Rng rng(seed);
  VecD v(n);
  for (double& x : v) x = static_cast<float>(sd * rng.normal());
  return v;
}

Tensor tensor(const VecD& v, Shape s, DType d = DType::f32) {
  const VecF f(v.begin(), v.end());
  return Tensor::from_f32(f.data(), std::move(s), d);
}

VecD values(const Tensor& t) {
  VecF f(static_cast<std::size_t>(t.numel()));
  t.to_f32(f.data());
  return VecD(f.begin(), f.end());
}

double norm2(const VecD& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

double rel_err(const VecD& a, const VecD& b) {
  VecD d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return norm2(d) / std::max({norm2(a), norm2(b), 1e-30});
}

bool all_finite(const VecD& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

// Central differences in FP64 (h = 1e-6): error ~1e-10 on O(1) gradients.
using mpt_test::numeric_grad;

// The FP64 reference, written out: for each of n heads, scores
// t_ij = scale·Σ_c q_ic k_jc + add_ij (−inf where keep_ij is false), the
// softmax with the row's maximum subtracted (a row with nothing kept: 0),
// out_i = Σ_j p_ij v_j. keep/add take (head, i, j).
struct RefOut {
  VecD p, out;
};
using KeepFn = std::function<bool(std::int64_t, std::int64_t, std::int64_t)>;
using AddFn = std::function<double(std::int64_t, std::int64_t, std::int64_t)>;

RefOut reference(const VecD& q, const VecD& k, const VecD& v, std::int64_t n, std::int64_t lq,
                 std::int64_t lk, std::int64_t d, std::int64_t dv, double scale, const KeepFn& keep = nullptr,
                 const AddFn& add = nullptr) {
  RefOut r{VecD(static_cast<std::size_t>(n * lq * lk)), VecD(static_cast<std::size_t>(n * lq * dv))};
  for (std::int64_t h = 0; h < n; ++h)
    for (std::int64_t i = 0; i < lq; ++i) {
      VecD t(static_cast<std::size_t>(lk));
      double m = -kInf;
      for (std::int64_t j = 0; j < lk; ++j) {
        double s = 0;
        for (std::int64_t c = 0; c < d; ++c)
          s += q[static_cast<std::size_t>((h * lq + i) * d + c)] *
               k[static_cast<std::size_t>((h * lk + j) * d + c)];
        t[static_cast<std::size_t>(j)] =
            (keep && !keep(h, i, j)) ? -kInf : s * scale + (add ? add(h, i, j) : 0.0);
        m = std::max(m, t[static_cast<std::size_t>(j)]);
      }
      double z = 0;
      for (double x : t) z += m == -kInf ? 0.0 : std::exp(x - m);
      for (std::int64_t j = 0; j < lk; ++j) {
        const double pij = z == 0 ? 0.0 : std::exp(t[static_cast<std::size_t>(j)] - m) / z;
        r.p[static_cast<std::size_t>((h * lq + i) * lk + j)] = pij;
        for (std::int64_t c = 0; c < dv; ++c)
          r.out[static_cast<std::size_t>((h * lq + i) * dv + c)] +=
              pij * v[static_cast<std::size_t>((h * lk + j) * dv + c)];
      }
    }
  return r;
}

Context context(DType d) { return Context(uniform_policy(d)); }

AttentionOptions with_order(bool q_first, bool causal = false) {
  AttentionOptions o;
  o.scale_q_first = q_first;
  o.is_causal = causal;
  return o;
}

// FP64 gradients of loss = Σ r·out from attention_math's row backward.
struct RefGrads {
  VecD dq, dk, dv;
};
RefGrads row_grads(const VecD& q, const VecD& k, const VecD& v, const VecD& r, std::int64_t n,
                   std::int64_t lq, std::int64_t lk, std::int64_t d, std::int64_t dv, double scale,
                   const KeepFn& keep) {
  RefGrads g{VecD(q.size()), VecD(k.size(), 0.0), VecD(v.size(), 0.0)};
  VecD t(static_cast<std::size_t>(lk)), p(static_cast<std::size_t>(lk)), o(static_cast<std::size_t>(dv)),
      dp(t.size()), ds(t.size());
  std::vector<unsigned char> kp(static_cast<std::size_t>(lk));
  for (std::int64_t h = 0; h < n; ++h)
    for (std::int64_t i = 0; i < lq; ++i) {
      for (std::int64_t j = 0; j < lk; ++j) kp[static_cast<std::size_t>(j)] = keep ? keep(h, i, j) : 1;
      attention_math::RowMask<double> m;
      m.keep = kp.data();
      m.visible = static_cast<int>(lk);
      const double* qi = q.data() + (h * lq + i) * d;
      const double* kh = k.data() + h * lk * d;
      const double* vh = v.data() + h * lk * dv;
      attention_math::row_forward(qi, kh, vh, static_cast<int>(lk), static_cast<int>(d), static_cast<int>(dv),
                                  scale, m, t.data(), p.data(), o.data());
      attention_math::row_backward(qi, kh, vh, p.data(), r.data() + (h * lq + i) * dv, static_cast<int>(lk),
                                   static_cast<int>(d), static_cast<int>(dv), scale, dp.data(), ds.data(),
                                   g.dq.data() + (h * lq + i) * d, g.dk.data() + h * lk * d,
                                   g.dv.data() + h * lk * dv);
    }
  return g;
}

double dot(const VecD& a, const VecD& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

bool one_line(const std::string& s) { return !s.empty() && s.find('\n') == std::string::npos; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

using mpt_test::HalfComputePolicy;

}  // namespace

TEST_CASE("SDPA by hand: two keys, D = 2, default scale 1/sqrt(2)") {
  // q = (1, 0); k0 = (1, 0), k1 = (0, 1): scores 1/√2 and 0, so
  // p0 = e^{1/√2} / (e^{1/√2} + 1) and out = p0·v0 + (1 − p0)·v1.
  Context ctx = context(DType::f32);
  const Tensor q = tensor({1, 0}, {1, 1, 2}), k = tensor({1, 0, 0, 1}, {1, 2, 2}),
               v = tensor({1, 2, 3, 4}, {1, 2, 2});
  for (bool q_first : {true, false}) {
    CAPTURE(q_first);
    const AttentionResult r =
        scaled_dot_product_attention(q, k, v, AttentionMask(), with_order(q_first), ctx);
    const double e = std::exp(1 / std::sqrt(2.0)), p0 = e / (e + 1);
    CHECK(r.out.shape() == Shape{1, 1, 2});
    CHECK(r.saved.probs.value(0) == doctest::Approx(p0).epsilon(1e-6));
    CHECK(r.saved.probs.value(1) == doctest::Approx(1 - p0).epsilon(1e-6));
    CHECK(r.out.value(0) == doctest::Approx(p0 * 1 + (1 - p0) * 3).epsilon(1e-6));
    CHECK(r.out.value(1) == doctest::Approx(p0 * 2 + (1 - p0) * 4).epsilon(1e-6));
    // The stored scores: scaled with the scale in Q, raw otherwise.
    CHECK(r.scores.value(0) == doctest::Approx(q_first ? 1 / std::sqrt(2.0) : 1.0).epsilon(1e-6));
  }
  // An explicit scale replaces 1/√D.
  AttentionOptions o;
  o.scale = 2.0;
  const AttentionResult r = scaled_dot_product_attention(q, k, v, AttentionMask(), o, ctx);
  const double p0 = std::exp(2.0) / (std::exp(2.0) + 1);
  CHECK(r.saved.probs.value(0) == doctest::Approx(p0).epsilon(1e-6));
}

TEST_CASE("SDPA in f32 matches the FP64 reference: [B, H, Lq, D] and [N, L, D], Lq != Lk, Dv != D") {
  struct Case {
    Shape lead;
    std::int64_t lq, lk, d, dv;
  };
  for (const Case& c : {Case{{2, 3}, 4, 5, 8, 3}, Case{{3}, 5, 5, 4, 4}, Case{{1, 1}, 1, 7, 16, 2}}) {
    for (bool q_first : {true, false}) {
      CAPTURE(c.lq);
      CAPTURE(q_first);
      const std::int64_t n = numel(c.lead);
      const VecD q = randn(static_cast<std::size_t>(n * c.lq * c.d), 11, 2.0),
                 k = randn(static_cast<std::size_t>(n * c.lk * c.d), 12, 2.0),
                 v = randn(static_cast<std::size_t>(n * c.lk * c.dv), 13);
      Shape qs = c.lead, ks = c.lead, vs = c.lead;
      qs.insert(qs.end(), {c.lq, c.d});
      ks.insert(ks.end(), {c.lk, c.d});
      vs.insert(vs.end(), {c.lk, c.dv});
      Context ctx = context(DType::f32);
      const AttentionResult r = scaled_dot_product_attention(tensor(q, qs), tensor(k, ks), tensor(v, vs),
                                                             AttentionMask(), with_order(q_first), ctx);
      const RefOut ref =
          reference(q, k, v, n, c.lq, c.lk, c.d, c.dv, 1 / std::sqrt(static_cast<double>(c.d)));
      Shape os = c.lead;
      os.insert(os.end(), {c.lq, c.dv});
      CHECK(r.out.shape() == os);
      CHECK(r.out.dtype() == DType::f32);
      // FP32 sums of O(10) scores and exps: a few ulps of FP32.
      CHECK(rel_err(values(r.saved.probs), ref.p) < 2e-6);
      CHECK(rel_err(values(r.out), ref.out) < 2e-6);
    }
  }
}

TEST_CASE("SDPA with large logits: the maximum is subtracted (no overflow in exp)") {
  // Scores 1024, 1023, 1022 (exact): exp(1024) overflows FP32 and FP64; the
  // softmax of the shifted row does not.
  const VecD q{1024, 0}, k{1, 0, 1 - 0x1p-10, 0, 1 - 0x1p-9, 0}, v{1, 2, 3};
  AttentionOptions o;
  o.scale = 1.0;
  Context ctx = context(DType::f32);
  const AttentionResult r = scaled_dot_product_attention(tensor(q, {1, 1, 2}), tensor(k, {1, 3, 2}),
                                                         tensor(v, {1, 3, 1}), AttentionMask(), o, ctx);
  const RefOut ref = reference(q, k, v, 1, 1, 3, 2, 1, 1.0);
  CHECK(all_finite(values(r.out)));
  CHECK(rel_err(values(r.saved.probs), ref.p) < 1e-6);
  CHECK(values(r.out)[0] == doctest::Approx(ref.out[0]).epsilon(1e-6));
}

TEST_CASE("the causal mask: row i sees keys j <= i (top-left aligned, also with Lq != Lk)") {
  for (const auto& shape : {std::pair<std::int64_t, std::int64_t>{4, 4}, {3, 5}, {5, 3}}) {
    const std::int64_t lq = shape.first, lk = shape.second;
    CAPTURE(lq);
    CAPTURE(lk);
    const std::int64_t n = 2, d = 4;
    const VecD q = randn(static_cast<std::size_t>(n * lq * d), 21),
               k = randn(static_cast<std::size_t>(n * lk * d), 22),
               v = randn(static_cast<std::size_t>(n * lk * d), 23);
    Context ctx = context(DType::f32);
    const AttentionResult r =
        scaled_dot_product_attention(tensor(q, {n, lq, d}), tensor(k, {n, lk, d}), tensor(v, {n, lk, d}),
                                     AttentionMask(), causal_attention(), ctx);
    const RefOut ref = reference(q, k, v, n, lq, lk, d, d, 0.5, [](auto, auto i, auto j) { return j <= i; });
    const VecD p = values(r.saved.probs);
    for (std::int64_t h = 0; h < n; ++h)
      for (std::int64_t i = 0; i < lq; ++i)
        for (std::int64_t j = i + 1; j < lk; ++j)
          CHECK(p[static_cast<std::size_t>((h * lq + i) * lk + j)] == 0.0);
    CHECK(rel_err(p, ref.p) < 2e-6);
    CHECK(rel_err(values(r.out), ref.out) < 2e-6);
    // Row 0 sees only key 0: its output is v0, exactly.
    const VecD out = values(r.out);
    for (std::int64_t c = 0; c < d; ++c)
      CHECK(out[static_cast<std::size_t>(c)] == static_cast<float>(v[static_cast<std::size_t>(c)]));
  }
}

TEST_CASE("boolean masks (true takes part) and additive masks, broadcast from [Lq, Lk] and [B, 1, Lq, Lk]") {
  const std::int64_t b = 2, h = 2, lq = 3, lk = 4, d = 4, n = b * h;
  const VecD q = randn(static_cast<std::size_t>(n * lq * d), 31),
             k = randn(static_cast<std::size_t>(n * lk * d), 32),
             v = randn(static_cast<std::size_t>(n * lk * d), 33);
  const Tensor qt = tensor(q, {b, h, lq, d}), kt = tensor(k, {b, h, lk, d}), vt = tensor(v, {b, h, lk, d});
  Context ctx = context(DType::f32);

  SUBCASE("boolean [Lq, Lk], the same for every batch and head") {
    const std::vector<std::uint8_t> keep{1, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0};
    const AttentionResult r =
        scaled_dot_product_attention(qt, kt, vt, AttentionMask::boolean({lq, lk}, keep), {}, ctx);
    const RefOut ref = reference(q, k, v, n, lq, lk, d, d, 0.5, [&](auto, auto i, auto j) {
      return keep[static_cast<std::size_t>(i * lk + j)] != 0;
    });
    CHECK(rel_err(values(r.saved.probs), ref.p) < 2e-6);
    CHECK(rel_err(values(r.out), ref.out) < 2e-6);
    CHECK(values(r.saved.probs)[1] == 0.0);  // row 0, key 1: false does not take part
  }
  SUBCASE("boolean [B, 1, Lq, Lk]: padding per sequence, shared by the heads") {
    std::vector<std::uint8_t> keep(static_cast<std::size_t>(b * lq * lk), 1);
    for (std::int64_t i = 0; i < lq; ++i)
      keep[static_cast<std::size_t>((1 * lq + i) * lk + 3)] = 0;  // batch 1: key 3 is padding
    const AttentionResult r =
        scaled_dot_product_attention(qt, kt, vt, AttentionMask::boolean({b, 1, lq, lk}, keep), {}, ctx);
    const RefOut ref =
        reference(q, k, v, n, lq, lk, d, d, 0.5, [](auto hh, auto, auto j) { return hh / 2 != 1 || j != 3; });
    CHECK(rel_err(values(r.saved.probs), ref.p) < 2e-6);
    CHECK(rel_err(values(r.out), ref.out) < 2e-6);
  }
  SUBCASE("additive [Lq, Lk]: added to the scaled scores") {
    const VecD add = randn(static_cast<std::size_t>(lq * lk), 34, 3.0);
    const AttentionResult r =
        scaled_dot_product_attention(qt, kt, vt, AttentionMask::additive(tensor(add, {lq, lk})), {}, ctx);
    const RefOut ref = reference(q, k, v, n, lq, lk, d, d, 0.5, nullptr, [&](auto, auto i, auto j) {
      return add[static_cast<std::size_t>(i * lk + j)];
    });
    CHECK(rel_err(values(r.saved.probs), ref.p) < 2e-6);
    CHECK(rel_err(values(r.out), ref.out) < 2e-6);
  }
  SUBCASE("additive −inf: a partially masked row has no NaN and equals the boolean mask") {
    const std::vector<std::uint8_t> keep{1, 0, 1, 1, 0, 1, 0, 1, 1, 1, 1, 0};
    VecD add(keep.size());
    for (std::size_t i = 0; i < keep.size(); ++i) add[i] = keep[i] ? 0.0 : -kInf;
    for (DType md : {DType::f32, DType::f16, DType::bf16}) {
      CAPTURE(dtype_name(md));
      const AttentionResult ra = scaled_dot_product_attention(
          qt, kt, vt, AttentionMask::additive(tensor(add, {lq, lk}, md)), {}, ctx);
      const AttentionResult rb =
          scaled_dot_product_attention(qt, kt, vt, AttentionMask::boolean({lq, lk}, keep), {}, ctx);
      CHECK(all_finite(values(ra.out)));
      CHECK(values(ra.out) == values(rb.out));
    }
  }
  SUBCASE("additive: the dtype's lowest finite value (f16: −65504) makes a position negligible") {
    VecD add(static_cast<std::size_t>(lq * lk), 0.0);
    add[1] = -65504.0;
    const AttentionResult r = scaled_dot_product_attention(
        qt, kt, vt, AttentionMask::additive(tensor(add, {lq, lk}, DType::f16)), {}, ctx);
    CHECK(values(r.saved.probs)[1] == 0.0);  // exp(−65504 + O(1)) underflows in FP32
    CHECK(all_finite(values(r.out)));
  }
}

TEST_CASE("fully masked rows give zeros (PyTorch's _safe_softmax), forward and backward") {
  const std::int64_t n = 2, lq = 3, lk = 4, d = 4;
  const VecD q = randn(static_cast<std::size_t>(n * lq * d), 41),
             k = randn(static_cast<std::size_t>(n * lk * d), 42),
             v = randn(static_cast<std::size_t>(n * lk * d), 43),
             dout = randn(static_cast<std::size_t>(n * lq * d), 44);
  // Row 1 of every head: nothing takes part.
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(lq * lk), 1);
  for (std::int64_t j = 0; j < lk; ++j) keep[static_cast<std::size_t>(1 * lk + j)] = 0;
  VecD add(keep.size());
  for (std::size_t i = 0; i < keep.size(); ++i) add[i] = keep[i] ? 0.0 : -kInf;
  const KeepFn kf = [](auto, auto i, auto) { return i != 1; };
  const RefOut ref = reference(q, k, v, n, lq, lk, d, d, 0.5, kf);
  const RefGrads rg = row_grads(q, k, v, dout, n, lq, lk, d, d, 0.5, kf);
  for (const AttentionMask& m :
       {AttentionMask::boolean({lq, lk}, keep), AttentionMask::additive(tensor(add, {lq, lk}))}) {
    for (bool q_first : {true, false}) {
      CAPTURE(q_first);
      Context ctx = context(DType::f32);
      const AttentionResult r = scaled_dot_product_attention(
          tensor(q, {n, lq, d}), tensor(k, {n, lk, d}), tensor(v, {n, lk, d}), m, with_order(q_first), ctx);
      const VecD out = values(r.out), p = values(r.saved.probs);
      CHECK(all_finite(out));
      for (std::int64_t h = 0; h < n; ++h)
        for (std::int64_t c = 0; c < d; ++c) {
          CHECK(out[static_cast<std::size_t>((h * lq + 1) * d + c)] == 0.0);
          CHECK(p[static_cast<std::size_t>((h * lq + 1) * lk + c)] == 0.0);
        }
      CHECK(rel_err(out, ref.out) < 2e-6);  // the other rows are untouched
      const AttentionGrads g = scaled_dot_product_attention_backward(r.saved, tensor(dout, {n, lq, d}), ctx);
      const VecD dq = values(g.dq);
      CHECK(all_finite(dq));
      for (std::int64_t h = 0; h < n; ++h)
        for (std::int64_t c = 0; c < d; ++c) CHECK(dq[static_cast<std::size_t>((h * lq + 1) * d + c)] == 0.0);
      CHECK(rel_err(dq, rg.dq) < 1e-5);
      CHECK(rel_err(values(g.dk), rg.dk) < 1e-5);
      CHECK(rel_err(values(g.dv), rg.dv) < 1e-5);
    }
  }
  // A row of the lowest finite value is not "fully masked": it is uniform,
  // as in PyTorch, whose _safe_softmax looks for −inf only.
  VecD low(static_cast<std::size_t>(lq * lk), 0.0);
  for (std::int64_t j = 0; j < lk; ++j) low[static_cast<std::size_t>(lk + j)] = -3.0e38;
  Context ctx = context(DType::f32);
  const AttentionResult r =
      scaled_dot_product_attention(tensor(q, {n, lq, d}), tensor(k, {n, lk, d}), tensor(v, {n, lk, d}),
                                   AttentionMask::additive(tensor(low, {lq, lk})), {}, ctx);
  for (std::int64_t j = 0; j < lk; ++j)
    CHECK(r.saved.probs.value(lk + j) == doctest::Approx(0.25).epsilon(1e-6));
}

TEST_CASE(
    "f16 with large scores: the unscaled product overflows its f16 storage; the scale in Q first does not") {
  // D = 16, q = k0 = 64 everywhere: q·k0 = 16·4096 = 65536 > 65504, f16's
  // largest finite value, while the scaled score q·k0/4 = 16384 fits. Key 1
  // is 32 everywhere (q·k1/4 = 8192). All these values are exact in f16.
  const std::int64_t d = 16, lk = 2;
  const VecD q(static_cast<std::size_t>(d), 64.0);
  VecD k(static_cast<std::size_t>(lk * d), 64.0);
  for (std::int64_t c = 0; c < d; ++c) k[static_cast<std::size_t>(d + c)] = 32.0;
  const VecD v{1, 2};
  const RefOut ref = reference(q, k, v, 1, 1, lk, d, 1, 0.25);  // p = (1, e^{−8192}) → out 1
  for (DType dt : {DType::f16, DType::f32}) {
    for (bool q_first : {false, true}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(q_first);
      Context ctx = context(dt);
      const AttentionResult r =
          scaled_dot_product_attention(tensor(q, {1, 1, d}), tensor(k, {1, lk, d}), tensor(v, {1, lk, 1}),
                                       AttentionMask(), with_order(q_first), ctx);
      CHECK(r.scores.dtype() == dt);
      CHECK(r.out.dtype() == dt);
      const double s0 = r.scores.value(0);
      if (dt == DType::f16 && !q_first) {
        CHECK(std::isinf(s0));  // 65536 stored in f16: inf, before the scale could help
        CHECK(std::isnan(r.out.value(0)));
      } else {
        CHECK(s0 == (q_first ? 16384.0 : 65536.0));
        CHECK(r.out.value(0) == ref.out[0]);
      }
    }
  }
}

TEST_CASE("the FP64 row backward matches finite differences for q, k and v (plain, causal, masked rows)") {
  const std::int64_t n = 2, lq = 3, lk = 4, d = 3, dv = 2;
  VecD q = randn(static_cast<std::size_t>(n * lq * d), 51),
       k = randn(static_cast<std::size_t>(n * lk * d), 52),
       v = randn(static_cast<std::size_t>(n * lk * dv), 53);
  const VecD r = randn(static_cast<std::size_t>(n * lq * dv), 54);
  const double scale = 0.7;
  const std::vector<KeepFn> masks = {nullptr, [](auto, auto i, auto j) { return j <= i; },
                                     [](auto h, auto i, auto j) { return !(h == 1 && i == 2) && j != 1; }};
  for (std::size_t mi = 0; mi < masks.size(); ++mi) {
    CAPTURE(mi);
    const KeepFn& keep = masks[mi];
    const auto loss = [&] { return dot(r, reference(q, k, v, n, lq, lk, d, dv, scale, keep).out); };
    const RefGrads g = row_grads(q, k, v, r, n, lq, lk, d, dv, scale, keep);
    CHECK(rel_err(g.dq, numeric_grad(loss, q)) < 1e-7);
    CHECK(rel_err(g.dk, numeric_grad(loss, k)) < 1e-7);
    CHECK(rel_err(g.dv, numeric_grad(loss, v)) < 1e-7);
  }
}

TEST_CASE("the f32 backward matches the FP64 gradients, both scale orders, with and without a causal mask") {
  const std::int64_t b = 2, h = 2, lq = 4, lk = 4, d = 8, n = b * h;
  const VecD q = randn(static_cast<std::size_t>(n * lq * d), 61),
             k = randn(static_cast<std::size_t>(n * lk * d), 62),
             v = randn(static_cast<std::size_t>(n * lk * d), 63),
             dout = randn(static_cast<std::size_t>(n * lq * d), 64);
  const double scale = 1 / std::sqrt(8.0);
  for (bool causal : {false, true}) {
    for (bool q_first : {true, false}) {
      CAPTURE(causal);
      CAPTURE(q_first);
      const KeepFn keep = causal ? KeepFn([](auto, auto i, auto j) { return j <= i; }) : KeepFn();
      const RefGrads ref = row_grads(q, k, v, dout, n, lq, lk, d, d, scale, keep);
      Context ctx = context(DType::f32);
      const AttentionResult r = scaled_dot_product_attention(
          tensor(q, {b, h, lq, d}), tensor(k, {b, h, lk, d}), tensor(v, {b, h, lk, d}), AttentionMask(),
          with_order(q_first, causal), ctx);
      const AttentionGrads g =
          scaled_dot_product_attention_backward(r.saved, tensor(dout, {b, h, lq, d}), ctx);
      CHECK(g.dq.shape() == Shape{b, h, lq, d});
      CHECK(rel_err(values(g.dq), ref.dq) < 1e-5);
      CHECK(rel_err(values(g.dk), ref.dk) < 1e-5);
      CHECK(rel_err(values(g.dv), ref.dv) < 1e-5);
    }
  }
}

namespace {

// FP64 multi-head causal self-attention: x [B, L, E], y = out(attn(q(x), k(x), v(x))).
struct RefMhsa {
  std::int64_t b, l, e, h;
  VecD wq, bq, wk, bk, wv, bv, wo, bo;
  VecD linear(const VecD& x, const VecD& w, const VecD& bias) const {
    VecD y(static_cast<std::size_t>(b * l * e));
    for (std::int64_t r = 0; r < b * l; ++r)
      for (std::int64_t o = 0; o < e; ++o) {
        double s = bias[static_cast<std::size_t>(o)];
        for (std::int64_t i = 0; i < e; ++i)
          s += x[static_cast<std::size_t>(r * e + i)] * w[static_cast<std::size_t>(o * e + i)];
        y[static_cast<std::size_t>(r * e + o)] = s;
      }
    return y;
  }
  // [B·L, E] → [B·H, L, E/H] and back.
  VecD heads(const VecD& x) const {
    const std::int64_t dh = e / h;
    VecD y(x.size());
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t li = 0; li < l; ++li)
        for (std::int64_t hi = 0; hi < h; ++hi)
          for (std::int64_t c = 0; c < dh; ++c)
            y[static_cast<std::size_t>(((bi * h + hi) * l + li) * dh + c)] =
                x[static_cast<std::size_t>((bi * l + li) * e + hi * dh + c)];
    return y;
  }
  VecD unheads(const VecD& x) const {
    const std::int64_t dh = e / h;
    VecD y(x.size());
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t li = 0; li < l; ++li)
        for (std::int64_t hi = 0; hi < h; ++hi)
          for (std::int64_t c = 0; c < dh; ++c)
            y[static_cast<std::size_t>((bi * l + li) * e + hi * dh + c)] =
                x[static_cast<std::size_t>(((bi * h + hi) * l + li) * dh + c)];
    return y;
  }
  VecD forward(const VecD& x) const {
    const std::int64_t dh = e / h;
    const RefOut a = reference(heads(linear(x, wq, bq)), heads(linear(x, wk, bk)), heads(linear(x, wv, bv)),
                               b * h, l, l, dh, dh, 1 / std::sqrt(static_cast<double>(dh)),
                               [](auto, auto i, auto j) { return j <= i; });
    return linear(unheads(a.out), wo, bo);
  }
};

}  // namespace

TEST_CASE("MultiHeadSelfAttention: forward and backward through the Linear layers vs an FP64 model") {
  const int e = 4, heads = 2;
  const std::int64_t b = 2, l = 3;
  Rng rng(7);
  MultiHeadSelfAttention mhsa(e, heads, rng);
  mhsa.set_path("block0.attn");
  CHECK(mhsa.q.path() == "block0.attn.q");
  CHECK(mhsa.out.weight.name == "block0.attn.out.weight");
  CHECK(mhsa.parameters().size() == 8);
  RefMhsa ref{b,
              l,
              e,
              heads,
              values(mhsa.q.weight.master),
              values(mhsa.q.bias.master),
              values(mhsa.k.weight.master),
              values(mhsa.k.bias.master),
              values(mhsa.v.weight.master),
              values(mhsa.v.bias.master),
              values(mhsa.out.weight.master),
              values(mhsa.out.bias.master)};
  VecD x = randn(static_cast<std::size_t>(b * l * e), 71);
  const VecD r = randn(x.size(), 72);
  Context ctx = context(DType::f32);
  const Tensor y = mhsa.forward(tensor(x, {b, l, e}), ctx);
  CHECK(y.shape() == Shape{b, l, e});
  CHECK(rel_err(values(y), ref.forward(x)) < 1e-5);
  // Causal: the first position's output depends on x[:, 0] only.
  const Tensor dx = mhsa.backward(tensor(r, {b, l, e}), ctx);
  const auto loss = [&] { return dot(r, ref.forward(x)); };
  CHECK(rel_err(values(dx), numeric_grad(loss, x)) < 1e-5);
  struct P {
    Parameter* p;
    VecD* w;
  };
  for (const P& p : {P{&mhsa.q.weight, &ref.wq}, P{&mhsa.q.bias, &ref.bq}, P{&mhsa.k.weight, &ref.wk},
                     P{&mhsa.k.bias, &ref.bk}, P{&mhsa.v.weight, &ref.wv}, P{&mhsa.v.bias, &ref.bv},
                     P{&mhsa.out.weight, &ref.wo}, P{&mhsa.out.bias, &ref.bo}}) {
    CAPTURE(p.p->name);
    const VecD fd = numeric_grad(loss, *p.w);
    // The key bias has no effect (softmax is shift-invariant per row): its
    // gradient is 0 up to rounding.
    if (p.p == &mhsa.k.bias) CHECK(norm2(values(p.p->grad)) < 1e-5);
    else CHECK(rel_err(values(p.p->grad), fd) < 1e-5);
  }
}

TEST_CASE("MultiHeadSelfAttention in f16: the policy's dtypes, the trace's paths, the casts") {
  Rng rng(8);
  MultiHeadSelfAttention mhsa(8, 2, rng);
  mhsa.set_path("block0.attn");
  mhsa.apply_policy(UniformPolicy(DType::f16));
  CHECK(mhsa.q.weight.model_dtype() == DType::f16);
  Context ctx = context(DType::f16);
  Trace trace;
  ctx.set_trace(&trace);
  const VecD x = randn(48, 81);
  const Tensor y = mhsa.forward(tensor(x, {2, 3, 8}, DType::f16), ctx);
  CHECK(y.dtype() == DType::f16);
  const Tensor dx = mhsa.backward(tensor(randn(48, 82), {2, 3, 8}, DType::f16), ctx);
  CHECK(dx.dtype() == DType::f16);
  CHECK(all_finite(values(dx)));
  std::vector<std::string> fwd, bwd;
  for (const TraceEntry& e : trace.entries()) {
    if (e.op == "cast") continue;
    (e.phase == Phase::forward ? fwd : bwd).push_back(e.path + " " + e.op);
  }
  CHECK(fwd == std::vector<std::string>{"block0.attn.q linear", "block0.attn.k linear",
                                        "block0.attn.v linear", "block0.attn scaled_dot_product_attention",
                                        "block0.attn.out linear"});
  CHECK(bwd == std::vector<std::string>{"block0.attn.out linear", "block0.attn scaled_dot_product_attention",
                                        "block0.attn.q linear", "block0.attn.k linear",
                                        "block0.attn.v linear"});
  CHECK(trace.casts() == 0);  // everything already f16
}

TEST_CASE("the trace entry of SDPA: what it read, computed in and wrote; casts at its boundary are counted") {
  const VecD q = randn(24, 91), k = randn(40, 92), v = randn(20, 93);
  Context ctx = context(DType::f16);
  Trace trace;
  ctx.set_trace(&trace);
  const AttentionResult r =
      scaled_dot_product_attention(tensor(q, {2, 3, 4}), tensor(k, {2, 5, 4}), tensor(v, {2, 5, 2}),
                                   AttentionMask::additive(tensor(VecD(15, 0.0), {3, 5})), {}, ctx, "attn");
  CHECK(ctx.casts().casts == 3);  // q, k, v f32 → f16
  const TraceEntry* e = nullptr;
  for (const TraceEntry& t : trace.entries())
    if (t.op == "scaled_dot_product_attention") e = &t;
  REQUIRE(e != nullptr);
  CHECK(e->path == "attn");
  CHECK(e->phase == Phase::forward);
  CHECK(e->compute == DType::f32);
  REQUIRE(e->inputs.size() == 4);
  CHECK(e->inputs[0].name == "q");
  CHECK(e->inputs[0].dtype == DType::f16);
  CHECK(e->inputs[3].name == "mask");
  REQUIRE(e->outputs.size() == 4);
  CHECK(e->outputs[0].name == "out");
  CHECK(e->outputs[0].shape == Shape{2, 3, 2});
  CHECK(e->outputs[0].bytes == 2 * 3 * 2 * 2);
  CHECK(e->outputs[1].name == "scores");
  CHECK(e->outputs[2].name == "probs");
  CHECK(e->outputs[2].shape == Shape{2, 3, 5});
  CHECK(e->outputs[3].name == "q_scaled");
  trace.clear();
  const AttentionGrads g =
      scaled_dot_product_attention_backward(r.saved, tensor(randn(12, 94), {2, 3, 2}), ctx, "attn");
  CHECK(g.dk.dtype() == DType::f16);
  REQUIRE(trace.entries().size() == 2);  // the cast of dout, then the op
  CHECK(trace.entries()[0].op == "cast");
  CHECK(trace.entries()[1].phase == Phase::backward);
  CHECK(trace.entries()[1].outputs.size() == 3);
}

TEST_CASE("bad input: one line naming what was wrong and what would be valid") {
  Context ctx = context(DType::f32);
  const Tensor q = tensor(VecD(24, 0.1), {2, 3, 4}), k = tensor(VecD(40, 0.1), {2, 5, 4}),
               v = tensor(VecD(40, 0.1), {2, 5, 4});
  const auto sdpa = [&](const Tensor& a, const Tensor& b, const Tensor& c,
                        const AttentionMask& m = AttentionMask(), const AttentionOptions& o = {}) {
    (void)scaled_dot_product_attention(a, b, c, m, o, ctx);
  };
  struct Bad {
    std::string expect;
    std::function<void()> call;
  };
  AttentionOptions causal = causal_attention(), inf_scale;
  inf_scale.scale = std::numeric_limits<double>::infinity();
  const std::vector<Bad> bad = {
      {"expected q [B, H, Lq, D]", [&] { sdpa(tensor(VecD(4, 0), {4}), k, v); }},
      {"k's last dimension must be q's D = 4",
       [&] {
         sdpa(q, tensor(VecD(30, 0), {2, 5, 3}), v);
       }},
      {"v must have as many rows as k",
       [&] {
         sdpa(q, k, tensor(VecD(32, 0), {2, 4, 4}));
       }},
      {"q's leading dimensions 2",
       [&] {
         sdpa(q, tensor(VecD(60, 0), {3, 5, 4}), tensor(VecD(60, 0), {3, 5, 4}));
       }},
      {"does not broadcast to the scores' 2x3x5",
       [&] {
         sdpa(q, k, v, AttentionMask::boolean({3, 4}, std::vector<std::uint8_t>(12, 1)));
       }},
      {"is_causal with an explicit mask",
       [&] {
         sdpa(q, k, v, AttentionMask::boolean({3, 5}, std::vector<std::uint8_t>(15, 1)), causal);
       }},
      {"must be finite", [&] { sdpa(q, k, v, AttentionMask(), inf_scale); }},
      {"one element per position",
       [&] {
         (void)AttentionMask::boolean({3, 5}, std::vector<std::uint8_t>(14, 1));
       }},
      {"dout is 2x3x5, expected the output's 2x3x4",
       [&] {
         const AttentionResult r = scaled_dot_product_attention(q, k, v, AttentionMask(), {}, ctx);
         (void)scaled_dot_product_attention_backward(r.saved, tensor(VecD(30, 0), {2, 3, 5}), ctx);
       }},
      {"backward without a forward",
       [&] { (void)scaled_dot_product_attention_backward(AttentionState{}, q, ctx); }},
      {"num_heads must divide embed_dim",
       [&] {
         Rng rng(1);
         MultiHeadSelfAttention m(6, 4, rng);
       }},
      {"takes [B, L, 4]",
       [&] {
         Rng rng(1);
         MultiHeadSelfAttention m(4, 2, rng);
         (void)m.forward(tensor(VecD(8, 0), {2, 4}), ctx);
       }},
      {"f16 compute; attention sums",
       [&] {
         Context half(std::make_shared<HalfComputePolicy>());
         (void)scaled_dot_product_attention(q, k, v, AttentionMask(), {}, half);
       }},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.expect);
    const std::string what = error_of(b.call);
    CHECK(one_line(what));
    CHECK(what.find(b.expect) != std::string::npos);
  }
}
