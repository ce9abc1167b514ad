// Chapter 04 — numerically stable attention: scaled dot-product attention and
// the causal multi-head self-attention layer.
// Depends on: attention.hpp, attention_math.hpp (the row formulas on
// softmax_math.hpp), gemm.hpp (multiply_into, the products).
#include "mpt/nn/layers/attention.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "mpt/nn/cpu/gemm.hpp"
#include "mpt/nn/layers/attention_math.hpp"

namespace mpt {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

// Round v into d and read the rounded values back into v: what storing an
// intermediate in d and reading it again does. Returns the stored tensor.
Tensor store_and_reload(std::vector<float>& v, Shape shape, DType d) {
  Tensor t = Tensor::from_f32(v.data(), std::move(shape), d);
  t.to_f32(v.data());
  return t;
}

std::string who(std::string_view path) {
  return path.empty() ? std::string(kOp) : std::string(kOp) + " at " + std::string(path);
}

// The sizes of one call: N = the product of the leading dimensions.
struct Dims {
  Shape lead;
  std::int64_t n = 1, lq = 0, lk = 0, d = 0, dv = 0;
};

Shape with_last2(const Shape& lead, std::int64_t a, std::int64_t b) {
  Shape s = lead;
  s.push_back(a);
  s.push_back(b);
  return s;
}

Dims check_shapes(const Tensor& q, const Tensor& k, const Tensor& v, std::string_view path) {
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument(who(path) + ": q is " + shape_string(q.shape()) + ", k " +
                                 shape_string(k.shape()) + ", v " + shape_string(v.shape()) + "; " + why);
  };
  if ((q.dim() != 3 && q.dim() != 4) || k.dim() != q.dim() || v.dim() != q.dim())
    throw bad(
        "expected q [B, H, Lq, D], k [B, H, Lk, D], v [B, H, Lk, Dv] (or all three of rank 3: [N, L, D])");
  for (const Tensor* t : {&q, &k, &v})
    for (std::int64_t s : t->shape())
      if (s < 1) throw bad("every size must be >= 1");
  Dims g;
  const int r = q.dim();
  g.lead.assign(q.shape().begin(), q.shape().end() - 2);
  for (int a = 0; a < r - 2; ++a)
    if (k.size(a) != q.size(a) || v.size(a) != q.size(a))
      throw bad("k and v must have q's leading dimensions " + shape_string(g.lead));
  g.n = numel(g.lead);
  g.lq = q.size(r - 2);
  g.d = q.size(r - 1);
  g.lk = k.size(r - 2);
  g.dv = v.size(r - 1);
  if (k.size(r - 1) != g.d) throw bad("k's last dimension must be q's D = " + std::to_string(g.d));
  if (v.size(r - 2) != g.lk) throw bad("v must have as many rows as k (Lk = " + std::to_string(g.lk) + ")");
  return g;
}

// Where element (n, i, j) of the scores [lead..., Lq, Lk] reads the mask:
// offset(n) + i·row + j·col, with stride 0 along broadcast dimensions.
struct MaskIndex {
  std::vector<std::int64_t> lead_offset;  // per n
  std::int64_t row = 0, col = 0;
};

MaskIndex mask_index(const Shape& mask, const Dims& g, std::string_view path) {
  const Shape target = with_last2(g.lead, g.lq, g.lk);
  const std::size_t r = target.size();
  bool ok = mask.size() <= r && !mask.empty();
  Shape padded(r, 1);
  for (std::size_t a = 0; ok && a < mask.size(); ++a) padded[r - mask.size() + a] = mask[a];
  for (std::size_t a = 0; ok && a < r; ++a) ok = padded[a] == 1 || padded[a] == target[a];
  if (!ok)
    throw std::invalid_argument(who(path) + ": the mask is " + shape_string(mask) +
                                ", which does not broadcast to the scores' " + shape_string(target) +
                                " (each dimension, aligned at the right, must be equal or 1)");
  std::vector<std::int64_t> stride(r, 0);
  std::int64_t s = 1;
  for (std::size_t a = r; a-- > 0;) {
    stride[a] = padded[a] == 1 ? 0 : s;
    s *= padded[a];
  }
  MaskIndex m;
  m.row = stride[r - 2];
  m.col = stride[r - 1];
  m.lead_offset.resize(static_cast<std::size_t>(g.n));
  for (std::int64_t n = 0; n < g.n; ++n) {
    std::int64_t rest = n, off = 0;
    for (std::size_t a = r - 2; a-- > 0;) {
      off += (rest % target[a]) * stride[a];
      rest /= target[a];
    }
    m.lead_offset[static_cast<std::size_t>(n)] = off;
  }
  return m;
}

