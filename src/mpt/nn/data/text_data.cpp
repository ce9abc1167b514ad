// Chapter 04 — a tiny language model: the character-level text it learns.
// Depends on: text_data.hpp.
#include "mpt/nn/data/text_data.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace mpt {

TextCorpus::TextCorpus(std::string text, std::string source)
    : source_(std::move(source)), text_(std::move(text)) {
  if (text_.empty())
    throw std::invalid_argument("text corpus '" + source_ + "' is empty; it needs at least one byte");
  std::array<bool, 256> seen{};
  for (char c : text_) seen[static_cast<unsigned char>(c)] = true;
  index_.fill(-1);
  for (int b = 0; b < 256; ++b)
    if (seen[static_cast<std::size_t>(b)]) {
      index_[static_cast<std::size_t>(b)] = static_cast<int>(vocab_.size());
      vocab_.push_back(static_cast<char>(b));
    }
  tokens_.reserve(text_.size());
  for (char c : text_) tokens_.push_back(index_[static_cast<unsigned char>(c)]);
}

std::uint64_t TextCorpus::checksum() const {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a offset basis
  for (char c : text_) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;  // FNV prime
  }
  return h;
}

int TextCorpus::encode(char c) const {
  const int id = index_[static_cast<unsigned char>(c)];
  if (id < 0)
    throw std::invalid_argument("byte " + std::to_string(static_cast<unsigned char>(c)) +
                                " does not occur in the corpus '" + source_ + "' (its vocabulary has " +
                                std::to_string(vocab_.size()) + " bytes)");
  return id;
}

std::vector<int> TextCorpus::encode(const std::string& s) const {
  std::vector<int> ids;
  ids.reserve(s.size());
  for (char c : s) ids.push_back(encode(c));
  return ids;
}

std::string TextCorpus::decode(const std::vector<int>& ids) const {
  std::string s;
  s.reserve(ids.size());
  for (int id : ids) {
    if (id < 0 || id >= vocab_size())
      throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                  std::to_string(vocab_size()) + ")");
    s += vocab_[static_cast<std::size_t>(id)];
  }
  return s;
}

TextCorpus load_common_licenses(const std::string& dir) {
  std::string text, source = dir + ":";
  for (const char* name : kCommonLicenseFiles) {
    const std::string path = dir + "/" + name;
    std::ifstream in(path, std::ios::binary);
    std::ostringstream body;
    if (in) body << in.rdbuf();
    if (!in || body.str().empty())
      throw std::runtime_error("cannot read " + path +
                               " (the licence texts of Debian's base-files package, in every Debian system)");
    if (!text.empty()) text += "\n\n";
    text += body.str();
    source += std::string(" ") + name;
  }
  return TextCorpus(std::move(text), std::move(source));
}

TokenBatch sample_windows(const std::vector<int>& tokens, std::size_t begin, std::size_t end, int batch,
                          int context, Rng& rng) {
  if (batch < 1 || context < 1)
    throw std::invalid_argument("sample_windows: batch " + std::to_string(batch) + " and context " +
                                std::to_string(context) + " must both be at least 1");
  if (end > tokens.size() || begin > end || end - begin <= static_cast<std::size_t>(context))
    throw std::invalid_argument("sample_windows: the range [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ") of " + std::to_string(tokens.size()) +
                                " tokens must hold more than context = " + std::to_string(context) +
                                " tokens");
  TokenBatch b;
  b.batch = batch;
  b.context = context;
  const auto n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(context);
  b.inputs.resize(n);
  b.targets.resize(n);
  const std::uint64_t starts = end - begin - static_cast<std::size_t>(context);
  for (std::size_t w = 0; w < static_cast<std::size_t>(batch); ++w) {
    const std::size_t at = begin + static_cast<std::size_t>(rng.below(starts));
    for (std::size_t t = 0; t < static_cast<std::size_t>(context); ++t) {
      b.inputs[w * static_cast<std::size_t>(context) + t] = tokens[at + t];
      b.targets[w * static_cast<std::size_t>(context) + t] = tokens[at + t + 1];
    }
  }
  return b;
}

TextSplit split_text(std::size_t n) {
  TextSplit s;
  s.train_end = n / 10 * 9 + (n % 10) * 9 / 10;  // ⌊0.9·n⌋ without overflow
  s.valid_begin = s.train_end;
  s.valid_end = n;
  return s;
}

}  // namespace mpt
