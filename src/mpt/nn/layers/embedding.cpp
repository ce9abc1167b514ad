// Chapter 04 — a tiny language model's layers: the token embedding and the
// tied output layer.
// Depends on: embedding.hpp, gemm.hpp (TiedLinear's products).
#include "mpt/nn/layers/embedding.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "mpt/nn/cpu/gemm.hpp"

namespace mpt {

namespace {

void require_f32_sum(const OpPrecision& q, const char* op) {
  if (q.compute != DType::f32)
    throw std::invalid_argument(std::string(op) + ": the policy asks for " +
                                std::string(dtype_name(q.compute)) + " compute; " + op + " sums in f32");
}

}  // namespace

// --- Embedding ---------------------------------------------------------------

Embedding::Embedding(int num_embeddings, int embedding_dim, Rng& rng) {
  if (num_embeddings < 1 || embedding_dim < 1)
    throw std::invalid_argument("Embedding: num_embeddings and embedding_dim must be >= 1, got " +
                                std::to_string(num_embeddings) + " and " + std::to_string(embedding_dim));
  Tensor w(DType::f32, {num_embeddings, embedding_dim});
  float* p = w.f32_data();
  for (std::int64_t i = 0; i < w.numel(); ++i) p[i] = static_cast<float>(rng.normal());
  weight = Parameter("weight", std::move(w));
}

Embedding::Embedding(Tensor w) {
  if (w.dim() != 2 || w.size(0) < 1 || w.size(1) < 1)
    throw std::invalid_argument("Embedding: the table must be [V, D] with V, D >= 1; got " +
                                shape_string(w.shape()));
  weight = Parameter("weight", std::move(w));
}

std::string Embedding::who() const { return path().empty() ? "Embedding" : "Embedding " + path(); }

void Embedding::set_path(std::string p) {
  Module::set_path(std::move(p));
  weight.name = path().empty() ? "weight" : path() + ".weight";
}

void Embedding::apply_policy(const Policy& policy) {
  weight.set_model_dtype(policy.parameter_dtype("embedding", path()));
}

Tensor Embedding::lookup(const std::vector<std::int64_t>& ids, const Shape& ids_shape, Context& ctx) {
  if (static_cast<std::int64_t>(ids.size()) != numel(ids_shape))
    throw std::invalid_argument(who() + ": " + std::to_string(ids.size()) + " indices for the shape " +
                                shape_string(ids_shape) +
                                "; give numel(shape) = " + std::to_string(numel(ids_shape)));
  const std::int64_t v = num_embeddings();
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= v)
      throw std::invalid_argument(who() + ": index " + std::to_string(ids[i]) + " at position " +
                                  std::to_string(i) + " is out of range; valid indices are 0 to " +
                                  std::to_string(v - 1));
  const std::vector<float> f(ids.begin(), ids.end());
  return forward(Tensor::from_f32(f.data(), ids_shape, DType::f32), ctx);
}

Tensor Embedding::forward_impl(const Tensor& ids, Context& ctx) {
  const std::int64_t v = num_embeddings(), d = embedding_dim();
  const std::vector<float> f = widened(ids);
  ids_.resize(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) {
    if (!(f[i] >= 0 && f[i] < static_cast<float>(v)) || std::floor(f[i]) != f[i]) {
      std::ostringstream o;
      o << f[i];
      throw std::invalid_argument(who() + ": index " + o.str() + " at position " + std::to_string(i) +
                                  " is out of range; valid indices are the whole numbers 0 to " +
                                  std::to_string(v - 1));
    }
    ids_[i] = static_cast<std::int64_t>(f[i]);
  }
  ids_shape_ = ids.shape();
  op_ = ctx.decide("embedding", path(), {weight.weights().dtype()});
  require_f32_sum(op_, "embedding");
  const Tensor w = weight.read(op_.input, ctx, path(), Phase::forward, "weight");
  // The gather: rows of the table as stored, rounded into the output dtype
  // (exact when it is the table's).
  const std::vector<float> wf = widened(w);
  std::vector<float> y(ids_.size() * static_cast<std::size_t>(d));
  for (std::size_t i = 0; i < ids_.size(); ++i)
    for (std::int64_t c = 0; c < d; ++c)
      y[i * static_cast<std::size_t>(d) + static_cast<std::size_t>(c)] =
          wf[static_cast<std::size_t>(ids_[i] * d + c)];
  Shape ys = ids_shape_;
  ys.push_back(d);
  Tensor out = Tensor::from_f32(y.data(), ys, op_.output);
  if (ctx.tracing())
    ctx.record({Phase::forward,
                path(),
                "embedding",
                {{"ids", DType::f32, ids_shape_, ids_.size() * sizeof(std::int64_t)}, traced("weight", w)},
                op_.compute,
                {traced("y", out)}});
  return out;
}

