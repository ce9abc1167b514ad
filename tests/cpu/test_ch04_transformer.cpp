// Chapter 04 — tests of the tiny decoder-only Transformer and its training loop.
// Depends on: mpt/nn/models/transformer.hpp, mpt/core/policy.hpp, mpt/core/trace.hpp,
// chapters/04-softmax-attention/training.hpp (train_lm), doctest.
//
// The whole model's backward against central differences of an FP64 loss
// written out here; causality; the tied table's two gradients; the policies
// (uniform f16 and bf16, KeepF32Policy by op, read from the trace); training
// lowering the loss; determinism; bad configurations.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../../chapters/04-softmax-attention/training.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/nn/models/transformer.hpp"

namespace {

using mpt::DType;
using mpt::Parameter;
using mpt::Tensor;
using mpt::TinyTransformer;
using mpt::TransformerConfig;

TransformerConfig tiny(DType d = DType::f32) {
  TransformerConfig c;
  c.vocab_size = 7;
  c.context = 5;
  c.d_model = 8;
  c.num_heads = 2;
  c.num_layers = 2;
  c.init_std = 0.3;  // larger than GPT-2's, so that every gradient is well above FD noise
  c.dtype = d;
  c.seed = 11;
  return c;
}

const std::vector<int> kIds = {1, 4, 2, 2, 6, 0, 3, 5, 1, 1};  // [2, 5]
const std::vector<int> kTargets = {4, 2, 2, 6, 0, 3, 5, 1, 1, 4};

std::vector<double> values(const Tensor& t) {
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) v[static_cast<std::size_t>(i)] = t.value(i);
  return v;
}

// The mean cross-entropy of logits [N, V] in FP64: log Σ exp(z − max) + max − z_t.
double ref_loss(const std::vector<double>& z, const std::vector<int>& t, std::int64_t v) {
  const std::size_t n = t.size();
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double* row = z.data() + i * static_cast<std::size_t>(v);
    const double m = *std::max_element(row, row + v);
    double s = 0;
    for (std::int64_t j = 0; j < v; ++j) s += std::exp(row[j] - m);
    sum += std::log(s) + m - row[t[i]];
  }
  return sum / static_cast<double>(n);
}

// Its gradient: (softmax − onehot)/N, in FP64, stored as f32.
Tensor ref_dlogits(const std::vector<double>& z, const std::vector<int>& t, std::int64_t v) {
  const std::size_t n = t.size();
  std::vector<float> g(z.size());
  for (std::size_t i = 0; i < n; ++i) {
    const double* row = z.data() + i * static_cast<std::size_t>(v);
    const double m = *std::max_element(row, row + v);
    double s = 0;
    for (std::int64_t j = 0; j < v; ++j) s += std::exp(row[j] - m);
    for (std::int64_t j = 0; j < v; ++j)
      g[i * static_cast<std::size_t>(v) + static_cast<std::size_t>(j)] =
          static_cast<float>((std::exp(row[j] - m) / s - (j == t[i] ? 1.0 : 0.0)) / static_cast<double>(n));
  }
  return Tensor::from_f32(g.data(), {static_cast<std::int64_t>(n), v}, DType::f32);
}

// Same bits: a rerun must give exactly the same numbers (NaN included).
bool same_bits(double a, double b) {
  std::uint64_t ua = 0, ub = 0;
  std::memcpy(&ua, &a, sizeof a);
  std::memcpy(&ub, &b, sizeof b);
  return ua == ub;
}

double loss_of(TinyTransformer& net) {
  return ref_loss(values(net.forward_tokens(kIds, 2, 5)), kTargets, net.config().vocab_size);
}

}  // namespace

