// Chapter 04 — a tiny language model's layers: Embedding and the tied output
// layer. The gather and the scatter-add against numbers worked out in the
// test, repeated indices, the policy's dtypes, tied weights receiving both
// gradients (against finite differences of an FP64 model), the trace, the
// errors.
// Depends on: mpt/nn/layers/embedding.hpp, the core tier (Context, policies, Trace, Rng).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/nn/layers/embedding.hpp"

using namespace mpt;
using VecD = std::vector<double>;
using VecF = std::vector<float>;

namespace {

Tensor tensor(const VecD& v, Shape s, DType d = DType::f32) {
  const VecF f(v.begin(), v.end());
  return Tensor::from_f32(f.data(), std::move(s), d);
}

VecD values(const Tensor& t) {
  VecF f(static_cast<std::size_t>(t.numel()));
  t.to_f32(f.data());
  return VecD(f.begin(), f.end());
}

Context context(DType d) { return Context(uniform_policy(d)); }

// The table [4, 3]: row r is (r, r + 0.5, −r).
Tensor table() { return tensor({0, 0.5, 0, 1, 1.5, -1, 2, 2.5, -2, 3, 3.5, -3}, {4, 3}); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("Embedding forward gathers rows; backward scatter-adds, repeated indices accumulating") {
  Embedding emb(table());
  emb.set_path("wte");
  CHECK(emb.weight.name == "wte.weight");
  CHECK(emb.num_embeddings() == 4);
  CHECK(emb.embedding_dim() == 3);
  Context ctx = context(DType::f32);
  // ids [2, 3] with 2 three times and 0 never.
  const Tensor y = emb.lookup({2, 1, 2, 3, 2, 1}, {2, 3}, ctx);
  CHECK(y.shape() == Shape{2, 3, 3});
  CHECK(values(y) == VecD{2, 2.5, -2, 1, 1.5, -1, 2, 2.5, -2, 3, 3.5, -3, 2, 2.5, -2, 1, 1.5, -1});
  // dy: position p's row is (p, 1, 0.25).
  VecD dy;
  for (int p = 0; p < 6; ++p) dy.insert(dy.end(), {static_cast<double>(p), 1, 0.25});
  CHECK(emb.backward(tensor(dy, {2, 3, 3}), ctx).numel() == 0);  // indices have no gradient
  // Row 2 gets positions 0, 2, 4; row 1 positions 1, 5; row 3 position 3; row 0 nothing.
  const VecD want{0, 0, 0, 1 + 5, 2, 0.5, 0 + 2 + 4, 3, 0.75, 3, 1, 0.25};
  CHECK(values(emb.weight.grad) == want);
  // A second backward adds (PyTorch's .grad accumulation).
  emb.forward(tensor({2, 1, 2, 3, 2, 1}, {2, 3}), ctx);
  emb.backward(tensor(dy, {2, 3, 3}), ctx);
  VecD twice = want;
  for (double& x : twice) x *= 2;
  CHECK(values(emb.weight.grad) == twice);
}

TEST_CASE("Embedding in f16: the model copy in the policy's dtype, the output in its output dtype") {
  // 1 + 2^-12 is not an f16 value: the model copy rounds it to 1.
  Embedding emb(tensor({1 + 0x1p-12, 2, 3, 4}, {2, 2}));
  emb.apply_policy(UniformPolicy(DType::f16));
  CHECK(emb.weight.model_dtype() == DType::f16);
  CHECK(emb.weight.master.value(0) == static_cast<float>(1 + 0x1p-12));  // the master stays FP32
  Context ctx = context(DType::f16);
  const Tensor y = emb.lookup({0, 1, 0}, {3}, ctx);
  CHECK(y.dtype() == DType::f16);
  CHECK(values(y) == VecD{1, 2, 3, 4, 1, 2});
  CHECK(ctx.casts().casts == 0);
  // Keeping the embedding in FP32 reads the master.
  KeepF32Policy keep(uniform_policy(DType::f16), {}, {"embedding"});
  emb.apply_policy(keep);
  Context c32(std::make_shared<KeepF32Policy>(keep));
  const Tensor y32 = emb.lookup({0}, {1}, c32);
  CHECK(y32.dtype() == DType::f32);
  CHECK(y32.value(0) == static_cast<float>(1 + 0x1p-12));
}

TEST_CASE("Embedding's random init is N(0, 1), as PyTorch's") {
  Rng rng(3);
  Embedding emb(200, 50, rng);
  const VecD w = values(emb.weight.master);
  double m = 0, s = 0;
  for (double x : w) m += x;
  m /= static_cast<double>(w.size());
  for (double x : w) s += (x - m) * (x - m);
  s = std::sqrt(s / static_cast<double>(w.size()));
  CHECK(std::abs(m) < 0.03);  // 10 000 samples: sd of the mean 0.01
  CHECK(std::abs(s - 1) < 0.03);
}

TEST_CASE("tied weights: logits = h Eᵀ, and the table receives both gradients (vs FP64 finite differences)") {
  // Model: h = E[ids] (Embedding), logits = h Eᵀ (TiedLinear), loss = Σ r·logits.
  Embedding emb(table());
  emb.set_path("wte");
  TiedLinear head(emb.weight);
  head.set_path("lm_head");
  CHECK(head.parameters().empty());  // the optimizer sees the table once, through the Embedding
  CHECK(&head.table() == &emb.weight);
  const std::vector<std::int64_t> ids{3, 1, 3};
  const VecD r{0.5, -1, 2, 0.25, 1, 0, -0.5, 3, -2, 1, 0.75, -0.25};  // [3, 4]
  Context ctx = context(DType::f32);
  const Tensor h = emb.lookup(ids, {3}, ctx);
  const Tensor logits = head.forward(h, ctx);
  CHECK(logits.shape() == Shape{3, 4});
  // logits[0][c] = E[3]·E[c]: (3, 3.5, −3)·(1, 1.5, −1) = 3 + 5.25 + 3.
  CHECK(logits.value(1) == doctest::Approx(11.25));
  const Tensor dh = head.backward(tensor(r, {3, 4}), ctx);
  emb.backward(dh, ctx);
  // The FP64 model and its central differences with respect to the table.
  VecD e = values(table());
  const auto loss = [&] {
    double s = 0;
    for (std::size_t i = 0; i < ids.size(); ++i)
      for (std::size_t c = 0; c < 4; ++c) {
        double l = 0;
        for (std::size_t k = 0; k < 3; ++k) l += e[static_cast<std::size_t>(ids[i]) * 3 + k] * e[c * 3 + k];
        s += r[i * 4 + c] * l;
      }
    return s;
  };
  VecD fd(e.size());
  for (std::size_t i = 0; i < e.size(); ++i) {
    const double keep = e[i];
    e[i] = keep + 1e-6;
    const double up = loss();
    e[i] = keep - 1e-6;
    const double down = loss();
    e[i] = keep;
    fd[i] = (up - down) / 2e-6;
  }
  const VecD g = values(emb.weight.grad);
  for (std::size_t i = 0; i < g.size(); ++i) {
    CAPTURE(i);
    CHECK(g[i] == doctest::Approx(fd[i]).epsilon(1e-6));
  }
  // Row 0 is never looked up: its gradient comes from the output layer only.
  CHECK(g[0] != 0.0);
}

TEST_CASE("Embedding and TiedLinear trace entries") {
  Embedding emb(table());
  emb.set_path("wte");
  emb.apply_policy(UniformPolicy(DType::bf16));
  TiedLinear head(emb.weight);
  head.set_path("lm_head");
  Context ctx = context(DType::bf16);
  Trace trace;
  ctx.set_trace(&trace);
  const Tensor logits = head.forward(emb.lookup({1, 2}, {1, 2}, ctx).reshaped({2, 3}), ctx);
  CHECK(logits.dtype() == DType::bf16);
  head.backward(logits, ctx);
  REQUIRE(trace.entries().size() == 3);
  const TraceEntry& f = trace.entries()[0];
  CHECK(f.path == "wte");
  CHECK(f.op == "embedding");
  CHECK(f.inputs[0].name == "ids");
  CHECK(f.inputs[0].bytes == 2 * 8);
  CHECK(f.inputs[1].dtype == DType::bf16);
  CHECK(f.outputs[0].shape == Shape{1, 2, 3});
  CHECK(f.outputs[0].bytes == 6 * 2);
  CHECK(trace.entries()[1].path == "lm_head");
  CHECK(trace.entries()[1].op == "linear");
  const TraceEntry& b = trace.entries()[2];
  CHECK(b.phase == Phase::backward);
  CHECK(b.outputs.back().name == "weight.grad");
  CHECK(b.outputs.back().dtype == DType::bf16);
}

TEST_CASE("Embedding and TiedLinear: bad input gives one line") {
  Embedding emb(table());
  TiedLinear head(emb.weight);
  Context ctx = context(DType::f32);
  Rng rng(1);
  struct Bad {
    std::string expect;
    std::function<void()> call;
  };
  const std::vector<Bad> bad = {
      {"index 4 at position 1 is out of range; valid indices are 0 to 3",
       [&] {
         emb.lookup({0, 4}, {2}, ctx);
       }},
      {"index -1 at position 0", [&] { emb.lookup({-1}, {1}, ctx); }},
      {"index 1.5 at position 0 is out of range; valid indices are the whole numbers 0 to 3",
       [&] { emb.forward(tensor({1.5}, {1}), ctx); }},
      {"3 indices for the shape 2x2",
       [&] {
         emb.lookup({0, 1, 2}, {2, 2}, ctx);
       }},
      {"must be >= 1, got 0 and 3", [&] { Embedding e(0, 3, rng); }},
      {"the table must be [V, D]",
       [&] {
         Embedding e(tensor({1, 2}, {2}));
       }},
      {"dy is 2x2, expected 2x3",
       [&] {
         emb.lookup({0, 1}, {2}, ctx);
         emb.backward(tensor({0, 0, 0, 0}, {2, 2}), ctx);
       }},
      {"h must be [B, 3]",
       [&] {
         head.forward(tensor({1, 2}, {1, 2}), ctx);
       }},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.expect);
    const std::string what = error_of(b.call);
    CHECK(what.find('\n') == std::string::npos);
    CHECK(what.find(b.expect) != std::string::npos);
  }
}