Tensor Embedding::backward_impl(const Tensor& dy, Context& ctx) {
  const std::int64_t d = embedding_dim();
  Shape want = ids_shape_;
  want.push_back(d);
  if (dy.shape() != want)
    throw std::invalid_argument(who() + ": dy is " + shape_string(dy.shape()) + ", expected " +
                                shape_string(want));
  // The scatter-add in FP32: every occurrence of an index adds its row.
  const std::vector<float> g = widened(dy);
  std::vector<float> dw(static_cast<std::size_t>(weight.master.numel()), 0.0f);
  for (std::size_t i = 0; i < ids_.size(); ++i)
    for (std::int64_t c = 0; c < d; ++c)
      dw[static_cast<std::size_t>(ids_[i] * d + c)] +=
          g[i * static_cast<std::size_t>(d) + static_cast<std::size_t>(c)];
  // The gradient passes through the dtype forward read the table in.
  const DType wd = op_.input;
  weight.accumulate_grad(dw.data(), static_cast<std::int64_t>(dw.size()), wd);
  if (ctx.tracing())
    ctx.record({Phase::backward,
                path(),
                "embedding",
                {traced("dy", dy)},
                op_.compute,
                {{"weight.grad", wd, weight.master.shape(),
                  static_cast<std::size_t>(weight.master.numel()) * bytes_per_element(wd)}}});
  return {};
}

// --- TiedLinear ----------------------------------------------------------------

Tensor TiedLinear::forward_impl(const Tensor& h, Context& ctx) {
  const Tensor& table = table_->weights();
  if (table.dim() != 2 || h.dim() != 2 || h.size(1) != table.size(1))
    throw std::invalid_argument("TiedLinear" + (path().empty() ? std::string() : " " + path()) + ": h is " +
                                shape_string(h.shape()) + " but the tied table is " +
                                shape_string(table.shape()) + "; h must be [B, " +
                                std::to_string(table.dim() == 2 ? table.size(1) : 0) + "]");
  op_ = ctx.decide("linear", path(), {h.dtype(), table.dtype()});
  require_f32_sum(op_, "linear");
  h_ = ctx.cast(h, op_.input, path(), Phase::forward, "h");
  const Tensor w = table_->read(op_.input, ctx, path(), Phase::forward, "weight");
  Tensor y = gemm(h_, Op::N, w, Op::T, op_.output);
  if (ctx.tracing())
    ctx.record({Phase::forward,
                path(),
                "linear",
                {traced("h", h_), traced("weight", w)},
                op_.compute,
                {traced("y", y)}});
  return y;
}

Tensor TiedLinear::backward_impl(const Tensor& dy_out, Context& ctx) {
  const Tensor& table = table_->weights();
  if (dy_out.shape() != Shape{h_.size(0), table.size(0)})
    throw std::invalid_argument("TiedLinear" + (path().empty() ? std::string() : " " + path()) + ": dy is " +
                                shape_string(dy_out.shape()) + ", expected " +
                                shape_string(Shape{h_.size(0), table.size(0)}));
  const Tensor dy = ctx.cast(dy_out, op_.input, path(), Phase::backward, "dy");
  const Tensor w = table_->read(op_.input, ctx, path(), Phase::backward, "weight");
  const F32Matrix dyf(dy), hf(h_);
  MatrixF dw;
  multiply_into(dw, dyf.map(), Op::T, hf.map(), Op::N);
  const DType wd = w.dtype();
  table_->accumulate_grad(dw.data(), dw.size(), w);
  Tensor dh;
  if (input_grad()) dh = gemm(dy, Op::N, w, Op::N, op_.input);
  if (ctx.tracing()) {
    TraceEntry e{Phase::backward, path(), "linear", {traced("dy", dy), traced("h", h_), traced("weight", w)},
                 op_.compute,     {}};
    if (input_grad()) e.outputs.push_back(traced("dh", dh));
    e.outputs.push_back({"weight.grad", wd, table_->master.shape(),
                         static_cast<std::size_t>(table_->master.numel()) * bytes_per_element(wd)});
    ctx.record(std::move(e));
  }
  return dh;
}

}  // namespace mpt
