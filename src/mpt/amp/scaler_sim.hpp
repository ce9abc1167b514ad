// Chapter 02 — loss scaling and FP32 master weights: the scaler simulation
// behind `mpt scaler simulate` (the sawtooth of a dynamic loss scale).
// Depends on: grad_scaler.hpp, parameter.hpp; the .cpp also uses explain.hpp
// (shortest_decimal), nlohmann_json, plot/svg_chart.hpp for the plot and
// io/atomic_file.hpp to write it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mpt/amp/grad_scaler.hpp"

namespace mpt {

/// The longest simulation simulate_scaler() accepts (steps).
inline constexpr std::int64_t kMaxScalerSimulationSteps = 10'000'000;

/// The longest simulation write_plot_svg() draws (steps).
inline constexpr std::int64_t kMaxPlottedSteps = 1'000'000;

/// Above this many overflows the plot does not mark each one (its title
/// gives the count instead), so that the SVG stays a reasonable size.
inline constexpr std::int64_t kMaxPlottedOverflowMarks = 20'000;

/// What to simulate: a GradScaler, a number of steps, and which steps
/// overflow — listed, or drawn with a probability from a seeded generator.
struct ScalerSimulationSpec {
  GradScaler::Options options;                 ///< the scaler's constructor arguments
  std::int64_t steps = 0;                      ///< iterations, 1 to kMaxScalerSimulationSteps
  std::vector<std::int64_t> overflow_at;       ///< overflowing steps, 1-based, any order
  std::optional<double> overflow_probability;  ///< instead: each step overflows with this probability
  std::uint64_t seed = 0;                      ///< seed of the draw (with overflow_probability)
};

/// One iteration of the simulation, as the scaler left it.
struct ScalerSimulationRow {
  std::int64_t step = 0;            ///< 1-based iteration number
  bool overflow = false;            ///< the gradient held an inf this step
  float scale = 0;                  ///< get_scale() after update()
  std::int32_t growth_tracker = 0;  ///< growth_tracker() after update()
  bool skipped = false;             ///< step() did not call optimizer.step()
};

/// A finished simulation: the spec and one row per step.
struct ScalerSimulation {
  ScalerSimulationSpec spec;              ///< what was simulated
  std::vector<ScalerSimulationRow> rows;  ///< one per step, in order
  /// How many optimizer steps were skipped.
  std::int64_t skipped_steps() const;
};

/// The 1-based steps among 1..steps that overflow when each does with
/// `probability` (uniform() < probability), drawn from mpt::Rng(seed), the
/// same generator on every machine.
std::vector<std::int64_t> draw_overflow_steps(std::int64_t steps, double probability, std::uint64_t seed);

/// Run a real GradScaler for spec.steps iterations against an optimizer
/// whose gradient holds an inf on the overflow steps (finite otherwise):
/// scale(loss), step(optimizer), update(), one row each.
/// \throws std::invalid_argument for steps outside [1, kMaxScalerSimulationSteps],
///         an overflow step outside [1, steps], a probability outside [0, 1],
///         both a list and a probability, or options GradScaler rejects
///         (with GradScaler's message).
ScalerSimulation simulate_scaler(const ScalerSimulationSpec& spec);

/// The rows as an aligned table (step, overflow, scale, growth_tracker,
/// skipped; 0/1 flags; the scale as the shortest decimal that reads back to
/// the same FP32 value), under a line naming the options and above a summary.
std::string render_text(const ScalerSimulation& sim);

/// The same as a JSON object: "options", "steps", the overflow source
/// ("overflow_at", or "overflow_probability" and "seed"), "rows" (objects
/// with the table's columns; flags 0/1), "skipped_steps", "final_scale".
std::string render_json(const ScalerSimulation& sim);

/// The loss scale against the step as an SVG document, drawn with
/// mpt::plot::to_svg(): a step line on a log2 axis (ticks 2^k) that holds
/// the scale each step ran with and changes level at x = k exactly where
/// step k's update() changed it, and a red dot (class "overflow") at each
/// overflowing step, at the scale that overflowed. Two title lines: the
/// options and the overflow steps. Scales of 0 or inf (no floor, no cap)
/// are left out (the title says how many). The same simulation gives the
/// same bytes on every machine; nothing is run.
/// \throws std::invalid_argument if the run has more than kMaxPlottedSteps steps.
std::string render_plot_svg(const ScalerSimulation& sim);

/// render_plot_svg() written to `path` by write_file_atomically()
/// (io/atomic_file.hpp): `path` is either the old file or the whole new
/// one, a symbolic link is written through, and a directory, device or
/// FIFO at `path` is refused, never replaced.
/// \throws std::invalid_argument if `path` is empty or holds a line break,
///         or the run has more than kMaxPlottedSteps steps.
/// \throws FileWriteError (a std::runtime_error, one line naming the path
///         and the reason) if `path` is refused or cannot be written (no
///         such directory, a full disk); no temporary file is left.
void write_plot_svg(const ScalerSimulation& sim, const std::string& path);

}  // namespace mpt
