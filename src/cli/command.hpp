// All chapters — the command registry of the `mpt` program: each command
// family (a chapter's subcommands, one .cpp file) registers itself here, and
// main() adds every family to the CLI11 app, in order, and runs the one chosen.
// Depends on: CLI11.
//
// Add a command family (say, Chapter NN's):
//   1. a new file src/cli/<family>_commands.cpp whose first line is
//      "// Chapter NN — ..." and whose second is "// Depends on: ...";
//   2. in it, one registration with its order key, {chapter, position among
//      that chapter's families}; `mpt --help` lists the families by key:
//        void add_family(CLI::App& app, mpt::cli::Handlers& handlers) {
//          auto* sub = app.add_subcommand("name", "what it does");
//          handlers.on(sub, [] { return 0; });  // every leaf subcommand needs one
//        }
//        const mpt::cli::Registration family_registered{{NN, 1}, "family", add_family};
//      (named after the family: the program is compiled as one unity file,
//      where two file-local objects of one name would clash);
//   3. one line in src/cli/CMakeLists.txt, adding the file to mpt_cli;
//   4. a test in tests/cli: the new subcommands in MPT_CLI_COMMAND_ORDER
//      (tests/cli/CMakeLists.txt, checked by commands_checks.sh) and a case
//      script for what they print, like scaler_checks.sh.
// main.cpp is never edited.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <utility>
#include <vector>

namespace mpt::cli {

/// Runs one subcommand after parsing; returns the exit status.
using Handler = std::function<int()>;

/// The handlers of the subcommands, filed by the families as they add them.
class Handlers {
 public:
  /// `subcommand` runs `handler` when it is the subcommand given.
  void on(const CLI::App* subcommand, Handler handler);
  /// The handler of the innermost parsed subcommand that has one; nullptr
  /// when none has (after a successful parse, only a family's bug).
  const Handler* chosen() const;
  /// Whether `subcommand` has a handler.
  bool has(const CLI::App* subcommand) const;

 private:
  std::vector<std::pair<const CLI::App*, Handler>> handlers_;
};

/// Where a family's subcommands go in `mpt --help`: by chapter, then by
/// position among that chapter's families.
struct OrderKey {
  int chapter;
  int position;
};

/// Adds a family's subcommands (and their options) to `app` and files a
/// handler for each subcommand that does something.
using AddCommands = void (*)(CLI::App& app, Handlers& handlers);

/// One static object of this type per family, at namespace scope in the
/// family's file, registers it before main() runs.
class Registration {
 public:
  Registration(OrderKey key, const char* family, AddCommands add);
};

/// Adds every registered family to `app`, lowest order key first. Throws
/// std::logic_error when two families share an order key, or when a
/// subcommand that has no subcommands of its own was given no handler.
void add_all_commands(CLI::App& app, Handlers& handlers);

}  // namespace mpt::cli
