// Chapter 02 — `mpt scaler simulate`: the sawtooth of a dynamic loss scale.
// Depends on: command.hpp (registry), cli_support.hpp, CLI11, and the mpt
// library's scaler_sim (and through it grad_scaler), explain
// (shortest_decimal, for the defaults in --help) and atomic_file (FileWriteError).
//
// Every option is taken as text and parsed here, so that each bad value gets
// a message naming the option, the value and what it may be.
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>

#include "cli_support.hpp"
#include "command.hpp"
#include "mpt/amp/scaler_sim.hpp"
#include "mpt/formats/explain.hpp"
#include "mpt/io/atomic_file.hpp"

namespace {

using mpt::cli::invalid_argument_is_usage_error;
using mpt::cli::parse_integer;
using mpt::cli::UsageError;

struct ScalerArgs {
  std::string init_scale, growth_factor, backoff_factor, growth_interval;
  std::string steps, overflow_at, overflow_prob, seed, plot;
  bool json = false;
};

constexpr const char* kOverflowChoice =
    "list the overflow steps (--overflow-at 3,7,8) or draw them (--overflow-prob P --seed N)";

float scaler_float_option(const std::string& name, const std::string& text) {
  float v = 0;
  if (!mpt::cli::parse_number(text, v)) throw UsageError(name + ": " + mpt::cli::not_a_number(text));
  return v;
}

/// The factors are doubles, as PyTorch's (Python floats) are: parsed with
/// strtod. Unlike --init-scale, a leading space is refused.
double scaler_double_option(const std::string& name, const std::string& text) {
  double v = 0;
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || !mpt::cli::parse_number(text, v))
    throw UsageError(name + ": " + mpt::cli::not_a_number(text));
  return v;
}

mpt::ScalerSimulationSpec scaler_spec(const ScalerArgs& a) {
  mpt::ScalerSimulationSpec spec;
  mpt::GradScaler::Options& o = spec.options;
  if (!a.init_scale.empty()) o.init_scale = scaler_float_option("--init-scale", a.init_scale);
  if (!a.growth_factor.empty()) o.growth_factor = scaler_double_option("--growth-factor", a.growth_factor);
  if (!a.backoff_factor.empty())
    o.backoff_factor = scaler_double_option("--backoff-factor", a.backoff_factor);
  long long v = 0;
  if (!a.growth_interval.empty()) {
    if (!parse_integer(a.growth_interval, 1, std::numeric_limits<std::int32_t>::max(), v))
      throw UsageError("--growth-interval: '" + a.growth_interval +
                       "' is not a whole number of steps from 1 to 2147483647");
    o.growth_interval = static_cast<std::int32_t>(v);
  }
  // The scaler's own rules and messages, before anything else.
  invalid_argument_is_usage_error([&] { mpt::GradScaler check(o); });

  const std::string steps_range = "from 1 to " + std::to_string(mpt::kMaxScalerSimulationSteps);
  if (a.steps.empty())
    throw UsageError("missing --steps; give the number of steps to simulate, " + steps_range +
                     " (e.g. --steps 20)");
  if (!parse_integer(a.steps, 1, mpt::kMaxScalerSimulationSteps, v))
    throw UsageError("--steps: '" + a.steps + "' is not a whole number of steps " + steps_range);
  spec.steps = v;

  if (!a.overflow_at.empty() && !a.overflow_prob.empty())
    throw UsageError(std::string("--overflow-at and --overflow-prob cannot be combined; ") + kOverflowChoice);
  if (!a.seed.empty() && a.overflow_prob.empty())
    throw UsageError(
        "--seed applies only to --overflow-prob; give --overflow-prob P with it, or "
        "drop --seed");
  if (!a.overflow_at.empty()) {
    std::string item;
    std::istringstream items(a.overflow_at);
    while (std::getline(items, item, ',')) {
      if (!parse_integer(item, 1, std::numeric_limits<long long>::max(), v))
        throw UsageError("--overflow-at: '" + item +
                         "' is not a step number; give 1-based steps separated by commas, e.g. "
                         "--overflow-at 3,7,8");
      if (v > spec.steps)
        throw UsageError("--overflow-at: step " + item + " is past the end of the run; valid steps: 1 to " +
                         std::to_string(spec.steps) + " (--steps " + a.steps + ")");
      spec.overflow_at.push_back(v);
    }
    if (a.overflow_at.back() == ',')
      throw UsageError("--overflow-at: '" + a.overflow_at +
                       "' ends with a comma; give 1-based steps separated by commas, e.g. 3,7,8");
  }
  if (!a.overflow_prob.empty()) {
    double p = 0;
    if (!mpt::cli::parse_number(a.overflow_prob, p) || !(p >= 0.0 && p <= 1.0))
      throw UsageError("--overflow-prob: '" + a.overflow_prob +
                       "' is not a probability; give a number from 0 to 1");
    spec.overflow_probability = p;
    if (!a.seed.empty()) {
      errno = 0;
      char* end = nullptr;
      const unsigned long long seed = std::strtoull(a.seed.c_str(), &end, 10);
      if (a.seed.empty() || !std::isdigit(static_cast<unsigned char>(a.seed[0])) || errno == ERANGE ||
          end != a.seed.c_str() + a.seed.size())
        throw UsageError("--seed: '" + a.seed + "' is not an unsigned integer (0 to 18446744073709551615)");
      spec.seed = seed;
    }
  }
  return spec;
}

