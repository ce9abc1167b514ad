// Chapters 02 onwards — layer paths and path patterns (see path_pattern.hpp).
// Depends on: path_pattern.hpp, text.hpp.
#include "mpt/core/path_pattern.hpp"

#include <cctype>
#include <cstddef>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "mpt/core/text.hpp"

namespace mpt {
namespace {

std::vector<std::string_view> segments_of(std::string_view s) { return split_at<std::string_view>(s, '.'); }

// One segment against one name: "*" is any run of characters (none included).
bool glob(std::string_view pattern, std::string_view name) {
  std::size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string_view::npos) {  // let the last "*" take one more character
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

// The pattern's segments against the path's names, by dynamic programming
// (no backtracking, so that many "**" cannot make it exponential): ok[i][j]
// is true when segments i.. match names j..; `prefix`: the pattern may end
// before the names do (covers()).
bool match(const std::vector<std::string>& pat, std::string_view path, bool prefix) {
  const std::vector<std::string_view> names = segments_of(path);
  const std::size_t np = pat.size(), nn = names.size();
  std::vector<std::vector<char>> ok(np + 1, std::vector<char>(nn + 1, 0));
  for (std::size_t j = 0; j <= nn; ++j) ok[np][j] = (j == nn || prefix) ? 1 : 0;
  for (std::size_t i = np; i-- > 0;)
    for (std::size_t j = nn + 1; j-- > 0;) {
      if (pat[i] == "**") ok[i][j] = ok[i + 1][j] != 0 || (j < nn && ok[i][j + 1] != 0) ? 1 : 0;
      else ok[i][j] = j < nn && glob(pat[i], names[j]) && ok[i + 1][j + 1] != 0 ? 1 : 0;
    }
  return ok[0][0] != 0;
}

}  // namespace

std::string path_pattern_syntax() {
  return "NAME[.NAME...], each NAME of letters, digits, _ and * (any characters within the name), or the "
         "name ** (any number of names)";
}

PathPattern::PathPattern(std::string text) : text_(std::move(text)) {
  // A character that is not allowed is named by its code, so that the
  // message stays one line whatever the text holds; then the text is safe to show.
  for (const char c : text_)
    if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '_' && c != '*' && c != '.') {
      char code[8];
      std::snprintf(code, sizeof code, "0x%02x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      throw std::invalid_argument("layer pattern: the character " + std::string(code) +
                                  " is not allowed; valid: " + path_pattern_syntax());
    }
  const auto refuse = [this](const std::string& why) {
    throw std::invalid_argument("layer pattern '" + text_ + "': " + why +
                                "; valid: " + path_pattern_syntax());
  };
  if (text_.empty()) refuse("empty");
  for (const std::string_view seg : segments_of(text_)) {
    if (seg.empty()) refuse("an empty name (a '.' too many)");
    if (seg.find("**") != std::string_view::npos && seg != "**") refuse("'**' must be a name of its own");
    segments_.emplace_back(seg);
  }
}

bool PathPattern::matches(std::string_view path) const { return match(segments_, path, false); }

bool PathPattern::covers(std::string_view path) const { return match(segments_, path, true); }

}  // namespace mpt
