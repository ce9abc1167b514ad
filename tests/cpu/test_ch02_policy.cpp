// Chapter 02 — precision as data: the op names, the policies, the Context
// that counts every cast, and the precision trace with its renderings.
// Depends on: mpt/core/ops.hpp, policy.hpp, context.hpp, trace.hpp,
// nlohmann_json (to parse the JSON rendering back).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "mpt/core/context.hpp"
#include "mpt/core/ops.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/trace.hpp"

using namespace mpt;

TEST_CASE("op names are PyTorch's; an unknown one is an error naming the known ones") {
  for (const char* name : {"linear", "matmul", "relu", "gelu", "layer_norm", "batch_norm", "softmax",
                           "log_softmax", "nll_loss", "cross_entropy", "mse_loss"})
    CHECK(op_info(name).name == name);
  CHECK(op_info("linear").kind == OpKind::matmul);
  CHECK(op_info("cross_entropy").kind == OpKind::loss);
  CHECK(op_info("layer_norm").kind == OpKind::normalization);
  CHECK(op_kind_name(OpKind::softmax) == "softmax");
  try {
    (void)op_info("lnear");
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    CHECK(m.rfind("unknown op 'lnear'; known ops: linear, matmul, ", 0) == 0);
    CHECK(m.find("mse_loss") != std::string::npos);
    CHECK(m.find('\n') == std::string::npos);  // one line
  }
  // Every policy checks the name before it decides.
  const UniformPolicy p(DType::f16);
  CHECK_THROWS_WITH_AS(p.decide({"Linear", "fc1", {DType::f32}}), doctest::Contains("unknown op 'Linear'"),
                       std::invalid_argument);
  CHECK_THROWS_AS(p.parameter_dtype("conv", "c1"), std::invalid_argument);
}

TEST_CASE("UniformPolicy: everything stored in one dtype, FP32 compute, the loss in FP32") {
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    CAPTURE(std::string(dtype_name(d)));
    const UniformPolicy p(d);
    const OpPrecision lin = p.decide({"linear", "fc1", {DType::f32, d}});
    CHECK(lin.input == d);
    CHECK(lin.compute == DType::f32);
    CHECK(lin.output == d);
    const OpPrecision relu = p.decide({"relu", "relu1", {d}});
    CHECK(relu.output == d);
    CHECK(p.parameter_dtype("linear", "fc2") == d);
    // A loss reads its input as it arrives and returns FP32.
    const OpPrecision ce = p.decide({"cross_entropy", "loss", {DType::bf16}});
    CHECK(ce.input == DType::bf16);
    CHECK(ce.output == DType::f32);
    CHECK(p.describe() == "uniform " + std::string(dtype_name(d)));
  }
}

TEST_CASE("KeepF32Policy: islands of FP32 by layer path and by op name") {
  const auto base = uniform_policy(DType::f16);
  const KeepF32Policy keep(base, {"fc3", "encoder.0"}, {"layer_norm"});
  // A path covers itself and everything below it, not its string prefixes.
  CHECK(keep.keeps("linear", "fc3"));
  CHECK(keep.keeps("linear", "fc3.inner"));
  CHECK_FALSE(keep.keeps("linear", "fc30"));
  CHECK(keep.keeps("linear", "encoder.0.ffn.fc1"));
  CHECK_FALSE(keep.keeps("linear", "encoder.01"));
  CHECK(keep.keeps("layer_norm", "anywhere"));
  const OpPrecision in = keep.decide({"linear", "fc3", {DType::f16, DType::f32}});
  CHECK(in.input == DType::f32);
  CHECK(in.compute == DType::f32);
  CHECK(in.output == DType::f32);
  CHECK(keep.parameter_dtype("linear", "fc3") == DType::f32);
  // Outside the islands: the base decides.
  const OpPrecision out = keep.decide({"linear", "fc2", {DType::f16}});
  CHECK(out.input == DType::f16);
  CHECK(out.output == DType::f16);
  CHECK(keep.parameter_dtype("linear", "fc2") == DType::f16);
  CHECK(keep.describe() == "uniform f16; f32 at fc3, encoder.0; f32 for layer_norm");
  // Bad islands are refused when the policy is made, not when a layer asks.
  CHECK_THROWS_WITH_AS(KeepF32Policy(base, {}, {"layernorm"}), doctest::Contains("unknown op 'layernorm'"),
                       std::invalid_argument);
  CHECK_THROWS_AS(KeepF32Policy(base, {""}), std::invalid_argument);
  CHECK_THROWS_AS(KeepF32Policy(nullptr, {"fc3"}), std::invalid_argument);
}