void require_f32_attention(const OpPrecision& op, std::string_view path) {
  if (op.compute != DType::f32)
    throw std::invalid_argument(who(path) + ": the policy asks for " + std::string(dtype_name(op.compute)) +
                                " compute; attention sums its products and its softmax in f32");
}

}  // namespace

// --- AttentionMask ---------------------------------------------------------------

AttentionMask AttentionMask::boolean(Shape shape, std::vector<std::uint8_t> keep) {
  bool ok = !shape.empty();
  for (std::int64_t s : shape) ok = ok && s >= 1;
  if (!ok || static_cast<std::int64_t>(keep.size()) != numel(shape))
    throw std::invalid_argument("AttentionMask::boolean: shape " + shape_string(shape) + " with " +
                                std::to_string(keep.size()) +
                                " elements; the shape needs every size >= 1 and one element per position");
  AttentionMask m;
  m.kind_ = Kind::boolean;
  m.shape_ = std::move(shape);
  m.keep_ = std::move(keep);
  return m;
}

AttentionMask AttentionMask::additive(Tensor add) {
  if (add.numel() == 0)
    throw std::invalid_argument("AttentionMask::additive: the mask " + shape_string(add.shape()) +
                                " is empty; give one value per position (broadcastable to [..., Lq, Lk])");
  AttentionMask m;
  m.kind_ = Kind::additive;
  m.shape_ = add.shape();
  m.add_ = std::move(add);
  return m;
}

