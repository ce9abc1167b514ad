// Chapter 04 — a tiny language model: the decoder-only Transformer.
// Depends on: transformer.hpp.
#include "mpt/nn/models/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace mpt {

namespace {

void require_f32_add(const OpPrecision& q, const std::string& path) {
  if (q.compute != DType::f32)
    throw std::invalid_argument("add at " + path + ": the policy asks for " +
                                std::string(dtype_name(q.compute)) + " compute; the sum is computed in f32");
}

void fill_normal(Tensor& t, double std, Rng& rng) {
  float* p = t.f32_data();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(std * rng.normal());
}

void fill_value(Tensor& t, float v) {
  float* p = t.f32_data();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = v;
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("TinyTransformer: " + what);
}

}  // namespace

// --- the sums --------------------------------------------------------------------

Tensor add_op(const Tensor& a, const Tensor& b, Context& ctx, const std::string& path) {
  const Shape& as = a.shape();
  const Shape& bs = b.shape();
  bool ok = b.numel() > 0 && bs.size() <= as.size();
  for (std::size_t i = 0; ok && i < bs.size(); ++i) ok = bs[bs.size() - 1 - i] == as[as.size() - 1 - i];
  if (!ok)
    throw std::invalid_argument("add at " + path + ": a is " + shape_string(as) + " and b " +
                                shape_string(bs) + "; b's shape must be a non-empty suffix of a's");
  const OpPrecision op = ctx.decide("add", path, {a.dtype(), b.dtype()});
  require_f32_add(op, path);
  const Tensor ac = ctx.cast(a, op.input, path, Phase::forward, "a");
  const Tensor bc = ctx.cast(b, op.input, path, Phase::forward, "b");
  std::vector<float> y = widened(ac);
  const std::vector<float> bf = widened(bc);
  const std::size_t n = bf.size();
  for (std::size_t i = 0; i < y.size(); ++i) y[i] += bf[i % n];
  Tensor out = Tensor::from_f32(y.data(), as, op.output);
  if (ctx.tracing())
    ctx.record(
        {Phase::forward, path, "add", {traced("a", ac), traced("b", bc)}, op.compute, {traced("y", out)}});
  return out;
}

Tensor sum_gradients(const Tensor& g1, const Tensor& g2, DType dtype, Context& ctx, const std::string& path) {
  if (g1.shape() != g2.shape())
    throw std::invalid_argument("add at " + path + ": the gradients to sum are " + shape_string(g1.shape()) +
                                " and " + shape_string(g2.shape()) + "; they must have one shape");
  std::vector<float> s = widened(g1);
  const std::vector<float> b = widened(g2);
  for (std::size_t i = 0; i < s.size(); ++i) s[i] += b[i];
  Tensor out = Tensor::from_f32(s.data(), g1.shape(), dtype);
  if (ctx.tracing())
    ctx.record({Phase::backward,
                path,
                "add",
                {traced("dy", g1), traced("dbranch", g2)},
                DType::f32,
                {traced("dx", out)}});
  return out;
}

// --- TransformerBlock --------------------------------------------------------------

TransformerBlock::TransformerBlock(int d_model, int num_heads, int hidden, Rng& rng) {
  ln1 = &emplace<LayerNorm>("ln1", Shape{d_model});
  attn = &emplace<MultiHeadSelfAttention>("attn", d_model, num_heads, rng);
  ln2 = &emplace<LayerNorm>("ln2", Shape{d_model});
  mlp = &emplace<Sequential>("mlp");
  fc1 = &mlp->emplace<Linear>("fc1", d_model, hidden, rng);
  mlp->emplace<GELU>("gelu");
  fc2 = &mlp->emplace<Linear>("fc2", hidden, d_model, rng);
}

std::vector<std::string> TransformerBlock::inner_paths() const {
  const std::string base = path().empty() ? "" : path() + ".";
  return {base + "residual1", base + "residual2"};
}

