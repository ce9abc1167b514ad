// Chapters 04 onwards — checkpoints of a training run: what a resumed run
// needs to continue bit for bit, a binary file format for it, and the
// atomic, crash-safe way it is written and found again.
// Depends on: the core tier (random.hpp: Rng::State, tensor.hpp: Shape,
// atomic_file.hpp: the atomic write and its stages).
//
// The file (all integers and floats little-endian, floats IEEE-754):
//
//   offset 0   8 bytes   magic "MPTCKPT" followed by a zero byte
//          8   u32       format version (kCheckpointVersion)
//         12   u64       L, the payload's length in bytes
//         20   L bytes   the payload (below)
//     20 + L   u64       FNV-1a 64 of bytes [0, 20 + L): every byte before it
//
// The file is exactly 28 + L bytes. The payload, field after field, where
// str is a u32 length and that many bytes, and a count comes before what it
// counts:
//
//   config     str model, str data, str policy, str scaler, str optimizer,
//              f64 lr, u64 seed, i64 steps, i64 every
//   step       i64: steps taken
//   tensors    u32 count; each: str name, u32 rank (<= 8), i64 dims[rank],
//              u64 n (the product of dims), f32 values[n]
//   counters   u32 count; each: str name, i64 value
//   scaler     str: GradScaler::state_dict() JSON ("{}" when disabled or static)
//   data       u64 epoch, i64 position: where Batches is (0, 0 for text)
//   rngs       u32 count; each: u64 word, u8 has_spare (0/1), f64 spare
//   history    u64 count (= step); each: i64 step, f32 loss, f32 scale, u8 skipped
//
// and nothing after it. Tensor names say what they hold: "master/<param>"
// (every parameter's FP32 master, in parameter order), "running_mean/<bn>"
// and "running_var/<bn>" (BatchNorm's estimates, widened to FP32 from their
// dtype), "sgd.momentum/<param>" (once SGD has them), "adamw.m/<param>",
// "adamw.v/<param>"; counters "num_batches_tracked/<bn>" and "adamw.steps".
//
// Files are DIR/ckpt-NNNNNNNNN.mpt (the step, 9 digits), written with
// write_file_atomically() (the temporary DIR/ckpt-NNNNNNNNN.mpt.tmp, which
// nothing here reads); after each save only the newest two of the writing
// run's are kept.
//
// One directory, one run. A checkpoint is *of a run* when it has the run's
// configuration (the fields a resume must match: same_run_configuration())
// and its history and the run's agree step for step as far as both go (one
// is a prefix of the other, bit for bit): a run resumed from it continues
// it. The newest-two rule deletes only the writing run's files; another
// run's are never touched. Two runs writing one directory at once are kept
// apart by a lock (io/directory_lock.hpp), which `mpt train` takes before
// it trains; a run that would overwrite another run's checkpoint is refused
// before it starts (other_runs_checkpoint()).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mpt/core/random.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/io/atomic_file.hpp"

