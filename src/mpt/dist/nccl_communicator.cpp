// Chapter 05 — loss scaling across ranks: the NCCL backend (see
// nccl_communicator.hpp).
// Depends on: nccl_communicator.hpp, communicator.hpp (CollectiveCall,
// check_buffer); the CUDA runtime; nccl.h for types and enums only — every
// NCCL function is looked up with dlsym() in the library dlopen() opened.
#include "mpt/dist/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

namespace mpt::dist {

namespace nccl_communicator {

static_assert(sizeof(ncclUniqueId) == std::tuple_size<NcclUniqueId>::value,
              "NcclUniqueId must hold ncclUniqueId's bytes");

// The functions this backend calls, found by name in the opened library.
// decltype() of nccl.h's declarations gives their types; nothing is linked.
struct Api {
  std::string path;
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclGetLastError) get_last_error = nullptr;  // NCCL >= 2.13; may be missing
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
};

template <class Fn>
void find(void* handle, const std::string& path, const char* name, Fn& fn, bool required = true) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (fn == nullptr && required)
    throw std::runtime_error(path + " has no " + name + ": not an NCCL 2 library this backend can use");
}

// Opened once; a failed open is tried again by the next call.
const Api& api() {
  static std::mutex mutex;
  static Api* loaded = nullptr;  // never freed: the library stays open until exit
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded != nullptr) return *loaded;
  const char* env = std::getenv("MPT_NCCL_LIBRARY");
  const std::string path = (env != nullptr && *env != '\0') ? env : "libnccl.so.2";
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw NcclNotFound("NCCL not found: dlopen(\"" + path + "\") failed: " + (why ? why : "no reason given") +
                       " (set MPT_NCCL_LIBRARY to the path of libnccl.so.2)");
  }
  auto a = std::make_unique<Api>();
  a->path = path;
  try {
    find(handle, path, "ncclGetVersion", a->get_version);
    find(handle, path, "ncclGetErrorString", a->get_error_string);
    find(handle, path, "ncclGetLastError", a->get_last_error, false);
    find(handle, path, "ncclGetUniqueId", a->get_unique_id);
    find(handle, path, "ncclCommInitRank", a->comm_init_rank);
    find(handle, path, "ncclCommDestroy", a->comm_destroy);
    find(handle, path, "ncclCommAbort", a->comm_abort);
    find(handle, path, "ncclCommGetAsyncError", a->comm_get_async_error);
    find(handle, path, "ncclAllReduce", a->all_reduce);
    find(handle, path, "ncclBroadcast", a->broadcast);
    find(handle, path, "ncclAllGather", a->all_gather);
  } catch (...) {
    dlclose(handle);
    throw;
  }
  loaded = a.release();
  return *loaded;
}

// One line: NCCL's messages are one line, but a last-error text may end in '\n'.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

void check_nccl(ncclResult_t rc, const char* call, ncclComm_t comm = nullptr) {
  if (rc == ncclSuccess) return;
  const Api& a = api();
  std::string msg = std::string(call) + " failed: " + a.get_error_string(rc);
  if (comm != nullptr && a.get_last_error != nullptr) {
    const char* last = a.get_last_error(comm);
    if (last != nullptr && *last != '\0') msg += " (" + std::string(last) + ")";
  }
  throw std::runtime_error(one_line(msg));
}

void check_cuda(cudaError_t rc, const char* call) {
  if (rc == cudaSuccess) return;
  throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(rc));
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    default: return ncclBfloat16;  // check_buffer() has refused every other dtype
  }
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }

// The caller's device while a call runs on the communicator's, then back.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

using Kind = CollectiveCall::Kind;

}  // namespace nccl_communicator

using namespace nccl_communicator;

std::string nccl_library() { return api().path; }

