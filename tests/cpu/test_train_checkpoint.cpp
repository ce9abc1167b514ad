// Chapters 04 onwards — the checkpoint format and the state it is made of:
// Rng, SGD and AdamW state, Batches, the atomic save (the write itself:
// test_ch01_atomic_file.cpp), one run per directory (the newest-two rule
// deletes only the writing run's files; the lock: test_ch04_directory_lock.cpp);
// every corruption of a checkpoint's bytes refused with one line.
// Depends on: mpt/train/checkpoint.hpp, mpt/io/atomic_file.hpp,
// mpt/core/random.hpp, mpt/nn/data/data.hpp, mpt/optim/sgd.hpp, mpt/optim/adamw.hpp.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/core/random.hpp"
#include "mpt/io/atomic_file.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/optim/adamw.hpp"
#include "mpt/optim/sgd.hpp"
#include "mpt/train/checkpoint.hpp"

using namespace mpt;
using namespace mpt::train;

namespace {

// A small checkpoint with a distinct value in every field.
Checkpoint sample() {
  Checkpoint c;
  c.config.model = "cnn";
  c.config.data = "digits";
  c.config.policy = "f16+keep-f32:batch_norm";
  c.config.scaler = "static:1024";
  c.config.optimizer = "sgd";
  c.config.lr = 0.0375;
  c.config.seed = 123456789012345ull;
  c.config.steps = 40;
  c.config.every = 7;
  c.step = 3;
  c.tensors.push_back({"master/fc.weight", {2, 3}, {1.5f, -2.25f, 0.0f, -0.0f, 1e-30f, 3.0f}});
  c.tensors.push_back({"running_var/bn1", {2}, {0.5f, 4.0f}});
  c.counters = {{"num_batches_tracked/bn1", 3}, {"adamw.steps", 2}};
  c.scaler_state =
      R"({"scale":65536.0,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":2000,"_growth_tracker":3})";
  c.data_epoch = 2;
  c.data_position = 128;
  c.rngs = {{0x0123456789abcdefull, true, -0.75}, {42, false, 0.0}};
  c.history = {{1, 2.5f, 65536.0f, false},
               {2, std::numeric_limits<float>::quiet_NaN(), 32768.0f, true},
               {3, 2.25f, 32768.0f, false}};
  return c;
}

