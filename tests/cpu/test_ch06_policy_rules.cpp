// Chapter 06 — per-task precision policies: layer path patterns and the
// per-layer rules PATTERN=DTYPE of the policy string. What "*" and "**"
// match, what a pattern covers, that the last rule that covers a layer
// wins, that keep-f32-layers is the rule PATH=f32 (and old strings keep
// their canonical text), and the one-line refusals.
// Depends on: mpt/core/path_pattern.hpp, policy.hpp, policy_string.hpp, dtype.hpp,
// policy_string_support.hpp.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/core/path_pattern.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/policy_string.hpp"
#include "policy_string_support.hpp"

using namespace mpt;

using mpt_test::output_of;
using mpt_test::refusal;

TEST_CASE("a pattern: * inside one name, ** for any number of names, never a substring") {
  struct Case {
    const char* pattern;
    const char* path;
    bool matches;
  };
  const Case cases[] = {
      {"fc1", "fc1", true},
      {"fc1", "fc10", false},  // a name, not a prefix of one
      {"fc*", "fc10", true},
      {"fc*", "fc", true},  // * may be empty
      {"*c1", "fc1", true},
      {"f*1", "fc21", true},
      {"f*1", "fc12", false},
      {"block*", "block0.mlp", false},  // * stays inside its name
      {"block*.mlp", "block12.mlp", true},
      {"block*.mlp", "block12.attn", false},
      {"*.mlp", "block0.mlp", true},
      {"*.mlp", "mlp", false},  // * is one name, not none
      {"**.ln1", "ln1", true},  // ** may be no name at all
      {"**.ln1", "block0.ln1", true},
      {"**.ln1", "a.b.c.ln1", true},
      {"**.ln1", "block0.ln10", false},
      {"block0.**", "block0", true},
      {"block0.**", "block0.mlp.fc1", true},
      {"block0.**", "block1.mlp", false},
      {"**", "anything.at.all", true},
      {"a.**.b.**.c", "a.b.c", true},
      {"a.**.b.**.c", "a.x.b.y.z.c", true},
      {"a.**.b.**.c", "a.x.y.c", false},
      {"bn", "block0.bn1", false},  // the substring rule the chapter warns about matches; a pattern does not
  };
  for (const Case& c : cases) {
    CAPTURE(c.pattern);
    CAPTURE(c.path);
    CHECK(PathPattern(c.pattern).matches(c.path) == c.matches);
  }
}

TEST_CASE("a pattern covers the layers under what it matches") {
  const PathPattern mlp("block0.mlp");
  CHECK(mlp.covers("block0.mlp"));
  CHECK(mlp.covers("block0.mlp.fc1"));
  CHECK_FALSE(mlp.matches("block0.mlp.fc1"));
  CHECK_FALSE(mlp.covers("block0.mlpx"));
  CHECK_FALSE(mlp.covers("block0"));  // not what is above it
  CHECK(PathPattern("block*.mlp").covers("block3.mlp.act"));
  CHECK(PathPattern("**.ln1").covers("block0.ln1.weight"));
  CHECK_FALSE(PathPattern("x").is_wildcard());
  CHECK(PathPattern("x*").is_wildcard());
}

TEST_CASE("many ** in a long pattern are matched in time (no backtracking)") {
  std::string pattern, path;
  for (int i = 0; i < 200; ++i) pattern += (i ? ".**" : "**");
  pattern += ".z";
  for (int i = 0; i < 60; ++i) path += (i ? ".a" : "a");
  CHECK_FALSE(PathPattern(pattern).matches(path));  // exponential with backtracking; O(200 x 60) here
  CHECK(PathPattern(pattern).matches(path + ".z"));
}

TEST_CASE("a malformed pattern is refused in one line that says what is valid") {
  for (const char* bad : {"", ".a", "a.", "a..b", "a**", "**b", "a.b-c", "a b", "a\nb"}) {
    CAPTURE(bad);
    try {
      (void)PathPattern(bad);
      FAIL("accepted");
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      CHECK(m.find('\n') == std::string::npos);
      CHECK(m.find("valid: NAME[.NAME...]") != std::string::npos);
    }
  }
}

