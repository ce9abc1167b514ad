// Chapters 02 onwards — the text of a policy string, cut and shown: the one
// splitter of the policy string ("+" between clauses, "," between names),
// the layer paths ("." between names) and Chapter 6's presets (jmp's ","
// and "="), and the one way their error messages quote what they were
// given, so that a message stays one line whatever the input holds.
// Depends on: the standard library only.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace mpt {

/// `s` cut at every `sep`, empty pieces kept: "a..b" gives "a", "", "b";
/// "" gives one empty piece. Piece is std::string (copies) or
/// std::string_view (views into `s`, which must outlive them).
template <class Piece = std::string>
std::vector<Piece> split_at(std::string_view s, char sep) {
  std::vector<Piece> pieces;
  std::size_t start = 0;
  for (;;) {
    const std::size_t at = s.find(sep, start);
    pieces.emplace_back(s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return pieces;
    start = at + 1;
  }
}

/// `s` as an error line may show it: in single quotes, at most 60
/// characters, every byte outside printable ASCII written as \\xHH, and the
/// length said when it was cut.
inline std::string shown(std::string_view s) {
  constexpr std::size_t kShown = 60;
  std::string out = "'";
  for (std::size_t i = 0; i < s.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  out += "'";
  if (s.size() > kShown) out += " (" + std::to_string(s.size()) + " characters, first 60 shown)";
  return out;
}

}  // namespace mpt
