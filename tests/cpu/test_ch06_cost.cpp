// Chapter 06 — per-task precision policies: the speed side of a policy. The
// cost model's FLOPs against hand counts, its bytes against the trace, its
// roofline against the GPU's figures, and what it says of a policy on the
// tiny Transformer (f16 moves fewer bytes and puts the products on the tensor
// cores); then the measured search's pieces: the policy string it writes,
// the gradient error, the greedy pass held to its budget.
// Depends on: mpt/core/cost_model.hpp, policy_string.hpp; mpt/nn/models/transformer.hpp
// (the Transformer, trace_step); mpt/train/policy_search.hpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/core/cost_model.hpp"
#include "mpt/core/path_pattern.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/nn/models/transformer.hpp"
#include "mpt/train/policy_search.hpp"

using namespace mpt;

namespace {

TracedValue value(const char* name, DType d, Shape shape) {
  std::size_t n = 1;
  for (const auto s : shape) n *= static_cast<std::size_t>(s);
  return {name, d, std::move(shape), n * bytes_per_element(d)};
}

TraceEntry entry(Phase phase, const char* op, std::vector<TracedValue> in, std::vector<TracedValue> out) {
  TraceEntry e;
  e.phase = phase;
  e.path = "layer";
  e.op = op;
  e.inputs = std::move(in);
  e.outputs = std::move(out);
  return e;
}

constexpr DType f32 = DType::f32, f16 = DType::f16;

// The Transformer's step traced under a policy (its defaults, 2 sequences of 8 tokens).
Trace transformer_trace(const std::string& policy) {
  TransformerConfig config;
  config.policy = parse_policy_string(policy).make();
  config.seed = 1;
  TinyTransformer net(config);
  MatrixF ids(2, 8);
  std::vector<int> targets;
  for (Eigen::Index i = 0; i < ids.size(); ++i) {
    ids.data()[i] = static_cast<float>((7 * i + 3) % 96);
    targets.push_back(static_cast<int>((5 * i + 1) % 96));
  }
  return trace_step(net, ids, targets);
}

}  // namespace

TEST_CASE("cost model: FLOPs of the matrix products, counted by hand") {
  // linear: x [6, 4] (K = 4), weight [3, 4] (N = 3), bias: 2·6·3·4 + 6·3.
  const TraceEntry fwd =
      entry(Phase::forward, "linear",
            {value("x", f16, {6, 4}), value("weight", f16, {3, 4}), value("bias", f16, {3})},
            {value("y", f16, {6, 3})});
  CHECK(op_flops(fwd) == doctest::Approx(2 * 6 * 3 * 4 + 6 * 3));
  // backward: dx and dW at 2·M·N·K each, the bias gradient M·N.
  const TraceEntry bwd =
      entry(Phase::backward, "linear",
            {value("dy", f16, {6, 3}), value("x", f16, {6, 4}), value("weight", f16, {3, 4})},
            {value("dx", f16, {6, 4}), value("weight.grad", f32, {3, 4}), value("bias.grad", f32, {3})});
  CHECK(op_flops(bwd) == doctest::Approx(2 * (2 * 6 * 3 * 4) + 6 * 3));
  // conv2d: y [2, 5, 4, 4], weight [5, 3, 3, 3]: 2 · 160 · 27.
  const TraceEntry conv =
      entry(Phase::forward, "conv2d", {value("x", f32, {2, 3, 6, 6}), value("weight", f32, {5, 3, 3, 3})},
            {value("y", f32, {2, 5, 4, 4})});
  CHECK(op_flops(conv) == doctest::Approx(2.0 * 160 * 27));
  // attention: q [2, 4, 8, 16], k [2, 4, 10, 16]: 4·B·H·L·S·D forward, twice that backward.
  TraceEntry att = entry(
      Phase::forward, "scaled_dot_product_attention",
      {value("q", f16, {2, 4, 8, 16}), value("k", f16, {2, 4, 10, 16}), value("v", f16, {2, 4, 10, 16})},
      {value("out", f16, {2, 4, 8, 16})});
  CHECK(op_flops(att) == doctest::Approx(4.0 * 2 * 4 * 8 * 10 * 16));
  att.phase = Phase::backward;
  CHECK(op_flops(att) == doctest::Approx(8.0 * 2 * 4 * 8 * 10 * 16));
  // everything else: one per element of the largest output; a cast none.
  CHECK(op_flops(entry(Phase::forward, "gelu", {value("x", f16, {6, 5})}, {value("y", f16, {6, 5})})) == 30);
  CHECK(op_flops(entry(Phase::forward, "cast", {value("x", f32, {6, 5})}, {value("x", f16, {6, 5})})) == 0);
}