TEST_CASE("Context::cast: nothing for the same dtype, a counted and traced copy otherwise") {
  Context ctx(uniform_policy(DType::f16));
  const float v[] = {1.0f, 1.0f / 3.0f, 70000.0f, -2.5f, 1e-9f, 0.0f};
  const Tensor x = Tensor::from_f32(v, {2, 3}, DType::f32);
  const Tensor same = ctx.cast(x, DType::f32, "fc1", Phase::forward, "x");
  CHECK(same.shares_storage_with(x));
  CHECK(ctx.casts().casts == 0);
  Trace trace;
  ctx.set_trace(&trace);
  const Tensor h = ctx.cast(x, DType::f16, "fc1", Phase::forward, "x");
  CHECK(h.dtype() == DType::f16);
  CHECK(std::isinf(h.value(2)));  // rounded by the library: 70000 overflows fp16
  CHECK(h.value(4) == 0.0f);      // 1e-9 flushes
  CHECK(ctx.casts().casts == 1);
  CHECK(ctx.casts().elements == 6);
  CHECK(ctx.casts().bytes == 12);
  REQUIRE(trace.entries().size() == 1);
  const TraceEntry& e = trace.entries()[0];
  CHECK(e.op == "cast");
  CHECK(e.path == "fc1");
  CHECK(e.inputs[0].dtype == DType::f32);
  CHECK(e.outputs[0].dtype == DType::f16);
  CHECK(e.bytes_written() == 12);
  CHECK(trace.casts() == 1);
  CHECK(trace.cast_bytes() == 12);
  ctx.reset_casts();
  CHECK(ctx.casts().casts == 0);
  CHECK_THROWS_AS(Context(nullptr), std::invalid_argument);
}

TEST_CASE("the trace renders as text, JSON and a Graphviz graph from the same entries") {
  Trace t;
  t.add({Phase::forward,
         "fc1",
         "cast",
         {{"x", DType::f32, {4, 8}, 128}},
         DType::f16,
         {{"x", DType::f16, {4, 8}, 64}}});
  t.add({Phase::forward,
         "fc1",
         "linear",
         {{"x", DType::f16, {4, 8}, 64}, {"weight", DType::f16, {32, 8}, 512}},
         DType::f32,
         {{"y", DType::f16, {4, 32}, 256}}});
  t.add({Phase::backward,
         "fc1",
         "linear",
         {{"dy", DType::f16, {4, 32}, 256}},
         DType::f32,
         {{"weight.grad", DType::f16, {32, 8}, 512}, {"bias.grad", DType::f16, {32}, 64}}});
  const std::string text = render_text(t);
  CHECK(text.find("1  forward   fc1   cast    x f32 4x8") != std::string::npos);
  CHECK(text.find("weight.grad f16 32x8, bias.grad f16 32") != std::string::npos);
  CHECK(text.find("  576\n") != std::string::npos);  // bytes written: 512 + 64
  CHECK(text.find("1 cast(s) at op boundaries, 64 bytes written by them") != std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(render_json(t));
  CHECK(j["entries"].size() == 3);
  CHECK(j["entries"][1]["inputs"][1]["dtype"] == "f16");
  CHECK(j["entries"][2]["bytes_written"] == 576);
  CHECK(j["casts"] == 1);
  const std::string dot = render_dot(t, "a \"quoted\" title");
  CHECK(dot.rfind("digraph precision {", 0) == 0);
  CHECK(dot.find("label=\"a \\\"quoted\\\" title\"") != std::string::npos);  // escaped for dot
  CHECK(dot.find("cast\\nf32 → f16") != std::string::npos);
  CHECK(dot.find("f1 -> f2 [label=\"f16 4x8\"]") != std::string::npos);  // the value that flows
  CHECK(std::count(dot.begin(), dot.end(), '{') == std::count(dot.begin(), dot.end(), '}'));
  CHECK(render_dot(t, "x") == render_dot(t, "x"));  // byte-stable
}
