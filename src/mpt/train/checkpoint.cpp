// Chapters 04 onwards — the checkpoint file: writing, parsing, finding.
// Depends on: checkpoint.hpp (io/atomic_file.hpp: the atomic write, file_kind),
// formats/explain.hpp (shortest_decimal, for an lr in a message); POSIX dirent.h
// (listing a directory).
#include "mpt/train/checkpoint.hpp"

#include "mpt/formats/explain.hpp"

#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <stdexcept>

namespace mpt::train {

namespace {

constexpr char kMagic[8] = {'M', 'P', 'T', 'C', 'K', 'P', 'T', '\0'};
constexpr std::size_t kHeader = 20;  // magic, version, payload length
constexpr std::size_t kTrailer = 8;  // the checksum
constexpr std::uint32_t kMaxRank = 8;
constexpr std::uint64_t kMaxFileBytes = 1ull << 30;

std::uint64_t fnv1a64(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// --- writing -------------------------------------------------------------------

class Writer {
 public:
  void u8(std::uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) u8(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) u8(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void i64(std::int64_t v) { u64(static_cast<std::uint64_t>(v)); }
  void f32(float v) {
    std::uint32_t b = 0;
    std::memcpy(&b, &v, sizeof b);
    u32(b);
  }
  void f64(double v) {
    std::uint64_t b = 0;
    std::memcpy(&b, &v, sizeof b);
    u64(b);
  }
  void str(const std::string& s) {
    u32(static_cast<std::uint32_t>(s.size()));
    out_ += s;
  }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

// --- reading -------------------------------------------------------------------

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument(what); }

class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  std::size_t left() const { return b_.size() - pos_; }
  void need(std::size_t n, const char* what) const {
    if (n > left())
      bad(std::string("truncated: ") + what + " needs " + std::to_string(n) + " bytes at payload offset " +
          std::to_string(pos_) + ", only " + std::to_string(left()) + " left");
  }
  std::uint8_t u8(const char* what) {
    need(1, what);
    return static_cast<std::uint8_t>(b_[pos_++]);
  }
  bool boolean(const char* what) {
    const std::uint8_t v = u8(what);
    if (v > 1) bad(std::string(what) + " is byte " + std::to_string(v) + "; a flag is 0 or 1");
    return v == 1;
  }
  std::uint32_t u32(const char* what) {
    need(4, what);
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i)
      v |= static_cast<std::uint32_t>(static_cast<unsigned char>(b_[pos_++])) << (8 * i);
    return v;
  }
  std::uint64_t u64(const char* what) {
    need(8, what);
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i)
      v |= static_cast<std::uint64_t>(static_cast<unsigned char>(b_[pos_++])) << (8 * i);
    return v;
  }
  std::int64_t i64(const char* what) { return static_cast<std::int64_t>(u64(what)); }
  float f32(const char* what) {
    const std::uint32_t b = u32(what);
    float v = 0;
    std::memcpy(&v, &b, sizeof v);
    return v;
  }
  double f64(const char* what) {
    const std::uint64_t b = u64(what);
    double v = 0;
    std::memcpy(&v, &b, sizeof v);
    return v;
  }
  std::string str(const char* what) {
    const std::uint32_t n = u32(what);
    need(n, what);
    std::string s(b_.substr(pos_, n));
    // Every string the format holds (names, the configuration, the scaler's
    // JSON) is printable ASCII; anything else is damage, and refusing it here
    // keeps every later message that quotes a string one line of text.
    for (std::size_t i = 0; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c < 0x20 || c > 0x7e)
        bad(std::string(what) + " holds byte " + std::to_string(c) + " at its offset " + std::to_string(i) +
            "; the strings of a checkpoint are printable ASCII");
    }
    pos_ += n;
    return s;
  }
  // A count of items each at least `min_bytes` long: refused when they
  // cannot fit in what is left, before anything is allocated for them.
  std::uint64_t count(std::uint64_t n, std::size_t min_bytes, const char* what) const {
    if (n > left() / min_bytes)
      bad(std::string(what) + " count " + std::to_string(n) + " needs at least " + std::to_string(min_bytes) +
          " bytes each, only " + std::to_string(left()) + " bytes left");
    return n;
  }

 private:
  std::string_view b_;
  std::size_t pos_ = 0;
};

}  // namespace

