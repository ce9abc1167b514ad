// Chapter 05 — loss scaling across ranks: N ranks as threads of one process
// (see thread_world.hpp).
// Depends on: thread_world.hpp, communicator.hpp (combine, CollectiveCall).
#include "mpt/dist/thread_world.hpp"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace mpt::dist {

namespace {
using Kind = CollectiveCall::Kind;

// What a rank throws when its call cannot complete because of another
// rank (the failure is that rank's, already recorded).
struct Abandoned : std::runtime_error {
  explicit Abandoned(const std::string& what) : std::runtime_error(what) {}
};

std::string seconds_text(double s) {
  std::ostringstream out;
  out << s;
  return out.str();
}
}  // namespace

struct ThreadWorld::State {
  int n = 1;
  double timeout_seconds = 30;

  // One slot per rank: the call it is waiting in and its buffers.
  struct Slot {
    bool present = false;
    CollectiveCall call;
    void* data = nullptr;        // all_reduce, broadcast: in place
    const void* send = nullptr;  // all_gather
    void* recv = nullptr;        // all_gather
  };

  std::mutex m;
  std::condition_variable cv;
  std::vector<Slot> slots;
  std::vector<bool> returned;  // the rank's body has returned (or thrown)
  int arrived = 0;
  std::uint64_t generation = 0;  // collectives completed
  std::string failure;           // the first failure; once set, every call throws it
  std::vector<std::string> own;  // per rank: what its body threw of its own accord

  void reset(int size, double timeout) {
    n = size;
    timeout_seconds = timeout;
    slots.assign(static_cast<std::size_t>(n), Slot{});
    returned.assign(static_cast<std::size_t>(n), false);
    own.assign(static_cast<std::size_t>(n), std::string());
    arrived = 0;
    generation = 0;
    failure.clear();
  }

  void fail(const std::string& what) {
    if (failure.empty()) failure = what;
    cv.notify_all();
  }

  std::string rank_name(int r) const { return "rank " + std::to_string(r) + " of " + std::to_string(n); }

  // The last rank to arrive: check the calls agree, then compute the result
  // into every rank's buffers, in rank order.
  void complete() {
    const CollectiveCall& first = slots[0].call;
    for (int q = 1; q < n; ++q) {
      const CollectiveCall& other = slots[static_cast<std::size_t>(q)].call;
      if (other.fields() != first.fields())
        throw std::runtime_error("the ranks disagree on a collective: rank 0 calls " + first.describe() +
                                 ", rank " + std::to_string(q) + " calls " + other.describe());
    }
    const auto bytes = static_cast<std::size_t>(first.count);
    switch (first.kind) {
      case Kind::all_reduce: {
        const std::size_t size = bytes * element_bytes(first.dtype);
        std::vector<unsigned char> sum(static_cast<unsigned char*>(slots[0].data),
                                       static_cast<unsigned char*>(slots[0].data) + size);
        for (int q = 1; q < n; ++q)
          combine(sum.data(), slots[static_cast<std::size_t>(q)].data, first.count, first.dtype, first.op);
        for (Slot& s : slots)
          if (size > 0) std::memcpy(s.data, sum.data(), size);
        break;
      }
      case Kind::broadcast:
        for (int q = 0; q < n; ++q)
          if (q != first.root && bytes > 0)
            std::memcpy(slots[static_cast<std::size_t>(q)].data,
                        slots[static_cast<std::size_t>(first.root)].data, bytes);
        break;
      case Kind::all_gather:
        for (Slot& to : slots)
          for (int q = 0; q < n; ++q)
            if (bytes > 0)
              std::memcpy(static_cast<unsigned char*>(to.recv) + bytes * static_cast<std::size_t>(q),
                          slots[static_cast<std::size_t>(q)].send, bytes);
        break;
      case Kind::barrier: break;
    }
  }

