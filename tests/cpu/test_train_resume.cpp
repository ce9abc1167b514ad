// Chapters 04 onwards — a run of each chapter model, stopped, checkpointed,
// read back into a fresh run and continued, equals the run that never
// stopped, bit for bit; what a checkpoint of another run is refused with.
// Depends on: mpt/train/run.hpp, mpt/train/checkpoint.hpp.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/train/checkpoint.hpp"
#include "mpt/train/run.hpp"

using namespace mpt::train;

namespace {

std::uint32_t bits(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

RunConfig config(const std::string& model, const std::string& data, const std::string& policy,
                 const std::string& optimizer = "") {
  RunConfig c;
  c.model = model;
  c.data = data;
  c.policy = policy;
  c.scaler = "dynamic";
  c.optimizer = optimizer;
  return c;
}

// N steps straight, against k steps + checkpoint bytes + a fresh run + N - k steps.
void check_resume(const RunConfig& c, int n, int k) {
  TrainRun straight(c);
  for (int i = 0; i < n; ++i) (void)straight.step();

  std::string bytes;
  {
    TrainRun first(c);
    for (int i = 0; i < k; ++i) (void)first.step();
    bytes = serialize_checkpoint(first.checkpoint());
  }
  TrainRun resumed(c);
  resumed.restore(parse_checkpoint(bytes));
  CHECK(resumed.steps_done() == k);
  for (int i = k; i < n; ++i) (void)resumed.step();

  REQUIRE(resumed.history().size() == straight.history().size());
  for (std::size_t i = 0; i < straight.history().size(); ++i) {
    INFO("step " << i + 1);
    CHECK(bits(resumed.history()[i].loss) == bits(straight.history()[i].loss));
    CHECK(resumed.history()[i].scale == straight.history()[i].scale);
    CHECK(resumed.history()[i].skipped == straight.history()[i].skipped);
  }
  CHECK(resumed.masters_checksum() == straight.masters_checksum());
  CHECK(serialize_checkpoint(resumed.checkpoint()) == serialize_checkpoint(straight.checkpoint()));
}

}  // namespace

TEST_CASE("bit-exact resume: the blobs MLP in f16 with SGD and a dynamic scaler") {
  check_resume(config("mlp", "synthetic", "f16"), 30, 13);  // 768/64 = 12 batches an epoch: k crosses one
}

TEST_CASE("bit-exact resume: the digits MLP with AdamW") {
  check_resume(config("mlp", "digits", "bf16", "adamw"), 12, 5);
}

TEST_CASE("bit-exact resume: the digits CNN, BatchNorm's running estimates in f16") {
  check_resume(config("cnn", "digits", "f16"), 8, 3);
}

TEST_CASE("bit-exact resume: the Transformer with layer_norm kept in f32") {
  check_resume(config("transformer", "text", "f16+keep-f32:layer_norm"), 4, 2);
}

TEST_CASE("a run is deterministic for its seed, and the seed matters") {
  RunConfig c = config("mlp", "synthetic", "f32");
  TrainRun a(c), b(c);
  c.seed = 8;
  TrainRun other(c);
  for (int i = 0; i < 5; ++i) {
    CHECK(bits(a.step().loss) == bits(b.step().loss));
    (void)other.step();
  }
  CHECK(a.masters_checksum() == b.masters_checksum());
  CHECK(a.masters_checksum() != other.masters_checksum());
}

TEST_CASE("a checkpoint of another configuration is refused, naming the field and both values") {
  TrainRun a(config("mlp", "synthetic", "f16"));
  (void)a.step();
  const Checkpoint c = a.checkpoint();
  const auto refusal = [&c](const RunConfig& other) {
    TrainRun r(other);
    const std::uint64_t before = r.masters_checksum();
    try {
      r.restore(c);
    } catch (const std::invalid_argument& e) {
      CHECK(r.masters_checksum() == before);  // unchanged
      CHECK(r.steps_done() == 0);
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refusal(config("mlp", "synthetic", "bf16")) ==
        "the checkpoint was made with policy f16 but this run has policy bf16; run with the checkpoint's "
        "policy, "
        "or pick another checkpoint with --resume-from PATH");
  CHECK(refusal(config("mlp", "digits", "f16")).find("data synthetic but this run has data digits") !=
        std::string::npos);
  RunConfig lr = config("mlp", "synthetic", "f16");
  lr.lr = 0.01;
  CHECK(refusal(lr).find("lr 0.05 but this run has lr 0.01") != std::string::npos);
  RunConfig seed = config("mlp", "synthetic", "f16");
  seed.seed = 1;
  CHECK(refusal(seed).find("seed 7 but this run has seed 1") != std::string::npos);
  RunConfig scaler = config("mlp", "synthetic", "f16");
  scaler.scaler = "none";
  CHECK(refusal(scaler).find("scaler dynamic but this run has scaler none") != std::string::npos);
  CHECK(refusal(config("mlp", "synthetic", "f16", "adamw")).find("optimizer sgd") != std::string::npos);

  // Steps and every may differ; a tensor of the wrong shape may not.
  RunConfig longer = config("mlp", "synthetic", "f16");
  longer.steps = 500;
  longer.every = 3;
  TrainRun ok(longer);
  ok.restore(c);
  CHECK(ok.steps_done() == 1);
  Checkpoint wrong = c;
  wrong.tensors[0].shape = {16, 16};
  wrong.tensors[0].values.resize(256);
  TrainRun r(config("mlp", "synthetic", "f16"));
  try {
    r.restore(wrong);
    FAIL("a wrong shape was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find(
              "checkpoint tensor master/fc1.weight has shape 16x16, this model's is 32x8") !=
          std::string::npos);
  }
  CHECK(r.steps_done() == 0);
}

TEST_CASE("resolve_config fills the chapters' defaults and refuses what is not a run") {
  const RunConfig m = resolve_config(config("mlp", "", "fp16"));
  CHECK(m.data == "synthetic");
  CHECK(m.policy == "f16");
  CHECK(m.optimizer == "sgd");
  CHECK(m.lr == 0.05);
  CHECK(m.seed == 7u);
  const RunConfig t = resolve_config(config("transformer", "", "f16+keep-f32:layer_norm"));
  CHECK(t.data == "text");
  CHECK(t.optimizer == "adamw");
  CHECK(t.lr == 3e-3);
  CHECK(t.seed == 1u);
  RunConfig s = config("cnn", "", "bf16");
  s.scaler = "static:1024.0";
  CHECK(resolve_config(s).scaler == "static:1024");
  const auto error = [](const RunConfig& c) {
    try {
      (void)resolve_config(c);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error(config("cnn", "synthetic", "f16")).find("the pairs are mlp with synthetic or digits") !=
        std::string::npos);
  CHECK(error(config("rnn", "", "f16")).find("model 'rnn' is not one of mlp, cnn, transformer") !=
        std::string::npos);
  CHECK_FALSE(error(config("mlp", "", "f17")).empty());
  CHECK_FALSE(error(config("mlp", "", "f16+keep-f32:no_such_op")).empty());
  CHECK_FALSE(error(config("mlp", "", "f16+keep-f32:")).empty());
  for (const char* bad : {"static:0", "static:abc", "static:-1", "static:inf", "dyn"}) {
    RunConfig b = config("mlp", "", "f16");
    b.scaler = bad;
    CHECK_FALSE(error(b).empty());
  }
  RunConfig steps = config("mlp", "", "f16");
  steps.steps = 0;
  CHECK(error(steps).find("steps 0") != std::string::npos);
}
