// Chapter 06 — exercises: grader tests for exercise 6.1 (a layer policy string, and the dtype it gives a
// layer). Depends on: grader.hpp; mpt's parse_policy_string is the reference for the parse, its
// PathPattern::covers and PathRulePolicy for the dtypes. Seven test cases, two points each: texts parsed as
// mpt parses them; bad texts refused; a plain pattern covers its path and what is under it, by whole
// segments; "*" inside a segment; "**" across segments; the last rule that covers a path wins; seeded random
// policies on the 12-block Transformer against the policy mpt builds. The parse is a third of the points: a
// matcher that tests substrings, or lets the first rule win, loses the rest.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex06;
using namespace mpt::ex06::grading;
using mpt::DType;

// The 12-block Transformer's paths and a few of other models (a CNN, an
// encoder of numbered layers, nested names): where the wildcards bite.
std::vector<std::string> graded_paths() {
  std::vector<std::string> p = transformer12_paths();
  for (const char* extra : {"conv1",
                            "conv10",
                            "bn1",
                            "bn1x",
                            "fc1",
                            "fc10",
                            "head",
                            "lm_head",
                            "encoder.layer0.attn",
                            "encoder.layer10.attn.q",
                            "encoder.layer1.ffn.fc1",
                            "decoder.layer1.ffn.fc1",
                            "a",
                            "a.b",
                            "a.bc",
                            "a.b.c",
                            "a.b.c.d",
                            "x.a.b",
                            "block",
                            "blockx.mlp",
                            "block1x",
                            "my_block1.mlp",
                            "ln1",
                            "ln10",
                            "mlp"})
    p.emplace_back(extra);
  return p;
}

}  // namespace

