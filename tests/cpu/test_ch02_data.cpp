// Chapter 02 — loss scaling and FP32 master weights: data.
// The portable generator pinned to known values, the synthetic sets
// deterministic, splits exact partitions, and the digits loader on small
// gzip files this test writes itself with zlib (the real file has its own
// suite, test_ch02_digits_data.cpp).
// Depends on: mpt/data.hpp; zlib (to write the test files).
#include <doctest/doctest.h>

#include <unistd.h>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include <zlib.h>

#include "mpt/nn/data/data.hpp"

using namespace mpt;
namespace fs = std::filesystem;

namespace {

// A scratch directory unique to this process, removed at the end.
struct ScratchDir {
  fs::path path = fs::temp_directory_path() / ("mpt-test-data-" + std::to_string(::getpid()));
  ScratchDir() { fs::create_directories(path); }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string write_gz(const fs::path& file, const std::string& text) {
  gzFile f = gzopen(file.string().c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, text.data(), static_cast<unsigned>(text.size())) == static_cast<int>(text.size()));
  REQUIRE(gzclose(f) == Z_OK);
  return file.string();
}

std::string row(int first_pixel, int label) {
  std::string r = std::to_string(first_pixel);
  for (int i = 1; i < 64; ++i) r += "," + std::to_string(i % 17);
  return r + "," + std::to_string(label) + "\n";
}

}  // namespace

TEST_CASE("Rng: SplitMix64 reference values, so every platform draws the same numbers") {
  Rng r(0);
  // SplitMix64 from state 0 (the published reference sequence).
  CHECK(r.next_u64() == 0xe220a8397b1dcdafull);
  CHECK(r.next_u64() == 0x6e789e6aa1b965f4ull);
  CHECK(r.next_u64() == 0x06c45d188009454full);
  Rng u(42);
  for (int i = 0; i < 1000; ++i) {
    const double v = u.uniform();
    REQUIRE(v >= 0.0);
    REQUIRE(v < 1.0);
    REQUIRE(u.below(7) < 7u);
  }
  CHECK_THROWS_AS(u.below(0), std::invalid_argument);
  // Normal draws: mean ≈ 0, variance ≈ 1 over 20000 samples (5σ bounds).
  Rng n(3);
  double sum = 0, sq = 0;
  const int count = 20000;
  for (int i = 0; i < count; ++i) {
    const double v = n.normal();
    sum += v;
    sq += v * v;
  }
  CHECK(std::fabs(sum / count) < 5 / std::sqrt(double(count)));
  CHECK(std::fabs(sq / count - 1) < 5 * std::sqrt(2.0 / count));
}

TEST_CASE("synthetic sets are deterministic in their seed") {
  const Dataset a = make_blobs(), b = make_blobs();
  BlobsOptions other;
  other.seed = 99;
  CHECK(a.x == b.x);
  CHECK(a.labels == b.labels);
  CHECK(a.x != make_blobs(other).x);
  CHECK(a.size() == 512);
  CHECK(a.x.cols() == 8);
  CHECK(a.num_classes == 4);
  CHECK(a.is_classification());
  CHECK(std::count(a.labels.begin(), a.labels.end(), 3) == 128);  // balanced
  CHECK_THROWS_AS(make_blobs(BlobsOptions{0, 8, 4, 2.0, 1.0, 1}), std::invalid_argument);

  const Dataset t = make_tiny_target_regression(), u = make_tiny_target_regression();
  CHECK(t.x == u.x);
  CHECK(t.targets == u.targets);
  CHECK_FALSE(t.is_classification());
  CHECK(t.targets.cols() == 4);
  // Targets at the requested scale: |t| ≤ scale·Σ|B| and typically ~scale.
  const double rms = std::sqrt(t.targets.cast<double>().array().square().mean());
  CHECK(rms > 1e-4);
  CHECK(rms < 1e-2);
  TinyTargetOptions big;
  big.target_scale = 1.0;
  CHECK((make_tiny_target_regression(big).targets - 1e3f * t.targets).cwiseAbs().maxCoeff() < 1e-4f);
}

TEST_CASE("train_test_split and rows: deterministic exact partitions") {
  const Dataset d = make_blobs();
  const Split s1 = train_test_split(d, 0.25, 7), s2 = train_test_split(d, 0.25, 7);
  CHECK(s1.test.size() == 128);
  CHECK(s1.train.size() == 384);
  CHECK(s1.test.x == s2.test.x);
  CHECK(s1.train.labels == s2.train.labels);
  CHECK(s1.test.x != train_test_split(d, 0.25, 8).test.x);
  // Every sample lands exactly once: match rows back by their first feature.
  std::multiset<float> all, parts;
  for (Eigen::Index i = 0; i < d.size(); ++i) all.insert(d.x(i, 0));
  for (const Dataset* p : {&s1.train, &s1.test})
    for (Eigen::Index i = 0; i < p->size(); ++i) parts.insert(p->x(i, 0));
  CHECK(all == parts);
  CHECK_THROWS_AS(train_test_split(d, 1.0, 1), std::invalid_argument);
  const std::vector<Eigen::Index> perm = shuffled_indices(10, 1);
  CHECK(std::set<Eigen::Index>(perm.begin(), perm.end()).size() == 10);
  CHECK(d.slice(500, 64).size() == 12);
  CHECK(d.rows({3, 1}).labels == std::vector<int>{d.labels[3], d.labels[1]});
  CHECK_THROWS_AS(d.rows({512}), std::out_of_range);
}