// --- scaled_dot_product_attention --------------------------------------------------

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionMask& mask, const AttentionOptions& options,
                                             Context& ctx, std::string_view path) {
  const Dims g = check_shapes(q, k, v, path);
  if (options.is_causal && mask.kind() != AttentionMask::Kind::none)
    throw std::invalid_argument(
        who(path) + ": is_causal with an explicit mask; give one or the other (as PyTorch requires)");
  const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(g.d));
  if (!std::isfinite(scale)) {
    std::ostringstream o;
    o << scale;
    throw std::invalid_argument(who(path) + ": scale " + o.str() + " must be finite (default 1/sqrt(D))");
  }
  MaskIndex mi;
  if (mask.kind() != AttentionMask::Kind::none) mi = mask_index(mask.shape(), g, path);

  AttentionResult r;
  AttentionState& st = r.saved;
  st.op = ctx.decide(kOp, path, {q.dtype(), k.dtype(), v.dtype()});
  require_f32_attention(st.op, path);
  st.scale = scale;
  st.scale_q_first = options.scale_q_first;
  const DType in = st.op.input;
  const Tensor qi = ctx.cast(q, in, path, Phase::forward, "q");
  st.k = ctx.cast(k, in, path, Phase::forward, "k");
  st.v = ctx.cast(v, in, path, Phase::forward, "v");

  std::vector<float> qf = widened(qi);
  const std::vector<float> kf = widened(st.k), vf = widened(st.v);
  if (options.scale_q_first) {
    // Q·scale in FP32, stored in the input dtype: what the product reads.
    for (float& x : qf) x *= static_cast<float>(scale);
    st.q = store_and_reload(qf, q.shape(), in);
  } else {
    st.q = qi;
  }
  const float post_scale = options.scale_q_first ? 1.0f : static_cast<float>(scale);

  // 1. S = Q Kᵀ per head: FP32 accumulation, rounded once into the input dtype.
  const std::int64_t lq = g.lq, lk = g.lk, d = g.d, dv = g.dv;
  std::vector<float> s(static_cast<std::size_t>(g.n * lq * lk));
  for (std::int64_t n = 0; n < g.n; ++n) {
    const ConstMatrixMap<float> qm(qf.data() + n * lq * d, lq, d), km(kf.data() + n * lk * d, lk, d);
    MatrixMapF sm(s.data() + n * lq * lk, lq, lk);
    multiply_into(sm, qm, Op::N, km, Op::T);
  }
  r.scores = store_and_reload(s, with_last2(g.lead, lq, lk), in);

  // 2. P = softmax(S·scale + mask) row by row in FP32 (MaxSum), stored in
  // the input dtype.
  std::vector<float> addf;
  if (mask.kind() == AttentionMask::Kind::additive) addf = widened(mask.add());
  std::vector<float> t(static_cast<std::size_t>(lk)), p(s.size());
  for (std::int64_t n = 0; n < g.n; ++n)
    for (std::int64_t i = 0; i < lq; ++i) {
      const std::int64_t row = (n * lq + i) * lk;
      for (std::int64_t j = 0; j < lk; ++j) {
        bool keep = !options.is_causal || j <= i;
        float add = 0.0f;
        if (mask.kind() != AttentionMask::Kind::none) {
          const auto at =
              static_cast<std::size_t>(mi.lead_offset[static_cast<std::size_t>(n)] + i * mi.row + j * mi.col);
          if (mask.kind() == AttentionMask::Kind::boolean) keep = mask.keep()[at] != 0;
          else add = addf[at];
        }
        t[static_cast<std::size_t>(j)] =
            attention_math::score(s[static_cast<std::size_t>(row + j)], post_scale, keep, add);
      }
      attention_math::row_softmax(t.data(), static_cast<int>(lk), p.data() + row);
    }
  st.probs = store_and_reload(p, with_last2(g.lead, lq, lk), in);

  // 3. out = P V: FP32 accumulation, rounded once into the output dtype.
  std::vector<float> o(static_cast<std::size_t>(g.n * lq * dv));
  for (std::int64_t n = 0; n < g.n; ++n) {
    const ConstMatrixMap<float> pm(p.data() + n * lq * lk, lq, lk), vm(vf.data() + n * lk * dv, lk, dv);
    MatrixMapF om(o.data() + n * lq * dv, lq, dv);
    multiply_into(om, pm, Op::N, vm, Op::N);
  }
  r.out = Tensor::from_f32(o.data(), with_last2(g.lead, lq, dv), st.op.output);

  if (ctx.tracing()) {
    TraceEntry e{Phase::forward,
                 std::string(path),
                 kOp,
                 {traced("q", qi), traced("k", st.k), traced("v", st.v)},
                 st.op.compute,
                 {traced("out", r.out), traced("scores", r.scores), traced("probs", st.probs)}};
    if (options.scale_q_first) e.outputs.push_back(traced("q_scaled", st.q));
    if (mask.kind() == AttentionMask::Kind::additive) e.inputs.push_back(traced("mask", mask.add()));
    ctx.record(std::move(e));
  }
  return r;
}

