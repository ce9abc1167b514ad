// Chapter 05 — the NCCL backend on the GPU: an all-reduce of f32, f16 and
// bf16 device buffers equals mpt::dist::combine() on the host, for sum and
// max; broadcast, all-gather, a started all-reduce, and the errors. World
// size 1 always; 2 (ranks as threads of this process, one GPU each) where
// two GPUs are there. Exits 77 printing "NCCL not found" when libnccl.so.2
// cannot be opened (MPT_NCCL_LIBRARY, else the loader's search), and 77
// without a usable GPU (Skipped, see gpu_test_support.hpp); with --no-gpu
// it runs only the cases that need no GPU (the unique id's exchange).
// Depends on: mpt/dist/nccl_communicator.hpp (mpt::dist_nccl),
// mpt/dist/communicator.hpp (combine), thread_world.hpp, mpt/formats/storage.hpp (the f16 and
// bf16 codes), gpu_test_support.hpp, the CUDA runtime, doctest.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_support.hpp"
#include "mpt/dist/communicator.hpp"
#include "mpt/dist/nccl_communicator.hpp"
#include "mpt/dist/thread_world.hpp"
#include "mpt/formats/storage.hpp"

namespace {

using mpt::DType;
using mpt::dist::NcclCommunicator;
using mpt::dist::ReduceOp;
using mpt::test::cuda_ok;
using mpt::test::DeviceArray;

constexpr DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::max};

// `n` elements of `dtype`'s storage, as raw bytes: floats of mixed signs
// and magnitudes (no NaN, no zero: NCCL's max need not order ±0 or keep
// NaN the way combine() does), rounded to f16/bf16 codes where asked.
// Some f16 values are near 65504, so that a sum of two overflows to inf.
std::vector<unsigned char> values(DType dtype, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> mag(-8.0f, 8.0f);
  std::vector<float> f(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float v = std::ldexp(1.0f + static_cast<float>(gen() % 1000) / 1000.0f, static_cast<int>(mag(gen)));
    f[i] = (gen() & 1) ? -v : v;
    if (i % 97 == 0) f[i] = 60000.0f;  // near f16's largest: two of them overflow
  }
  std::vector<unsigned char> out(n * mpt::dist::element_bytes(dtype));
  if (dtype == DType::f32) {
    std::memcpy(out.data(), f.data(), out.size());
  } else if (dtype == DType::f16) {
    mpt::to_fp16(f.data(), reinterpret_cast<Eigen::half*>(out.data()), n);
  } else {
    mpt::to_bf16(f.data(), reinterpret_cast<Eigen::bfloat16*>(out.data()), n);
  }
  return out;
}

std::vector<unsigned char> upload_reduce_download(NcclCommunicator& comm,
                                                  const std::vector<unsigned char>& host, DType dtype,
                                                  ReduceOp op, bool started) {
  cuda_ok(cudaSetDevice(comm.device()), "cudaSetDevice");
  DeviceArray<unsigned char> dev(host);
  const auto n = static_cast<std::int64_t>(host.size() / mpt::dist::element_bytes(dtype));
  if (started) {
    auto pending = comm.start_all_reduce(dev.get(), n, dtype, op);
    pending->wait();
  } else {
    comm.all_reduce(dev.get(), n, dtype, op);
  }
  return dev.download();
}

// The index of the first element whose bytes differ, or -1.
long first_difference(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b, DType dtype) {
  const std::size_t e = mpt::dist::element_bytes(dtype);
  for (std::size_t i = 0; i * e < a.size(); ++i)
    if (std::memcmp(a.data() + i * e, b.data() + i * e, e) != 0) return static_cast<long>(i);
  return -1;
}

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

}  // namespace

TEST_CASE("no GPU needed: every rank of a bootstrap communicator gets rank 0's new unique id") {
  mpt::dist::ThreadWorld world(3);
  mpt::dist::NcclUniqueId got[2][3] = {};
  for (auto& pass : got)
    world.run([&](mpt::dist::Communicator& comm) { pass[comm.rank()] = mpt::dist::nccl_unique_id(comm); });
  const mpt::dist::NcclUniqueId zero{};
  for (const auto& pass : got) {
    CHECK(pass[0] != zero);
    CHECK(pass[1] == pass[0]);
    CHECK(pass[2] == pass[0]);
  }
  CHECK(got[1][0] != got[0][0]);  // a new id each time
}

TEST_CASE("world size 1: an all-reduce of each dtype and op returns combine() of the one buffer") {
  NcclCommunicator comm;
  CHECK(comm.size() == 1);
  CHECK(comm.rank() == 0);
  CHECK(std::string(comm.backend()) == "nccl");
  for (DType dtype : kDtypes)
    for (ReduceOp op : kOps)
      for (bool started : {false, true}) {
        const std::string dtype_text(mpt::dtype_name(dtype));
        CAPTURE(dtype_text);
        const std::string op_text = mpt::dist::reduce_op_name(op);
        CAPTURE(op_text);
        CAPTURE(started);
        const std::size_t n = 1000 + 3;  // not a multiple of any vector width
        const auto x = values(dtype, n, mpt::test::test_seed());
        // The reduction of one rank's buffer is that buffer: combine() is
        // applied between ranks, and there are none to combine with.
        const auto got = upload_reduce_download(comm, x, dtype, op, started);
        CHECK(first_difference(x, got, dtype) == -1);
      }
}

