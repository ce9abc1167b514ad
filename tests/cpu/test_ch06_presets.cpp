// Chapter 06 — per-task precision policies: other libraries' presets as
// policy strings. apex's O0–O3 with the properties of apex/amp/frontend.py
// (0466713933de1a2b5e1760d2818c0a8076adea46), Keras's mixed_float16 and
// mixed_bfloat16, and jmp's grammar and defaults (jmp/_src/policy.py at
// 7b3a5f784eca7e1f0f9d231ef8c9dae181f01f16): what each decides, what each
// asks of a run, and the one-line refusals.
// Depends on: mpt/core/presets.hpp, policy_string.hpp; mpt/nn/models/mlp.hpp.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

#include "mpt/core/policy_string.hpp"
#include "mpt/core/presets.hpp"
#include "mpt/nn/models/mlp.hpp"

using namespace mpt;

namespace {

constexpr DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16;

OpPrecision decision(const std::string& policy, const char* op, std::vector<DType> in) {
  return parse_policy_string(policy).make()->decide({op, "fc1", std::move(in)});
}

DType params_of(const std::string& policy, const char* op) {
  return parse_policy_string(policy).make()->parameter_dtype(op, "fc1");
}

std::string jmp_refusal(const std::string& text) {
  try {
    (void)parse_jmp(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("apex's opt levels, as frontend.py sets them") {
  const std::vector<ApexLevel>& l = apex_levels();
  REQUIRE(l.size() == 4);
  // O3: everything f16, no master weights, loss_scale 1.0.
  CHECK(l[3].cast_model_type == "torch.float16");
  CHECK(l[3].keep_batchnorm_fp32 == "False");
  CHECK(l[3].master_weights == "False");
  CHECK(l[3].loss_scale == "1.0");
  CHECK(params_of("O3", "batch_norm") == f16);
  CHECK(!parse_policy_string("O3").needs().master_weights);
  CHECK(parse_policy_string("O3").needs().scaler == "static:1");
  // O2: f16 model with FP32 batch norms and FP32 masters, dynamic scaling.
  CHECK(l[2].keep_batchnorm_fp32 == "True");
  CHECK(params_of("O2", "linear") == f16);
  CHECK(params_of("O2", "batch_norm") == f32);
  CHECK(params_of("O2", "layer_norm") == f16);  // apex keeps batch norms only
  // BN_convert_float converts the parameters, not the op's data: cuDNN's
  // batch norm reads the fp16 activation, computes in f32 and returns fp16.
  const OpPrecision bn = decision("O2", "batch_norm", {f16, f32});
  CHECK(bn.input == f16);
  CHECK(bn.compute == f32);
  CHECK(bn.output == f16);
  CHECK(decision("O2", "batch_norm", {f32, f32}).output == f32);
  CHECK(decision("O2", "linear", {f16, f16}).output == f16);
  CHECK(parse_policy_string("O2").needs().master_weights);
  CHECK(parse_policy_string("O2").needs().scaler == "dynamic");
  // O1: patched functions (autocast's lists), f32 weights, dynamic scaling.
  CHECK(l[1].patch_torch_functions);
  CHECK(l[1].cast_model_type == "None");
  CHECK(params_of("O1", "linear") == f32);
  CHECK(decision("O1", "linear", {f32, f32}).output == f16);
  CHECK(decision("O1", "layer_norm", {f16, f32}).output == f32);
  CHECK(parse_policy_string("O1").needs().scaler == "dynamic");
  // O0: FP32, loss_scale 1.0.
  CHECK(decision("O0", "linear", {f32, f32}).output == f32);
  CHECK(parse_policy_string("O0").needs().scaler == "static:1");
  CHECK(parse_policy_string("O2").needs().origin.find("keep_batchnorm_fp32=True") != std::string::npos);
}

TEST_CASE("Keras: variables f32, compute in f16 or bf16; mixed_float16 comes with loss scaling") {
  CHECK(params_of("mixed_float16", "linear") == f32);
  const OpPrecision p = decision("mixed_float16", "linear", {f32, f32});
  CHECK(p.input == f16);
  CHECK(p.output == f16);
  CHECK(decision("mixed_bfloat16", "layer_norm", {f32}).output == bf16);
  CHECK(parse_policy_string("mixed_float16").needs().scaler == "dynamic");
  CHECK(parse_policy_string("mixed_bfloat16").needs().scaler.empty());
}

TEST_CASE("jmp's grammar and defaults: params f32, compute follows params, output follows compute") {
  struct Case {
    const char* text;
    DType p, c, o;
  };
  const Case cases[] = {
      {"params=float32,compute=float16,output=float32", f32, f16, f32},
      {"p=f32,c=f16,o=f32", f32, f16, f32},
      {"c=f16", f32, f16, f16},  // output follows compute
      {"p=f16,c=f16", f16, f16, f16},
      {"p=f16,c=bf16", f16, bf16, bf16},
      {"p=bf16", bf16, bf16, bf16},  // compute follows params
      {"o=f16", f32, f32, f16},
      {"c=f16,c=bf16", f32, bf16, bf16},  // a later key wins
      {"half", f16, f16, f16},            // half: f16 off TPU
      {"full", f32, f32, f32},
      {"bfloat16", bf16, bf16, bf16},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    const JmpSpec s = parse_jmp(c.text);
    CHECK(s.params == c.p);
    CHECK(s.compute == c.c);
    CHECK(s.output == c.o);
  }
  // jmp's str() names f32 "full" (first in its dtype_to_names).
  CHECK(parse_jmp("params=float32,compute=float16,output=float32").jmp_text() == "p=full,c=f16,o=full");
  CHECK(parse_policy_string("jmp:c=half").text() == "jmp:p=f32,c=f16,o=f16");
}

TEST_CASE("jmp refuses what jmp refuses, in one line") {
  CHECK(jmp_refusal("f").find("unknown dtype 'f'") != std::string::npos);  // its comment's "contraction"
  CHECK(jmp_refusal("").find("unknown dtype ''") != std::string::npos);
  CHECK(jmp_refusal("x=f16").find("unknown key 'x'") != std::string::npos);
  CHECK(jmp_refusal("x=f17").find("unknown dtype 'f17'") != std::string::npos);  // the value is parsed first
  CHECK(jmp_refusal("p=f16=bf16").find("is not KEY=DTYPE") != std::string::npos);
  CHECK(jmp_refusal("p=f16,").find("is not KEY=DTYPE") != std::string::npos);
  CHECK(jmp_refusal("p=f64").find("no f64") != std::string::npos);
  for (const char* t : {"f", "x=f16", "p=f16=bf16", "p=f64"})
    CHECK(jmp_refusal(t).find('\n') == std::string::npos);
  CHECK_THROWS_WITH_AS(parse_policy_string("jmp:p=f16,q=f32"), doctest::Contains("unknown key 'q'"),
                       std::invalid_argument);
}

TEST_CASE("jmp's output dtype is where the model's output leaves it; params below f32 have no masters") {
  MlpConfig c;
  c.sizes = {4, 3, 2};
  c.seed = 5;
  MatrixF x = MatrixF::Constant(2, 4, 0.5f);
  c.policy = parse_policy_string("jmp:p=f32,c=f16,o=f32").make();
  Mlp out32(c);
  CHECK(out32.forward(x).dtype() == f32);
  c.policy = parse_policy_string("jmp:c=f16").make();
  Mlp out16(c);
  CHECK(out16.forward(x).dtype() == f16);
  CHECK(params_of("jmp:p=f16,c=f16", "linear") == f16);
  CHECK(!parse_policy_string("jmp:p=f16,c=f16").needs().master_weights);
  CHECK(parse_policy_string("jmp:c=f16").needs().master_weights);
}

TEST_CASE("named bases take the clauses a dtype takes, and their canonical text parses back to itself") {
  for (const char* t :
       {"O2+**.ln1=f32", "autocast:cpu:bf16+keep-f32:softmax", "mixed_float16+fc3=f32",
        "jmp:p=f32,c=bf16,o=f32+keep-f32-layers:head", "O1+head=autocast-off+head.x=autocast-on"}) {
    CAPTURE(t);
    const PolicySpec s = parse_policy_string(t);
    CHECK(parse_policy_string(s.text()).text() == s.text());
  }
  CHECK(decision("O2+fc1=f32", "linear", {f16, f16}).output == f32);
  CHECK_THROWS_WITH_AS(parse_policy_string("O4"),
                       doctest::Contains("unknown dtype 'O4', and no named policy"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_policy_string("autocast:tpu"), doctest::Contains("DEVICE cuda or cpu"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_policy_string("autocast:cuda:f32"), doctest::Contains("f16 or bf16"),
                       std::invalid_argument);
}
