// All chapters — main() of the `mpt` program: the CLI11 app, every registered
// command family added in order, the parse, and the chosen subcommand run.
// Depends on: command.hpp (the registry), cli_support.hpp (UsageError,
// report_parse_error, one_line), CLI11. The subcommands themselves live in
// one file per family (formats_commands.cpp, pitfall_commands.cpp,
// scaler_commands.cpp, ...); a chapter adds its own without editing this file.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#include "cli_support.hpp"
#include "command.hpp"

int main(int argc, char** argv) try {
  // First, so that the families' option values outlive the app that writes them.
  mpt::cli::Handlers handlers;
  CLI::App app{
      "mpt: mixed precision training, chapter by chapter. Formats, rounding and the "
      "pitfall registry from the command line.",
      "mpt"};
  app.require_subcommand(1);
  app.footer("Bad input exits with status 2 and one line on stderr.");
  try {
    mpt::cli::add_all_commands(app, handlers);
  } catch (const std::exception& e) {  // a family's bug, not the user's
    std::cerr << "mpt: error: " << mpt::cli::one_line(e.what()) << "\n";
    return 1;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help: the help text, status 0
    return mpt::cli::report_parse_error(app, e);
  }

  try {
    if (const mpt::cli::Handler* run = handlers.chosen()) return (*run)();
  } catch (const mpt::cli::UsageError& e) {
    std::cerr << "mpt: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "mpt: error: " << mpt::cli::one_line(e.what()) << "\n";
    return 1;
  }
  return 2;      // unreachable: require_subcommand(1), and every leaf has a handler
} catch (...) {  // setting up the app failed (out of memory, a CLI11 bug): still one line
  std::cerr << "mpt: error: could not start\n";
  return 1;
}