TEST_CASE("cost model: the products a step replays, by hand, and their FLOPs are op_flops") {
  auto same = [](const MatrixProduct& p, const char* what, double count, std::int64_t m, std::int64_t n,
                 std::int64_t k, bool ta, bool tb, DType d) {
    CHECK_MESSAGE(p.what == what, p.what);
    CHECK(p.count == count);
    CHECK(p.m == m);
    CHECK(p.n == n);
    CHECK(p.k == k);
    CHECK(p.a_transposed == ta);
    CHECK(p.b_transposed == tb);
    CHECK(p.dtype == d);
  };
  // linear x [6, 4], W [3, 4]: y = x Wᵀ (6 x 3 x 4, W read transposed);
  // backward dx = dy W (6 x 4 x 3) and dW = dyᵀ x (3 x 4 x 6, dy read transposed).
  const TraceEntry fwd =
      entry(Phase::forward, "linear",
            {value("x", f16, {6, 4}), value("weight", f16, {3, 4}), value("bias", f16, {3})},
            {value("y", f16, {6, 3})});
  std::vector<MatrixProduct> p = op_products(fwd);
  REQUIRE(p.size() == 1);
  same(p[0], "y", 1, 6, 3, 4, false, true, f16);
  const TraceEntry bwd =
      entry(Phase::backward, "linear",
            {value("dy", f32, {6, 3}), value("x", f32, {6, 4}), value("weight", f32, {3, 4})},
            {value("dx", f32, {6, 4}), value("weight.grad", f32, {3, 4}), value("bias.grad", f32, {3})});
  p = op_products(bwd);
  REQUIRE(p.size() == 2);
  same(p[0], "dx", 1, 6, 4, 3, false, false, f32);
  same(p[1], "dW", 1, 3, 4, 6, true, false, f32);
  // The tied output layer calls its input's gradient "dh": still a product.
  TraceEntry tied = bwd;
  tied.outputs[0].name = "dh";
  p = op_products(tied);
  REQUIRE(p.size() == 2);
  same(p[0], "dh", 1, 6, 4, 3, false, false, f32);
  // The first layer of a network computes no dx: only dW.
  TraceEntry first = bwd;
  first.outputs.erase(first.outputs.begin());
  p = op_products(first);
  REQUIRE(p.size() == 1);
  same(p[0], "dW", 1, 3, 4, 6, true, false, f32);
  // attention q [2, 4, 8, 16], k [2, 4, 10, 16]: 8 heads of 8 x 10 x 16 and 8 x 16 x 10.
  TraceEntry att = entry(Phase::forward, "scaled_dot_product_attention",
                         {value("q", DType::bf16, {2, 4, 8, 16}), value("k", DType::bf16, {2, 4, 10, 16}),
                          value("v", DType::bf16, {2, 4, 10, 16})},
                         {value("out", DType::bf16, {2, 4, 8, 16})});
  p = op_products(att);
  REQUIRE(p.size() == 2);
  same(p[0], "scores", 8, 8, 10, 16, false, true, DType::bf16);
  same(p[1], "out", 8, 8, 16, 10, false, false, DType::bf16);
  // conv2d y [2, 5, 4, 4], weight [5, 3, 3, 3]: 32 positions x 5 channels x 27.
  const TraceEntry conv =
      entry(Phase::forward, "conv2d", {value("x", f32, {2, 3, 6, 6}), value("weight", f32, {5, 3, 3, 3})},
            {value("y", f32, {2, 5, 4, 4})});
  p = op_products(conv);
  REQUIRE(p.size() == 1);
  same(p[0], "y", 1, 32, 5, 27, false, true, f32);
  // Not a product: none.
  CHECK(op_products(entry(Phase::forward, "gelu", {value("x", f16, {6, 5})}, {value("y", f16, {6, 5})}))
            .empty());

  // On every entry of the Transformer's step under three policies: the
  // products' 2·count·m·n·k plus the bias terms is exactly op_flops, and a
  // product's dtype is f16 exactly when the op runs on the tensor cores.
  for (const char* policy : {"f32", "f16", "O1"}) {
    const Trace t = transformer_trace(policy);
    std::size_t products = 0;
    for (const TraceEntry& e : t.entries()) {
      const std::vector<MatrixProduct> ps = op_products(e);
      if (ps.empty()) continue;
      double f = 0;
      for (const MatrixProduct& q : ps) {
        f += 2 * q.count * static_cast<double>(q.m) * static_cast<double>(q.n) * static_cast<double>(q.k);
        CHECK((q.dtype == f16) == (op_unit(e) == Unit::tensor_f16));
        ++products;
      }
      double bias = 0;
      if (e.op == "linear") {
        const std::int64_t rows = e.phase == Phase::forward ? ps[0].m : ps.back().k;
        const std::int64_t outs = e.phase == Phase::forward ? ps[0].n : ps.back().m;
        bool has_bias = false;
        for (const TracedValue& v : e.phase == Phase::forward ? e.inputs : e.outputs)
          has_bias = has_bias || v.name == "bias" || v.name == "bias.grad";
        if (has_bias) bias = static_cast<double>(rows * outs);
      }
      CHECK_MESSAGE(f + bias == op_flops(e), policy, " ", e.path, " ", e.op);
    }
    CHECK(products > 10);
  }
}