namespace mpt::train {

/// The format version this library writes and reads.
inline constexpr std::uint32_t kCheckpointVersion = 1;

/// What a run is made of. resolve_config() (run.hpp) fills the defaults
/// and checks every field.
struct RunConfig {
  std::string model = "mlp";  ///< mlp | cnn | transformer
  std::string data;  ///< synthetic | digits (mlp), digits (cnn), text (transformer); "" = the model's first
  std::string policy = "f32";      ///< the policy string's canonical text (policy_string.hpp)
  std::string scaler = "dynamic";  ///< dynamic | static:S | none
  std::string optimizer;  ///< sgd | adamw; "" = the model's (sgd for mlp and cnn, adamw for transformer)
  double lr = 0;          ///< learning rate; 0 = the optimizer's default (sgd 0.05, adamw 3e-3)
  std::optional<std::uint64_t>
      seed;                  ///< initial weights; unset = the chapter's (mlp 7, cnn 3, transformer 1)
  std::int64_t steps = 100;  ///< steps to run in all
  std::int64_t every = 0;    ///< checkpoint every this many steps (0: never)
};

/// What one step did.
struct StepRecord {
  std::int64_t step = 0;  ///< 1-based
  float loss = 0;         ///< the batch's FP32 training loss, before the step
  float scale = 1;        ///< the loss scale the step ran with (1 without a scaler)
  bool skipped = false;   ///< the scaler skipped the optimizer step (inf/NaN gradient)
};

/// A named FP32 tensor of a checkpoint.
struct TensorRecord {
  std::string name;           ///< see the file comment
  Shape shape;                ///< its dims
  std::vector<float> values;  ///< numel(shape) values, row-major
};

/// Everything a resumed run needs (see the file comment).
struct Checkpoint {
  RunConfig config;                   ///< the resolved configuration it was made with
  std::int64_t step = 0;              ///< steps taken
  std::vector<TensorRecord> tensors;  ///< masters, buffers, optimizer state
  std::vector<std::pair<std::string, std::int64_t>> counters;  ///< whole-number state
  std::string scaler_state = "{}";                             ///< GradScaler::state_dict()
  std::uint64_t data_epoch = 0;                                ///< Batches::epoch()
  std::int64_t data_position = 0;                              ///< Batches::position()
  std::vector<Rng::State> rngs;     ///< every generator the run draws from, in order
  std::vector<StepRecord> history;  ///< every step's record (step of them)
};

/// The file's bytes (see the file comment).
std::string serialize_checkpoint(const Checkpoint& c);

/// The checkpoint in `bytes`: a pure function of them. Every malformed
/// input is std::invalid_argument with one line saying what is wrong (too
/// short, bad magic, another version, a length that does not match the
/// size, a checksum mismatch, then parse_checkpoint_payload's errors); no
/// allocation is larger than the input.
Checkpoint parse_checkpoint(std::string_view bytes);

/// The payload alone (no header, no checksum): what parse_checkpoint()
/// reads once the checksum matched, for fuzzing past it.
/// std::invalid_argument (one line) for a field that runs past the end, a
/// count or length larger than what is left, a string that is not printable
/// ASCII, a rank above 8, dims whose product is not n, a bool byte that is
/// not 0/1, an lr that is not finite and > 0, a negative step or position, a
/// non-finite pending normal, a history that is not steps 1..step or has a
/// scale that is not finite and >= 0, and trailing bytes.
Checkpoint parse_checkpoint_payload(std::string_view payload);

/// "ckpt-NNNNNNNNN.mpt" for `step` (9 digits).
std::string checkpoint_file_name(std::int64_t step);

/// The complete checkpoints in `dir` (regular files, or links to them,
/// named ckpt-NNNNNNNNN.mpt; temporaries, other names and anything that is
/// not a regular file ignored: the newest-two rule never removes a
/// directory or a FIFO, --resume never opens one), as (step, path), oldest
/// first. A directory that cannot be read: std::invalid_argument naming it.
std::vector<std::pair<std::int64_t, std::string>> list_checkpoints(const std::string& dir);

/// Refuse, before a run starts, a checkpoint directory `dir` that
/// save_checkpoint() could fail in: an entry named like a checkpoint
/// (ckpt-NNNNNNNNN.mpt) that is, or links to, something other than a
/// regular file, or its temporary (ckpt-NNNNNNNNN.mpt.tmp) that is not a
/// regular file (write_file_atomically() refuses both). std::invalid_argument,
/// one line naming the entry, what it is and what to do; also for a
/// directory that cannot be read.
void check_checkpoint_directory(const std::string& dir);

/// The first field, in the order model, data, policy, scaler, optimizer,
/// lr, seed, in which two configurations differ, with both values as text
/// (check_resumable()'s refusal and other_runs_checkpoint()'s phrase are
/// made from it); steps and every are not compared.
struct ConfigDifference {
  std::string field;   ///< "seed", "lr", ...
  std::string theirs;  ///< the first configuration's value
  std::string ours;    ///< the second's
};

/// See ConfigDifference; nothing when the two make the same run.
std::optional<ConfigDifference> configuration_difference(const RunConfig& theirs, const RunConfig& ours);

/// Whether `a` and `b` make the same run: equal in every field a resume
/// must match (configuration_difference() finds none).
bool same_run_configuration(const RunConfig& a, const RunConfig& b);

/// Whether checkpoint `c` is of the run with configuration `config` and
/// history `history` so far: the same run configuration, and one history a
/// prefix of the other (step, loss and scale bits, skipped).
bool is_of_run(const Checkpoint& c, const RunConfig& config, const std::vector<StepRecord>& history);

/// The first complete checkpoint in `dir` (oldest first) that is not of the
/// run (`config`, `history`), described in one phrase: "PATH (seed 1, where
/// this run has seed 2)" or "PATH (its history differs from this run's at
/// step K)"; "" when there is none. A file named like a checkpoint that does
/// not parse is nobody's complete checkpoint and is skipped. A directory
/// that cannot be read: std::invalid_argument naming it.
std::string other_runs_checkpoint(const std::string& dir, const RunConfig& config,
                                  const std::vector<StepRecord>& history);

/// Write `c` to dir/checkpoint_file_name(c.step) atomically (the previous
/// checkpoints stay until it is complete), then delete the checkpoints of
/// c's run (is_of_run(file, c.config, c.history)) but the newest two; files
/// of other runs, and files that do not parse, are kept. `observe` sees the
/// atomic write's stages. Returns the path.
/// \throws FileWriteError when the write fails (nothing old is lost).
std::string save_checkpoint(const std::string& dir, const Checkpoint& c,
                            const std::function<void(AtomicWriteStage)>& observe = {});

/// parse_checkpoint() of the file at `path`; every error (unreadable,
/// larger than 1 GiB, malformed) is std::invalid_argument
/// "checkpoint PATH: <what>".
Checkpoint read_checkpoint_file(const std::string& path);

}  // namespace mpt::train
