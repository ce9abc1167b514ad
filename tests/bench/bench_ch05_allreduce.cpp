// Chapter 05 — what data parallelism's communication costs on real ranks.
// Depends on: mpt/dist/ddp.hpp, mpt/dist/mpi_communicator.hpp (mpt::dist_mpi),
// mpt/nn/models/mlp.hpp, mpt/nn/layers/losses.hpp, mpt/optim/sgd.hpp, MPI (the raw
// MPI_Allreduce, the yardstick). No Google Benchmark: an MPI program that
// times with MPI_Wtime, the slowest rank's time of each repeat, the median.
//
// DDP's bucketed all-reduce against one raw MPI_Allreduce of the same bytes,
// the overlap of communication with backward, and time per step by world size.
//
// Run under mpiexec (bench_ch05_allreduce.sh runs all three parts):
//   mpiexec -n 2 bench_ch05_allreduce --part=reduce   # (1) bandwidth vs MPI_Allreduce
//   mpiexec -n 2 bench_ch05_allreduce --part=overlap  # (2) overlap on vs off
//   mpiexec -n N bench_ch05_allreduce --part=world    # (3) time per step at N ranks
// Options: --width=W --layers=L (the MLP: L hidden layers of W, 1024 and 3),
// --batch=B (the global batch of a step, split over the ranks; 64),
// --repeats=R (41), --quick (tiny sizes, 3 repeats: the CTest smoke run).
//
// (1) The roofline is one MPI_Allreduce (MPI_SUM, in place) of the model's
// gradient bytes as one f32 buffer. DDP's reduction is timed as
// finish_backward() after backward's gradient hooks have fired (called here
// without backward's arithmetic, overlap off, so that the time is the
// reduction's alone): with the gradients as views of the buckets (the
// default, gradient_as_bucket_view; the 1/N rides on backward's
// accumulate_grad, not timed here, as backward is not) each bucket
// all-reduced through MpiCommunicator (each call's fingerprint checked
// first, as `mpt train --data-parallel` runs it). The target is at least 0.8x
// the raw call's bandwidth, for both bucket sizes; the verdict says whether
// this run met it. A third row, for comparison and without a target, copies
// the gradients into the buckets and back (gradient_as_bucket_view off).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mpt/dist/ddp.hpp"
#include "mpt/dist/mpi_communicator.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/sgd.hpp"

namespace bench_ch05 {

struct Flags {
  std::string part = "reduce";
  int width = 1024, layers = 3, batch = 64, repeats = 41;
  bool quick = false;
};

[[noreturn]] void usage(const char* arg) {
  std::fprintf(stderr,
               "bench_ch05_allreduce: unknown or bad argument '%s'; valid: --part=reduce|overlap|world, "
               "--width=W, --layers=L, --batch=B, --repeats=R (integers >= 1), --quick\n",
               arg);
  std::exit(2);
}

bool int_flag(const char* arg, const char* name, int& out) {
  const std::size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0) return false;
  char* end = nullptr;
  const long v = std::strtol(arg + n, &end, 10);
  if (end == arg + n || *end != '\0' || v < 1 || v > 1000000) usage(arg);
  out = static_cast<int>(v);
  return true;
}

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strncmp(a, "--part=", 7) == 0) {
      f.part = a + 7;
      if (f.part != "reduce" && f.part != "overlap" && f.part != "world") usage(a);
    } else if (std::strcmp(a, "--quick") == 0) {
      f.quick = true;
    } else if (!int_flag(a, "--width=", f.width) && !int_flag(a, "--layers=", f.layers) &&
               !int_flag(a, "--batch=", f.batch) && !int_flag(a, "--repeats=", f.repeats)) {
      usage(a);
    }
  }
  if (f.quick) {
    f.width = 64;
    f.layers = 2;
    f.batch = 8;
    f.repeats = 3;
  }
  return f;
}

std::unique_ptr<mpt::Mlp> make_mlp(const Flags& f) {
  mpt::MlpConfig c;
  c.sizes.push_back(1024);
  for (int i = 0; i < f.layers; ++i) c.sizes.push_back(f.width);
  c.sizes.push_back(3);
  c.seed = 5;
  return std::make_unique<mpt::Mlp>(c);
}

std::string describe(const mpt::Mlp& net) {
  std::string s = "MLP";
  for (std::size_t i = 0; i < net.config().sizes.size(); ++i)
    s += (i == 0 ? " " : "-") + std::to_string(net.config().sizes[i]);
  return s;
}

std::int64_t gradient_elements(mpt::Model& net) {
  std::int64_t n = 0;
  for (const mpt::Parameter* p : net.parameters()) n += p->grad.numel();
  return n;
}

/// The slowest rank's time of `body`, every rank starting together.
template <class F>
double slowest(F&& body) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  body();
  double t = MPI_Wtime() - t0, worst = 0;
  MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