TEST_CASE("TinyTransformer: shapes, paths, parameters") {
  TinyTransformer net(tiny());
  const Tensor& y = net.forward_tokens(kIds, 2, 5);
  CHECK(y.shape() == mpt::Shape{10, 7});
  CHECK(y.dtype() == DType::f32);
  const std::vector<std::string> paths = net.paths();
  for (const char* p :
       {"tok_emb", "pos_emb", "block0", "block0.ln1", "block0.attn", "block0.ln2", "block0.mlp",
        "block0.mlp.fc1", "block0.mlp.gelu", "block0.mlp.fc2", "block1.attn", "ln_f", "lm_head"})
    CHECK_MESSAGE(std::find(paths.begin(), paths.end(), p) != paths.end(), p);
  std::vector<std::string> names;
  for (const Parameter* p : net.parameters()) names.push_back(p->name);
  CHECK(names.front() == "tok_emb.weight");
  CHECK(std::count(names.begin(), names.end(), "tok_emb.weight") == 1);  // the tied table once
  CHECK(std::find(names.begin(), names.end(), "block0.attn.q.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "block1.mlp.fc2.bias") != names.end());
  // 2 tables, per block 2 norms (2 each) + 4 projections (2 each) + 2 MLP Linears (2 each), ln_f.
  CHECK(names.size() == 2 + 2 * (4 + 8 + 4) + 2);
  // A shorter sequence than the context works; a longer one does not.
  CHECK(net.forward_tokens({1, 2, 3}, 1, 3).shape() == mpt::Shape{3, 7});
  CHECK_THROWS_AS(net.forward_tokens({1, 2, 3, 4, 5, 6}, 1, 6), std::invalid_argument);
  CHECK_THROWS_AS(net.forward_tokens({1, 2, 3}, 1, 2), std::invalid_argument);
  CHECK_THROWS_AS(net.forward_tokens({1, 9}, 1, 2), std::invalid_argument);  // id outside the vocabulary
}

TEST_CASE("TinyTransformer: GPT-2's initialisation") {
  TransformerConfig c = tiny();
  c.init_std = 0.02;
  c.d_model = 64;
  c.vocab_size = 50;
  c.num_layers = 2;
  TinyTransformer net(c);
  const auto stdev = [](const Parameter& p) {
    double s = 0;
    for (std::int64_t i = 0; i < p.master.numel(); ++i) s += p.master.value(i) * p.master.value(i);
    return std::sqrt(s / static_cast<double>(p.master.numel()));
  };
  CHECK(stdev(net.blocks[0]->fc1->weight) == doctest::Approx(0.02).epsilon(0.05).scale(0));
  CHECK(stdev(net.tok_emb->weight) == doctest::Approx(0.02).epsilon(0.05).scale(0));
  // Residual projections: 0.02/√(2L) = 0.01 for L = 2.
  CHECK(stdev(net.blocks[1]->fc2->weight) == doctest::Approx(0.01).epsilon(0.05).scale(0));
  CHECK(stdev(net.blocks[0]->attn->out.weight) == doctest::Approx(0.01).epsilon(0.05).scale(0));
  CHECK(stdev(net.blocks[0]->fc1->bias) == 0);
  CHECK(net.ln_f->weight.master.value(3) == 1);
  CHECK(net.ln_f->bias.master.value(3) == 0);
  // The same seed, the same weights.
  TinyTransformer again(c);
  CHECK(again.blocks[1]->attn->q.weight.master.value(17) == net.blocks[1]->attn->q.weight.master.value(17));
}

TEST_CASE("TinyTransformer: backward matches central differences, every kind of parameter") {
  TinyTransformer net(tiny());
  const std::vector<double> z = values(net.forward_tokens(kIds, 2, 5));
  for (Parameter* p : net.parameters()) p->grad.fill_zero();
  net.backward(ref_dlogits(z, kTargets, 7));
  int checked = 0;
  for (Parameter* p : net.parameters()) {
    const std::int64_t n = p->master.numel();
    for (std::int64_t i : {std::int64_t{0}, n / 2 + 1 < n ? n / 2 + 1 : 0, n - 1}) {
      float* w = p->master.f32_data();
      const float w0 = w[i];
      const float h = 1e-2f;
      w[i] = w0 + h;
      const double up = loss_of(net);
      w[i] = w0 - h;
      const double down = loss_of(net);
      w[i] = w0;
      const double fd = (up - down) / (2.0 * static_cast<double>(h));
      const double an = p->grad.value(i);
      CHECK_MESSAGE(std::fabs(an - fd) <= 2e-4 + 2e-2 * std::fabs(fd),
                    p->name << "[" << i << "]: backward " << an << ", central difference " << fd);
      ++checked;
    }
  }
  CHECK(checked == 3 * static_cast<int>(net.parameters().size()));
}

TEST_CASE("TinyTransformer: causal — a later token does not change earlier logits") {
  TinyTransformer net(tiny());
  const std::vector<double> a = values(net.forward_tokens({1, 4, 2, 2, 6}, 1, 5));
  const std::vector<double> b = values(net.forward_tokens({1, 4, 2, 5, 3}, 1, 5));
  const std::size_t early = std::size_t{3} * 7;                 // the logits of positions 0..2 (V = 7)
  for (std::size_t i = 0; i < early; ++i) CHECK(a[i] == b[i]);  // bit for bit
  bool later_differs = false;
  for (std::size_t i = early; i < a.size(); ++i) later_differs = later_differs || a[i] != b[i];
  CHECK(later_differs);
}

TEST_CASE("TinyTransformer: the tied table gets the embedding's and the output layer's gradients") {
  TinyTransformer net(tiny());
  const std::vector<int> ids = {1, 2, 1, 3, 1};  // tokens 0, 4, 5, 6 never appear in the input
  const std::vector<int> targets = {2, 1, 3, 1, 2};
  const std::vector<double> z = values(net.forward_tokens(ids, 1, 5));
  for (Parameter* p : net.parameters()) p->grad.fill_zero();
  const Tensor dz = ref_dlogits(z, targets, 7);
  net.backward(dz);
  // The output layer's part, dE = dzᵀ h, from the h it read (FP64 here).
  const Tensor& h = *net.lm_head->saved().front();
  const std::int64_t d = h.size(1);
  std::vector<double> head(7 * static_cast<std::size_t>(d), 0.0);
  for (std::int64_t r = 0; r < 5; ++r)
    for (std::int64_t v = 0; v < 7; ++v)
      for (std::int64_t c = 0; c < d; ++c)
        head[static_cast<std::size_t>(v * d + c)] += dz.value(r * 7 + v) * h.value(r * d + c);
  const Tensor& g = net.tok_emb->weight.grad;
  double in_input_diff = 0;
  for (std::int64_t v = 0; v < 7; ++v)
    for (std::int64_t c = 0; c < d; ++c) {
      const double gv = g.value(v * d + c), hv = head[static_cast<std::size_t>(v * d + c)];
      const bool in_input = std::find(ids.begin(), ids.end(), static_cast<int>(v)) != ids.end();
      if (in_input) in_input_diff = std::max(in_input_diff, std::fabs(gv - hv));
      else CHECK(gv == doctest::Approx(hv).epsilon(1e-5).scale(1e-7));  // only the head's part
    }
  CHECK(in_input_diff > 1e-3);  // the rows of the input tokens also get the embedding's scatter-add
}

TEST_CASE(
    "TinyTransformer: uniform f16 and bf16 run; KeepF32Policy by op keeps the norms and attention f32") {
  for (DType d : {DType::f16, DType::bf16}) {
    TinyTransformer net(tiny(d));
    mpt::Trace trace;
    net.context().set_trace(&trace);
    const Tensor& y = net.forward_tokens(kIds, 2, 5);
    CHECK(y.dtype() == d);
    std::vector<double> z = values(y);
    for (double v : z) CHECK(std::isfinite(v));
    net.backward(ref_dlogits(z, kTargets, 7));
    CHECK(net.tok_emb->weight.model_dtype() == d);
    for (const auto& e : trace.entries())
      if (e.op == "linear" && e.phase == mpt::Phase::forward) CHECK(e.outputs.front().dtype == d);
    for (const Parameter* p : net.parameters())
      for (std::int64_t i = 0; i < p->grad.numel(); ++i) REQUIRE(std::isfinite(p->grad.value(i)));
  }
  TransformerConfig c = tiny(DType::f16);
  c.policy = std::make_shared<mpt::KeepF32Policy>(
      mpt::uniform_policy(DType::f16), std::vector<std::string>{},
      std::vector<std::string>{"layer_norm", "scaled_dot_product_attention"});
  TinyTransformer net(c);
  mpt::Trace trace;
  net.context().set_trace(&trace);
  const std::vector<double> z = values(net.forward_tokens(kIds, 2, 5));
  net.backward(ref_dlogits(z, kTargets, 7));
  int norms = 0, attentions = 0, linears = 0, adds = 0;
  for (const auto& e : trace.entries()) {
    if (e.phase != mpt::Phase::forward) continue;
    if (e.op == "layer_norm" || e.op == "scaled_dot_product_attention") {
      (e.op == "layer_norm" ? norms : attentions) += 1;
      CHECK(e.compute == DType::f32);
      for (const auto& v : e.inputs) CHECK_MESSAGE(v.dtype == DType::f32, e.path << " reads " << v.name);
      for (const auto& v : e.outputs) CHECK_MESSAGE(v.dtype == DType::f32, e.path << " writes " << v.name);
    }
    if (e.op == "linear") {
      ++linears;
      CHECK(e.outputs.front().dtype == DType::f16);
    }
    if (e.op == "add") {
      ++adds;
      CHECK(e.outputs.front().dtype == DType::f16);
    }
  }
  CHECK(norms == 2 * 2 + 1);
  CHECK(attentions == 2);
  CHECK(linears == 2 * 6 + 1);
  CHECK(adds == 1 + 2 * 2);
  CHECK(net.ln_f->weight.model_dtype() == DType::f32);
  CHECK(net.blocks[0]->fc1->weight.model_dtype() == DType::f16);
}

TEST_CASE("TinyTransformer: bad configurations are refused with one line") {
  TransformerConfig c = tiny();
  c.num_heads = 3;
  CHECK_THROWS_AS(TinyTransformer{c}, std::invalid_argument);
  c = tiny();
  c.num_layers = 0;
  CHECK_THROWS_AS(TinyTransformer{c}, std::invalid_argument);
  c = tiny();
  c.init_std = 0;
  CHECK_THROWS_AS(TinyTransformer{c}, std::invalid_argument);
}

namespace {
mpt::ch04::LmConfig small_run(int steps) {
  mpt::ch04::LmConfig c;
  c.model.d_model = 32;
  c.model.num_heads = 2;
  c.model.num_layers = 1;
  c.model.context = 32;
  c.batch = 8;
  c.steps = steps;
  c.adam.lr = 1e-2;
  c.eval_every = steps;
  c.eval_batches = 2;
  return c;
}
}  // namespace

TEST_CASE("train_lm: 100 steps lower the loss well below log V, in fp32 and fp16 with the scaler") {
  const mpt::TextCorpus& corpus = mpt::ch04::licence_corpus();
  const double log_v = std::log(static_cast<double>(corpus.vocab_size()));
  for (DType d : {DType::f32, DType::f16}) {
    const mpt::ch04::LmRun r =
        mpt::ch04::train_lm(corpus, small_run(100), mpt::uniform_policy(d),
                            d == DType::f16 ? mpt::ch04::ScalerMode::dynamic : mpt::ch04::ScalerMode::none);
    CHECK(r.valid.front().loss ==
          doctest::Approx(log_v).epsilon(0.02).scale(0));  // untrained: a uniform guess
    CHECK(r.final_valid() < log_v - 1.0);
    CHECK(r.nonfinite_losses == 0);
    CHECK(r.steps.size() == 100);
  }
}

TEST_CASE("train_lm: the same run twice gives the same losses, bit for bit") {
  const mpt::TextCorpus& corpus = mpt::ch04::licence_corpus();
  const auto run = [&] {
    return mpt::ch04::train_lm(corpus, small_run(15), mpt::uniform_policy(DType::f16),
                               mpt::ch04::ScalerMode::dynamic);
  };
  const mpt::ch04::LmRun a = run(), b = run();
  REQUIRE(a.steps.size() == b.steps.size());
  for (std::size_t i = 0; i < a.steps.size(); ++i) {
    CHECK(same_bits(a.steps[i].loss, b.steps[i].loss));
    CHECK(a.steps[i].scale == b.steps[i].scale);
  }
  CHECK(same_bits(a.valid.back().loss, b.valid.back().loss));
  // A different seed is a different run.
  mpt::ch04::LmConfig other = small_run(15);
  other.seed = 2;
  const mpt::ch04::LmRun c =
      mpt::ch04::train_lm(corpus, other, mpt::uniform_policy(DType::f16), mpt::ch04::ScalerMode::dynamic);
  CHECK(c.steps.back().loss != a.steps.back().loss);
}