TEST_CASE("PATTERN=DTYPE rules: the last rule that covers a layer decides") {
  // The examples.
  CHECK(output_of("f16+block*.mlp=f32", "linear", "block0.mlp.fc1") == DType::f32);
  CHECK(output_of("f16+block*.mlp=f32", "linear", "block0.attn.qkv") == DType::f16);
  CHECK(output_of("bf16+**.ln1=f32", "layer_norm", "block1.ln1") == DType::f32);
  CHECK(output_of("bf16+**.ln1=f32", "layer_norm", "block1.ln2") == DType::bf16);
  // Later rules override earlier ones where both cover the layer.
  const std::string p = "f32+block*=f16+block0.mlp=bf16+block0.mlp.fc2=f32";
  CHECK(output_of(p, "linear", "block1.mlp.fc1") == DType::f16);
  CHECK(output_of(p, "linear", "block0.mlp.fc1") == DType::bf16);
  CHECK(output_of(p, "linear", "block0.mlp.fc2") == DType::f32);
  CHECK(output_of(p, "linear", "head") == DType::f32);  // no rule: the base
  // Parameters' model copies follow the same rule.
  const auto pol = parse_policy_string(p).make();
  CHECK(pol->parameter_dtype("linear", "block0.mlp.fc1") == DType::bf16);
  CHECK(pol->parameter_dtype("linear", "block0.mlp.fc2") == DType::f32);
  CHECK(pol->parameter_dtype("linear", "head") == DType::f32);
  CHECK(pol->describe() == "uniform f32; block*=f16; block0.mlp=bf16; block0.mlp.fc2=f32");
  // A rule to a low-precision dtype answers as that uniform policy: a loss
  // reads what arrives and returns FP32.
  const OpPrecision loss = pol->decide({"cross_entropy", "block0.mlp.x", {DType::bf16}});
  CHECK(loss.input == DType::bf16);
  CHECK(loss.output == DType::f32);
  // The op list wins over the rules (a rule picks layers, the list picks ops).
  CHECK(output_of("f16+keep-f32:layer_norm+**=bf16", "layer_norm", "block0.ln1") == DType::f32);
  CHECK(output_of("f16+keep-f32:layer_norm+**=bf16", "linear", "block0.fc") == DType::bf16);
}

TEST_CASE("keep-f32-layers is the rule PATH=f32 before the pattern rules; old strings keep their text") {
  // Without rules nothing changes: the same policy type, the same text.
  const PolicySpec old = parse_policy_string("bf16+keep-f32:layer_norm+keep-f32-layers:fc3");
  CHECK(old.rules.empty());
  CHECK(old.text() == "bf16+keep-f32:layer_norm+keep-f32-layers:fc3");
  CHECK(dynamic_cast<const KeepF32Policy*>(old.make().get()) != nullptr);
  // With rules, a later rule overrides a kept layer, wherever the clause was written.
  for (const char* t :
       {"f16+keep-f32-layers:block0+block0.mlp=bf16", "f16+block0.mlp=bf16+keep-f32-layers:block0"}) {
    CAPTURE(t);
    const PolicySpec s = parse_policy_string(t);
    CHECK(s.text() == "f16+keep-f32-layers:block0+block0.mlp=bf16");
    CHECK(output_of(t, "linear", "block0.attn.qkv") == DType::f32);
    CHECK(output_of(t, "linear", "block0.mlp.fc1") == DType::bf16);
    CHECK(output_of(t, "linear", "block1.mlp.fc1") == DType::f16);
  }
}

TEST_CASE("the canonical text of rules: in the order given, dtype names canonical, and it parses back") {
  const PolicySpec s = parse_policy_string("fp16+b*.mlp=fp32+**.ln1=bf16");
  CHECK(s.rules == std::vector<LayerRule>{{"b*.mlp", DType::f32}, {"**.ln1", DType::bf16}});
  CHECK(s.text() == "f16+b*.mlp=f32+**.ln1=bf16");
  const PolicySpec again = parse_policy_string(s.text());
  CHECK(again.rules == s.rules);
  CHECK(again.text() == s.text());
}

TEST_CASE("bad rules are refused in one line naming the rule and what is valid") {
  struct Bad {
    const char* text;
    const char* says;
  };
  const Bad cases[] = {
      {"f16+block*.mlp=f64", "unknown dtype 'f64'"},
      {"f16+block*.mlp=", "unknown dtype ''"},
      {"f16+=f32", "empty"},
      {"f16+a..b=f32", "an empty name"},
      {"f16+a**=f32", "'**' must be a name of its own"},
      {"f16+a-b=f32", "the character 0x2d is not allowed"},
      {"f16+fc1=f32+fc1=bf16", "the pattern 'fc1' is given twice"},
  };
  for (const Bad& b : cases) {
    CAPTURE(b.text);
    const std::string m = refusal(b.text);
    CHECK(m.find(b.says) != std::string::npos);
    CHECK(m.rfind("policy '", 0) == 0);
    CHECK(m.find("valid: BASE") != std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
  }
}
