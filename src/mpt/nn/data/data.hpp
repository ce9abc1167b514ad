// Chapter 02 — loss scaling and FP32 master weights.
// Depends on: the core tier (tensor.hpp: MatrixF, random.hpp: Rng, input_error.hpp:
// InputFileError), Eigen; zlib in data.cpp.
//
// Data for the training chapters: a portable seeded random generator,
// seeded mini-batches (Batches), synthetic sets built to make a failure happen deterministically, and the
// handwritten digits set (1797 8x8 images) read from the digits.csv.gz that
// Debian's python3-sklearn package ships. Nothing is downloaded at run
// time: tools/fetch_digits.sh (or the `fetch-data` build target) extracts
// the file from the .deb once, and a missing file is an error saying so.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "mpt/core/random.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/io/input_error.hpp"

namespace mpt {

/// A supervised data set: inputs plus either class labels or regression targets.
struct Dataset {
  std::string name;         ///< e.g. "digits", "blobs"
  MatrixF x;                ///< [N, features] inputs
  std::vector<int> labels;  ///< N class ids in [0, num_classes) — classification only
  MatrixF targets;          ///< [N, outputs] — regression only
  int num_classes = 0;      ///< > 0 for classification, 0 for regression

  /// Number of samples N.
  Eigen::Index size() const { return x.rows(); }
  /// True when the set has class labels.
  bool is_classification() const { return num_classes > 0; }
  /// The samples at `index`, in that order (a gather: batches, splits).
  Dataset rows(const std::vector<Eigen::Index>& index) const;
  /// `count` consecutive samples from `begin` (clamped to the end).
  Dataset slice(Eigen::Index begin, Eigen::Index count) const;
};

/// 0..n-1 in a seeded random order (Fisher–Yates with Rng).
std::vector<Eigen::Index> shuffled_indices(Eigen::Index n, std::uint64_t seed);

/// Mini-batches drawn from a fresh seeded permutation each epoch, so every
/// run with the same seed sees the same batches in the same order. Epoch e
/// (1-based) uses shuffled_indices(N, seed + e − 1); a batch that would run
/// past the end of the permutation starts the next epoch instead.
class Batches {
 public:
  /// Batches of `batch` rows of `d` (which must outlive them), shuffled from `seed`.
  Batches(const Dataset& d, Eigen::Index batch, std::uint64_t seed) : data_(&d), batch_(batch), seed_(seed) {}
  /// The next batch; a new epoch (a new permutation) when this one is used up.
  Dataset next() {
    if (order_.empty() || pos_ + batch_ > data_->size()) {
      order_ = shuffled_indices(data_->size(), seed_ + epoch_++);
      pos_ = 0;
    }
    std::vector<Eigen::Index> idx(order_.begin() + pos_, order_.begin() + pos_ + batch_);
    pos_ += batch_;
    return data_->rows(idx);
  }
  /// Epochs started so far (0 before the first batch).
  std::uint64_t epoch() const { return epoch_; }
  /// Rows of the current epoch's permutation already handed out.
  Eigen::Index position() const { return pos_; }
  /// Continue where a Batches over the same data, batch size and seed was
  /// (its epoch() and position()): the permutation is regenerated from the
  /// seed. Throws std::invalid_argument for a position that is not a whole
  /// number of batches within one epoch, or a nonzero position before the
  /// first epoch.
  void restore(std::uint64_t epoch, Eigen::Index position) {
    if (epoch == 0 ? position != 0 : position < batch_ || position > data_->size() || position % batch_ != 0)
      throw std::invalid_argument("batch position " + std::to_string(position) + " of epoch " +
                                  std::to_string(epoch) + " is not a whole number of batches of " +
                                  std::to_string(batch_) + " within " + std::to_string(data_->size()) +
                                  " rows");
    epoch_ = epoch;
    pos_ = position;
    if (epoch == 0) order_.clear();
    else order_ = shuffled_indices(data_->size(), seed_ + epoch - 1);
  }

