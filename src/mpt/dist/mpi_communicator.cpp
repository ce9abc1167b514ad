// Chapter 05 — loss scaling across ranks: the MPI backend (see
// mpi_communicator.hpp).
// Depends on: mpi_communicator.hpp, communicator.hpp (combine); MPI.
#include "mpt/dist/mpi_communicator.hpp"

#include <mpi.h>

#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace mpt::dist {

namespace {

// --- the reductions MPI does not have: mpt::dist::combine as MPI_Ops ---------------

template <DType D, ReduceOp Op>
void mpi_combine(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  combine(inout, in, *len, D, Op);  // commutative, so inout op in = in op inout
}

using Kind = CollectiveCall::Kind;

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(std::string(call) +
                           " failed: " + std::string(text, static_cast<std::size_t>(len)));
}

int checked_count(std::int64_t count, const char* who) {
  if (count > INT_MAX)
    throw std::invalid_argument(std::string(who) + ": " + std::to_string(count) +
                                " elements; one MPI call moves at most " + std::to_string(INT_MAX));
  return static_cast<int>(count);
}

bool g_made = false;  // one MpiCommunicator per process

}  // namespace

struct MpiCommunicator::Impl {
  Options options;
  int rank = 0, size = 1;
  std::int64_t seq = 0;
  bool initialised_here = false;
  MPI_Op f16_sum{}, f16_max{}, bf16_sum{}, bf16_max{}, f32_max{};

  // Wait for r, polling, until the deadline; then throw naming the call.
  void wait(MPI_Request& r, const CollectiveCall& f, const char* phase) const {
    const auto start = std::chrono::steady_clock::now();
    int done = 0;
    for (;;) {
      check_mpi(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > options.timeout_seconds)
        throw std::runtime_error((*phase != '\0' ? std::string(phase) + " " : std::string()) + f.describe() +
                                 " did not complete within " +
                                 std::to_string(static_cast<int>(std::lround(options.timeout_seconds))) +
                                 " s: a rank did not make this call (it stopped, or took another branch)");
      // MPI moves a non-blocking collective on only inside MPI calls, so
      // poll without pause at first: a sleep between polls stalls every
      // round of the engine's schedule (a 12 MB all-reduce here took three
      // times the blocking call's time with 50 us naps). Yield the core
      // meanwhile, so that ranks still computing on an oversubscribed
      // machine get it; sleep only once the call is plainly waiting for a
      // rank that is elsewhere (past 20 ms).
      if (waited < 0.02) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  CollectiveCall next(Kind kind, std::int64_t tag, DType dtype, ReduceOp op, std::int64_t count, int root) {
    CollectiveCall f;
    f.seq = ++seq;
    f.tag = tag;
    f.kind = kind;
    f.dtype = dtype;
    f.op = op;
    f.count = count;
    f.root = root;
    if (options.check_calls) check(f);
    return f;
  }

  // Every rank shares the fingerprint of its next call; any difference ends
  // the call here, naming the first rank that differs.
  void check(const CollectiveCall& f) const {
    const std::array<std::int64_t, 7> mine = f.fields();
    std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(size));
    MPI_Request r{};
    check_mpi(MPI_Iallgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(),
                             static_cast<int>(mine.size()), MPI_INT64_T, MPI_COMM_WORLD, &r),
              "MPI_Iallgather");
    wait(r, f, "the check before");
    for (int q = 0; q < size; ++q) {
      const CollectiveCall other =
          CollectiveCall::from_fields(all.data() + mine.size() * static_cast<std::size_t>(q));
      if (other.fields() != mine)
        throw std::runtime_error("the ranks disagree on a collective: this rank calls " + f.describe() +
                                 ", rank " + std::to_string(q) + " calls " + other.describe());
    }
  }

  MPI_Op op_for(DType d, ReduceOp op) const {
    if (d == DType::f32) return op == ReduceOp::sum ? MPI_SUM : f32_max;
    if (d == DType::f16) return op == ReduceOp::sum ? f16_sum : f16_max;
    return op == ReduceOp::sum ? bf16_sum : bf16_max;
  }
  static MPI_Datatype type_for(DType d) { return d == DType::f32 ? MPI_FLOAT : MPI_UINT16_T; }
};

MpiCommunicator::MpiCommunicator() : MpiCommunicator(Options{}) {}

MpiCommunicator::MpiCommunicator(const Options& options) : impl_(std::make_unique<Impl>()) {
  if (!std::isfinite(options.timeout_seconds) || options.timeout_seconds <= 0)
    throw std::invalid_argument("the collective timeout must be a finite number of seconds > 0, not " +
                                std::to_string(options.timeout_seconds));
  if (g_made) throw std::logic_error("one MpiCommunicator per process: MPI_COMM_WORLD is already wrapped");
  impl_->options = options;
  int ready = 0;
  check_mpi(MPI_Initialized(&ready), "MPI_Initialized");
  if (!ready) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      throw std::runtime_error("MPI_Init_thread failed: MPI could not start (run the program under mpiexec)");
    impl_->initialised_here = true;
  }
  g_made = true;
  check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &impl_->rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &impl_->size), "MPI_Comm_size");
  check_mpi(MPI_Op_create(&mpi_combine<DType::f16, ReduceOp::sum>, 1, &impl_->f16_sum), "MPI_Op_create");
  check_mpi(MPI_Op_create(&mpi_combine<DType::f16, ReduceOp::max>, 1, &impl_->f16_max), "MPI_Op_create");
  check_mpi(MPI_Op_create(&mpi_combine<DType::bf16, ReduceOp::sum>, 1, &impl_->bf16_sum), "MPI_Op_create");
  check_mpi(MPI_Op_create(&mpi_combine<DType::bf16, ReduceOp::max>, 1, &impl_->bf16_max), "MPI_Op_create");
  check_mpi(MPI_Op_create(&mpi_combine<DType::f32, ReduceOp::max>, 1, &impl_->f32_max), "MPI_Op_create");
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Op* op : {&impl_->f16_sum, &impl_->f16_max, &impl_->bf16_sum, &impl_->bf16_max, &impl_->f32_max})
    MPI_Op_free(op);
  if (impl_->initialised_here) MPI_Finalize();
  g_made = false;
}