std::string one_line_error(const std::string& bytes) {
  try {
    (void)parse_checkpoint(bytes);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

std::string temp_dir() {
  char tmpl[] = "/tmp/mpt-train-test-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  REQUIRE(d != nullptr);
  return d;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

TEST_CASE("a checkpoint reads back with every field equal") {
  const Checkpoint c = sample();
  const std::string bytes = serialize_checkpoint(c);
  const Checkpoint r = parse_checkpoint(bytes);
  CHECK(r.config.model == c.config.model);
  CHECK(r.config.data == c.config.data);
  CHECK(r.config.policy == c.config.policy);
  CHECK(r.config.scaler == c.config.scaler);
  CHECK(r.config.optimizer == c.config.optimizer);
  CHECK(r.config.lr == c.config.lr);
  CHECK(r.config.seed == c.config.seed);
  CHECK(r.config.steps == c.config.steps);
  CHECK(r.config.every == c.config.every);
  CHECK(r.step == c.step);
  REQUIRE(r.tensors.size() == c.tensors.size());
  for (std::size_t i = 0; i < c.tensors.size(); ++i) {
    CHECK(r.tensors[i].name == c.tensors[i].name);
    CHECK(r.tensors[i].shape == c.tensors[i].shape);
    REQUIRE(r.tensors[i].values.size() == c.tensors[i].values.size());
    for (std::size_t k = 0; k < c.tensors[i].values.size(); ++k)
      CHECK(std::signbit(r.tensors[i].values[k]) == std::signbit(c.tensors[i].values[k]));
    CHECK(r.tensors[i].values == c.tensors[i].values);
  }
  CHECK(r.counters == c.counters);
  CHECK(r.scaler_state == c.scaler_state);
  CHECK(r.data_epoch == c.data_epoch);
  CHECK(r.data_position == c.data_position);
  REQUIRE(r.rngs.size() == 2);
  CHECK(r.rngs[0].word == c.rngs[0].word);
  CHECK(r.rngs[0].has_spare);
  CHECK(r.rngs[0].spare == -0.75);
  CHECK_FALSE(r.rngs[1].has_spare);
  REQUIRE(r.history.size() == 3);
  CHECK(r.history[1].step == 2);
  CHECK(std::isnan(r.history[1].loss));
  CHECK(r.history[1].scale == 32768.0f);
  CHECK(r.history[1].skipped);
  CHECK_FALSE(r.history[2].skipped);
  CHECK(serialize_checkpoint(r) == bytes);  // and writes back to the same bytes
}

TEST_CASE("a checkpoint cut short at any byte is refused with one line") {
  const std::string bytes = serialize_checkpoint(sample());
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    const std::string e = one_line_error(bytes.substr(0, n));
    INFO("cut at " << n);
    CHECK_FALSE(e.empty());
    CHECK(e.find('\n') == std::string::npos);
  }
}

TEST_CASE("a checkpoint with any bit of any byte flipped is refused") {
  const std::string bytes = serialize_checkpoint(sample());
  for (std::size_t i = 0; i < bytes.size(); ++i)
    for (const int bit : {0, 7}) {
      std::string b = bytes;
      b[i] = static_cast<char>(b[i] ^ (1 << bit));
      INFO("byte " << i << " bit " << bit);
      CHECK_FALSE(one_line_error(b).empty());
    }
}

TEST_CASE("magic, version, length and checksum errors say which") {
  const std::string bytes = serialize_checkpoint(sample());
  std::string b = bytes;
  b[0] = 'X';
  CHECK(one_line_error(b).find("bad magic") != std::string::npos);
  b = bytes;
  b[8] = 2;
  CHECK(one_line_error(b).find("format version 2 is not supported; this mpt reads version 1") !=
        std::string::npos);
  CHECK(one_line_error(bytes + "x").find("the header says") != std::string::npos);
  b = bytes;
  b[30] = static_cast<char>(b[30] ^ 1);
  CHECK(one_line_error(b).find("checksum mismatch") != std::string::npos);
  CHECK(one_line_error("MPT").find("too short") != std::string::npos);
}

TEST_CASE("the payload's lengths, counts and values are checked before anything is allocated") {
  // Payloads built by hand past the checksum (what a fuzzer reaches with parse_checkpoint_payload).
  const auto payload = [](const Checkpoint& c) {
    const std::string b = serialize_checkpoint(c);
    return b.substr(20, b.size() - 28);
  };
  const auto error = [](const std::string& p) {
    try {
      (void)parse_checkpoint_payload(p);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string good = payload(sample());
  CHECK(error(good).empty());
  for (std::size_t n = 0; n < good.size(); ++n) CHECK_FALSE(error(good.substr(0, n)).empty());
  CHECK(error(good + '\0').find("bytes after the last field") != std::string::npos);

  Checkpoint c = sample();
  c.config.lr = std::nan("");
  CHECK(error(payload(c)).find("learning rate") != std::string::npos);
  c = sample();
  c.history[0].scale = std::numeric_limits<float>::infinity();
  CHECK(error(payload(c)).find("scale that is not finite") != std::string::npos);
  c = sample();
  c.rngs[0].spare = std::nan("");
  CHECK(error(payload(c)).find("spare normal") != std::string::npos);
  c = sample();
  c.history[2].step = 5;
  CHECK(error(payload(c)).find("history record 3 is for step 5") != std::string::npos);
  c = sample();
  c.tensors[0].shape = {2, 2};  // 6 values, shape of 4
  CHECK(error(payload(c)).find("has 6 values but shape") != std::string::npos);
  c = sample();
  c.tensors[0].shape = {1, 1, 1, 1, 1, 1, 1, 1, 6};
  CHECK(error(payload(c)).find("rank 9") != std::string::npos);

  // A tensor claiming 2^60 values in a few bytes: refused by its size, not by an allocation.
  std::string huge = good;
  const std::size_t name_at = huge.find("master/fc.weight");
  const std::size_t count_at = name_at + 16 + 4 + 16;  // name, rank, dims
  for (int k = 0; k < 8; ++k) huge[count_at + k] = k == 7 ? 0x10 : 0;
  CHECK(error(huge).find("has 1152921504606846976 values") != std::string::npos);
  // A string length larger than what is left.
  std::string longname = good;
  longname[0] = '\xff';
  longname[1] = '\xff';
  longname[2] = '\xff';
  CHECK(error(longname).find("truncated") != std::string::npos);
  // A flag byte that is neither 0 nor 1.
  c = sample();
  std::string flag = payload(c);
  flag[flag.size() - 1] = 2;
  CHECK(error(flag).find("a flag is 0 or 1") != std::string::npos);
}

TEST_CASE("Rng state round trip, a pending spare normal included") {
  Rng a(2024);
  (void)a.normal();  // leaves the pair's second normal pending
  const Rng::State s = a.state();
  CHECK(s.has_spare);
  Rng b(1);
  b.set_state(s);
  for (int i = 0; i < 5; ++i) {
    CHECK(a.normal() == b.normal());
    CHECK(a.next_u64() == b.next_u64());
  }
  (void)a.normal();
  (void)a.normal();  // the spare consumed: none pending
  CHECK_FALSE(a.state().has_spare);
  CHECK(a.state().spare == 0.0);
  b.set_state(a.state());
  CHECK(a.uniform() == b.uniform());
  CHECK_THROWS_AS(b.set_state({1, true, std::nan("")}), std::invalid_argument);
  CHECK_THROWS_AS(b.set_state({1, false, 0.5}), std::invalid_argument);
}

TEST_CASE("SGD momentum and AdamW state are restored, checked") {
  Parameter p = make_parameter("w", MatrixF::Constant(2, 3, 0.5f), DType::f32);
  Parameter q = make_parameter("w", MatrixF::Constant(2, 3, 0.5f), DType::f32);
  SgdOptions so;
  so.lr = 0.1;
  so.momentum = 0.9;
  SGD a({&p}, so), b({&q}, so);
  p.grad.f32().setConstant(0.25f);
  a.step();
  b.set_momentum_buffers(a.momentum_buffers());
  q.master.assign(p.master.f32_data(), p.master.numel());
  p.grad.f32().setConstant(-0.125f);
  q.grad.f32().setConstant(-0.125f);
  a.step();
  b.step();
  CHECK(p.master.to_matrix() == q.master.to_matrix());
  CHECK_THROWS_AS(b.set_momentum_buffers({MatrixF::Zero(1, 5)}), std::invalid_argument);
  CHECK_THROWS_AS(SGD({&q}, SgdOptions{}).set_momentum_buffers({MatrixF::Zero(1, 6)}), std::invalid_argument);

  AdamW x({&p}), y({&q});
  x.step();
  x.step();
  y.set_state(x.step_count(), {x.exp_avg(0)}, {x.exp_avg_sq(0)});
  q.master.assign(p.master.f32_data(), p.master.numel());
  x.step();
  y.step();
  CHECK(y.step_count() == 3);
  CHECK(p.master.to_matrix() == q.master.to_matrix());
  CHECK_THROWS_AS(y.set_state(-1, {x.exp_avg(0)}, {x.exp_avg_sq(0)}), std::invalid_argument);
  CHECK_THROWS_AS(y.set_state(1, {x.exp_avg(0)}, {-x.exp_avg_sq(0).cwiseAbs() - MatrixF::Ones(2, 3)}),
                  std::invalid_argument);
  CHECK_THROWS_AS(y.set_state(1, {MatrixF::Zero(1, 2)}, {x.exp_avg_sq(0)}), std::invalid_argument);
  CHECK(y.step_count() == 3);  // unchanged by the refused calls
}

TEST_CASE("Batches continue from their epoch and position") {
  BlobsOptions o;
  o.samples = 100;
  const Dataset d = make_blobs(o);
  Batches a(d, 16, 9), b(d, 16, 9);
  for (int i = 0; i < 9; ++i) (void)a.next();  // into the second epoch
  b.restore(a.epoch(), a.position());
  for (int i = 0; i < 10; ++i) CHECK(a.next().x == b.next().x);
  CHECK_THROWS_AS(b.restore(1, 17), std::invalid_argument);
  CHECK_THROWS_AS(b.restore(0, 16), std::invalid_argument);
  CHECK_THROWS_AS(b.restore(1, 112), std::invalid_argument);
}

TEST_CASE("save_checkpoint keeps the newest two; list_checkpoints ignores temporaries") {
  const std::string dir = temp_dir();
  Checkpoint c = sample();
  for (const std::int64_t s : {1, 2, 3}) {
    c.step = s;
    c.history.resize(static_cast<std::size_t>(s));
    for (std::int64_t i = 0; i < s; ++i) c.history[static_cast<std::size_t>(i)] = {i + 1, 1.0f, 2.0f, false};
    save_checkpoint(dir, c);
  }
  std::ofstream(dir + "/ckpt-000000009.mpt.tmp") << "partial";
  std::ofstream(dir + "/notes.txt") << "x";
  const auto all = list_checkpoints(dir);
  REQUIRE(all.size() == 2);
  CHECK(all[0].first == 2);
  CHECK(all[1].first == 3);
  CHECK(read_checkpoint_file(all[1].second).step == 3);
  std::ofstream(all[1].second, std::ios::trunc) << "MPTCKPT";
  try {
    (void)read_checkpoint_file(all[1].second);
    FAIL("a truncated file was read");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).rfind("checkpoint " + all[1].second + ": too short", 0) == 0);
  }
  CHECK_THROWS_AS(list_checkpoints(dir + "/missing"), std::invalid_argument);
  for (const char* f :
       {"/ckpt-000000002.mpt", "/ckpt-000000003.mpt", "/ckpt-000000009.mpt.tmp", "/notes.txt"})
    std::remove((dir + f).c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("a folder or FIFO named like a checkpoint: refused before a run, never listed or removed") {
  const std::string dir = temp_dir();
  Checkpoint c = sample();
  c.step = 1;
  c.history = {{1, 1.0f, 2.0f, false}};  // the history the saves below continue
  save_checkpoint(dir, c);
  CHECK_NOTHROW(check_checkpoint_directory(dir));
  const std::string folder = dir + "/ckpt-000000000.mpt", fifo = dir + "/ckpt-000000004.mpt",
                    tmp = dir + "/ckpt-000000005.mpt.tmp";
  REQUIRE(::mkdir(folder.c_str(), 0755) == 0);
  CHECK_THROWS_WITH_AS(check_checkpoint_directory(dir),
                       ("'" + folder +
                        "' is a directory, not a checkpoint file; move it away or give another checkpoint "
                        "directory")
                           .c_str(),
                       std::invalid_argument);
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  REQUIRE(::mkfifo(tmp.c_str(), 0644) == 0);
  // Listed are the regular files only: --resume never opens the FIFO, and the
  // newest-two rule (three saves more) removes neither the folder nor the FIFO.
  const auto all = list_checkpoints(dir);
  CHECK(all.size() == 1);
  CHECK(all.front().first == 1);
  for (const std::int64_t s : {7, 8, 9}) {
    c.step = s;
    c.history.resize(static_cast<std::size_t>(s));
    for (std::int64_t i = 0; i < s; ++i) c.history[static_cast<std::size_t>(i)] = {i + 1, 1.0f, 2.0f, false};
    save_checkpoint(dir, c);
  }
  CHECK(list_checkpoints(dir).size() == 2);
  struct stat st {};
  CHECK((::lstat(folder.c_str(), &st) == 0 && S_ISDIR(st.st_mode)));
  CHECK((::lstat(fifo.c_str(), &st) == 0 && S_ISFIFO(st.st_mode)));
  ::rmdir(folder.c_str());
  CHECK_THROWS_WITH_AS(check_checkpoint_directory(dir), doctest::Contains("is a FIFO (named pipe)"),
                       std::invalid_argument);
  std::remove(fifo.c_str());
  CHECK_THROWS_WITH_AS(check_checkpoint_directory(dir),
                       doctest::Contains("is a FIFO (named pipe), not a checkpoint's temporary file"),
                       std::invalid_argument);
  std::remove(tmp.c_str());
  CHECK_NOTHROW(check_checkpoint_directory(dir));
  for (const char* f : {"/ckpt-000000008.mpt", "/ckpt-000000009.mpt"}) {
    CHECK(exists(dir + f));
    std::remove((dir + f).c_str());
  }
  ::rmdir(dir.c_str());
}

namespace {

// Run `seed`'s checkpoint at `step`: sample()'s configuration with that
// seed, and a history whose losses depend on the seed (and, from step
// `diverge` on, differ once more: another history of the same configuration).
Checkpoint of_run_at(std::uint64_t seed, std::int64_t step, std::int64_t diverge = 0) {
  Checkpoint c = sample();
  c.config.seed = seed;
  c.step = step;
  c.history.clear();
  for (std::int64_t i = 1; i <= step; ++i) {
    const float loss = static_cast<float>(seed) + 0.25f * static_cast<float>(i) +
                       (diverge != 0 && i >= diverge ? 0.125f : 0.0f);
    c.history.push_back({i, loss, 1024.0f, false});
  }
  return c;
}

}  // namespace

TEST_CASE("one directory, one run: the newest-two rule deletes only the writing run's checkpoints") {
  const std::string dir = temp_dir();
  const auto steps_in = [&dir] {
    std::vector<std::int64_t> s;
    for (const auto& [step, path] : list_checkpoints(dir)) s.push_back(step);
    return s;
  };
  for (const std::int64_t s : {1, 2, 3}) save_checkpoint(dir, of_run_at(1, s));
  CHECK(steps_in() == std::vector<std::int64_t>{2, 3});
  // A file named like a checkpoint that does not parse: nobody's, never removed.
  std::ofstream(dir + "/ckpt-000000000.mpt") << "not a checkpoint";
  // Another seed (another configuration) writes on: run 1's files stay.
  for (const std::int64_t s : {4, 5, 6}) save_checkpoint(dir, of_run_at(2, s));
  CHECK(steps_in() == std::vector<std::int64_t>{0, 2, 3, 5, 6});
  // The same configuration with another history (it differs from step 2
  // on) is another run too.
  const std::string other = dir + "/other";
  REQUIRE(::mkdir(other.c_str(), 0755) == 0);
  for (const std::int64_t s : {1, 2}) save_checkpoint(other, of_run_at(1, s));
  for (const std::int64_t s : {3, 4, 5}) save_checkpoint(other, of_run_at(1, s, 2));
  std::vector<std::int64_t> in_other;
  for (const auto& [step, path] : list_checkpoints(other)) in_other.push_back(step);
  // Step 1 is where both histories agree: the diverging run's as much as
  // the first's, so its newest-two rule took it; step 2 is the first run's.
  CHECK(in_other == std::vector<std::int64_t>{2, 4, 5});
  // A resumed run continues its history: its older files are its own.
  save_checkpoint(dir, of_run_at(1, 7));
  CHECK(steps_in() == std::vector<std::int64_t>{0, 3, 5, 6, 7});
  for (const auto& [step, path] : list_checkpoints(other)) std::remove(path.c_str());
  ::rmdir(other.c_str());
  for (const auto& [step, path] : list_checkpoints(dir)) std::remove(path.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("other_runs_checkpoint names the first checkpoint of another run and what differs") {
  const std::string dir = temp_dir();
  const Checkpoint mine = of_run_at(1, 4);
  CHECK(other_runs_checkpoint(dir, mine.config, {}).empty());
  save_checkpoint(dir, of_run_at(1, 2));
  // A fresh run (no history yet) and a run resumed further on: both this run.
  CHECK(other_runs_checkpoint(dir, mine.config, {}).empty());
  CHECK(other_runs_checkpoint(dir, mine.config, mine.history).empty());
  CHECK(other_runs_checkpoint(dir, mine.config, of_run_at(1, 1).history).empty());
  // Another seed, another lr: named with the field.
  CHECK(other_runs_checkpoint(dir, of_run_at(2, 4).config, {}) ==
        dir + "/ckpt-000000002.mpt (seed 1, where this run has seed 2)");
  Checkpoint faster = of_run_at(1, 4);
  faster.config.lr = 0.5;
  CHECK(other_runs_checkpoint(dir, faster.config, {}) ==
        dir + "/ckpt-000000002.mpt (lr 0.0375, where this run has lr 0.5)");
  // steps and every are not part of what makes a run.
  Checkpoint longer = of_run_at(1, 4);
  longer.config.steps = 400;
  longer.config.every = 1;
  CHECK(other_runs_checkpoint(dir, longer.config, {}).empty());
  CHECK(same_run_configuration(longer.config, mine.config));
  // The same configuration with a history that differs at step 2.
  CHECK(
      other_runs_checkpoint(dir, mine.config, of_run_at(1, 3, 2).history) ==
      dir +
          "/ckpt-000000002.mpt (the same configuration, but its history differs from this run's at step 2)");
  CHECK_FALSE(is_of_run(of_run_at(1, 2), mine.config, of_run_at(1, 3, 2).history));
  CHECK(is_of_run(of_run_at(1, 2), mine.config, mine.history));
  CHECK_THROWS_AS((void)other_runs_checkpoint(dir + "/missing", mine.config, {}), std::invalid_argument);
  for (const auto& [step, path] : list_checkpoints(dir)) std::remove(path.c_str());
  ::rmdir(dir.c_str());
}
