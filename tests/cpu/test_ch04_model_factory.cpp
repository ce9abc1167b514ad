// Chapter 04 — the model factory (mpt/nn/models/model_factory.hpp): every chapter
// model by its name, as `mpt trace` and `mpt train` build it.
// Depends on: mpt/nn/models/model_factory.hpp, mlp.hpp, cnn.hpp, transformer.hpp,
// the core tier (Policy, Tensor), doctest.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "mpt/core/policy.hpp"
#include "mpt/nn/models/cnn.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/nn/models/model_factory.hpp"
#include "mpt/nn/models/transformer.hpp"

using namespace mpt;

namespace {

// Every parameter's FP32 master, flattened: what the seed initialised.
std::vector<float> masters(Model& m) {
  std::vector<float> out;
  for (Parameter* p : m.parameters()) {
    const std::vector<float> v = widened(p->master);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

TEST_CASE("make_model builds each chapter's model by name, with its seed, policy and options") {
  CHECK(model_names() == std::vector<std::string>{"mlp", "cnn", "transformer"});
  ModelSpec spec;
  spec.name = "mlp";
  spec.mlp_sizes = {5, 7, 3};
  spec.mlp_activation = Activation::gelu;
  spec.seed = 11;
  const std::unique_ptr<Model> mlp = make_model(spec);
  REQUIRE(dynamic_cast<Mlp*>(mlp.get()) != nullptr);
  CHECK(mlp->paths() == std::vector<std::string>{"fc1", "gelu1", "fc2"});
  CHECK(mlp->parameters().front()->master.shape() == Shape{7, 5});

  spec.name = "cnn";
  const std::unique_ptr<Model> cnn = make_model(spec);
  CHECK(dynamic_cast<Cnn*>(cnn.get()) != nullptr);

  spec.name = "transformer";
  spec.vocab_size = 50;
  spec.dtype = DType::bf16;
  const std::unique_ptr<Model> lm = make_model(spec);
  auto* t = dynamic_cast<TinyTransformer*>(lm.get());
  REQUIRE(t != nullptr);
  CHECK(t->config().vocab_size == 50);
  CHECK(t->config().seed == 11);
  CHECK(t->config().dtype == DType::bf16);

  // The seed decides the weights; the same spec gives the same ones.
  ModelSpec a;
  a.name = "cnn";
  a.seed = 3;
  ModelSpec b = a;
  b.seed = 4;
  const std::unique_ptr<Model> a1 = make_model(a), a2 = make_model(a), b1 = make_model(b);
  CHECK(masters(*a1) == masters(*a2));
  CHECK(masters(*a1) != masters(*b1));

  // The policy, when given, is what the model's ops ask.
  ModelSpec p;
  p.name = "mlp";
  p.policy = uniform_policy(DType::f16);
  CHECK(&make_model(p)->context().policy() == p.policy.get());
}

TEST_CASE("make_model refuses an unknown name, naming the valid ones") {
  ModelSpec spec;
  spec.name = "resnet";
  CHECK_THROWS_WITH_AS(make_model(spec), "make_model: unknown model 'resnet'; valid: mlp, cnn, transformer",
                       std::invalid_argument);
}
