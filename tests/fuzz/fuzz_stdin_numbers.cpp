// All chapters — fuzz target: the reader of the numbers on stdin that
// `mpt op` uses (mpt::cli::op::StdinNumbers), block by block.
// Depends on: src/cli/op_runners.hpp and cli_support.hpp (their .cpp files
// compiled in), fuzz_check.hpp.
//
// (`mpt round` and `mpt range` read stdin with their own loop, private to
// formats_commands.cpp, over the same parse_number; the number-parser target
// covers that function.)
//
// The first byte chooses the blocks: x of 1 to 8 numbers, a target of 0 to
// 3, and with its top bit --backward's dy of 1 to 4 after them. The rest is
// stdin. The reader is compared with a model: the text split at white space
// (what operator>> does in the C locale), each piece read with strtof.
//  - a piece that does not parse: the first take() fails with exactly the
//    line "stdin: cannot parse 'PIECE' (input K) as a number; ..." for the
//    first such piece;
//  - fewer numbers than asked: a one-line error ending "; got N";
//  - otherwise each block holds the model's numbers, bit for bit, in order,
//    and finish() fails (one line, "; got N") exactly when numbers are left.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_support.hpp"
#include "cli/op_runners.hpp"
#include "fuzz_check.hpp"

namespace {

using mpt::cli::UsageError;
using mpt::cli::op::StdinNumbers;
using mpt::fuzz::fuzz_require;
using mpt::fuzz::is_one_line;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

std::vector<std::string> pieces(const std::string& text) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_space(text[i])) ++i;
    const std::size_t start = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    if (i > start) out.push_back(text.substr(start, i - start));
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t choice = data[0];
  const std::int64_t nx = 1 + (choice & 7);
  const std::int64_t ntarget = (choice >> 3) & 3;
  const bool backward = (choice & 0x80) != 0;
  const std::int64_t ndy = 1 + ((choice >> 5) & 3);
  const std::string text = mpt::fuzz::input_text(data + 1, size - 1);

  // The model.
  std::vector<float> model;
  std::string bad;
  std::size_t bad_index = 0;
  for (const std::string& p : pieces(text)) {
    char* end = nullptr;
    const float v = std::strtof(p.c_str(), &end);
    if (end != p.c_str() + p.size()) {
      bad = p;
      bad_index = model.size() + 1;
      break;
    }
    model.push_back(v);
  }
  const std::string got = "; got " + std::to_string(model.size());

  std::istringstream in(text);
  StdinNumbers numbers(in, backward);
  std::vector<StdinNumbers::Block> blocks{{"x", {nx}}};
  if (ntarget > 0) blocks.push_back({"target", {ntarget}});
  const auto first = static_cast<std::size_t>(nx + ntarget);
  std::vector<std::vector<float>> taken;
  try {
    taken = numbers.take(blocks);
  } catch (const UsageError& e) {
    const std::string line = e.what();
    if (bad_index > 0) {
      fuzz_require(
          line == "stdin: " + mpt::cli::not_a_number(bad, "(input " + std::to_string(bad_index) + ")"),
          "the error does not name the first bad number '" + bad + "': " + line);
    } else {
      fuzz_require(model.size() < first, "take() refused enough good numbers: " + line);
      fuzz_require(line.rfind("stdin: expected ", 0) == 0 && ends_with(line, got),
                   "a short stdin said: " + line);
    }
    fuzz_require(is_one_line(line), "the error is not one line: " + line);
    return 0;
  }
  fuzz_require(bad_index == 0, "take() accepted the piece '" + bad + "'");
  fuzz_require(model.size() >= first, "take() handed out more numbers than stdin holds");
  fuzz_require(taken.size() == blocks.size(), "take() returned another number of blocks");
  std::size_t at = 0;
  for (const std::vector<float>& block : taken)
    for (const float v : block) {
      fuzz_require(mpt::fuzz::bits_of(v) == mpt::fuzz::bits_of(model[at]),
                   "number " + std::to_string(at + 1) + " differs from the model");
      ++at;
    }
  fuzz_require(at == first, "the blocks do not have the sizes asked for");

  std::size_t used = first;
  if (backward) {
    try {
      const std::vector<float> dy = numbers.take("dy", {ndy});
      fuzz_require(model.size() >= first + static_cast<std::size_t>(ndy), "take(dy) read past the end");
      for (std::size_t i = 0; i < dy.size(); ++i)
        fuzz_require(mpt::fuzz::bits_of(dy[i]) == mpt::fuzz::bits_of(model[first + i]),
                     "dy differs from the model");
      used += static_cast<std::size_t>(ndy);
    } catch (const UsageError& e) {
      const std::string line = e.what();
      fuzz_require(model.size() < first + static_cast<std::size_t>(ndy),
                   "take(dy) refused enough numbers: " + line);
      fuzz_require(is_one_line(line) && ends_with(line, got), "a short dy said: " + line);
      return 0;
    }
  }
  try {
    numbers.finish();
    fuzz_require(used == model.size(), "finish() accepted numbers left over");
  } catch (const UsageError& e) {
    const std::string line = e.what();
    fuzz_require(used < model.size(), "finish() refused when every number was taken: " + line);
    fuzz_require(is_one_line(line) && ends_with(line, got), "numbers left over said: " + line);
  }
  return 0;
}