  // Rank r's part of one collective: fill its slot, then complete it (the
  // last to arrive) or wait for the others.
  void collective(int r, const Slot& mine) {
    std::unique_lock<std::mutex> lock(m);
    const std::string what = rank_name(r) + ": " + mine.call.describe();
    if (!failure.empty()) throw Abandoned(what + " not made: " + failure);
    slots[static_cast<std::size_t>(r)] = mine;
    slots[static_cast<std::size_t>(r)].present = true;
    const std::uint64_t gen = generation;
    if (++arrived == n) {
      try {
        complete();
      } catch (const std::exception& e) {
        fail(e.what());
        throw Abandoned(e.what());
      }
      for (Slot& s : slots) s.present = false;
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
    for (;;) {
      if (generation != gen) return;
      if (!failure.empty()) throw Abandoned(what + " abandoned: " + failure);
      for (int q = 0; q < n; ++q)
        if (returned[static_cast<std::size_t>(q)] && !slots[static_cast<std::size_t>(q)].present) {
          fail(rank_name(q) + " returned without making " + mine.call.describe() + ", which rank " +
               std::to_string(r) + " waits in");
          throw Abandoned(failure);
        }
      if (cv.wait_until(lock, deadline) == std::cv_status::timeout && generation == gen && failure.empty()) {
        std::string missing;
        for (int q = 0; q < n; ++q)
          if (!slots[static_cast<std::size_t>(q)].present)
            missing += (missing.empty() ? "" : ", ") + std::to_string(q);
        fail(what + " did not complete within " + seconds_text(timeout_seconds) + " s: rank(s) " + missing +
             " did not make this call");
        throw Abandoned(failure);
      }
    }
  }
};

namespace {

// Rank r's view of the world.
class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadWorld::State& s, int rank) : s_(s), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_.n; }
  const char* backend() const override { return "threads"; }

  void all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op) override {
    check_buffer("all_reduce", count, dtype);
    ThreadWorld::State::Slot slot;
    slot.call = next(Kind::all_reduce, dtype, op, count, 0);
    slot.data = data;
    s_.collective(rank_, slot);
  }
  // The ranks compute concurrently; a collective completes when the last
  // arrives, so a started one is complete at once.
  std::unique_ptr<PendingAllReduce> start_all_reduce(void* data, std::int64_t count, DType dtype,
                                                     ReduceOp op) override {
    all_reduce(data, count, dtype, op);
    return finished_all_reduce();
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    if (root < 0 || root >= s_.n)
      throw std::invalid_argument("broadcast: root " + std::to_string(root) + " in a world of " +
                                  std::to_string(s_.n) + " ranks (valid: 0 .. " + std::to_string(s_.n - 1) +
                                  ")");
    ThreadWorld::State::Slot slot;
    slot.call = next(Kind::broadcast, DType::f32, ReduceOp::sum, static_cast<std::int64_t>(bytes), root);
    slot.data = data;
    s_.collective(rank_, slot);
  }
  void all_gather(const void* send, void* recv, std::size_t bytes) override {
    ThreadWorld::State::Slot slot;
    slot.call = next(Kind::all_gather, DType::f32, ReduceOp::sum, static_cast<std::int64_t>(bytes), 0);
    slot.send = send;
    slot.recv = recv;
    s_.collective(rank_, slot);
  }
  void barrier() override {
    ThreadWorld::State::Slot slot;
    slot.call = next(Kind::barrier, DType::f32, ReduceOp::sum, 0, 0);
    s_.collective(rank_, slot);
  }

 private:
  CollectiveCall next(Kind kind, DType dtype, ReduceOp op, std::int64_t count, int root) {
    CollectiveCall c;
    c.seq = ++seq_;
    c.tag = tag();
    c.kind = kind;
    c.dtype = dtype;
    c.op = op;
    c.count = count;
    c.root = root;
    return c;
  }

  ThreadWorld::State& s_;
  int rank_;
  std::int64_t seq_ = 0;
};

}  // namespace

ThreadWorld::ThreadWorld(int size, double timeout_seconds) : state_(std::make_shared<State>()) {
  if (size < 1 || size > 64)
    throw std::invalid_argument("ThreadWorld: " + std::to_string(size) + " ranks; valid: 1 .. 64");
  if (!std::isfinite(timeout_seconds) || timeout_seconds <= 0)
    throw std::invalid_argument("ThreadWorld: a timeout of " + std::to_string(timeout_seconds) +
                                " s; it must be a finite number > 0");
  state_->reset(size, timeout_seconds);
}

ThreadWorld::~ThreadWorld() = default;

int ThreadWorld::size() const { return state_->n; }

void ThreadWorld::run(const std::function<void(Communicator&)>& body) {
  State& s = *state_;
  s.reset(s.n, s.timeout_seconds);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(s.n));
  for (int r = 0; r < s.n; ++r)
    threads.emplace_back([&s, &body, r] {
      ThreadCommunicator comm(s, r);
      std::string error;
      try {
        body(comm);
      } catch (const Abandoned&) {
        // failed because another rank did, or because the ranks' calls
        // disagree: the failure is already recorded
      } catch (const std::exception& e) {
        error = e.what();
      } catch (...) {
        error = "an exception that is not a std::exception";
      }
      std::lock_guard<std::mutex> lock(s.m);
      s.returned[static_cast<std::size_t>(r)] = true;
      if (!error.empty()) {
        s.own[static_cast<std::size_t>(r)] = error;
        if (s.failure.empty()) s.failure = s.rank_name(r) + ": " + error;
      }
      s.cv.notify_all();
    });
  for (std::thread& t : threads) t.join();
  // Ranks that failed of their own accord come first, the lowest rank of
  // them (not the first in time: threads race, and a report must not).
  for (int r = 0; r < s.n; ++r)
    if (!s.own[static_cast<std::size_t>(r)].empty())
      throw std::runtime_error(s.rank_name(r) + ": " + s.own[static_cast<std::size_t>(r)]);
  if (!s.failure.empty()) throw std::runtime_error(s.failure);
}

}  // namespace mpt::dist