TEST_CASE("cost model: the unit follows the multiplicands, the time is the roofline") {
  const auto lin = [](DType a, DType b) {
    return entry(Phase::forward, "linear", {value("x", a, {64, 64}), value("weight", b, {64, 64})},
                 {value("y", a, {64, 64})});
  };
  CHECK(op_unit(lin(f16, f16)) == Unit::tensor_f16);
  CHECK(op_unit(lin(DType::bf16, DType::bf16)) == Unit::tensor_f16);
  CHECK(op_unit(lin(f32, f32)) == Unit::fp32);  // PyTorch's matmul.allow_tf32 = False
  CHECK(op_unit(lin(f16, f32)) == Unit::fp32);
  CHECK(op_unit(lin(DType::e4m3, DType::e4m3)) == Unit::tensor_fp8);
  const TraceEntry conv =
      entry(Phase::forward, "conv2d", {value("x", f32, {2, 3, 6, 6}), value("weight", f32, {5, 3, 3, 3})},
            {value("y", f32, {2, 5, 4, 4})});
  CHECK(op_unit(conv) == Unit::tensor_tf32);  // cudnn.allow_tf32 = True
  CHECK(op_unit(entry(Phase::forward, "relu", {value("x", f16, {4})}, {value("y", f16, {4})})) == Unit::fp32);

  Trace t;
  t.add(lin(f16, f16));
  t.add(entry(Phase::forward, "cached_cast", {value("weight", f16, {64, 64})}, {}));
  const GpuSpec& h100 = gpu_spec("h100-sxm");
  const StepCost c = estimate_cost(t, h100);
  REQUIRE(c.ops.size() == 2);
  const double bytes = 3 * 64 * 64 * 2;  // x, weight, y in f16
  CHECK(c.ops[0].bytes == bytes);
  CHECK(c.ops[1].bytes == 0);  // the cache's reuse moves nothing
  const double flops = 2.0 * 64 * 64 * 64;
  CHECK(c.ops[0].seconds ==
        doctest::Approx(std::max(bytes / h100.bytes_per_s, flops / h100.f16_tensor_flops)));
  CHECK(c.ops[0].memory_bound == (bytes / h100.bytes_per_s >= flops / h100.f16_tensor_flops));
  CHECK(c.seconds == doctest::Approx(c.ops[0].seconds));
  CHECK(c.tensor_flops == doctest::Approx(flops));
  // the H200 has more bandwidth and the same arithmetic: a memory-bound op is faster there
  CHECK(estimate_cost(t, gpu_spec("h200-sxm")).seconds < c.seconds);
}