 private:
  const Dataset* data_;
  Eigen::Index batch_, pos_ = 0;
  std::uint64_t seed_, epoch_ = 0;
  std::vector<Eigen::Index> order_;
};

/// A train/test partition of one data set.
struct Split {
  Dataset train;  ///< the samples to train on
  Dataset test;   ///< the held-out samples
};

/// Shuffle with `seed`, then put round(test_fraction·N) samples in `test`
/// and the rest in `train`. Deterministic; every sample lands in exactly one.
/// Throws std::invalid_argument unless 0 < test_fraction < 1.
Split train_test_split(const Dataset& d, double test_fraction, std::uint64_t seed);

// --- synthetic sets ------------------------------------------------------------

/// Gaussian blobs: an easy classification set an MLP learns in a few
/// hundred steps in any precision — the baseline for "fp16 matches fp32".
struct BlobsOptions {
  Eigen::Index samples = 512;  ///< N
  int features = 8;            ///< input dimension
  int classes = 4;             ///< number of blobs, one class each
  double center_range = 2.0;   ///< centres uniform in [-center_range, center_range]^features
  double spread = 1.0;         ///< standard deviation around each centre
  std::uint64_t seed = 1;      ///< everything follows from the seed
};
/// Samples are assigned to classes round-robin (balanced), then drawn
/// around their class centre.
Dataset make_blobs(const BlobsOptions& o = {});

/// A regression whose targets are tiny: t = target_scale · tanh(x·Aᵀ)·Bᵀ,
/// a random teacher network on standard-normal inputs. Built for the
/// "no loss scaling" failure. Train it with Adam (whose update does not
/// depend on the gradient's magnitude, so FP32 training proceeds as it
/// would with large targets) and a zero-initialised output layer
/// (MlpConfig::zero_init_output, so the output starts at the targets'
/// scale). The gradients that then reach the hidden layers carry the
/// factor target_scale twice — once from the residual, once from the small
/// output weights — and, divided by batch·outputs, most fall below fp16's
/// 2^-24: without loss scaling they flush to zero and the hidden layers stop
/// learning, while FP32, BF16 and loss-scaled FP16 train on. The targets
/// themselves are mostly normal fp16 numbers: it is the gradients that
/// underflow.
struct TinyTargetOptions {
  Eigen::Index samples = 512;  ///< N
  int features = 8;            ///< input dimension
  int outputs = 4;             ///< target dimension
  int teacher_hidden = 16;     ///< width of the teacher's hidden layer
  double target_scale = 1e-3;  ///< multiplies the teacher's output
  std::uint64_t seed = 2;      ///< everything follows from the seed
};
/// See TinyTargetOptions.
Dataset make_tiny_target_regression(const TinyTargetOptions& o = {});

// --- the digits set --------------------------------------------------------------

/// Thrown when a data file is absent; what() (one line) says how to get it.
class DataFileMissing : public InputFileError {
 public:
  using InputFileError::InputFileError;
};

/// Where the real data sets live: $MPT_DATA_DIR when set and non-empty,
/// else the build's data directory (MPT_DATA_DIR at configure time,
/// default `BUILD_DIR/data`), else "data".
std::string default_data_dir();
/// default_data_dir() + "/digits.csv.gz".
std::string digits_path();
/// How to obtain digits.csv.gz into `dir`: the exact commands, one per line.
std::string digits_fetch_instructions(const std::string& dir);

/// Read a digits CSV, gzip-compressed (zlib; nothing is shelled out): one
/// row per image, 64 pixel counts 0..16 (8x8, row-major) then the label
/// 0..9, comma-separated, no header. Pixels become x = count/16 in [0, 1]
/// (exact in fp16 and bf16). Throws DataFileMissing (with the fetch
/// commands) when the file does not exist, InputFileError (a
/// std::runtime_error; one line) naming the file and line for anything
/// unreadable or malformed.
Dataset load_digits(const std::string& path);
/// load_digits(digits_path()).
Dataset load_digits();

}  // namespace mpt