std::string serialize_checkpoint(const Checkpoint& c) {
  Writer p;
  const RunConfig& k = c.config;
  p.str(k.model);
  p.str(k.data);
  p.str(k.policy);
  p.str(k.scaler);
  p.str(k.optimizer);
  p.f64(k.lr);
  p.u64(k.seed.value_or(0));
  p.i64(k.steps);
  p.i64(k.every);
  p.i64(c.step);
  p.u32(static_cast<std::uint32_t>(c.tensors.size()));
  for (const TensorRecord& t : c.tensors) {
    p.str(t.name);
    p.u32(static_cast<std::uint32_t>(t.shape.size()));
    for (const std::int64_t d : t.shape) p.i64(d);
    p.u64(t.values.size());
    for (const float v : t.values) p.f32(v);
  }
  p.u32(static_cast<std::uint32_t>(c.counters.size()));
  for (const auto& [name, value] : c.counters) {
    p.str(name);
    p.i64(value);
  }
  p.str(c.scaler_state);
  p.u64(c.data_epoch);
  p.i64(c.data_position);
  p.u32(static_cast<std::uint32_t>(c.rngs.size()));
  for (const Rng::State& r : c.rngs) {
    p.u64(r.word);
    p.u8(r.has_spare ? 1 : 0);
    p.f64(r.spare);
  }
  p.u64(c.history.size());
  for (const StepRecord& s : c.history) {
    p.i64(s.step);
    p.f32(s.loss);
    p.f32(s.scale);
    p.u8(s.skipped ? 1 : 0);
  }
  Writer f;
  for (const char m : kMagic) f.u8(static_cast<std::uint8_t>(m));
  f.u32(kCheckpointVersion);
  f.u64(p.bytes().size());
  f.bytes() += p.bytes();
  f.u64(fnv1a64(f.bytes()));
  return std::move(f.bytes());
}

Checkpoint parse_checkpoint_payload(std::string_view payload) {
  Reader r(payload);
  Checkpoint c;
  RunConfig& k = c.config;
  k.model = r.str("the model name");
  k.data = r.str("the data name");
  k.policy = r.str("the policy");
  k.scaler = r.str("the scaler");
  k.optimizer = r.str("the optimizer");
  k.lr = r.f64("the learning rate");
  if (!std::isfinite(k.lr) || k.lr <= 0) bad("the learning rate is not finite and > 0");
  k.seed = r.u64("the seed");
  k.steps = r.i64("the configured steps");
  k.every = r.i64("the checkpoint interval");
  if (k.steps < 1 || k.every < 0) bad("the configured steps or checkpoint interval is out of range");
  c.step = r.i64("the step");
  if (c.step < 0) bad("the step " + std::to_string(c.step) + " is negative");

  const std::uint64_t nt = r.count(r.u32("the tensor count"), 4 + 4 + 8, "tensor");
  for (std::uint64_t i = 0; i < nt; ++i) {
    TensorRecord t;
    t.name = r.str("a tensor name");
    const std::uint32_t rank = r.u32("a tensor rank");
    if (rank > kMaxRank)
      bad("tensor " + t.name + " has rank " + std::to_string(rank) + "; at most " + std::to_string(kMaxRank));
    std::uint64_t product = 1;
    bool overflow = false;
    for (std::uint32_t d = 0; d < rank; ++d) {
      const std::int64_t dim = r.i64("a tensor dim");
      if (dim < 0) bad("tensor " + t.name + " has a negative dim " + std::to_string(dim));
      const auto u = static_cast<std::uint64_t>(dim);
      if (u != 0 && product > std::numeric_limits<std::uint64_t>::max() / u) overflow = true;
      else product *= u;
      t.shape.push_back(dim);
    }
    const std::uint64_t n = r.u64("a tensor's value count");
    if (overflow || n != product)
      bad("tensor " + t.name + " has " + std::to_string(n) + " values but shape " + shape_string(t.shape));
    r.count(n, 4, "tensor value");
    t.values.resize(n);
    for (float& v : t.values) v = r.f32("a tensor value");
    c.tensors.push_back(std::move(t));
  }
  const std::uint64_t nc = r.count(r.u32("the counter count"), 4 + 8, "counter");
  for (std::uint64_t i = 0; i < nc; ++i) {
    std::string name = r.str("a counter name");
    const std::int64_t v = r.i64("a counter value");
    if (v < 0) bad("counter " + name + " is negative (" + std::to_string(v) + ")");
    c.counters.emplace_back(std::move(name), v);
  }
  c.scaler_state = r.str("the scaler state");
  c.data_epoch = r.u64("the data epoch");
  c.data_position = r.i64("the data position");
  if (c.data_position < 0) bad("the data position " + std::to_string(c.data_position) + " is negative");
  const std::uint64_t nr = r.count(r.u32("the generator count"), 8 + 1 + 8, "generator");
  for (std::uint64_t i = 0; i < nr; ++i) {
    Rng::State s;
    s.word = r.u64("a generator state");
    s.has_spare = r.boolean("a generator's spare flag");
    s.spare = r.f64("a generator's spare normal");
    if (s.has_spare ? !std::isfinite(s.spare) : s.spare != 0.0)
      bad("generator " + std::to_string(i) + " has a spare normal that no generator can hold");
    c.rngs.push_back(s);
  }
  const std::uint64_t nh = r.count(r.u64("the history length"), 8 + 4 + 4 + 1, "history record");
  if (nh != static_cast<std::uint64_t>(c.step))
    bad("the history has " + std::to_string(nh) + " records for step " + std::to_string(c.step));
  c.history.resize(nh);
  for (std::uint64_t i = 0; i < nh; ++i) {
    StepRecord& s = c.history[i];
    s.step = r.i64("a history step");
    s.loss = r.f32("a history loss");
    s.scale = r.f32("a history scale");
    s.skipped = r.boolean("a history skipped flag");
    if (s.step != static_cast<std::int64_t>(i + 1))
      bad("history record " + std::to_string(i + 1) + " is for step " + std::to_string(s.step));
    if (!std::isfinite(s.scale) || s.scale < 0)
      bad("history record " + std::to_string(i + 1) + " has a scale that is not finite and >= 0");
  }
  if (r.left() != 0) bad(std::to_string(r.left()) + " bytes after the last field");
  return c;
}

