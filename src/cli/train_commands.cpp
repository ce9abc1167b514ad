// Chapters 05 onwards — `mpt train` (Chapter 4's command, data-parallel since
// Chapter 5, hence the tag): train any chapter's model with any
// policy and scaler, with progress, atomic checkpoints and bit-exact resume.
// Depends on: command.hpp (registry), cli_support.hpp, CLI11, nlohmann_json,
// the mpt library's train tier (run.hpp, checkpoint.hpp, test_hooks.hpp),
// nn/data/data.hpp (DataFileMissing), formats/explain.hpp (shortest_decimal),
// io/atomic_file.hpp (file_kind), io/directory_lock.hpp (one writer per
// checkpoint directory); POSIX (isatty, access, mkdir, mkstemp,
// popen) and gnuplot for --plot.
//
// Everything is read and checked before the first byte of output: the
// numbers, the combinations of options, the configuration (the library's
// resolve_config), the test hook's variable, the plot's directory, path
// and gnuplot, the checkpoint directory (a directory, no folder or FIFO
// under a checkpoint's name: the atomic write's rules, which refuse
// rather than replace them), and on --resume the checkpoint itself
// (parsed, and checked against this run's configuration), and that the
// checkpoint directory holds no other run's checkpoint. Before the first
// step the directory's lock is taken (a second run on it is refused, exit
// 2, nothing written) and that check repeated under it. Progress goes to stdout (a line
// rewritten in place on a terminal, plain lines otherwise); with --json
// stdout is one JSON document and progress goes to stderr, on a terminal only.
//
// Chapter 5: with --data-parallel the same command runs on every rank of
// `mpiexec -n N mpt train ...` (the MPI backend, mpt::dist_mpi): each rank
// takes its B/N rows of every batch, gradients are averaged by DDP, and
// only rank 0 prints, takes the checkpoint directory's lock (the ranks are
// one run; each learns rank 0's verdict) and writes checkpoints (which every
// rank helps to gather). A rank that fails after the start ends the whole job.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "command.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/dist/communicator.hpp"
#include "mpt/formats/explain.hpp"
#include "mpt/io/atomic_file.hpp"
#include "mpt/io/directory_lock.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/train/checkpoint.hpp"
#include "mpt/train/run.hpp"
#include "mpt/train/test_hooks.hpp"
#if MPT_HAVE_MPI
#include "mpt/dist/mpi_communicator.hpp"
#endif

namespace {

using mpt::cli::invalid_argument_is_usage_error;
using mpt::cli::UsageError;
namespace tr = mpt::train;

constexpr long long kMaxSteps = 1000000000;

struct TrainArgs {
  std::string model, data, policy, scaler, optimizer, lr, steps, seed, checkpoint, every, resume_from, plot;
  std::string bucket_mb, comm_dtype;
  bool resume = false, json = false, data_parallel = false, shard_optimizer = false, sync_bn = false;
};

// What a validated command line is.
struct Plan {
  tr::RunConfig config;
  std::string checkpoint_dir;  // "" : no checkpoints
  std::string plot;            // "" : no plot
  std::string resume_path;     // "" : a fresh run
  bool resume_newest = false;  // --resume: resume_path was the newest checkpoint in checkpoint_dir
  tr::Checkpoint resume;       // the parsed checkpoint, when resume_path is set
  tr::KillPoint kill;
  bool json = false;
  bool data_parallel = false, shard_optimizer = false, sync_bn = false;
  double bucket_mb = 25;
  mpt::DType comm_dtype = mpt::DType::f32;
};

std::string directory_of(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The refusal of a run whose checkpoint directory holds a checkpoint of
// another run (checkpoint.hpp: one directory, one run), or "".
std::string other_run_refusal(const Plan& p) {
  const std::vector<tr::StepRecord> fresh;
  const std::string other = invalid_argument_is_usage_error([&] {
    return tr::other_runs_checkpoint(p.checkpoint_dir, p.config,
                                     p.resume_path.empty() ? fresh : p.resume.history);
  });
  if (other.empty()) return "";
  return "--checkpoint: '" + p.checkpoint_dir + "' holds a checkpoint of another run, " + other +
         "; a directory holds one run's checkpoints: continue that run (its options and --resume), or give "
         "another directory";
}

bool gnuplot_on_path() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path == nullptr ? "" : path);
  std::string dir;
  while (std::getline(dirs, dir, ':'))
    if (!dir.empty() && ::access((dir + "/gnuplot").c_str(), X_OK) == 0) return true;
  return false;
}