/// The median of `repeats` timings of `body` (one untimed run first).
template <class F>
double median_of(int repeats, F&& body) {
  body();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) t.push_back(slowest(body));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// A fixed batch of `rows` rows of 1024 features and labels in 0..2.
struct Batch {
  mpt::MatrixF x;
  std::vector<int> labels;
  explicit Batch(int rows) : x(rows, 1024) {
    for (int r = 0; r < rows; ++r) {
      labels.push_back(r % 3);
      for (int c = 0; c < 1024; ++c) x(r, c) = static_cast<float>(((r * 131 + c * 17) % 97) - 48) / 48.0f;
    }
  }
};

/// One data-parallel training step of this rank's rows: forward, loss,
/// backward (buckets start as gradients become ready, with overlap),
/// finish_backward, SGD, refresh of the model copies.
void step(mpt::Mlp& net, mpt::dist::DistributedDataParallel& ddp, mpt::SGD& opt, const Batch& b) {
  opt.zero_grad();
  ddp.before_forward();
  const mpt::Tensor& out = net.forward(b.x);
  (void)mpt::cross_entropy_loss(out, b.labels);
  net.backward(mpt::cross_entropy_backward(out, b.labels));
  ddp.finish_backward();
  opt.step();
  net.refresh_model_copies();
}

const char* kMachine =
    "one machine (%u cores): the ranks are processes that talk through shared memory; there is no network "
    "and no GPU here, so these figures say nothing about NCCL, InfiniBand or Ethernet";