Checkpoint parse_checkpoint(std::string_view bytes) {
  if (bytes.size() < kHeader + kTrailer)
    bad("too short: " + std::to_string(bytes.size()) + " bytes, a checkpoint has at least " +
        std::to_string(kHeader + kTrailer));
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) bad("bad magic: this is not an mpt checkpoint");
  Reader h(bytes.substr(8, 12));
  const std::uint32_t version = h.u32("the version");
  if (version != kCheckpointVersion)
    bad("format version " + std::to_string(version) + " is not supported; this mpt reads version " +
        std::to_string(kCheckpointVersion));
  const std::uint64_t length = h.u64("the payload length");
  if (length != bytes.size() - kHeader - kTrailer)
    bad("truncated or padded: the header says " + std::to_string(length) + " payload bytes, the file has " +
        std::to_string(bytes.size() - kHeader - kTrailer));
  Reader t(bytes.substr(bytes.size() - kTrailer));
  if (t.u64("the checksum") != fnv1a64(bytes.substr(0, bytes.size() - kTrailer)))
    bad("checksum mismatch: the file is corrupted");
  return parse_checkpoint_payload(bytes.substr(kHeader, static_cast<std::size_t>(length)));
}

std::string checkpoint_file_name(std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%09lld.mpt", static_cast<long long>(step));
  return name;
}

namespace {

// Exactly ckpt-<9 digits>.mpt, or (`temporary`) that with ".tmp" after it.
bool is_checkpoint_name(const std::string& name, bool temporary) {
  const std::size_t size = temporary ? 22 : 18;
  if (name.size() != size || name.compare(0, 5, "ckpt-") != 0 || name.compare(14, 4, ".mpt") != 0)
    return false;
  if (temporary && name.compare(18, 4, ".tmp") != 0) return false;
  return std::all_of(name.begin() + 5, name.begin() + 14, [](char ch) { return ch >= '0' && ch <= '9'; });
}

// The names in `dir`.
std::vector<std::string> entries_of(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr)
    throw std::invalid_argument("cannot read the checkpoint directory '" + dir +
                                "': " + std::strerror(errno));
  std::vector<std::string> out;
  while (const dirent* e = ::readdir(d)) out.emplace_back(e->d_name);
  ::closedir(d);
  return out;
}

}  // namespace