Plan plan_of(const TrainArgs& a) {
  Plan p;
  tr::RunConfig& c = p.config;
  if (a.model.empty()) throw UsageError("missing --model; give mlp, cnn or transformer");
  if (a.policy.empty())
    throw UsageError("missing --policy; give a policy such as f32, f16, bf16 or f16+keep-f32:layer_norm");
  if (a.steps.empty())
    throw UsageError("missing --steps; give the number of steps to train, e.g. --steps 200");
  c.model = a.model;
  c.data = a.data;
  c.policy = a.policy;
  c.scaler = a.scaler;
  c.optimizer = a.optimizer;
  c.steps = mpt::cli::whole_option("--steps", a.steps, 1, kMaxSteps);
  if (!a.lr.empty()) {
    double lr = 0;
    if (!mpt::cli::parse_number(a.lr, lr)) throw UsageError("--lr: " + mpt::cli::not_a_number(a.lr));
    if (!std::isfinite(lr) || lr <= 0) throw UsageError("--lr: '" + a.lr + "' is not a finite number > 0");
    c.lr = lr;
  }
  if (!a.seed.empty()) {
    errno = 0;
    char* end = nullptr;
    const unsigned long long s = std::strtoull(a.seed.c_str(), &end, 10);
    if (a.seed[0] < '0' || a.seed[0] > '9' || errno == ERANGE || end != a.seed.c_str() + a.seed.size())
      throw UsageError("--seed: '" + a.seed + "' is not an unsigned integer (0 to 18446744073709551615)");
    c.seed = s;
  }
  if (!a.every.empty()) {
    if (a.checkpoint.empty())
      throw UsageError("--every needs --checkpoint DIR: where to write the checkpoints");
    c.every = mpt::cli::whole_option("--every", a.every, 1, kMaxSteps);
  }
  if (a.resume && !a.resume_from.empty())
    throw UsageError(
        "--resume and --resume-from cannot be combined; --resume takes the newest checkpoint in --checkpoint "
        "DIR, --resume-from PATH a specific one");
  if (a.resume && a.checkpoint.empty())
    throw UsageError(
        "--resume needs --checkpoint DIR: the directory whose newest checkpoint to continue from");
  if (!a.data_parallel) {
    if (a.shard_optimizer) throw UsageError("--shard-optimizer needs --data-parallel (under mpiexec -n N)");
    if (!a.bucket_mb.empty()) throw UsageError("--bucket-mb needs --data-parallel (under mpiexec -n N)");
    if (!a.comm_dtype.empty()) throw UsageError("--comm-dtype needs --data-parallel (under mpiexec -n N)");
    if (a.sync_bn) throw UsageError("--sync-bn needs --data-parallel (under mpiexec -n N)");
  }
  if (a.sync_bn && (a.model == "mlp" || a.model == "transformer"))
    throw UsageError("--sync-bn: the " + a.model +
                     " model has no BatchNorm to synchronise; --sync-bn is for --model cnn");
  p.data_parallel = a.data_parallel;
  p.shard_optimizer = a.shard_optimizer;
  p.sync_bn = a.sync_bn;
  if (!a.bucket_mb.empty()) {
    double mb = 0;
    if (!mpt::cli::parse_number(a.bucket_mb, mb))
      throw UsageError("--bucket-mb: " + mpt::cli::not_a_number(a.bucket_mb));
    if (!std::isfinite(mb) || mb <= 0)
      throw UsageError("--bucket-mb: '" + a.bucket_mb + "' is not a finite number of MiB > 0");
    p.bucket_mb = mb;
  }
  if (!a.comm_dtype.empty()) {
    if (a.comm_dtype != "f32" && a.comm_dtype != "f16" && a.comm_dtype != "bf16")
      throw UsageError("--comm-dtype: '" + a.comm_dtype + "' is not one of f32, f16, bf16");
    p.comm_dtype = mpt::dtype_named(a.comm_dtype);
  }
#if !MPT_HAVE_MPI
  if (a.data_parallel)
    throw UsageError(
        "--data-parallel needs the MPI backend, and this mpt was built without MPI (Debian: apt-get install "
        "openmpi-bin libopenmpi-dev, then rebuild)");
#endif
  c = invalid_argument_is_usage_error([&] { return tr::resolve_config(c); });
  p.kill = invalid_argument_is_usage_error([] { return tr::kill_point_from_environment(); });
  p.json = a.json;
  if (!a.checkpoint.empty()) {
    p.checkpoint_dir = a.checkpoint;
    const std::string kind = mpt::file_kind(a.checkpoint);
    if (!kind.empty() && kind != "a directory")
      throw UsageError("--checkpoint: '" + a.checkpoint + "' is " + kind +
                       "; give a directory (an existing one, or a new name in an existing directory)");
    if (kind.empty() && !is_directory(directory_of(a.checkpoint)))
      throw UsageError("--checkpoint: neither '" + a.checkpoint + "' nor its parent directory exists");
    if (!kind.empty()) {
      try {
        tr::check_checkpoint_directory(a.checkpoint);
      } catch (const std::invalid_argument& e) {
        throw UsageError(std::string("--checkpoint: ") + e.what());
      }
    }
  }
  if (!a.plot.empty()) {
    if (!is_directory(directory_of(a.plot)))
      throw UsageError("--plot: the directory '" + directory_of(a.plot) + "' of '" + a.plot +
                       "' does not exist");
    mpt::cli::check_output_path("--plot", a.plot);  // not a directory, device or FIFO: before gnuplot
    if (!gnuplot_on_path())
      throw UsageError(
          "--plot needs gnuplot, which is not on PATH; install it (Debian: apt-get install gnuplot-nox) or "
          "drop "
          "--plot");
    p.plot = a.plot;
  }
  if (a.resume) {
    const auto all = invalid_argument_is_usage_error([&] { return tr::list_checkpoints(a.checkpoint); });
    if (all.empty())
      throw UsageError("no checkpoint in '" + a.checkpoint +
                       "' to resume from; start the run without --resume "
                       "(--checkpoint " +
                       a.checkpoint + " --every K writes them)");
    p.resume_path = all.back().second;
    p.resume_newest = true;
  } else if (!a.resume_from.empty()) {
    p.resume_path = a.resume_from;
  }
  if (!p.resume_path.empty()) {
    const std::string path = p.resume_path;
    const std::string other = a.resume ? "; --resume-from PATH picks a specific (older) checkpoint" : "";
    try {
      p.resume = tr::read_checkpoint_file(path);
      tr::check_resumable(c, p.resume.config);
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      throw UsageError((what.rfind("checkpoint ", 0) == 0 ? what : "checkpoint " + path + ": " + what) +
                       (what.find("--resume-from") == std::string::npos ? other : ""));
    }
    if (p.resume.step > c.steps)
      throw UsageError("checkpoint " + path + " is at step " + std::to_string(p.resume.step) +
                       ", past --steps " + std::to_string(c.steps) + "; give --steps " +
                       std::to_string(p.resume.step) + " or more");
  }
  // One directory, one run: no other run holds it (read from the kernel's
  // table of locks, writing nothing) and none left its checkpoints there;
  // checked here, before anything runs, and again under the directory's
  // lock (lock_checkpoint_directory).
  if (!p.checkpoint_dir.empty() && is_directory(p.checkpoint_dir)) {
    if (const std::string busy = mpt::DirectoryLock::holder(p.checkpoint_dir); !busy.empty())
      throw UsageError("--checkpoint: " + busy);
    const std::string refusal = other_run_refusal(p);
    if (!refusal.empty()) throw UsageError(refusal);
  }
  return p;
}