AttentionGrads scaled_dot_product_attention_backward(const AttentionState& saved, const Tensor& dout,
                                                     Context& ctx, std::string_view path) {
  const AttentionState& st = saved;
  if (st.q.dim() < 3 || st.probs.dim() != st.q.dim())
    throw std::invalid_argument(who(path) + ": backward without a forward (the saved state is empty)");
  const int r = st.q.dim();
  Shape lead(st.q.shape().begin(), st.q.shape().end() - 2);
  const std::int64_t n_all = numel(lead), lq = st.q.size(r - 2), d = st.q.size(r - 1), lk = st.k.size(r - 2),
                     dv = st.v.size(r - 1);
  const Shape out_shape = with_last2(lead, lq, dv);
  if (dout.shape() != out_shape)
    throw std::invalid_argument(who(path) + ": dout is " + shape_string(dout.shape()) +
                                ", expected the output's " + shape_string(out_shape));
  const DType in = st.op.input;
  const Tensor dot = ctx.cast(dout, in, path, Phase::backward, "dout");
  const std::vector<float> qf = widened(st.q), kf = widened(st.k), vf = widened(st.v), pf = widened(st.probs),
                           gf = widened(dot);
  // With the scale in Q, the product read Q·scale: the row formulas run with
  // factor 1 and give d(Q·scale), which the chain rule multiplies by scale.
  const float post = st.scale_q_first ? 1.0f : static_cast<float>(st.scale);
  const float pre = st.scale_q_first ? static_cast<float>(st.scale) : 1.0f;
  std::vector<float> dq(qf.size()), dk(kf.size(), 0.0f), dvv(vf.size(), 0.0f);
  std::vector<float> dp(static_cast<std::size_t>(lk)), ds(static_cast<std::size_t>(lk));
  for (std::int64_t n = 0; n < n_all; ++n)
    for (std::int64_t i = 0; i < lq; ++i) {
      const std::int64_t qi = (n * lq + i) * d;
      attention_math::row_backward(
          qf.data() + qi, kf.data() + n * lk * d, vf.data() + n * lk * dv, pf.data() + (n * lq + i) * lk,
          gf.data() + (n * lq + i) * dv, static_cast<int>(lk), static_cast<int>(d), static_cast<int>(dv),
          post, dp.data(), ds.data(), dq.data() + qi, dk.data() + n * lk * d, dvv.data() + n * lk * dv);
    }
  if (pre != 1.0f)
    for (float& x : dq) x *= pre;
  AttentionGrads gr;
  gr.dq = Tensor::from_f32(dq.data(), st.q.shape(), in);
  gr.dk = Tensor::from_f32(dk.data(), st.k.shape(), in);
  gr.dv = Tensor::from_f32(dvv.data(), st.v.shape(), in);
  if (ctx.tracing())
    ctx.record({Phase::backward,
                std::string(path),
                kOp,
                {traced("dout", dot), traced("q", st.q), traced("k", st.k), traced("v", st.v),
                 traced("probs", st.probs)},
                st.op.compute,
                {traced("dq", gr.dq), traced("dk", gr.dk), traced("dv", gr.dv)}});
  return gr;
}

// --- MultiHeadSelfAttention ---------------------------------------------------------

namespace {

int checked_heads(int e, int h) {
  if (e < 1 || h < 1 || e % h != 0)
    throw std::invalid_argument("MultiHeadSelfAttention: embed_dim " + std::to_string(e) + " and num_heads " +
                                std::to_string(h) +
                                "; both must be >= 1 and num_heads must divide embed_dim");
  return e;
}

// [B·L, E] (heads side by side in E) ↔ [B, H, L, E/H]: a permutation of
// values already in their dtype, so storing them again is exact.
Tensor to_heads(const Tensor& x, std::int64_t b, std::int64_t l, std::int64_t h) {
  const std::int64_t e = x.numel() / (b * l), dh = e / h;
  const std::vector<float> xf = widened(x);
  std::vector<float> y(xf.size());
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t li = 0; li < l; ++li)
      for (std::int64_t hi = 0; hi < h; ++hi)
        for (std::int64_t c = 0; c < dh; ++c)
          y[static_cast<std::size_t>(((bi * h + hi) * l + li) * dh + c)] =
              xf[static_cast<std::size_t>((bi * l + li) * e + hi * dh + c)];
  return Tensor::from_f32(y.data(), {b, h, l, dh}, x.dtype());
}

Tensor from_heads(const Tensor& x) {
  const std::int64_t b = x.size(0), h = x.size(1), l = x.size(2), dh = x.size(3), e = h * dh;
  const std::vector<float> xf = widened(x);
  std::vector<float> y(xf.size());
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t li = 0; li < l; ++li)
      for (std::int64_t hi = 0; hi < h; ++hi)
        for (std::int64_t c = 0; c < dh; ++c)
          y[static_cast<std::size_t>((bi * l + li) * e + hi * dh + c)] =
              xf[static_cast<std::size_t>(((bi * h + hi) * l + li) * dh + c)];
  return Tensor::from_f32(y.data(), {b * l, e}, x.dtype());
}

}  // namespace