TEST_SUITE("exercise-6.1") {
  TEST_CASE("6.1 parses DTYPE(+PATTERN=DTYPE)*: the base and the rules, in order, as mpt's parser") {
    Mismatches m;
    for (const char* text :
         {"f32", "f16", "bf16", "f16+block1=f32", "bf16+block*.mlp=f32", "f16+**.ln1=f32", "f32+lm_head=f16",
          "f16+block1=f32+block1.mlp.fc2=f16", "bf16+**=f32", "f16+**.attn.*=f32+block0.attn.q=bf16",
          "f32+a=f16+a.b=bf16+a.b.c=f32+a.b.c.d=f16", "f16+*=bf16", "f16+block*1=f32", "f16+*lock*=f32",
          "bf16+encoder.**.ffn=f32+decoder.**=f16", "f16+tok_emb=f32+pos_emb=f32+ln_f=f32+lm_head=f32",
          "f16+B_1.x2=bf16", "f32+**.**=f16", "f16+block10=f32+block1=bf16"}) {
      expect_parse(m, text);
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.1 bad text throws std::invalid_argument") {
    Mismatches m;
    // mpt's parser refuses these too.
    expect_refused(m, "", "empty");
    expect_refused(m, "f64", "an unknown base dtype");
    expect_refused(m, "half", "an unknown base dtype");
    expect_refused(m, "f16+", "a '+' with nothing after it");
    expect_refused(m, "f16++block1=f32", "a '+' too many");
    expect_refused(m, "+block1=f32", "no base");
    expect_refused(m, "f16+block1", "a clause without '='");
    expect_refused(m, "f16+=f32", "an empty pattern");
    expect_refused(m, "f16+block1=", "an empty rule dtype");
    expect_refused(m, "f16+block1=f64", "an unknown rule dtype");
    expect_refused(m, "f16+block1=f32=f16", "two '=' in one clause");
    expect_refused(m, "f16+a..b=f32", "an empty segment");
    expect_refused(m, "f16+.a=f32", "an empty first segment");
    expect_refused(m, "f16+a.=f32", "an empty last segment");
    expect_refused(m, "f16+a**=f32", "'**' inside a segment");
    expect_refused(m, "f16+**b.c=f32", "'**' inside a segment");
    expect_refused(m, "f16+block-1=f32", "a '-' in a pattern");
    expect_refused(m, "f16+block 1=f32", "a space in a pattern");
    expect_refused(m, "f16 +block1=f32", "a space after the base");
    expect_refused(m, "f16+block1=f32+block1=bf16", "the same pattern twice");
    expect_refused(m, "f16+a/b=f32", "a '/' in a pattern");
    // mpt's full grammar accepts these; 6.1's cut-down one does not.
    expect_refused(m, "fp16", "the Chapter 1 name, not a DTYPE of 6.1");
    expect_refused(m, "F16", "a DTYPE is lower case");
    expect_refused(m, "e4m3", "an FP8 dtype");
    expect_refused(m, "f16+block1=e5m2", "an FP8 rule dtype");
    expect_refused(m, "O1", "a preset");
    expect_refused(m, "f16+keep-f32:layer_norm", "a keep-f32 clause");
    expect_refused(m, "f16+keep-f32-layers:fc1", "a keep-f32-layers clause");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.1 a plain pattern covers its own path and every layer under it, by whole segments") {
    // "block1" covers block1.attn.q, never block10 or block11: a substring
    // test keeps three blocks where one was meant (the pitfall
    // name-substring-policy); "a.b" covers "a.b.c", never "a.bc".
    Mismatches m;
    const std::vector<std::string> paths = graded_paths();
    expect_dtypes(m, {DType::f16, {{"block1", DType::f32}}}, paths);
    expect_dtypes(m, {DType::bf16, {{"block1.mlp", DType::f32}}}, paths);
    expect_dtypes(m, {DType::f16, {{"a.b", DType::bf16}}}, paths);
    expect_dtypes(m, {DType::f32, {{"fc1", DType::f16}, {"conv1", DType::bf16}}}, paths);
    expect_dtypes(m, {DType::f16, {{"ln1", DType::f32}, {"bn1", DType::f32}}}, paths);
    expect_dtypes(m, {DType::f16, {{"encoder.layer1", DType::f32}}}, paths);
    expect_dtypes(m, {DType::bf16, {{"head", DType::f32}}}, paths);
    expect_dtypes(m, {DType::f16, {{"block11.attn.q", DType::f32}, {"lm_head", DType::bf16}}}, paths);
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.1 '*' matches any run of characters within one name, none included") {
    Mismatches m;
    const std::vector<std::string> paths = graded_paths();
    expect_dtypes(m, {DType::f16, {{"block*", DType::f32}}}, paths);
    expect_dtypes(m, {DType::f16, {{"block*.mlp", DType::f32}}}, paths);
    expect_dtypes(m, {DType::bf16, {{"block1*", DType::f32}}}, paths);
    expect_dtypes(m, {DType::f16, {{"block*1", DType::f32}}}, paths);
    expect_dtypes(m, {DType::f16, {{"*", DType::bf16}}}, paths);
    expect_dtypes(m, {DType::f32, {{"*.ln*", DType::f16}}}, paths);
    expect_dtypes(m, {DType::f16, {{"block*.attn.*", DType::f32}}}, paths);
    expect_dtypes(m, {DType::f16, {{"*head", DType::f32}, {"encoder.layer*.attn", DType::bf16}}}, paths);
    expect_dtypes(m, {DType::bf16, {{"*lock*", DType::f32}}}, paths);
    expect_dtypes(m, {DType::f16, {{"a.*", DType::f32}}}, paths);
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.1 '**' matches any number of whole names, none included") {
    Mismatches m;
    const std::vector<std::string> paths = graded_paths();
    expect_dtypes(m, {DType::f16, {{"**.ln1", DType::f32}}}, paths);
    expect_dtypes(m, {DType::f16, {{"**.fc1", DType::f32}}}, paths);
    expect_dtypes(m, {DType::bf16, {{"**", DType::f32}}}, paths);
    expect_dtypes(m, {DType::f16, {{"encoder.**.fc1", DType::f32}}}, paths);
    expect_dtypes(m, {DType::f16, {{"a.**.d", DType::bf16}}}, paths);
    expect_dtypes(m, {DType::f16, {{"**.attn.q", DType::f32}, {"**.b", DType::bf16}}}, paths);
    expect_dtypes(m, {DType::f32, {{"**.layer1*.**", DType::f16}}}, paths);
    expect_dtypes(m, {DType::f16, {{"block1.**", DType::f32}}}, paths);
    expect_dtypes(m, {DType::f16, {{"**.**.c", DType::f32}}}, paths);
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.1 the last rule that covers a path decides") {
    // A rule for a parent, then one for its part: the part's wins; the
    // other way round, the parent's.
    Mismatches m;
    const std::vector<std::string> paths = graded_paths();
    expect_dtypes(m, {DType::f16, {{"block*", DType::f32}, {"block1.mlp", DType::bf16}}}, paths);
    expect_dtypes(m, {DType::f16, {{"block1.mlp", DType::bf16}, {"block*", DType::f32}}}, paths);
    expect_dtypes(m, {DType::bf16, {{"**", DType::f32}, {"**.attn", DType::bf16}, {"**.attn.q", DType::f32}}},
                  paths);
    expect_dtypes(m, {DType::f32, {{"a", DType::f16}, {"a.b", DType::bf16}, {"a.b.c", DType::f32}}}, paths);
    expect_dtypes(m, {DType::f32, {{"a.b.c", DType::f32}, {"a.b", DType::bf16}, {"a", DType::f16}}}, paths);
    expect_dtypes(
        m, {DType::f16, {{"**.ln*", DType::f32}, {"block1*.**", DType::bf16}, {"lm_head", DType::f32}}},
        paths);
    expect_dtypes(m, {DType::f16, {{"*", DType::bf16}, {"tok_emb", DType::f32}, {"*_emb", DType::f16}}},
                  paths);
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.1 seeded random policies on the 12-block Transformer, against the policy mpt builds") {
    // 300 policies of 1 to 5 rules drawn from 30 patterns, each parsed by
    // the student's parser and by mpt's; every path's dtype compared with
    // PathRulePolicy's.
    const std::vector<std::string> pool = {"block1",       "block10",       "block*",
                                           "block1*",      "block*1",       "*",
                                           "**",           "**.ln1",        "**.ln2",
                                           "**.attn",      "**.attn.q",     "block*.mlp",
                                           "**.fc1",       "**.fc2",        "ln_f",
                                           "lm_head",      "tok_emb",       "*_emb",
                                           "block0",       "block11.attn",  "block2.**",
                                           "**.mlp.*",     "*.ln*",         "block*.attn.*",
                                           "**.residual*", "embedding_sum", "block5.mlp.gelu",
                                           "**.out",       "block1.**",     "*lock1*"};
    const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
    const std::vector<std::string> paths = graded_paths();
    std::mt19937 rng(6101u);
    Mismatches m;
    for (int k = 0; k < 300; ++k) {
      std::string text(mpt::dtype_name(dtypes[rng() % 3]));
      std::vector<std::string> used;
      const int rules = 1 + static_cast<int>(rng() % 5);
      for (int r = 0; r < rules; ++r) {
        const std::string& p = pool[rng() % pool.size()];
        if (std::find(used.begin(), used.end(), p) != used.end()) continue;  // a pattern at most once
        used.push_back(p);
        text += "+" + p + "=" + std::string(mpt::dtype_name(dtypes[rng() % 3]));
      }
      const auto library = mpt::parse_policy_string(text).make();
      m.checked();
      const LayerPolicy got = parse_layer_policy(text);
      for (const std::string& path : paths) {
        const DType want = library_policy_dtype(*library, path), answer = layer_dtype(got, path);
        if (answer == want) continue;
        if (m.wrong())
          m.detail("'" + text + "' at '" + path + "': " + name_of(answer) + ", expected " + name_of(want));
        break;
      }
    }
    CHECK_MESSAGE(m.none(), m.report());
  }
}  // TEST_SUITE
