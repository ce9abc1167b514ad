// Chapters 02 onwards — layer paths and path patterns, the one way a policy
// (or any tool) selects layers by where they are in a model, never by a
// substring of their name. Chapter 2's keep-f32-layers names a path, which
// covers the layers under it; Chapter 6's per-task policies add the
// wildcards "*" and "**".
// Depends on: nothing but the standard library.
//
// A path is NAME ( "." NAME )*, e.g. "block0.mlp.fc1". A pattern is a path
// whose segments may hold "*" (any run of characters inside one segment:
// "block*" matches "block0" and "block12", never "block0.mlp"), and whose
// segment "**" matches any number of segments, none included ("**.ln1"
// matches "ln1", "block0.ln1" and "a.b.ln1"). A pattern that matches a path
// also *covers* every layer under it: "block0.mlp" covers "block0.mlp.fc1",
// as a rule for a module holds for its parts (PyTorch's module tree).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mpt {

/// A parsed layer path pattern (see the file comment).
class PathPattern {
 public:
  /// Throws std::invalid_argument, one line naming what is wrong and the
  /// syntax, for: an empty pattern or segment, a character other than
  /// letters, digits, "_" and "*", or "**" inside a segment ("a**").
  explicit PathPattern(std::string text);
  /// The pattern as written.
  const std::string& text() const { return text_; }
  /// True when the pattern matches `path` itself.
  bool matches(std::string_view path) const;
  /// True when the pattern matches `path` or a path above it ("a.b" covers
  /// "a.b" and "a.b.c", not "a.bc").
  bool covers(std::string_view path) const;
  /// True when the text has a "*" (false: it names one path).
  bool is_wildcard() const { return text_.find('*') != std::string::npos; }

 private:
  std::string text_;
  std::vector<std::string> segments_;
};

/// "NAME[.NAME...], each NAME of letters, digits, _ and *, or the segment **"
/// — for error messages.
std::string path_pattern_syntax();

}  // namespace mpt