// --- output --------------------------------------------------------------------

std::string scale_text(float s) { return mpt::shortest_decimal(s); }

std::string loss_text(float v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4f", static_cast<double>(v));
  return b;
}

std::string progress_line(const tr::StepRecord& r, std::int64_t steps, std::int64_t skipped, double rate) {
  char b[200];
  const double eta = rate > 0 ? static_cast<double>(steps - r.step) / rate : 0.0;
  std::snprintf(b, sizeof b, "step %lld/%lld  loss %s  scale %s  skipped %lld  %.1f steps/s  eta %.0fs",
                static_cast<long long>(r.step), static_cast<long long>(steps), loss_text(r.loss).c_str(),
                scale_text(r.scale).c_str(), static_cast<long long>(skipped), rate, eta);
  return b;
}

nlohmann::ordered_json config_json(const tr::RunConfig& c) {
  nlohmann::ordered_json j;
  j["model"] = c.model;
  j["data"] = c.data;
  j["policy"] = c.policy;
  j["scaler"] = c.scaler;
  j["optimizer"] = c.optimizer;
  j["lr"] = c.lr;
  j["seed"] = c.seed.value_or(0);
  j["steps"] = c.steps;
  j["every"] = c.every;
  return j;
}

std::string hex64(std::uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// gnuplot draws into a scratch file of its own, made new by mkstemp beside
// the target (so gnuplot never writes through a link or into a FIFO left at
// a fixed name) and removed afterwards; the bytes are then written into
// place atomically (write_atomically: the target's kind checked again,
// fsync, rename, fsync of the directory).
void draw_plot(const std::string& path, const std::vector<tr::StepRecord>& history, const tr::RunConfig& c) {
  if (path.find('\'') != std::string::npos) throw UsageError("--plot: the path may not contain a quote");
  std::string tmp = path + ".gnuplot-XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0)
    throw UsageError("--plot: cannot create a scratch file beside '" + path + "': " + std::strerror(errno));
  ::close(fd);
  std::string script =
      "set terminal svg size 900,500 background rgb 'white'\n"
      "set output '" +
      tmp +
      "'\n"
      "set title 'mpt train: " +
      c.model + " on " + c.data + ", policy " + c.policy + ", scaler " + c.scaler +
      "' noenhanced\n"
      "set xlabel 'step'\nset ylabel 'training loss'\nset y2label 'loss scale (log)'\n"
      "set logscale y2\nset ytics nomirror\nset y2tics\nset grid\nset key top right\n"
      "$run << EOD\n";
  for (const tr::StepRecord& r : history) {
    char line[96];
    std::snprintf(line, sizeof line, "%lld %.9g %.9g\n", static_cast<long long>(r.step),
                  std::isfinite(r.loss) ? static_cast<double>(r.loss) : NAN,
                  r.scale > 0 ? static_cast<double>(r.scale) : NAN);
    script += line;
  }
  script +=
      "EOD\n"
      "plot $run using 1:2 with lines lw 1.5 title 'training loss' axes x1y1, "
      "$run using 1:3 with steps lw 1.5 title 'loss scale' axes x1y2\n"
      "unset output\n";
  FILE* g = ::popen("gnuplot 2>/dev/null", "w");
  if (g == nullptr) {
    std::remove(tmp.c_str());
    throw UsageError("--plot: cannot start gnuplot");
  }
  std::fwrite(script.data(), 1, script.size(), g);
  const int status = ::pclose(g);
  std::ifstream in(tmp, std::ios::binary);
  std::stringstream svg;
  svg << in.rdbuf();
  std::remove(tmp.c_str());
  if (status != 0 || svg.str().empty())
    throw std::runtime_error("gnuplot failed to draw " + path + " (status " + std::to_string(status) + ")");
  mpt::cli::write_atomically(path, svg.str());
}

// The ranks of a --data-parallel run (MPI starts here, once); nullptr for
// a one-process run.
mpt::dist::Communicator* world_of(const Plan& p) {
#if MPT_HAVE_MPI
  if (!p.data_parallel) return nullptr;
  static mpt::dist::MpiCommunicator comm;
  return &comm;
#else
  (void)p;
  return nullptr;
#endif
}

int train_run(Plan& p, mpt::dist::Communicator* world);

// Create the checkpoint directory where it is missing, take its lock into
// `lock`, and check again, now that no other run can write there, that it
// holds no other run's checkpoint and (--resume) that its newest checkpoint
// is the one read. Returns the refusal ("" when the run may go on).
std::string lock_checkpoint_directory(const Plan& p, mpt::DirectoryLock& lock) {
  const std::string& dir = p.checkpoint_dir;
  if (!is_directory(dir) && ::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return "--checkpoint: cannot create '" + dir + "': " + std::strerror(errno) +
           "; give a directory (an existing one, or a new name in an existing directory)";
  try {
    lock = mpt::DirectoryLock::acquire(dir);
  } catch (const mpt::DirectoryBusy& e) {
    return std::string("--checkpoint: ") + e.what();
  } catch (const std::invalid_argument& e) {
    return std::string("--checkpoint: ") + e.what();
  }
  try {
    if (p.resume_newest) {
      const auto all = tr::list_checkpoints(dir);
      if (all.empty() || all.back().second != p.resume_path)
        return "--checkpoint: the newest checkpoint in '" + dir +
               "' changed while this run started (it was " + p.resume_path + "); run the command again";
    }
    return other_run_refusal(p);
  } catch (const UsageError& e) {
    return e.what();
  }
}

int cmd_train(const TrainArgs& a) {
  Plan p = plan_of(a);  // every input checked; nothing written yet
  mpt::dist::Communicator* world = world_of(p);
  if (world != nullptr) {
    if (const char* only = std::getenv("MPT_TRAIN_KILL_RANK");
        only != nullptr && std::to_string(world->rank()) != only)
      p.kill = tr::KillPoint{};
  }
  if (world == nullptr || world->size() == 1) return train_run(p, world);
  try {
    return train_run(p, world);
  } catch (const UsageError&) {
    throw;  // the same on every rank: each exits 2
  } catch (const std::exception& e) {
    // One rank cannot go on: end every rank now, so none waits for it.
    std::cerr << "mpt: rank " << world->rank() << " of " << world->size()
              << ": error: " << mpt::cli::one_line(e.what()) << "\n";
#if MPT_HAVE_MPI
    mpt::dist::MpiCommunicator::abort_job(1);
#else
    return 1;
#endif
  }
}

int train_run(Plan& p, mpt::dist::Communicator* world) {
  const bool lead = world == nullptr || world->rank() == 0;
  tr::DataParallel dp;
  dp.comm = world;
  dp.shard_optimizer = p.shard_optimizer;
  dp.bucket_mb = p.bucket_mb;
  dp.comm_dtype = p.comm_dtype;
  dp.sync_bn = p.sync_bn;
  tr::TrainRun run = [&] {
    try {
      return invalid_argument_is_usage_error([&] { return tr::TrainRun(p.config, dp); });
    } catch (const mpt::DataFileMissing& e) {
      throw UsageError(mpt::cli::one_line(e.what()));
    }
  }();
  // Chapter 6: a policy can refuse an op only when the op runs (a banned op,
  // a matrix product of mixed dtypes where autocast is off). One step of a
  // throwaway run of this configuration, in this process alone, finds it
  // before anything is written: a usage error (exit 2), not a failure at step 1.
  try {
    tr::RunConfig probe = p.config;
    probe.every = 0;
    tr::TrainRun first(probe);
    (void)first.step();
  } catch (const std::invalid_argument& e) {
    throw UsageError("--policy " + p.config.policy +
                     ": the first step is refused: " + mpt::cli::one_line(e.what()));
  }
  if (!p.resume_path.empty()) {
    try {
      run.restore(p.resume);
    } catch (const std::invalid_argument& e) {
      throw UsageError("checkpoint " + p.resume_path + ": " + e.what());
    }
  }
  // The checkpoint directory's one writer: the lead takes its lock before
  // the first step and holds it to the end (released by the kernel however
  // the process ends); every rank learns the verdict.
  mpt::DirectoryLock lock;
  if (!p.checkpoint_dir.empty()) {
    std::string refusal = lead ? lock_checkpoint_directory(p, lock) : "";
    if (world != nullptr) {
      std::uint64_t size = refusal.size();
      world->broadcast(&size, sizeof size, 0);
      refusal.resize(size);
      if (size > 0) world->broadcast(refusal.data(), size, 0);
    }
    if (!refusal.empty()) throw UsageError(refusal);
  }

  const std::int64_t steps = p.config.steps;
  const bool tty = ::isatty(p.json ? 2 : 1) == 1;
  std::ostream& progress = p.json ? std::cerr : std::cout;
  const bool show = lead && (!p.json || tty);
  const std::int64_t interval = std::max<std::int64_t>(1, steps / 20);
  const std::int64_t first = run.steps_done();
  std::int64_t skipped = 0, written = 0;
  for (const tr::StepRecord& r : run.history()) skipped += r.skipped;
  if (lead && !p.json && first > 0)
    std::cout << "resumed from " << p.resume_path << " at step " << first << "\n";
  const auto start = std::chrono::steady_clock::now();
  const auto seconds = [&start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (std::int64_t k = first + 1; k <= steps; ++k) {
    const tr::StepRecord r = run.step();
    skipped += r.skipped;
    tr::maybe_kill_after_step(p.kill, k);
    if (!p.checkpoint_dir.empty() && ((p.config.every > 0 && k % p.config.every == 0) || k == steps)) {
      const tr::KillPoint kill = p.kill;
      const tr::Checkpoint snapshot = run.checkpoint();  // collective: every rank
      if (lead) {                                        // one writer
        try {
          tr::save_checkpoint(p.checkpoint_dir, snapshot, [&kill, k](mpt::AtomicWriteStage s) {
            tr::maybe_kill_in_checkpoint(kill, k, s);
          });
        } catch (const mpt::FileWriteError& e) {
          throw std::runtime_error(std::string("checkpoint not written: ") + e.what());
        }
      }
      if (world != nullptr) world->barrier();  // no rank runs ahead of a checkpoint being written
      ++written;
    }
    if (show && (tty || k % interval == 0 || k == steps)) {
      const double t = seconds();
      const double rate = t > 0 ? static_cast<double>(k - first) / t : 0.0;
      if (tty) progress << "\r" << progress_line(r, steps, skipped, rate) << "\x1b[K" << std::flush;
      else progress << progress_line(r, steps, skipped, rate) << "\n";
    }
  }
  if (show && tty && steps > first) progress << "\n";
  const double wall = seconds();
  const tr::RunSummary s = run.summary();
  const std::vector<std::int64_t> per_rank = run.skipped_per_rank();  // collective
  if (!lead) return 0;
  if (!p.plot.empty()) draw_plot(p.plot, run.history(), p.config);

  if (p.json) {
    nlohmann::ordered_json j;
    j["config"] = config_json(p.config);
    if (world != nullptr) {
      j["data_parallel"] = {
          {"world_size", world->size()}, {"shard_optimizer", p.shard_optimizer},
          {"bucket_mb", p.bucket_mb},    {"comm_dtype", std::string(mpt::dtype_name(p.comm_dtype))},
          {"sync_bn", p.sync_bn},        {"skipped_per_rank", per_rank}};
    }
    j["resumed_at_step"] = first;
    nlohmann::ordered_json records = nlohmann::ordered_json::array();
    for (const tr::StepRecord& r : run.history())
      records.push_back({{"step", r.step}, {"loss", r.loss}, {"scale", r.scale}, {"skipped", r.skipped}});
    j["steps"] = std::move(records);
    j["summary"] = {{"final_loss", s.final_loss},     {"metric", s.metric},
                    {"metric_value", s.metric_value}, {"skipped", s.skipped},
                    {"final_scale", s.final_scale},   {"checkpoints_written", written}};
    j["masters_checksum"] = hex64(run.masters_checksum());
    j["timing"] = {{"wall_seconds", wall},
                   {"steps_per_second", wall > 0 ? static_cast<double>(steps - first) / wall : 0.0}};
    std::cout << j.dump(1) << "\n";
    return 0;
  }
  if (world != nullptr)
    std::cout << "data parallel: " << world->size() << " rank" << (world->size() == 1 ? "" : "s")
              << (p.shard_optimizer ? ", sharded optimizer" : "") << (p.sync_bn ? ", sync BN" : "")
              << ", gradients in " << mpt::dtype_name(p.comm_dtype) << "\n";
  std::cout << "final loss " << loss_text(s.final_loss) << " (step " << steps << "), " << s.metric << " "
            << mpt::cli::outcome_text(s.metric_value) << "\n"
            << "skipped steps " << s.skipped << " of " << steps << ", final scale "
            << scale_text(s.final_scale) << "\n"
            << "checkpoints written " << written
            << (p.checkpoint_dir.empty() ? "" : " to " + p.checkpoint_dir) << "\n"
            << "masters checksum " << hex64(run.masters_checksum()) << "\n";
  char w[64];
  std::snprintf(w, sizeof w, "wall time %.2f s", wall);
  std::cout << w << "\n";
  if (!p.plot.empty()) std::cout << "plot written to " << p.plot << "\n";
  return 0;
}

// ---------------------------------------------------------------------------
// Its command line.

void add_train_commands(CLI::App& app, mpt::cli::Handlers& handlers) {
  auto a = std::make_shared<TrainArgs>();
  auto* t = app.add_subcommand(
      "train",
      "Train a chapter's model (Chapter 2's MLP, Chapter 3's CNN, Chapter 4's Transformer) with any policy "
      "and "
      "loss scaler, printing progress and a summary; checkpoints are written atomically and a run killed "
      "anywhere resumes to the same bits.");
  t->add_option("--model", a->model, "mlp (Chapter 2), cnn (Chapter 3) or transformer (Chapter 4) (required)")
      ->type_name("NAME");
  t->add_option(
       "--data", a->data,
       "synthetic (blobs) or digits for mlp, digits for cnn, text (the licence corpus) for transformer; "
       "default: the first of the model's")
      ->type_name("NAME");
  t->add_option(
       "--policy", a->policy,
       "BASE[+keep-f32:OP[,OP...]][+keep-f32-layers:PATH[,PATH...]][+PATTERN=DTYPE...]"
       "[+PATTERN=autocast-off|autocast-on...]; BASE a dtype (f32, bf16, f16) or a preset: O0-O3 (apex), "
       "mixed_float16, mixed_bfloat16 (Keras), autocast:cuda[:f16|bf16], autocast:cpu[:bf16|f16], "
       "jmp:POLICY, fp8:delayed|current|mx-floor|mx-rceil (Linear GEMMs in FP8, Transformer Engine's "
       "recipes; fp8:delayed:margin=M,history=H,algo=max|most_recent and fp8:current:margin=M set their "
       "options); PATTERN a "
       "layer path with * and ** that must select a layer of the model (the last rule "
       "that covers a layer wins); e.g. f16+keep-f32:layer_norm, f16+block*.mlp=f32, O1 (required; "
       "`mpt policy show P` explains one)")
      ->type_name("P");
  t->add_option(
       "--scaler", a->scaler,
       "dynamic (a GradScaler, PyTorch's defaults), static:S (a constant scale S > 0, never skips) or "
       "none (required, unless the policy is a preset that names one: O0-O3, mixed_float16, fp8:* (none); "
       "then it "
       "overrides the preset's)")
      ->type_name("S");
  t->add_option("--optimizer", a->optimizer,
                "sgd (momentum 0.9) or adamw (no weight decay); default sgd for mlp and cnn, adamw for "
                "transformer")
      ->type_name("NAME");
  t->add_option("--lr", a->lr, "learning rate, a finite number > 0; default 0.05 for sgd, 0.003 for adamw")
      ->type_name("X");
  t->add_option("--steps", a->steps, "steps to train in all, 1 to 1000000000 (required)")->type_name("N");
  t->add_option("--seed", a->seed,
                "seed of the initial weights (and of the Transformer's batches), 0 to 2^64-1; default the "
                "chapter's: 7 mlp, 3 cnn, 1 transformer")
      ->type_name("S");
  t->add_option("--checkpoint", a->checkpoint,
                "write checkpoints into this directory (created if its parent exists): after every K steps "
                "and after the last; the newest two of this run's are kept. One run per directory: it is "
                "locked while the run writes it (a second run is refused), and a directory holding another "
                "run's checkpoints is refused")
      ->type_name("DIR");
  t->add_option("--every", a->every, "with --checkpoint: a checkpoint every K steps, K >= 1")->type_name("K");
  t->add_flag(
      "--resume", a->resume,
      "continue from the newest complete checkpoint in --checkpoint DIR (refused if it is corrupted or "
      "made with another model, data, policy, scaler, optimizer, lr or seed)");
  t->add_option("--resume-from", a->resume_from, "continue from this checkpoint file instead")
      ->type_name("PATH");
  t->add_flag("--json", a->json,
              "stdout is one JSON document: config, steps [{step, loss, scale, skipped}] of the whole run, "
              "summary, masters_checksum, and timing (the only part that differs between equal runs)");
  t->add_option("--plot", a->plot,
                "draw the loss and the scale (log axis) against the step with gnuplot into this SVG file "
                "(written atomically; needs gnuplot, Debian package gnuplot-nox)")
      ->type_name("FILE.svg");
  t->add_flag("--data-parallel", a->data_parallel,
              "Chapter 5: run on the ranks of mpiexec -n N (OpenMPI): each rank trains on its B/N rows of "
              "every batch and DDP averages the gradients; rank 0 prints and writes the checkpoints");
  t->add_flag("--shard-optimizer", a->shard_optimizer,
              "with --data-parallel: ZeRO-1, each rank keeps and updates its shard of the optimizer state; "
              "the scaler's found-inf flag is all-reduced (ShardedGradScaler)");
  t->add_flag("--sync-bn", a->sync_bn,
              "with --data-parallel and --model cnn: SyncBatchNorm, every BatchNorm normalizes with the "
              "statistics of the whole batch across the ranks (all-gathered, merged by Chan's formula)");
  t->add_option("--bucket-mb", a->bucket_mb,
                "with --data-parallel: DDP's bucket capacity in MiB, a finite number > 0; default 25")
      ->type_name("X");
  t->add_option("--comm-dtype", a->comm_dtype,
                "with --data-parallel: the dtype gradients travel and are summed in: f32 (default), f16 or "
                "bf16 (divided by the world size first)")
      ->type_name("DTYPE");
  handlers.on(t, [a] { return cmd_train(*a); });
}

// After every Chapter 4 family.
const mpt::cli::Registration train_registered{{4, 90}, "train", add_train_commands};

}  // namespace