std::string nccl_version() {
  int v = 0;
  check_nccl(api().get_version(&v), "ncclGetVersion");
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

NcclUniqueId nccl_unique_id() {
  ncclUniqueId id;
  check_nccl(api().get_unique_id(&id), "ncclGetUniqueId");
  NcclUniqueId out{};
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

struct NcclCommunicator::Impl {
  const Api* api = nullptr;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;  // barrier()'s one float
  int rank = 0, size = 1, device = 0;
  double timeout_seconds = 60;
  std::int64_t seq = 0;
  bool aborted = false;

  CollectiveCall next(Kind kind, std::int64_t tag, DType dtype, ReduceOp op, std::int64_t count, int root) {
    if (aborted)
      throw std::runtime_error(
          "the NCCL communicator was aborted after an earlier collective failed; make a new one");
    CollectiveCall f;
    f.seq = ++seq;
    f.tag = tag;
    f.kind = kind;
    f.dtype = dtype;
    f.op = op;
    f.count = count;
    f.root = root;
    return f;
  }

  // Wait for `event` (recorded after the call on `stream`), watching NCCL's
  // asynchronous errors and the deadline; abort the communicator on either.
  void wait(cudaEvent_t event, const CollectiveCall& f) {
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      const cudaError_t q = cudaEventQuery(event);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check_cuda(q, ("cudaEventQuery after " + f.describe()).c_str());
      ncclResult_t async = ncclSuccess;
      check_nccl(api->comm_get_async_error(comm, &async), "ncclCommGetAsyncError", comm);
      if (async != ncclSuccess && async != ncclInProgress) {
        const std::string what = one_line(f.describe() + " failed: " + api->get_error_string(async));
        abort_comm();
        throw std::runtime_error(what);
      }
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_seconds) {
        abort_comm();
        throw std::runtime_error(f.describe() + " did not complete within " +
                                 std::to_string(static_cast<int>(std::lround(timeout_seconds))) +
                                 " s: a rank did not make this call (it stopped, or took another branch); "
                                 "the NCCL communicator is aborted");
      }
      if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void abort_comm() {
    if (aborted || comm == nullptr) return;
    api->comm_abort(comm);  // frees it; nothing more to report if it fails
    comm = nullptr;
    aborted = true;
  }

  // Record an event after the queued call; the caller waits on it.
  cudaEvent_t record() const {
    cudaEvent_t event = nullptr;
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    const cudaError_t rc = cudaEventRecord(event, stream);
    if (rc != cudaSuccess) {
      cudaEventDestroy(event);
      check_cuda(rc, "cudaEventRecord");
    }
    return event;
  }

  // Queue-then-wait for the blocking calls.
  void finish(const CollectiveCall& f) {
    cudaEvent_t event = record();
    try {
      wait(event, f);
    } catch (...) {
      cudaEventDestroy(event);
      throw;
    }
    cudaEventDestroy(event);
  }
};

NcclCommunicator::NcclCommunicator() : NcclCommunicator(Options{}) {}

NcclCommunicator::NcclCommunicator(const Options& options)
    : NcclCommunicator(nccl_unique_id(), 0, 1, options) {}

NcclCommunicator::NcclCommunicator(Communicator& bootstrap) : NcclCommunicator(bootstrap, Options{}) {}

NcclUniqueId nccl_unique_id(Communicator& bootstrap) {
  NcclUniqueId id{};
  if (bootstrap.rank() == 0) id = nccl_unique_id();
  bootstrap.broadcast(id.data(), id.size(), 0);
  return id;
}

NcclCommunicator::NcclCommunicator(Communicator& bootstrap, const Options& options)
    : NcclCommunicator(nccl_unique_id(bootstrap), bootstrap.rank(), bootstrap.size(), options) {}

NcclCommunicator::NcclCommunicator(const NcclUniqueId& id, int rank, int size, const Options& options)
    : impl_(std::make_unique<Impl>()) {
  if (!std::isfinite(options.timeout_seconds) || options.timeout_seconds <= 0)
    throw std::invalid_argument("the collective timeout must be a finite number of seconds > 0, not " +
                                std::to_string(options.timeout_seconds));
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument("NCCL rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                " ranks (valid: a size >= 1 and a rank from 0 to size - 1)");
  Impl& m = *impl_;
  m.api = &api();
  m.rank = rank;
  m.size = size;
  m.timeout_seconds = options.timeout_seconds;
  int devices = 0;
  check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (devices < 1)
    throw std::runtime_error("cudaGetDeviceCount found no CUDA device: NCCL needs one per rank");
  if (options.device >= devices)
    throw std::invalid_argument("CUDA device " + std::to_string(options.device) + " on a machine with " +
                                std::to_string(devices) + " (valid: -1, or 0 to " +
                                std::to_string(devices - 1) + ")");
  m.device = options.device >= 0 ? options.device : rank % devices;
  DeviceGuard guard(m.device);
  check_cuda(cudaStreamCreate(&m.stream), "cudaStreamCreate");
  check_cuda(cudaMalloc(&m.scratch, sizeof(float)), "cudaMalloc");
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), id.size());
  const ncclResult_t rc = m.api->comm_init_rank(&m.comm, size, uid, rank);
  if (rc != ncclSuccess) {
    m.comm = nullptr;
    cudaFree(m.scratch);
    cudaStreamDestroy(m.stream);
    check_nccl(rc, "ncclCommInitRank");
  }
}

NcclCommunicator::~NcclCommunicator() {
  Impl& m = *impl_;
  // No DeviceGuard (it throws): a destructor reports nothing and frees what it can.
  int previous = m.device;
  cudaGetDevice(&previous);
  cudaSetDevice(m.device);
  if (m.comm != nullptr) {
    cudaStreamSynchronize(m.stream);
    m.api->comm_destroy(m.comm);
  }
  cudaFree(m.scratch);
  cudaStreamDestroy(m.stream);
  cudaSetDevice(previous);
}

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::size() const { return impl_->size; }
int NcclCommunicator::device() const { return impl_->device; }
void* NcclCommunicator::stream() const { return impl_->stream; }

namespace nccl_communicator {
class NcclPending final : public PendingAllReduce {
 public:
  NcclPending(NcclCommunicator::Impl* impl, cudaEvent_t event, CollectiveCall f)
      : impl_(impl), event_(event), f_(f) {}
  ~NcclPending() override {
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mpt: rank %d of %d: %s\n", impl_->rank, impl_->size, e.what());
    }
    cudaEventDestroy(event_);
  }
  NcclPending(const NcclPending&) = delete;
  NcclPending& operator=(const NcclPending&) = delete;
  void wait() override {
    if (done_) return;
    done_ = true;  // a failed wait is not waited for again
    impl_->wait(event_, f_);
  }
  bool progress() override {
    if (done_) return true;
    const cudaError_t q = cudaEventQuery(event_);
    if (q == cudaErrorNotReady) return false;
    wait();  // complete, or an error that wait() reports
    return true;
  }

 private:
  NcclCommunicator::Impl* impl_;
  cudaEvent_t event_;
  CollectiveCall f_;
  bool done_ = false;
};
}  // namespace nccl_communicator