TEST_CASE("digits loader: parses a gzip CSV written here") {
  ScratchDir dir;
  const std::string path = write_gz(dir.path / "digits.csv.gz", row(0, 7) + row(16, 0) + "\r\n" + row(8, 9));
  const Dataset d = load_digits(path);
  CHECK(d.name == "digits");
  CHECK(d.size() == 3);
  CHECK(d.x.cols() == 64);
  CHECK(d.num_classes == 10);
  CHECK(d.labels == std::vector<int>{7, 0, 9});
  CHECK(d.x(0, 0) == 0.0f);
  CHECK(d.x(1, 0) == 1.0f);  // 16/16
  CHECK(d.x(2, 0) == 0.5f);
  CHECK(d.x(0, 5) == 5.0f / 16);
}

TEST_CASE("digits loader: malformed files are named, with the line") {
  ScratchDir dir;
  const auto message = [&](const std::string& text) {
    const std::string path = write_gz(dir.path / "bad.csv.gz", text);
    try {
      load_digits(path);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message(row(0, 1) + "1,2,3\n").find("bad.csv.gz line 2: 3 fields") != std::string::npos);
  CHECK(message(row(17, 1)).find("line 1: pixel 1 is 17") != std::string::npos);
  CHECK(message(row(0, 10)).find("line 1: label is 10") != std::string::npos);
  CHECK(message(row(0, 1).substr(0, row(0, 1).size() - 1) + ",3\n").find("66 fields") != std::string::npos);
  CHECK(message("x" + row(0, 1)).find("line 1: field 1 is 'x0', not an integer") != std::string::npos);
  CHECK(message("1.5" + row(0, 1).substr(1)).find("field 1 is '1.5', not an integer") != std::string::npos);
  CHECK(message("").find("no rows") != std::string::npos);
  // Corrupt and truncated gzip streams: zlib's complaint is reported.
  const auto write_raw = [&](const char* name, const std::string& bytes) {
    const fs::path p = dir.path / name;
    FILE* f = std::fopen(p.string().c_str(), "wb");
    REQUIRE(f);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    return p.string();
  };
  const std::string header("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10);
  CHECK_THROWS_WITH_AS(load_digits(write_raw("corrupt.csv.gz", header + "garbage-garbage")),
                       doctest::Contains("not a readable gzip file"), std::runtime_error);
  std::string whole;
  {
    const std::string good = write_gz(dir.path / "good.csv.gz", row(0, 1) + row(3, 2));
    FILE* f = std::fopen(good.c_str(), "rb");
    REQUIRE(f);
    char c;
    while (std::fread(&c, 1, 1, f) == 1) whole += c;
    std::fclose(f);
  }
  CHECK_THROWS_WITH_AS(load_digits(write_raw("truncated.csv.gz", whole.substr(0, whole.size() / 2))),
                       doctest::Contains("truncated?"), std::runtime_error);
}

TEST_CASE("digits loader: a missing file says how to get it") {
  ScratchDir dir;
  const std::string path = (dir.path / "nowhere" / "digits.csv.gz").string();
  try {
    load_digits(path);
    FAIL("no exception");
  } catch (const DataFileMissing& e) {
    const std::string m = e.what();
    CHECK(m.find("digits data file not found: " + path) != std::string::npos);
    CHECK(m.find("tools/fetch_digits.sh " + (dir.path / "nowhere").string()) != std::string::npos);
    CHECK(m.find("--target fetch-data") != std::string::npos);
    CHECK(m.find("MPT_DATA_DIR") != std::string::npos);
  }
}

TEST_CASE("the data directory: MPT_DATA_DIR overrides the build's default") {
  const char* saved = std::getenv("MPT_DATA_DIR");
  const std::string keep = saved ? saved : "";
  ::setenv("MPT_DATA_DIR", "/some/where", 1);
  CHECK(default_data_dir() == "/some/where");
  CHECK(digits_path() == "/some/where/digits.csv.gz");
  ::setenv("MPT_DATA_DIR", "", 1);  // empty means unset
  CHECK(default_data_dir() != "");
  CHECK(default_data_dir() != "/some/where");
  if (saved) ::setenv("MPT_DATA_DIR", keep.c_str(), 1);
  else ::unsetenv("MPT_DATA_DIR");
}