MultiHeadSelfAttention::MultiHeadSelfAttention(int embed_dim, int num_heads, Rng& rng,
                                               AttentionOptions options)
    : q(checked_heads(embed_dim, num_heads), embed_dim, rng),
      k(embed_dim, embed_dim, rng),
      v(embed_dim, embed_dim, rng),
      out(embed_dim, embed_dim, rng),
      embed_dim_(embed_dim),
      num_heads_(num_heads),
      options_(options) {
  if (options_.scale && !std::isfinite(*options_.scale))
    throw std::invalid_argument("MultiHeadSelfAttention: the scale must be finite (default 1/sqrt(E/H))");
  set_path("");
}

std::vector<Parameter*> MultiHeadSelfAttention::parameters() {
  return {&q.weight, &q.bias, &k.weight, &k.bias, &v.weight, &v.bias, &out.weight, &out.bias};
}

void MultiHeadSelfAttention::apply_policy(const Policy& policy) {
  for (Linear* l : {&q, &k, &v, &out}) l->apply_policy(policy);
}

std::vector<const Tensor*> MultiHeadSelfAttention::saved() const {
  std::vector<const Tensor*> s;
  for (const Linear* l : {&q, &k, &v, &out}) {
    const std::vector<const Tensor*> ls = l->saved();
    s.insert(s.end(), ls.begin(), ls.end());
  }
  for (const Tensor* t : {&attn_.saved.q, &attn_.saved.k, &attn_.saved.v, &attn_.saved.probs}) s.push_back(t);
  return s;
}

void MultiHeadSelfAttention::set_path(std::string p) {
  Module::set_path(std::move(p));
  const std::string base = path().empty() ? "" : path() + ".";
  q.set_path(base + "q");
  k.set_path(base + "k");
  v.set_path(base + "v");
  out.set_path(base + "out");
}

Tensor MultiHeadSelfAttention::forward_impl(const Tensor& x, Context& ctx) {
  if (x.dim() != 3 || x.size(2) != embed_dim_ || x.size(0) < 1 || x.size(1) < 1)
    throw std::invalid_argument(std::string(kind()) + (path().empty() ? "" : " " + path()) + ": x is " +
                                shape_string(x.shape()) + " but the layer takes [B, L, " +
                                std::to_string(embed_dim_) + "] with B, L >= 1");
  batch_ = x.size(0);
  length_ = x.size(1);
  const Tensor x2 = x.reshaped({batch_ * length_, embed_dim_});
  const Tensor qh = to_heads(q.forward(x2, ctx), batch_, length_, num_heads_);
  const Tensor kh = to_heads(k.forward(x2, ctx), batch_, length_, num_heads_);
  const Tensor vh = to_heads(v.forward(x2, ctx), batch_, length_, num_heads_);
  attn_ = scaled_dot_product_attention(qh, kh, vh, AttentionMask(), options_, ctx, path());
  const Tensor y = out.forward(from_heads(attn_.out), ctx);
  return y.reshaped({batch_, length_, embed_dim_});
}

Tensor MultiHeadSelfAttention::backward_impl(const Tensor& dy, Context& ctx) {
  if (dy.shape() != Shape{batch_, length_, embed_dim_})
    throw std::invalid_argument(std::string(kind()) + (path().empty() ? "" : " " + path()) + ": dy is " +
                                shape_string(dy.shape()) + ", expected " +
                                shape_string(Shape{batch_, length_, embed_dim_}));
  const Tensor dheads = out.backward(dy.reshaped({batch_ * length_, embed_dim_}), ctx);
  const AttentionGrads g = scaled_dot_product_attention_backward(
      attn_.saved, to_heads(dheads, batch_, length_, num_heads_), ctx, path());
  Tensor dx;
  std::vector<float> sum;
  for (auto [lin, grad] : {std::pair<Linear*, const Tensor*>{&q, &g.dq}, {&k, &g.dk}, {&v, &g.dv}}) {
    lin->set_input_grad(input_grad());
    const Tensor part = lin->backward(from_heads(*grad), ctx);
    if (!input_grad()) continue;
    const std::vector<float> pf = widened(part);
    if (sum.empty()) sum.assign(pf.size(), 0.0f);
    for (std::size_t i = 0; i < pf.size(); ++i) sum[i] += pf[i];
    dx = part;  // its dtype and shape
  }
  if (!input_grad()) return {};
  return Tensor::from_f32(sum.data(), {batch_, length_, embed_dim_}, dx.dtype());
}

}  // namespace mpt
