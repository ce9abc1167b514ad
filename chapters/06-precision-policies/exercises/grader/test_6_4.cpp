// Chapter 06 — exercises: grader tests for exercise 6.4 (diagnose: a policy that picks its FP32 layers by
// name). Depends on: grader.hpp (the reference: mpt's KeepF32Policy over UniformPolicy(low), on every path
// and op of the 12-block Transformer, and in a traced training step of it). Four test cases, three points
// each (a diagnose exercise's): block1 alone; a leaf layer with a block; every path of the model kept alone;
// a traced step. The given, broken body (a substring test, `path.find(name)`) fails every one of them:
// "block1" is inside "block10" and "block11".
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex06;
using namespace mpt::ex06::grading;
using mpt::DType;

// Grades one keep list in `low`; adds one line to `m` for a wrong answer.
void expect_keep(Mismatches& m, const std::vector<std::string>& paths, DType low) {
  m.checked();
  const std::string problem = keep_problem(paths, low);
  if (problem.empty() || !m.wrong()) return;
  m.detail("keep " + describe(paths) + " in FP32, " + name_of(low) + " elsewhere: " + problem);
}

}  // namespace

TEST_SUITE("exercise-6.4") {
  TEST_CASE(
      "6.4 block1 alone on a 12-block Transformer: block1's layers in FP32, block10's and block11's not") {
    Mismatches m;
    for (DType low : {DType::f16, DType::bf16}) {
      expect_keep(m, {"block1"}, low);
      expect_keep(m, {"block0", "block1"}, low);
      expect_keep(m, {"block1", "block2", "block3"}, low);
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.4 a leaf layer and a block: the layer at the path itself is covered too") {
    // lm_head and tok_emb are layers, not containers: a rule for a path
    // covers that path and what is under it.
    Mismatches m;
    for (DType low : {DType::f16, DType::bf16}) {
      expect_keep(m, {"lm_head", "block1"}, low);
      expect_keep(m, {"tok_emb", "ln_f", "block1"}, low);
      expect_keep(m, {"block1.mlp.fc1", "block1"}, low);
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.4 every path of the model kept alone: exactly that layer and the layers under it") {
    // 173 paths: the embeddings, each block and its norms, projections and
    // residual sums, ln_f and lm_head, one at a time.
    Mismatches m;
    for (const std::string& path : transformer12_paths()) expect_keep(m, {path}, DType::f16);
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.4 a traced training step with block1 and lm_head kept: FP32 ran exactly there") {
    // The trace of one step of the 12-block Transformer: every forward op,
    // what it read and what it stored, against the reference policy's.
    Mismatches m;
    for (DType low : {DType::f16, DType::bf16}) {
      for (const std::vector<std::string>& paths :
           {std::vector<std::string>{"block1", "lm_head"}, std::vector<std::string>{"tok_emb", "block1.attn"},
            std::vector<std::string>{"block1"}}) {
        m.checked();
        const std::string problem = trace_problem(paths, low);
        if (!problem.empty() && m.wrong())
          m.detail("keep " + describe(paths) + " in FP32, " + name_of(low) + " elsewhere: " + problem);
      }
    }
    CHECK_MESSAGE(m.none(), m.report());
  }
}  // TEST_SUITE
