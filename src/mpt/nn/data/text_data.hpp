// Chapter 04 — a tiny language model: the character-level text it learns.
// Depends on: the core tier (random.hpp: Rng).
//
// The tiny Transformer of Chapter 4 learns to continue English legal prose:
// the licence texts every Debian system ships in /usr/share/common-licenses
// (package base-files, always installed), so nothing is downloaded and every
// machine reads the same bytes. The corpus is the files of
// kCommonLicenseFiles read in that order, joined with a blank line; its size
// and a checksum are printed with every result that depends on it, so a
// reader can tell whether their system ships the same texts.
//
// A token is one byte. The vocabulary is the bytes that occur in the corpus,
// sorted; a batch is `batch` windows of `context + 1` consecutive tokens at
// seeded random positions: the first `context` are the input, the last
// `context` (shifted by one) the next-token targets.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "mpt/core/random.hpp"

namespace mpt {

/// The licence files of the corpus, in reading order: present in
/// base-files' /usr/share/common-licenses on every Debian release since 2010.
inline constexpr std::array<const char*, 7> kCommonLicenseFiles = {"Apache-2.0", "Artistic", "BSD",   "GPL-2",
                                                                   "GPL-3",      "LGPL-2.1", "LGPL-3"};

/// A text read as bytes, and its byte vocabulary.
class TextCorpus {
 public:
  /// The corpus of `text`; throws std::invalid_argument if it is empty.
  explicit TextCorpus(std::string text, std::string source = "text");

  /// Where the text came from ("/usr/share/common-licenses: Apache-2.0, ...").
  const std::string& source() const { return source_; }
  /// The whole text.
  const std::string& text() const { return text_; }
  /// The text as token ids, one per byte.
  const std::vector<int>& tokens() const { return tokens_; }
  /// Number of distinct bytes: the model's vocabulary size.
  int vocab_size() const { return static_cast<int>(vocab_.size()); }
  /// FNV-1a (64-bit) of the text: the same number means the same corpus.
  std::uint64_t checksum() const;

  /// The token id of byte c; throws std::invalid_argument for a byte the
  /// corpus does not contain (naming it and the vocabulary size).
  int encode(char c) const;
  /// encode() of every byte of s.
  std::vector<int> encode(const std::string& s) const;
  /// The bytes of token ids; throws std::invalid_argument for an id outside
  /// [0, vocab_size()).
  std::string decode(const std::vector<int>& ids) const;

 private:
  std::string source_;
  std::string text_;
  std::vector<char> vocab_;     // the distinct bytes, sorted (as unsigned)
  std::array<int, 256> index_;  // byte → id, −1 where absent
  std::vector<int> tokens_;
};

/// The corpus from the files kCommonLicenseFiles in `dir`, joined by "\n\n".
/// A missing or unreadable file: std::runtime_error naming the path and the
/// package that ships it (base-files).
TextCorpus load_common_licenses(const std::string& dir = "/usr/share/common-licenses");

/// Next-token training windows: inputs and targets, both [batch, context]
/// row-major, targets[b][t] = the token after inputs[b][t].
struct TokenBatch {
  int batch = 0;             ///< windows
  int context = 0;           ///< tokens per window
  std::vector<int> inputs;   ///< batch·context token ids
  std::vector<int> targets;  ///< batch·context next-token ids
};

/// `batch` windows of context + 1 tokens starting at rng.below(n − context)
/// positions of tokens[begin, end). Throws std::invalid_argument unless
/// batch ≥ 1, context ≥ 1 and the range holds more than context tokens.
TokenBatch sample_windows(const std::vector<int>& tokens, std::size_t begin, std::size_t end, int batch,
                          int context, Rng& rng);

/// The first 90 % of the tokens (training) and the rest (validation), as
/// the [begin, end) offsets to pass to sample_windows.
struct TextSplit {
  std::size_t train_begin = 0;  ///< first training token
  std::size_t train_end = 0;    ///< one past the last training token
  std::size_t valid_begin = 0;  ///< first validation token
  std::size_t valid_end = 0;    ///< one past the last validation token
};
/// The split of n tokens: training [0, ⌊0.9·n⌋), validation the rest.
TextSplit split_text(std::size_t n);

}  // namespace mpt
