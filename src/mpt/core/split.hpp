// Chapters 02 onwards — cutting a line of text at a separator: the one
// splitter of the policy string ("+" between clauses, "," between names),
// the layer paths ("." between names) and Chapter 6's presets (jmp's ","
// and "=").
// Depends on: the standard library only.
#pragma once

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

}  // namespace mpt
