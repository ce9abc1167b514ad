// Chapters 01 onwards — the error of an input file a run needs (a data set
// that is missing or malformed): bad input of the environment, not a bug.
// Depends on: the standard library only.
//
// The loaders throw it (nn/data/data.hpp's digits loader); run_pitfall lets it
// through instead of reporting a failed reproduction, so that the program
// can report it as bad input (the CLI: one line, exit status 2).
#pragma once

#include <stdexcept>

namespace mpt {

/// An input file is missing, unreadable or malformed. what() is one line
/// naming the file, what was wrong and what would be valid (or how to get it).
class InputFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace mpt