TEST_CASE("world size 1: broadcast and all-gather move device bytes; barrier returns") {
  NcclCommunicator comm;
  std::vector<unsigned char> host(257);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned char>(i * 7 + 3);
  DeviceArray<unsigned char> data(host);
  comm.broadcast(data.get(), host.size(), 0);
  CHECK(data.download() == host);
  DeviceArray<unsigned char> gathered(host.size());
  gathered.poison();
  comm.all_gather(data.get(), gathered.get(), host.size());
  CHECK(gathered.download() == host);
  comm.barrier();
  // Zero elements: nothing queued, nothing to wait for.
  comm.all_reduce(data.get(), 0, DType::f16, ReduceOp::sum);
  comm.start_all_reduce(data.get(), 0, DType::f32, ReduceOp::max)->wait();
}

TEST_CASE("bad arguments and NCCL's errors are one line naming the call") {
  NcclCommunicator comm;
  DeviceArray<float> d(4);
  CHECK_THROWS_WITH_AS(comm.all_reduce(d.get(), 4, DType::e4m3, ReduceOp::sum), doctest::Contains("e4m3"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(comm.broadcast(d.get(), 16, 1),
                       "broadcast: root 1 in a world of 1 ranks (valid: 0 to 0)", std::invalid_argument);
  NcclCommunicator::Options bad;
  bad.device = device_count();
  CHECK_THROWS_WITH_AS(NcclCommunicator{bad}, doctest::Contains("valid: -1, or 0 to"), std::invalid_argument);
  // Pageable host memory is not a buffer NCCL can reduce: its argument
  // check refuses it, and the message names ncclAllReduce and NCCL's reason.
  std::vector<float> host(4, 1.0f);
  try {
    comm.all_reduce(host.data(), 4, DType::f32, ReduceOp::sum);
    FAIL("a host pointer was accepted");
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    MESSAGE(what);
    CHECK(what.rfind("ncclAllReduce failed: ", 0) == 0);
    CHECK(what.find('\n') == std::string::npos);
  }
}

TEST_CASE("world size 2 (two GPUs, ranks as threads): an all-reduce equals combine() of both buffers") {
  if (device_count() < 2) {
    MESSAGE("one GPU here: the two-rank case needs two and is not run");
    return;
  }
  for (DType dtype : kDtypes)
    for (ReduceOp op : kOps) {
      const std::string dtype_text(mpt::dtype_name(dtype));
      CAPTURE(dtype_text);
      const std::string op_text = mpt::dist::reduce_op_name(op);
      CAPTURE(op_text);
      const std::size_t n = 4096 + 5;
      std::vector<unsigned char> x[2] = {values(dtype, n, 1), values(dtype, n, 2)};
      std::vector<unsigned char> got[2];
      std::string error[2];
      // A new group per pass: both threads join the group of `id`.
      const mpt::dist::NcclUniqueId id = mpt::dist::nccl_unique_id();
      std::vector<std::thread> ranks;
      for (int r = 0; r < 2; ++r)
        ranks.emplace_back([&, r] {
          try {
            NcclCommunicator::Options o;
            o.device = r;
            o.timeout_seconds = 30;
            NcclCommunicator comm(id, r, 2, o);
            got[r] = upload_reduce_download(comm, x[r], dtype, op, r == 1);
          } catch (const std::exception& e) {
            error[r] = e.what();
          }
        });
      for (auto& t : ranks) t.join();
      REQUIRE(error[0] == "");
      REQUIRE(error[1] == "");
      std::vector<unsigned char> want = x[0];
      mpt::dist::combine(want.data(), x[1].data(), static_cast<std::int64_t>(n), dtype, op);
      CHECK(first_difference(want, got[0], dtype) == -1);
      CHECK(first_difference(want, got[1], dtype) == -1);
    }
}

int main(int argc, char** argv) {
  // NCCL first: a machine without libnccl.so.2 says so, GPU or not.
  try {
    const std::string path = mpt::dist::nccl_library();
    std::printf("NCCL %s from %s\n", mpt::dist::nccl_version().c_str(), path.c_str());
  } catch (const mpt::dist::NcclNotFound& e) {
    std::printf("SKIPPED %s: %s\n", argc > 0 ? argv[0] : "test_ch05_nccl_cuda", e.what());
    return 77;
  }
  // --no-gpu: only the cases that need libnccl and no GPU (CTest
  // nccl_unique_id_exchange runs them on any machine).
  if (argc > 1 && std::string(argv[1]) == "--no-gpu") {
    doctest::Context context(argc - 1, argv + 1);
    context.setOption("test-case", "no GPU needed*");
    return context.run();
  }
  return mpt::test::gpu_test_main(argc, argv);
}
