// Chapters 02 onwards — the policy string: what each form of the grammar
// builds (asked through the policy it makes, as an op would ask), the
// canonical text, and the one-line refusals of every malformed string.
// Depends on: mpt/core/policy_string.hpp, policy.hpp, dtype.hpp, policy_string_support.hpp.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/policy_string.hpp"
#include "policy_string_support.hpp"

using namespace mpt;

using mpt_test::output_of;
using mpt_test::refusal;

TEST_CASE("a dtype alone is Chapter 2's uniform policy") {
  const PolicySpec s = parse_policy_string("f16");
  CHECK(s.dtype == DType::f16);
  CHECK(s.keep_ops.empty());
  CHECK(s.keep_layers.empty());
  CHECK(s.text() == "f16");
  CHECK(s.make()->describe() == "uniform f16");
  CHECK(output_of("f16", "linear", "fc1") == DType::f16);
  CHECK(output_of("bf16", "linear", "fc1") == DType::bf16);
  CHECK(output_of("f32", "linear", "fc1") == DType::f32);
  CHECK(parse_policy_string("e4m3").dtype == DType::e4m3);
  // The format names of Chapter 1 are dtype names too; the canonical text uses the dtype's.
  CHECK(parse_policy_string("fp16+keep-f32:softmax").text() == "f16+keep-f32:softmax");
}

TEST_CASE("keep-f32 keeps ops by name, keep-f32-layers keeps layers and what is below them") {
  CHECK(output_of("f16+keep-f32:layer_norm", "layer_norm", "block0.ln1") == DType::f32);
  CHECK(output_of("f16+keep-f32:layer_norm", "linear", "block0.attn.qkv") == DType::f16);
  CHECK(output_of("f16+keep-f32:layer_norm,linear", "linear", "fc1") == DType::f32);
  CHECK(output_of("bf16+keep-f32-layers:fc3", "linear", "fc3") == DType::f32);
  CHECK(output_of("bf16+keep-f32-layers:fc3", "linear", "fc2") == DType::bf16);
  CHECK(output_of("bf16+keep-f32-layers:block0", "linear", "block0.attn.qkv") == DType::f32);
  CHECK(output_of("bf16+keep-f32-layers:block0", "linear", "block1.attn.qkv") == DType::bf16);
  const PolicySpec both = parse_policy_string("f16+keep-f32-layers:head+keep-f32:softmax,gelu");
  CHECK(both.keep_ops == std::vector<std::string>{"softmax", "gelu"});
  CHECK(both.keep_layers == std::vector<std::string>{"head"});
  CHECK(output_of(both.text(), "gelu", "block0.mlp.act") == DType::f32);
  CHECK(output_of(both.text(), "linear", "head") == DType::f32);
  CHECK(output_of(both.text(), "linear", "fc1") == DType::f16);
}

TEST_CASE("the canonical text lists the op clause first and parses back to itself") {
  const std::string canonical = "f16+keep-f32:softmax,gelu+keep-f32-layers:head,block0.ln_1";
  CHECK(parse_policy_string("f16+keep-f32-layers:head,block0.ln_1+keep-f32:softmax,gelu").text() ==
        canonical);
  for (const char* t : {"f32", "bf16+keep-f32:layer_norm", "f16+keep-f32-layers:a.b.c", canonical.c_str()}) {
    CAPTURE(t);
    const PolicySpec once = parse_policy_string(t);
    CHECK(parse_policy_string(once.text()).text() == once.text());
  }
}

TEST_CASE("every malformed string is refused with one line naming the problem and the grammar") {
  struct Case {
    std::string text;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"", {"policy '': empty"}},
      {"fp8", {"unknown dtype 'fp8'", "DTYPE one of f32, bf16, f16, e4m3, e5m2"}},
      {"tf32", {"tf32 is a compute format", "valid: BASE"}},
      {"F16", {"unknown dtype 'F16'"}},
      {"f16+", {"a '+' with no clause after it"}},
      {"+f16", {"unknown dtype ''"}},
      {"f16+keep-fp32:linear", {"unknown clause 'keep-fp32:linear'"}},
      {"f16+keep-f32", {"unknown clause 'keep-f32'"}},
      {"f16+keep-f32:", {"'keep-f32:' names nothing"}},
      {"f16+keep-f32:linear,", {"'keep-f32:' has an empty name (a comma too many)"}},
      {"f16+keep-f32:,linear", {"has an empty name"}},
      {"f16+keep-f32:lnear", {"unknown op 'lnear'; known ops: linear, matmul"}},
      {"f16+keep-f32:linear,linear", {"'linear' is named twice"}},
      {"f16+keep-f32:linear+keep-f32:relu", {"'keep-f32:' given twice"}},
      {"f16+keep-f32-layers:fc1+keep-f32-layers:fc2", {"'keep-f32-layers:' given twice"}},
      {"f16+keep-f32-layers:", {"'keep-f32-layers:' names nothing"}},
      {"f16+keep-f32-layers:fc1..x", {"layer path 'fc1..x' is not NAME[.NAME...]"}},
      {"f16+keep-f32-layers:.fc1", {"layer path '.fc1'"}},
      {"f16+keep-f32-layers:fc 1", {"layer path 'fc 1'"}},
      {"f16 ", {"unknown dtype 'f16 '"}},
      {"f16\n", {"unknown dtype 'f16\\x0a'"}},
      {"f16+keep-f32-layers:fc1,fc1", {"'fc1' is named twice"}},
      {std::string(5000, 'x'), {"5000 characters, first 60 shown", "longer than 4096 characters"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    const std::string m = refusal(c.text);
    REQUIRE_FALSE(m.empty());
    CHECK(m.find('\n') == std::string::npos);
    CHECK(m.size() < 600);
    for (const std::string& f : c.fragments) {
      CAPTURE(f);
      CHECK(m.find(f) != std::string::npos);
    }
    if (m.find("unknown op") == std::string::npos)
      CHECK(m.find("valid: BASE[+keep-f32:OP") != std::string::npos);
  }
}