void part_reduce(mpt::dist::MpiCommunicator& comm, const Flags& f) {
  struct Row {
    double cap;
    bool views;
    std::unique_ptr<mpt::Mlp> net;  // a model of its own: each DDP keeps its gradients in its buckets
    std::unique_ptr<mpt::dist::DistributedDataParallel> ddp;
    std::vector<double> times;
    double t = 0, x = 0;
  };
  std::vector<Row> rows;
  for (const auto& [cap, views] : {std::pair{25.0, true}, std::pair{1.0, true}, std::pair{25.0, false}}) {
    Row r{cap, views, make_mlp(f), nullptr, {}, 0, 0};
    mpt::dist::DdpOptions o;
    o.bucket_cap_mb = cap;
    o.gradient_as_bucket_view = views;
    o.overlap = false;
    r.ddp = std::make_unique<mpt::dist::DistributedDataParallel>(*r.net, comm, o);
    for (mpt::Parameter* p : r.net->parameters())
      std::fill(p->grad.f32_data(), p->grad.f32_data() + p->grad.numel(), 1e-3f);
    rows.push_back(std::move(r));
  }
  const std::int64_t n = gradient_elements(*rows[0].net);
  const double mb = static_cast<double>(n) * 4 / 1e6;
  std::vector<float> raw(static_cast<std::size_t>(n), 1e-3f);
  const auto raw_call = [&] {
    MPI_Allreduce(MPI_IN_PLACE, raw.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  const auto ddp_call = [](Row& r) {
    const std::vector<mpt::Parameter*> params = r.net->parameters();
    // What backward's accumulate_grad leaves: the gradient divided (its
    // carry used up, grad_carry 1), then the hook called.
    for (std::size_t k = params.size(); k-- > 0;) {
      params[k]->grad_carry = 1.0f;
      params[k]->grad_hook(*params[k]);
    }
    r.ddp->finish_backward();
  };
  // Interleaved: each repeat times the raw call, then every row, so that a
  // change of the machine's speed during the run reaches every row alike.
  std::vector<double> raw_times;
  raw_call();
  for (Row& r : rows) ddp_call(r);  // untimed first runs
  for (int i = 0; i < f.repeats; ++i) {
    raw_times.push_back(slowest(raw_call));
    for (Row& r : rows) r.times.push_back(slowest([&] { ddp_call(r); }));
  }
  const auto median = [](std::vector<double> t) {
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const double t_raw = median(raw_times);
  for (Row& r : rows) {
    r.t = median(r.times);
    std::vector<double> ratio;  // paired: the raw call and this row in the same repeat
    for (std::size_t i = 0; i < r.times.size(); ++i) ratio.push_back(raw_times[i] / r.times[i]);
    r.x = median(ratio);
  }
  if (comm.rank() != 0) return;
  std::printf(
      "all-reduce of a model's gradients, %d ranks, MPI: %s, %lld f32 gradients = %.2f MB; time: the median "
      "of %d repeats of the slowest rank's, the rows taking turns; GB/s: MB / time; x raw: the median of "
      "the repeats' ratios raw time / row time\n\n",
      comm.size(), describe(*rows[0].net).c_str(), static_cast<long long>(n), mb, f.repeats);
  std::printf("%-22s %7s %8s %9s %8s %6s %7s  %s\n", "run", "buckets", "MB", "ms", "GB/s", "x raw", "target",
              "verdict");
  std::printf("%-22s %7d %8.2f %9.3f %8.2f %6.2f %7s\n", "raw MPI_Allreduce", 1, mb, t_raw * 1e3,
              mb / 1e3 / t_raw, 1.0, "-");
  for (const Row& r : rows) {
    const double x = r.x;
    const std::string name =
        "ddp cap " + std::to_string(static_cast<int>(r.cap)) + " MiB, " + (r.views ? "views" : "copies");
    const char* verdict = !r.views   ? "for comparison: copies into the buckets and back"
                          : x >= 0.8 ? "meets target"
                                     : "BELOW target (the per-bucket calls and their checks cost more)";
    std::printf("%-22s %7zu %8.2f %9.3f %8.2f %6.2f %7s  %s\n", name.c_str(), r.ddp->buckets().size(), mb,
                r.t * 1e3, mb / 1e3 / r.t, x, r.views ? ">=0.8x" : "-", verdict);
  }
  std::printf("\n");
  std::printf(kMachine, std::thread::hardware_concurrency());
  std::printf("\n");
}

void part_overlap(mpt::dist::MpiCommunicator& comm, const Flags& f) {
  auto net = make_mlp(f);
  const auto [lo, hi] = mpt::dist::shard_rows(f.batch, comm.rank(), comm.size());
  const Batch b(static_cast<int>(hi - lo));
  struct Row {
    double cap;
    bool overlap;
    double t;
    mpt::dist::DdpStats stats;
    std::size_t buckets;
  };
  std::vector<Row> rows;
  for (double cap : {25.0, 1.0})
    for (bool overlap : {false, true}) {
      mpt::dist::DdpOptions o;
      o.bucket_cap_mb = cap;
      o.overlap = overlap;
      mpt::dist::DistributedDataParallel ddp(*net, comm, o);
      mpt::SGD opt(net->parameters(), mpt::SgdOptions{1e-4, 0.0});
      step(*net, ddp, opt, b);  // the first backward learns the counts: no overlap yet
      const double t = median_of(f.repeats, [&] { step(*net, ddp, opt, b); });
      rows.push_back({cap, overlap, t, ddp.stats(), ddp.buckets().size()});
    }
  if (comm.rank() != 0) return;
  std::printf(
      "one training step, %d ranks, MPI: %s, batch %d (%lld rows per rank), SGD; time: the median of %d "
      "steps of the slowest rank's\n\n",
      comm.size(), describe(*net).c_str(), f.batch, static_cast<long long>(hi - lo), f.repeats);
  std::printf("%-22s %7s %9s %18s %12s\n", "run", "overlap", "ms/step", "started in backward",
              "x no overlap");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double base = rows[i - (r.overlap ? 1 : 0)].t;
    const std::string name = "ddp bucket_cap_mb=" + std::to_string(static_cast<int>(r.cap));
    const std::string started =
        std::to_string(r.stats.buckets_started_in_backward) + " of " + std::to_string(r.buckets) + " buckets";
    std::printf("%-22s %7s %9.3f %18s %12.2f\n", name.c_str(), r.overlap ? "on" : "off", r.t * 1e3,
                started.c_str(), r.t / base);
  }
  std::printf(
      "\noverlap: MPI moves a started all-reduce on only inside MPI calls (DDP polls at every gradient "
      "hook); with fewer cores than ranks plus a progress thread, little can run at the same time\n");
}

void part_world(mpt::dist::MpiCommunicator& comm, const Flags& f) {
  auto net = make_mlp(f);
  const auto [lo, hi] = mpt::dist::shard_rows(f.batch, comm.rank(), comm.size());
  const Batch b(static_cast<int>(hi - lo));
  mpt::dist::DistributedDataParallel ddp(*net, comm, mpt::dist::DdpOptions{});
  mpt::SGD opt(net->parameters(), mpt::SgdOptions{1e-4, 0.0});
  step(*net, ddp, opt, b);
  const double t = median_of(f.repeats, [&] { step(*net, ddp, opt, b); });
  if (comm.rank() != 0) return;
  std::printf("world %d: %s, batch %d, %lld rows per rank, %zu buckets, %.3f ms/step (median of %d)\n",
              comm.size(), describe(*net).c_str(), f.batch, static_cast<long long>(hi - lo),
              ddp.buckets().size(), t * 1e3, f.repeats);
}

}  // namespace bench_ch05

int main(int argc, char** argv) {
  const bench_ch05::Flags flags = bench_ch05::parse(argc, argv);
  mpt::dist::MpiCommunicator comm;  // initialises MPI for the raw calls too
  return mpt::dist::run_rank(comm, [&] {
    if (flags.part == "reduce") bench_ch05::part_reduce(comm, flags);
    else if (flags.part == "overlap") bench_ch05::part_overlap(comm, flags);
    else bench_ch05::part_world(comm, flags);
    std::fflush(stdout);
    return 0;
  });
}