Tensor TransformerBlock::forward_impl(const Tensor& x, Context& ctx) {
  if (x.dim() != 3 || x.size(2) != ln1->normalized_shape().front())
    throw std::invalid_argument(std::string(kind()) + " " + path() + ": x is " + shape_string(x.shape()) +
                                " but the block takes [B, T, " +
                                std::to_string(ln1->normalized_shape().front()) + "]");
  batch_ = x.size(0);
  length_ = x.size(1);
  width_ = x.size(2);
  x_dtype_ = x.dtype();
  const std::string base = path().empty() ? "" : path() + ".";
  const Tensor a = attn->forward(ln1->forward(x, ctx), ctx);
  const Tensor x1 = add_op(x, a, ctx, base + "residual1");
  mid_dtype_ = x1.dtype();
  const Tensor m = mlp->forward(ln2->forward(x1, ctx).reshaped({batch_ * length_, width_}), ctx);
  return add_op(x1, m.reshaped({batch_, length_, width_}), ctx, base + "residual2");
}

Tensor TransformerBlock::backward_impl(const Tensor& dy, Context& ctx) {
  const Shape want{batch_, length_, width_};
  if (dy.shape() != want)
    throw std::invalid_argument(std::string(kind()) + " " + path() + ": dy is " + shape_string(dy.shape()) +
                                ", expected " + shape_string(want));
  const std::string base = path().empty() ? "" : path() + ".";
  // residual2 = x1 + m: dm = dy through the MLP and ln2, plus dy itself.
  const Tensor dln2 = mlp->backward(dy.reshaped({batch_ * length_, width_}), ctx);
  const Tensor dx1_branch = ln2->backward(dln2.reshaped(want), ctx);
  const Tensor dx1_pass = ctx.cast(dy, mid_dtype_, base + "residual2", Phase::backward, "dy");
  const Tensor dx1 = sum_gradients(dx1_pass, dx1_branch, mid_dtype_, ctx, base + "residual2");
  // residual1 = x + a: the same through attention and ln1.
  const Tensor dx_branch = ln1->backward(attn->backward(dx1, ctx), ctx);
  const Tensor dx_pass = ctx.cast(dx1, x_dtype_, base + "residual1", Phase::backward, "dy");
  return sum_gradients(dx_pass, dx_branch, x_dtype_, ctx, base + "residual1");
}

// --- TinyTransformer ---------------------------------------------------------------

namespace {

TransformerConfig checked(TransformerConfig c) {
  require(c.vocab_size >= 1, "vocab_size must be >= 1, got " + std::to_string(c.vocab_size));
  require(c.context >= 1, "context must be >= 1, got " + std::to_string(c.context));
  require(c.d_model >= 1, "d_model must be >= 1, got " + std::to_string(c.d_model));
  require(c.num_heads >= 1 && c.d_model % c.num_heads == 0, "num_heads must be >= 1 and divide d_model " +
                                                                std::to_string(c.d_model) + ", got " +
                                                                std::to_string(c.num_heads));
  require(c.num_layers >= 1, "num_layers must be >= 1, got " + std::to_string(c.num_layers));
  require(c.mlp_ratio >= 1, "mlp_ratio must be >= 1, got " + std::to_string(c.mlp_ratio));
  require(std::isfinite(c.init_std) && c.init_std > 0,
          "init_std must be finite and > 0, got " + std::to_string(c.init_std));
  return c;
}

}  // namespace

TinyTransformer::TinyTransformer(TransformerConfig config)
    : Model("TinyTransformer", config.policy ? config.policy : uniform_policy(config.dtype)),
      config_(checked(std::move(config))) {
  Rng construct(config_.seed);  // the layers' own draws; init_weights() replaces them all
  tok_emb = &emplace<Embedding>("tok_emb", config_.vocab_size, config_.d_model, construct);
  tok_emb->set_input_grad(false);
  pos_emb = &emplace<Embedding>("pos_emb", config_.context, config_.d_model, construct);
  pos_emb->set_input_grad(false);
  for (int l = 0; l < config_.num_layers; ++l)
    blocks.push_back(&emplace<TransformerBlock>("block" + std::to_string(l), config_.d_model,
                                                config_.num_heads, config_.mlp_ratio * config_.d_model,
                                                construct));
  ln_f = &emplace<LayerNorm>("ln_f", Shape{config_.d_model});
  lm_head = &emplace<TiedLinear>("lm_head", tok_emb->weight);
  finish();
  init_weights(config_.seed);
}

