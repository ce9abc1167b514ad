// Chapter 02 — loss scaling and FP32 master weights.
// Depends on: data.hpp; zlib (gzip reading).
//
// The synthetic sets and the digits loader (the generator is random.cpp).
// MPT_DEFAULT_DATA_DIR and MPT_SOURCE_DIR come from cmake/MptData.cmake.
#include "mpt/nn/data/data.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include <zlib.h>

namespace mpt {

// --- Dataset -----------------------------------------------------------------------

Dataset Dataset::rows(const std::vector<Eigen::Index>& index) const {
  Dataset out;
  out.name = name;
  out.num_classes = num_classes;
  const auto n = static_cast<Eigen::Index>(index.size());
  out.x.resize(n, x.cols());
  if (targets.size() > 0) out.targets.resize(n, targets.cols());
  if (!labels.empty()) out.labels.resize(index.size());
  for (Eigen::Index i = 0; i < n; ++i) {
    const Eigen::Index r = index[static_cast<std::size_t>(i)];
    if (r < 0 || r >= size())
      throw std::out_of_range("Dataset::rows: index " + std::to_string(r) + " outside 0.." +
                              std::to_string(size() - 1));
    out.x.row(i) = x.row(r);
    if (targets.size() > 0) out.targets.row(i) = targets.row(r);
    if (!labels.empty()) out.labels[static_cast<std::size_t>(i)] = labels[static_cast<std::size_t>(r)];
  }
  return out;
}

Dataset Dataset::slice(Eigen::Index begin, Eigen::Index count) const {
  begin = std::max<Eigen::Index>(0, std::min(begin, size()));
  count = std::max<Eigen::Index>(0, std::min(count, size() - begin));
  std::vector<Eigen::Index> index(static_cast<std::size_t>(count));
  for (Eigen::Index i = 0; i < count; ++i) index[static_cast<std::size_t>(i)] = begin + i;
  return rows(index);
}

std::vector<Eigen::Index> shuffled_indices(Eigen::Index n, std::uint64_t seed) {
  std::vector<Eigen::Index> v(static_cast<std::size_t>(std::max<Eigen::Index>(n, 0)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<Eigen::Index>(i);
  Rng rng(seed);
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
  return v;
}

Split train_test_split(const Dataset& d, double test_fraction, std::uint64_t seed) {
  if (!(test_fraction > 0.0 && test_fraction < 1.0))
    throw std::invalid_argument("train_test_split: test_fraction must be in (0, 1), got " +
                                std::to_string(test_fraction));
  const std::vector<Eigen::Index> order = shuffled_indices(d.size(), seed);
  const auto n_test = static_cast<std::size_t>(std::llround(test_fraction * static_cast<double>(d.size())));
  const std::vector<Eigen::Index> test(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n_test));
  const std::vector<Eigen::Index> train(order.begin() + static_cast<std::ptrdiff_t>(n_test), order.end());
  return {d.rows(train), d.rows(test)};
}

// --- synthetic sets ------------------------------------------------------------------

Dataset make_blobs(const BlobsOptions& o) {
  if (o.samples <= 0 || o.features <= 0 || o.classes <= 1)
    throw std::invalid_argument("make_blobs: need samples > 0, features > 0, classes > 1");
  Rng rng(o.seed);
  MatrixF centers(o.classes, o.features);
  for (Eigen::Index i = 0; i < centers.size(); ++i)
    centers.data()[i] = static_cast<float>(rng.uniform(-o.center_range, o.center_range));
  Dataset d;
  d.name = "blobs";
  d.num_classes = o.classes;
  d.x.resize(o.samples, o.features);
  d.labels.resize(static_cast<std::size_t>(o.samples));
  for (Eigen::Index i = 0; i < o.samples; ++i) {
    const int c = static_cast<int>(i % o.classes);
    d.labels[static_cast<std::size_t>(i)] = c;
    for (int j = 0; j < o.features; ++j)
      d.x(i, j) = centers(c, j) + static_cast<float>(o.spread * rng.normal());
  }
  return d;
}

Dataset make_tiny_target_regression(const TinyTargetOptions& o) {
  if (o.samples <= 0 || o.features <= 0 || o.outputs <= 0 || o.teacher_hidden <= 0)
    throw std::invalid_argument("make_tiny_target_regression: sizes must be positive");
  Rng rng(o.seed);
  // Teacher weights N(0, 1/fan_in): its hidden pre-activations are O(1), so
  // tanh is in its curved range and the targets are O(target_scale).
  Eigen::MatrixXd a(o.teacher_hidden, o.features), b(o.outputs, o.teacher_hidden);
  for (Eigen::Index i = 0; i < a.size(); ++i) a.data()[i] = rng.normal() / std::sqrt(double(o.features));
  for (Eigen::Index i = 0; i < b.size(); ++i)
    b.data()[i] = rng.normal() / std::sqrt(double(o.teacher_hidden));
  Eigen::MatrixXd x(o.samples, o.features);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = rng.normal();
  const Eigen::MatrixXd h = (x * a.transpose()).array().tanh().matrix();
  const Eigen::MatrixXd t = o.target_scale * (h * b.transpose());
  Dataset d;
  d.name = "tiny-target regression";
  d.x = x.cast<float>();
  d.targets = t.cast<float>();
  return d;
}

// --- digits ------------------------------------------------------------------------------

std::string default_data_dir() {
  if (const char* env = std::getenv("MPT_DATA_DIR"); env && *env) return env;
#if defined(MPT_DEFAULT_DATA_DIR)
  return MPT_DEFAULT_DATA_DIR;
#else
  return "data";
#endif
}

std::string digits_path() { return default_data_dir() + "/digits.csv.gz"; }

namespace {

std::string fetch_script() {
#if defined(MPT_SOURCE_DIR)
  return std::string(MPT_SOURCE_DIR) + "/tools/fetch_digits.sh";
#else
  return "tools/fetch_digits.sh";
#endif
}

}  // namespace

std::string digits_fetch_instructions(const std::string& dir) {
  return "Get it (extracted from Debian's python3-sklearn package; no Python is installed) with:\n"
         "  " +
         fetch_script() + " " + dir +
         "\n"
         "or, from a configured build directory: cmake --build <build-dir> --target fetch-data\n"
         "Set MPT_DATA_DIR to read the data from another directory.";
}

namespace {

std::string read_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw InputFileError(path + ": cannot open for reading; give a gzip-compressed digits CSV");
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int code = 0;
      const std::string msg = gzerror(f, &code);
      gzclose(f);
      throw InputFileError(path + ": not a readable gzip file (" + msg +
                           "); give a gzip-compressed digits CSV");
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  // A stream that ends early is not an error to gzread; zlib records it
  // (Z_BUF_ERROR) for gzerror to report.
  int code = Z_OK;
  const std::string msg = gzerror(f, &code);
  gzclose(f);
  if (code != Z_OK && code != Z_STREAM_END)
    throw InputFileError(path + ": not a readable gzip file (" + msg +
                         "; truncated?); give a whole gzip-compressed digits CSV");
  return out;
}

}  // namespace

Dataset load_digits(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    const std::string dir = std::filesystem::path(path).parent_path().string();
    throw DataFileMissing("digits data file not found: " + path + "; get it with " + fetch_script() + " " +
                          (dir.empty() ? "." : dir) +
                          " (it extracts the file from Debian's python3-sklearn package), or from a "
                          "configured build directory with cmake --build <build-dir> --target fetch-data, "
                          "or set MPT_DATA_DIR to the directory that holds digits.csv.gz");
  }
  const std::string text = read_gzip(path);
  constexpr int kPixels = 64;
  std::vector<float> pixels;
  std::vector<int> labels;
  std::size_t pos = 0;
  int line = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string row = text.substr(pos, end - pos);
    pos = end + 1;
    ++line;
    if (!row.empty() && row.back() == '\r') row.pop_back();
    if (row.empty()) continue;
    const auto fail = [&](const std::string& why) {
      throw InputFileError(path + " line " + std::to_string(line) + ": " + why +
                           " (expected 64 pixel counts 0..16 and a label 0..9, "
                           "comma-separated)");
    };
    int field = 0;
    std::size_t p = 0;
    while (true) {
      const std::size_t comma = row.find(',', p);
      const std::string cell = row.substr(p, comma == std::string::npos ? std::string::npos : comma - p);
      char* stop = nullptr;
      const double v = std::strtod(cell.c_str(), &stop);
      if (cell.empty() || *stop != '\0' || v != std::floor(v))
        fail("field " + std::to_string(field + 1) + " is '" + cell + "', not an integer");
      if (field < kPixels) {
        if (v < 0 || v > 16) fail("pixel " + std::to_string(field + 1) + " is " + cell);
        pixels.push_back(static_cast<float>(v / 16.0));
      } else if (field == kPixels) {
        if (v < 0 || v > 9) fail("label is " + cell);
        labels.push_back(static_cast<int>(v));
      }
      ++field;
      if (comma == std::string::npos) break;
      p = comma + 1;
    }
    if (field != kPixels + 1) fail(std::to_string(field) + " fields");
  }
  if (labels.empty())
    throw InputFileError(path +
                         ": no rows; expected one row per image, 64 pixel counts 0..16 and a label 0..9");
  Dataset d;
  d.name = "digits";
  d.num_classes = 10;
  d.labels = std::move(labels);
  d.x = Eigen::Map<const MatrixF>(pixels.data(), static_cast<Eigen::Index>(d.labels.size()), kPixels);
  return d;
}

Dataset load_digits() { return load_digits(digits_path()); }

}  // namespace mpt