int cmd_scaler_simulate(const ScalerArgs& a) {
  const mpt::ScalerSimulationSpec spec = scaler_spec(a);  // all input checked first
  const mpt::ScalerSimulation sim =
      invalid_argument_is_usage_error([&] { return mpt::simulate_scaler(spec); });
  // An unusable, refused or unwritable path is bad input (exit 2), as for
  // every option that writes a file (cli_support.hpp's write_atomically).
  if (!a.plot.empty()) {
    try {
      invalid_argument_is_usage_error([&] { mpt::write_plot_svg(sim, a.plot); });
    } catch (const mpt::FileWriteError& e) {
      throw UsageError(e.what());
    }
  }
  if (a.json) {
    std::cout << mpt::render_json(sim);
  } else {
    std::cout << mpt::render_text(sim);
    if (!a.plot.empty()) std::cout << "plot written to " << a.plot << "\n";
  }
  return 0;
}

// ---------------------------------------------------------------------------
// Its command line.

void add_scaler_commands(CLI::App& app, mpt::cli::Handlers& handlers) {
  auto* scaler =
      app.add_subcommand("scaler", "Chapter 2's GradScaler from the command line")->require_subcommand(1);
  auto a = std::make_shared<ScalerArgs>();
  const mpt::GradScaler::Options defaults;
  auto* simulate = scaler->add_subcommand(
      "simulate",
      "Run a real GradScaler (PyTorch's semantics) for --steps iterations in which the listed or "
      "drawn steps overflow (their gradient holds an inf), and print one row per step: step, "
      "overflow (0/1), the scale after update() (the shortest decimal that reads back to the same "
      "FP32 value), the growth tracker, and skipped (0/1: optimizer.step() was not called).");
  simulate->add_option("--init-scale", a->init_scale, "the first scale")
      ->default_str(mpt::shortest_decimal(defaults.init_scale))
      ->type_name("FLOAT");
  simulate
      ->add_option("--growth-factor", a->growth_factor,
                   "scale *= this after growth_interval clean steps (> 1)")
      ->default_str(mpt::shortest_decimal(defaults.growth_factor))
      ->type_name("FLOAT");
  simulate
      ->add_option("--backoff-factor", a->backoff_factor, "scale *= this after an overflow (between 0 and 1)")
      ->default_str(mpt::shortest_decimal(defaults.backoff_factor))
      ->type_name("FLOAT");
  simulate
      ->add_option("--growth-interval", a->growth_interval,
                   "clean steps in a row before the scale grows (>= 1)")
      ->default_str(std::to_string(defaults.growth_interval))
      ->type_name("INT");
  simulate
      ->add_option(
          "--steps", a->steps,
          "iterations to simulate, 1 to " + std::to_string(mpt::kMaxScalerSimulationSteps) + " (required)")
      ->type_name("K");
  simulate
      ->add_option("--overflow-at", a->overflow_at, "overflowing steps, 1-based, separated by commas: 3,7,8")
      ->type_name("LIST");
  simulate
      ->add_option("--overflow-prob", a->overflow_prob,
                   "instead: each step overflows with this probability (0 to 1)")
      ->type_name("P");
  simulate->add_option("--seed", a->seed, "seed of the --overflow-prob draw")
      ->default_str("0")
      ->type_name("N");
  simulate->add_flag("--json", a->json,
                     "the same rows as JSON: {\"options\", \"steps\", \"overflow_at\" (or "
                     "\"overflow_probability\" and \"seed\"), \"rows\": [{\"step\", \"overflow\", "
                     "\"scale\", \"growth_tracker\", \"skipped\"}], \"skipped_steps\", \"final_scale\"}");
  simulate
      ->add_option("--plot", a->plot,
                   "also draw the scale against the step (log2 axis), overflows marked, as an SVG "
                   "at this path, up to " +
                       std::to_string(mpt::kMaxPlottedSteps) +
                       " steps (drawn by the library: same bytes on every machine)")
      ->type_name("FILE.svg")
      ->check(mpt::cli::non_empty("a file name"));
  handlers.on(simulate, [a] { return cmd_scaler_simulate(*a); });
}

// Chapter 2's only family: after all of Chapter 1's in `mpt --help`.
const mpt::cli::Registration scaler_registered{{2, 1}, "scaler", add_scaler_commands};

}  // namespace