void TinyTransformer::init_weights(std::uint64_t seed) {
  Rng rng(seed);
  const double sigma = config_.init_std;
  // nanoGPT's model.py: c_proj weights get std 0.02/sqrt(2·n_layer), after
  // GPT-2's "scale the weights of residual layers by 1/sqrt(N)".
  const double residual_sigma = sigma / std::sqrt(2.0 * config_.num_layers);
  std::vector<const Parameter*> residual;
  for (TransformerBlock* b : blocks) {
    residual.push_back(&b->attn->out.weight);
    residual.push_back(&b->fc2->weight);
  }
  std::vector<const Parameter*> gammas;
  std::vector<LayerNorm*> lns;
  for (TransformerBlock* b : blocks) {
    lns.push_back(b->ln1);
    lns.push_back(b->ln2);
  }
  lns.push_back(ln_f);
  for (LayerNorm* n : lns) gammas.push_back(&n->weight);
  const auto in = [](const std::vector<const Parameter*>& v, const Parameter* p) {
    return std::find(v.begin(), v.end(), p) != v.end();
  };
  for (Parameter* p : parameters()) {
    if (in(gammas, p)) {
      fill_value(p->master, 1.0f);
    } else if (p->master.dim() == 1) {
      fill_value(p->master, 0.0f);  // a LayerNorm's β or a Linear's bias
    } else {
      fill_normal(p->master, in(residual, p) ? residual_sigma : sigma, rng);
    }
    p->grad.fill_zero();
  }
  refresh_model_copies();
}

const Tensor& TinyTransformer::forward_tokens(const std::vector<int>& ids, int batch, int length) {
  if (batch < 1 || length < 1 ||
      ids.size() != static_cast<std::size_t>(batch) * static_cast<std::size_t>(length))
    throw std::invalid_argument("TinyTransformer::forward_tokens: " + std::to_string(ids.size()) +
                                " ids for batch " + std::to_string(batch) + " x length " +
                                std::to_string(length) + "; give batch·length ids, batch and length >= 1");
  MatrixF x(batch, length);
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < length; ++t)
      x(b, t) = static_cast<float>(
          ids[static_cast<std::size_t>(b) * static_cast<std::size_t>(length) + static_cast<std::size_t>(t)]);
  return forward(x);
}

Tensor TinyTransformer::forward_impl(const Tensor& ids, Context& ctx) {
  if (ids.dim() != 2 || ids.size(0) < 1 || ids.size(1) < 1 || ids.size(1) > config_.context)
    throw std::invalid_argument("TinyTransformer: ids are " + shape_string(ids.shape()) +
                                "; give [B, T] token ids with B >= 1 and 1 <= T <= context " +
                                std::to_string(config_.context));
  batch_ = ids.size(0);
  length_ = ids.size(1);
  const std::int64_t d = config_.d_model;
  const Tensor tok = tok_emb->forward(ids, ctx);
  std::vector<float> positions(static_cast<std::size_t>(length_));
  for (std::int64_t t = 0; t < length_; ++t) positions[static_cast<std::size_t>(t)] = static_cast<float>(t);
  const Tensor pos = pos_emb->forward(Tensor::from_f32(positions.data(), {length_}, DType::f32), ctx);
  tok_dtype_ = tok.dtype();
  pos_dtype_ = pos.dtype();
  Tensor h = add_op(tok, pos, ctx, "embedding_sum");
  for (TransformerBlock* b : blocks) h = b->forward(h, ctx);
  h = ln_f->forward(h, ctx);
  return lm_head->forward(h.reshaped({batch_ * length_, d}), ctx);
}

Tensor TinyTransformer::backward_impl(const Tensor& dy, Context& ctx) {
  const std::int64_t d = config_.d_model;
  const Tensor dh = lm_head->backward(dy, ctx);
  Tensor g = ln_f->backward(dh.reshaped({batch_, length_, d}), ctx);
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) g = (*it)->backward(g, ctx);
  // embedding_sum = tok + pos (broadcast over the batch): tok gets dh as it
  // is, pos the FP32 sum of dh over the batch.
  tok_emb->backward(ctx.cast(g, tok_dtype_, "embedding_sum", Phase::backward, "dy"), ctx);
  const std::vector<float> gf = widened(g);
  std::vector<float> dpos(static_cast<std::size_t>(length_ * d), 0.0f);
  for (std::size_t i = 0; i < gf.size(); ++i) dpos[i % dpos.size()] += gf[i];
  const Tensor dp = Tensor::from_f32(dpos.data(), {length_, d}, pos_dtype_);
  if (ctx.tracing())
    ctx.record({Phase::backward, "embedding_sum", "add", {traced("dy", g)}, DType::f32, {traced("db", dp)}});
  pos_emb->backward(dp, ctx);
  return {};
}

}  // namespace mpt
