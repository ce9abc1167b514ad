// Chapter 05 — loss scaling across ranks: the elementwise reduction every
// backend applies, the fixed-order all-reduce, and the one-process world.
// Depends on: communicator.hpp; the formats tier (storage.hpp).
#include "mpt/dist/communicator.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/formats/storage.hpp"

namespace mpt::dist {

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : "max"; }

std::size_t element_bytes(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::e4m3:
    case DType::e5m2: break;
  }
  throw std::invalid_argument("a collective moves f32, f16 or bf16 buffers, not " +
                              std::string(dtype_name(dtype)));
}

void check_buffer(const char* who, std::int64_t count, DType dtype) {
  if (count < 0)
    throw std::invalid_argument(std::string(who) + ": a count of " + std::to_string(count) +
                                " elements; it must be >= 0");
  (void)element_bytes(dtype);
}

namespace {

// max with NaN winning, so that a NaN flag or gradient is never hidden.
inline float max_nan(float a, float b) { return std::isnan(a) || std::isnan(b) ? a + b : std::max(a, b); }

inline void combine_f32(float* d, const float* s, std::int64_t n, ReduceOp op) {
  if (op == ReduceOp::sum)
    for (std::int64_t i = 0; i < n; ++i) d[i] += s[i];
  else
    for (std::int64_t i = 0; i < n; ++i) d[i] = max_nan(d[i], s[i]);
}

// 16-bit codes: decode a chunk of each side to float, combine, round back.
template <class Code>
void combine_16(Code* d, const Code* s, std::int64_t n, ReduceOp op,
                void (*decode)(const Code*, float*, std::size_t),
                void (*encode)(const float*, Code*, std::size_t, const RoundingOptions&)) {
  constexpr std::int64_t kChunk = 1024;
  float a[kChunk], b[kChunk];
  for (std::int64_t at = 0; at < n; at += kChunk) {
    const auto m = static_cast<std::size_t>(std::min(kChunk, n - at));
    decode(d + at, a, m);
    decode(s + at, b, m);
    combine_f32(a, b, static_cast<std::int64_t>(m), op);
    encode(a, d + at, m, RoundingOptions{});
  }
}

}  // namespace

void combine(void* dst, const void* src, std::int64_t count, DType dtype, ReduceOp op) {
  check_buffer("combine", count, dtype);
  switch (dtype) {
    case DType::f32: combine_f32(static_cast<float*>(dst), static_cast<const float*>(src), count, op); return;
    case DType::f16:
      combine_16<Eigen::half>(static_cast<Eigen::half*>(dst), static_cast<const Eigen::half*>(src), count, op,
                              from_fp16, to_fp16);
      return;
    case DType::bf16:
      combine_16<Eigen::bfloat16>(static_cast<Eigen::bfloat16*>(dst),
                                  static_cast<const Eigen::bfloat16*>(src), count, op, from_bf16, to_bf16);
      return;
    default: return;  // refused by check_buffer
  }
}

void all_reduce_fixed_order(Communicator& comm, void* data, std::int64_t count, DType dtype, ReduceOp op) {
  check_buffer("all_reduce_fixed_order", count, dtype);
  const std::size_t bytes = static_cast<std::size_t>(count) * element_bytes(dtype);
  std::vector<unsigned char> all(bytes * static_cast<std::size_t>(comm.size()));
  comm.all_gather(data, all.data(), bytes);
  std::memcpy(data, all.data(), bytes);
  for (int r = 1; r < comm.size(); ++r)
    combine(data, all.data() + bytes * static_cast<std::size_t>(r), count, dtype, op);
}

// --- the description of a call ---------------------------------------------------

std::array<std::int64_t, 7> CollectiveCall::fields() const {
  return {seq,
          tag,
          static_cast<std::int64_t>(kind),
          static_cast<std::int64_t>(dtype),
          static_cast<std::int64_t>(op),
          count,
          root};
}

CollectiveCall CollectiveCall::from_fields(const std::int64_t* v) {
  CollectiveCall c;
  c.seq = v[0];
  c.tag = v[1];
  c.kind = static_cast<Kind>(v[2]);
  c.dtype = static_cast<DType>(v[3]);
  c.op = static_cast<ReduceOp>(v[4]);
  c.count = v[5];
  c.root = v[6];
  return c;
}

std::string CollectiveCall::describe() const {
  std::string s;
  switch (kind) {
    case Kind::all_reduce:
      s = "all_reduce(" + std::string(dtype_name(dtype)) + " x " + std::to_string(count) + ", " +
          reduce_op_name(op) + ")";
      break;
    case Kind::broadcast:
      s = "broadcast(" + std::to_string(count) + " bytes from rank " + std::to_string(root) + ")";
      break;
    case Kind::all_gather: s = "all_gather(" + std::to_string(count) + " bytes)"; break;
    case Kind::barrier: s = "barrier()"; break;
    default: s = "an unknown call";
  }
  return s + " as collective #" + std::to_string(seq) + " (tag " + std::to_string(tag) + ")";
}

// --- the world of one --------------------------------------------------------------

namespace {
class DoneAllReduce final : public PendingAllReduce {
 public:
  void wait() override {}
  bool progress() override { return true; }
};
}  // namespace

std::unique_ptr<PendingAllReduce> finished_all_reduce() { return std::make_unique<DoneAllReduce>(); }

void LocalCommunicator::all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op) {
  (void)data;
  (void)op;
  check_buffer("all_reduce", count, dtype);
}

std::unique_ptr<PendingAllReduce> LocalCommunicator::start_all_reduce(void* data, std::int64_t count,
                                                                      DType dtype, ReduceOp op) {
  all_reduce(data, count, dtype, op);
  return finished_all_reduce();
}

void LocalCommunicator::broadcast(void* data, std::size_t bytes, int root) {
  (void)data;
  (void)bytes;
  if (root != 0)
    throw std::invalid_argument("broadcast: root " + std::to_string(root) +
                                " in a world of 1 rank (valid: 0)");
}

void LocalCommunicator::all_gather(const void* send, void* recv, std::size_t bytes) {
  if (bytes > 0) std::memmove(recv, send, bytes);
}

}  // namespace mpt::dist