TEST_CASE("cost model: an unknown GPU is one line naming the known ones") {
  try {
    (void)gpu_spec("h100");
    FAIL("no error");
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    CHECK(m.find("'h100'") != std::string::npos);
    CHECK(m.find("h100-sxm, h200-sxm") != std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
  }
}

TEST_CASE(
    "cost model on the Transformer: f16 halves the products' bytes and moves them to the tensor cores") {
  const GpuSpec& gpu = gpu_spec("h100-sxm");
  const StepCost full = estimate_cost(transformer_trace("f32"), gpu);
  const StepCost half = estimate_cost(transformer_trace("f16"), gpu);
  const StepCost o1 = estimate_cost(transformer_trace("O1"), gpu);
  // the same products are counted whatever the policy: FLOPs do not depend on dtypes
  double full_products = 0, half_products = 0, full_product_bytes = 0, half_product_bytes = 0;
  for (const OpCost& c : full.ops)
    if (c.op == "linear" || c.op == "scaled_dot_product_attention") {
      full_products += c.flops;
      full_product_bytes += c.bytes;
    }
  for (const OpCost& c : half.ops)
    if (c.op == "linear" || c.op == "scaled_dot_product_attention") {
      half_products += c.flops;
      half_product_bytes += c.bytes;
    }
  CHECK(full_products == doctest::Approx(half_products));
  CHECK(full.tensor_flops == 0);
  CHECK(half.tensor_flops == doctest::Approx(half_products));
  // a product's gradients of the weights stay f32 (Parameter::grad), the rest halves
  CHECK(half_product_bytes < 0.75 * full_product_bytes);
  CHECK(half.bytes < full.bytes);
  CHECK(half.seconds < full.seconds);
  // O1 computes the products on the tensor cores too, but pays for its casts
  CHECK(o1.tensor_flops > 0);
  double o1_casts = 0;
  for (const OpCost& c : o1.ops)
    if (c.op == "cast") o1_casts += c.bytes;
  CHECK(o1_casts > 0);
  CHECK(o1.seconds < full.seconds);
}

// --- the measured search (mpt/train/policy_search.hpp) -----------------------

namespace {

train::SearchOptions mlp_search(double budget) {
  train::SearchOptions o;
  o.model = "mlp";
  o.budget = budget;
  o.steps = 12;
  o.seeds = 2;
  return o;
}

}  // namespace

TEST_CASE("policy search: the policy string gives every layer the dtype asked, parents before children") {
  const std::vector<std::string> layers = {"tok_emb",       "block0.attn.q",  "block0.attn",
                                           "block0.attn.k", "block0.mlp.fc1", "block0.mlp.gelu",
                                           "lm_head"};
  const std::vector<std::vector<std::string>> choices = {
      {},
      {"block0.attn"},
      {"block0.attn", "block0.attn.k"},
      {"tok_emb", "block0.mlp.fc1", "block0.mlp.gelu", "lm_head", "block0.attn.q", "block0.attn"},
      layers};
  for (const auto& lowered : choices) {
    const std::string text = train::policy_for(layers, lowered, DType::bf16);
    CAPTURE(text);
    const auto policy = parse_policy_string(text).make();
    for (const std::string& path : layers) {
      const bool down = std::find(lowered.begin(), lowered.end(), path) != lowered.end();
      CHECK(policy->parameter_dtype("linear", path) == (down ? DType::bf16 : DType::f32));
    }
  }
  // the shorter spelling: everything but one layer lowered is "bf16+that=f32"
  CHECK(train::policy_for({"a", "b", "c"}, {"a", "c"}, DType::bf16) == "bf16+b=f32");
  CHECK(train::policy_for({"a", "b", "c"}, {"b"}, DType::f16) == "f32+b=f16");
  CHECK(train::policy_for({"a", "b"}, {"a", "b"}, DType::f16) == "f16");
  CHECK(train::policy_for({"a", "b"}, {}, DType::f16) == "f32");
}

TEST_CASE("policy search: the gradient error is measured against FP32 on the same weights and batch") {
  const train::SearchOptions o = mlp_search(0.02);
  const std::vector<float> g32 = train::reference_gradients(o);
  REQUIRE(!g32.empty());
  const train::Evaluation same = train::evaluate_policy(o, "f32", g32);
  CHECK(same.grad_error == 0);
  const train::Evaluation half = train::evaluate_policy(o, "f16", g32);
  CHECK(half.grad_error > 0);
  CHECK(half.grad_error < 0.05);  // fp16's rounding, not a different gradient
  // f16 halves the activations the forward writes and the weights it reads
  CHECK(half.activation_bytes < 0.6 * same.activation_bytes);
  CHECK(half.weight_bytes == doctest::Approx(same.weight_bytes / 2));
  CHECK(half.final_losses.size() == 2);
  CHECK(same.spread >= 0);
}

TEST_CASE("policy search: greedy within the budget, and a generous budget lowers every layer") {
  const train::SearchResult strict = train::search_policy(mlp_search(0.0));
  REQUIRE(!strict.layers.empty());
  CHECK(strict.evaluations == 1 + 2 * static_cast<std::int64_t>(strict.layers.size()));
  CHECK(strict.loss_limit == doctest::Approx(strict.fp32.mean_loss));
  for (const train::LayerResult& l : strict.layers) {
    CAPTURE(l.path);
    CHECK(l.lowered == (l.loss_when_tried <= strict.loss_limit));  // the verdict is the budget's
  }
  CHECK(strict.found.mean_loss <= strict.loss_limit);
  // least sensitive first
  for (std::size_t i = 1; i < strict.layers.size(); ++i)
    CHECK(strict.layers[i - 1].loss_change <= strict.layers[i].loss_change);
  // the found policy, measured again, is the same numbers: everything is seeded
  const train::Evaluation again = train::evaluate_policy(mlp_search(0.0), strict.policy);
  CHECK(again.final_losses == strict.found.final_losses);

  const train::SearchResult loose = train::search_policy(mlp_search(10.0));
  CHECK(loose.policy == "f16");
  for (const train::LayerResult& l : loose.layers) CHECK(l.lowered);
}

TEST_CASE("policy search: bad options are one line naming the field") {
  train::SearchOptions o = mlp_search(0.02);
  o.seeds = 0;
  CHECK_THROWS_WITH_AS(train::check_search_options(o), doctest::Contains("seeds 0"), std::invalid_argument);
  o = mlp_search(-1);
  CHECK_THROWS_WITH_AS(train::check_search_options(o), doctest::Contains("from 0 to 10"),
                       std::invalid_argument);
  o = mlp_search(0.02);
  o.low = DType::e4m3;
  CHECK_THROWS_WITH_AS(train::check_search_options(o), doctest::Contains("valid: f16, bf16"),
                       std::invalid_argument);
}

TEST_CASE("policy search: a depth cuts the op paths into coarser layers, each covering what is under it") {
  train::SearchOptions o;
  o.model = "transformer";
  o.steps = 1;
  o.seeds = 1;
  std::vector<std::string> every;
  for (const auto& l : train::searchable_layers(o)) every.push_back(l.first);
  CHECK(std::find(every.begin(), every.end(), "block0.attn.q") != every.end());
  o.depth = 1;
  std::vector<std::string> blocks;
  for (const auto& l : train::searchable_layers(o)) blocks.push_back(l.first);
  CHECK(blocks == std::vector<std::string>{"tok_emb", "pos_emb", "embedding_sum", "block0", "block1", "ln_f",
                                           "lm_head"});
  o.depth = 2;
  const auto two = train::searchable_layers(o);
  const auto attn =
      std::find_if(two.begin(), two.end(), [](const auto& l) { return l.first == "block0.attn"; });
  REQUIRE(attn != two.end());
  CHECK(attn->second.find("linear") != std::string::npos);  // its projections' op, gathered
  CHECK(attn->second.find("scaled_dot_product_attention") != std::string::npos);
  // every op path belongs to exactly one layer of the cut
  for (const std::string& p : every) {
    int covering = 0;
    for (const auto& l : two) covering += PathPattern(l.first).covers(p) ? 1 : 0;
    CAPTURE(p);
    CHECK(covering == 1);
  }
  // lowering a block lowers everything under it
  const auto policy = parse_policy_string(train::policy_for(blocks, {"block1"}, DType::f16)).make();
  CHECK(policy->parameter_dtype("linear", "block1.attn.q") == DType::f16);
  CHECK(policy->parameter_dtype("linear", "block0.attn.q") == DType::f32);
  o.depth = 17;
  CHECK_THROWS_WITH_AS(train::check_search_options(o), doctest::Contains("depth 17"), std::invalid_argument);
}