std::vector<std::pair<std::int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  for (const std::string& name : entries_of(dir)) {
    if (!is_checkpoint_name(name, false)) continue;  // a temporary is not one
    const std::string path = dir + "/" + name;
    if (file_kind(path) != "a regular file") continue;
    out.emplace_back(std::stoll(name.substr(5, 9)), path);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void check_checkpoint_directory(const std::string& dir) {
  for (const std::string& name : entries_of(dir)) {
    const bool temporary = is_checkpoint_name(name, true);
    if (!temporary && !is_checkpoint_name(name, false)) continue;
    const std::string path = dir + "/" + name;
    // A checkpoint is written through a link; its temporary never is.
    const std::string kind = file_kind(path, !temporary);
    if (!kind.empty() && kind != "a regular file")
      throw std::invalid_argument("'" + path + "' is " + kind + ", not a " +
                                  (temporary ? "checkpoint's temporary file" : "checkpoint file") +
                                  "; move it away or give another checkpoint directory");
  }
}

std::optional<ConfigDifference> configuration_difference(const RunConfig& theirs, const RunConfig& ours) {
  if (theirs.model != ours.model) return ConfigDifference{"model", theirs.model, ours.model};
  if (theirs.data != ours.data) return ConfigDifference{"data", theirs.data, ours.data};
  if (theirs.policy != ours.policy) return ConfigDifference{"policy", theirs.policy, ours.policy};
  if (theirs.scaler != ours.scaler) return ConfigDifference{"scaler", theirs.scaler, ours.scaler};
  if (theirs.optimizer != ours.optimizer)
    return ConfigDifference{"optimizer", theirs.optimizer, ours.optimizer};
  if (theirs.lr != ours.lr)
    return ConfigDifference{"lr", shortest_decimal(theirs.lr), shortest_decimal(ours.lr)};
  if (theirs.seed != ours.seed)
    return ConfigDifference{"seed", std::to_string(theirs.seed.value_or(0)),
                            std::to_string(ours.seed.value_or(0))};
  return std::nullopt;
}

bool same_run_configuration(const RunConfig& a, const RunConfig& b) {
  return !configuration_difference(a, b);
}

namespace {

bool same_record(const StepRecord& a, const StepRecord& b) {
  std::uint32_t la = 0, lb = 0, sa = 0, sb = 0;
  std::memcpy(&la, &a.loss, 4);
  std::memcpy(&lb, &b.loss, 4);
  std::memcpy(&sa, &a.scale, 4);
  std::memcpy(&sb, &b.scale, 4);
  return a.step == b.step && la == lb && sa == sb && a.skipped == b.skipped;
}

// The first step at which two histories disagree where both have a record,
// or 0 when one is a prefix of the other.
std::int64_t first_disagreement(const std::vector<StepRecord>& a, const std::vector<StepRecord>& b) {
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i)
    if (!same_record(a[i], b[i])) return static_cast<std::int64_t>(i) + 1;
  return 0;
}

// The checkpoint at `path`, or nothing when it does not parse.
std::optional<Checkpoint> complete_checkpoint(const std::string& path) {
  try {
    return read_checkpoint_file(path);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
}

}  // namespace

bool is_of_run(const Checkpoint& c, const RunConfig& config, const std::vector<StepRecord>& history) {
  return same_run_configuration(c.config, config) && first_disagreement(c.history, history) == 0;
}

std::string other_runs_checkpoint(const std::string& dir, const RunConfig& config,
                                  const std::vector<StepRecord>& history) {
  for (const auto& [step, path] : list_checkpoints(dir)) {
    const std::optional<Checkpoint> c = complete_checkpoint(path);
    if (!c) continue;
    if (const auto d = configuration_difference(c->config, config))
      return path + " (" + d->field + " " + d->theirs + ", where this run has " + d->field + " " + d->ours +
             ")";
    const std::int64_t k = first_disagreement(c->history, history);
    if (k != 0)
      return path + " (the same configuration, but its history differs from this run's at step " +
             std::to_string(k) + ")";
  }
  return "";
}

std::string save_checkpoint(const std::string& dir, const Checkpoint& c,
                            const std::function<void(AtomicWriteStage)>& observe) {
  std::string path = dir + "/" + checkpoint_file_name(c.step);
  write_file_atomically(path, serialize_checkpoint(c), observe);
  std::vector<std::pair<std::int64_t, std::string>> all;
  try {
    all = list_checkpoints(dir);
  } catch (const std::invalid_argument& e) {
    throw FileWriteError(e.what());
  }
  // This run's files, newest first; the one just written counts.
  std::size_t kept = 0;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const bool mine = it->second == path || [&] {
      const std::optional<Checkpoint> other = complete_checkpoint(it->second);
      return other && is_of_run(*other, c.config, c.history);
    }();
    if (!mine) continue;
    if (++kept > 2) std::remove(it->second.c_str());
  }
  return path;
}

Checkpoint read_checkpoint_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) bad("checkpoint " + path + ": cannot be read: " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0 || static_cast<std::uint64_t>(size) > kMaxFileBytes)
    bad("checkpoint " + path + ": larger than 1 GiB, not a checkpoint of these models");
  in.seekg(0);
  std::string bytes(static_cast<std::size_t>(size), '\0');
  in.read(bytes.data(), size);
  if (!in) bad("checkpoint " + path + ": cannot be read");
  try {
    return parse_checkpoint(bytes);
  } catch (const std::invalid_argument& e) {
    bad("checkpoint " + path + ": " + e.what());
  }
}

}  // namespace mpt::train