int MpiCommunicator::rank() const { return impl_->rank; }
int MpiCommunicator::size() const { return impl_->size; }
std::int64_t MpiCommunicator::calls() const { return impl_->seq; }
const MpiCommunicator::Options& MpiCommunicator::options() const { return impl_->options; }

namespace {
class MpiPending final : public PendingAllReduce {
 public:
  MpiPending(const MpiCommunicator::Impl* impl, MPI_Request r, CollectiveCall f)
      : impl_(impl), r_(r), f_(f) {}
  ~MpiPending() override {
    if (done_) return;
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mpt: rank %d of %d: %s\n", impl_->rank, impl_->size, e.what());
      MpiCommunicator::abort_job(1);
    }
  }
  MpiPending(const MpiPending&) = delete;
  MpiPending& operator=(const MpiPending&) = delete;
  void wait() override {
    if (done_) return;
    impl_->wait(r_, f_, "");
    done_ = true;
  }
  bool progress() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Test(&r_, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    done_ = flag != 0;
    return done_;
  }

 private:
  const MpiCommunicator::Impl* impl_;
  MPI_Request r_;
  CollectiveCall f_;
  bool done_ = false;
};
}  // namespace

std::unique_ptr<PendingAllReduce> MpiCommunicator::start_all_reduce(void* data, std::int64_t count,
                                                                    DType dtype, ReduceOp op) {
  check_buffer("all_reduce", count, dtype);
  const int n = checked_count(count, "all_reduce");
  const CollectiveCall f = impl_->next(Kind::all_reduce, tag(), dtype, op, count, 0);
  MPI_Request r{};
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, n, Impl::type_for(dtype), impl_->op_for(dtype, op),
                           MPI_COMM_WORLD, &r),
            "MPI_Iallreduce");
  return std::make_unique<MpiPending>(impl_.get(), r, f);
}

void MpiCommunicator::all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op) {
  if (!impl_->options.check_calls) {  // the deadline is the only guard against a hang
    start_all_reduce(data, count, dtype, op)->wait();
    return;
  }
  // Every rank has just agreed (within the deadline) that this is the call
  // it makes, so the blocking MPI_Allreduce cannot wait for a rank that
  // went elsewhere; a rank that dies in it ends the job (mpiexec). It is
  // Open MPI's fastest path: its non-blocking MPI_Iallreduce (libnbc) took
  // twice as long for 12 MB between two ranks here.
  check_buffer("all_reduce", count, dtype);
  const int n = checked_count(count, "all_reduce");
  (void)impl_->next(Kind::all_reduce, tag(), dtype, op, count, 0);
  check_mpi(
      MPI_Allreduce(MPI_IN_PLACE, data, n, Impl::type_for(dtype), impl_->op_for(dtype, op), MPI_COMM_WORLD),
      "MPI_Allreduce");
}

void MpiCommunicator::broadcast(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= impl_->size)
    throw std::invalid_argument("broadcast: root " + std::to_string(root) + " in a world of " +
                                std::to_string(impl_->size) + " ranks (valid: 0 to " +
                                std::to_string(impl_->size - 1) + ")");
  const int n = checked_count(static_cast<std::int64_t>(bytes), "broadcast");
  const CollectiveCall f = impl_->next(Kind::broadcast, tag(), DType::f32, ReduceOp::sum, n, root);
  MPI_Request r{};
  check_mpi(MPI_Ibcast(data, n, MPI_BYTE, root, MPI_COMM_WORLD, &r), "MPI_Ibcast");
  impl_->wait(r, f, "");
}

void MpiCommunicator::all_gather(const void* send, void* recv, std::size_t bytes) {
  const int n = checked_count(static_cast<std::int64_t>(bytes), "all_gather");
  const CollectiveCall f = impl_->next(Kind::all_gather, tag(), DType::f32, ReduceOp::sum, n, 0);
  MPI_Request r{};
  check_mpi(MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, MPI_COMM_WORLD, &r), "MPI_Iallgather");
  impl_->wait(r, f, "");
}

void MpiCommunicator::barrier() {
  const CollectiveCall f = impl_->next(Kind::barrier, tag(), DType::f32, ReduceOp::sum, 0, 0);
  MPI_Request r{};
  check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &r), "MPI_Ibarrier");
  impl_->wait(r, f, "");
}

void MpiCommunicator::abort_job(int code) {
  std::fflush(stderr);
  std::fflush(stdout);
  int ready = 0, finalized = 0;
  MPI_Initialized(&ready);
  MPI_Finalized(&finalized);
  if (ready && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

int run_rank(MpiCommunicator& comm, const std::function<int()>& body, int error_code) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpt: rank %d of %d: %s\n", comm.rank(), comm.size(), e.what());
    MpiCommunicator::abort_job(error_code);
  }
}

}  // namespace mpt::dist