std::unique_ptr<PendingAllReduce> NcclCommunicator::start_all_reduce(void* data, std::int64_t count,
                                                                     DType dtype, ReduceOp op) {
  check_buffer("all_reduce", count, dtype);
  Impl& m = *impl_;
  const CollectiveCall f = m.next(Kind::all_reduce, tag(), dtype, op, count, 0);
  if (count == 0) return finished_all_reduce();
  DeviceGuard guard(m.device);
  check_nccl(m.api->all_reduce(data, data, static_cast<std::size_t>(count), nccl_type(dtype), nccl_op(op),
                               m.comm, m.stream),
             "ncclAllReduce", m.comm);
  return std::make_unique<NcclPending>(impl_.get(), m.record(), f);
}

void NcclCommunicator::all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op) {
  start_all_reduce(data, count, dtype, op)->wait();
}

void NcclCommunicator::broadcast(void* data, std::size_t bytes, int root) {
  Impl& m = *impl_;
  if (root < 0 || root >= m.size)
    throw std::invalid_argument("broadcast: root " + std::to_string(root) + " in a world of " +
                                std::to_string(m.size) + " ranks (valid: 0 to " + std::to_string(m.size - 1) +
                                ")");
  const CollectiveCall f =
      m.next(Kind::broadcast, tag(), DType::f32, ReduceOp::sum, static_cast<std::int64_t>(bytes), root);
  if (bytes == 0) return;
  DeviceGuard guard(m.device);
  check_nccl(m.api->broadcast(data, data, bytes, ncclUint8, root, m.comm, m.stream), "ncclBroadcast", m.comm);
  m.finish(f);
}

void NcclCommunicator::all_gather(const void* send, void* recv, std::size_t bytes) {
  Impl& m = *impl_;
  const CollectiveCall f =
      m.next(Kind::all_gather, tag(), DType::f32, ReduceOp::sum, static_cast<std::int64_t>(bytes), 0);
  if (bytes == 0) return;
  DeviceGuard guard(m.device);
  check_nccl(m.api->all_gather(send, recv, bytes, ncclUint8, m.comm, m.stream), "ncclAllGather", m.comm);
  m.finish(f);
}

void NcclCommunicator::barrier() {
  Impl& m = *impl_;
  const CollectiveCall f = m.next(Kind::barrier, tag(), DType::f32, ReduceOp::sum, 0, 0);
  DeviceGuard guard(m.device);
  check_nccl(m.api->all_reduce(m.scratch, m.scratch, 1, ncclFloat32, ncclSum, m.comm, m.stream),
             "ncclAllReduce", m.comm);
  m.finish(f);
}

}  // namespace mpt::dist
