// Chapter 02 — loss scaling and FP32 master weights: the GradScaler.
// Depends on: grad_scaler.hpp, scaler_math.hpp (update_scale), unscale.hpp
// (the fused unscale-and-check over a list of gradients, built on
// scaler_math.hpp's), explain.hpp (shortest_decimal, for messages), nlohmann_json.
//
// Every behaviour below was checked against pytorch/pytorch:
// torch/amp/grad_scaler.py (defaults, checks, state machine, messages,
// state_dict) and aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp /
// aten/src/ATen/native/cuda/AmpKernels.cu (unscale-and-check, update rule).
#include "mpt/amp/grad_scaler.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>

#include "mpt/amp/scaler_math.hpp"
#include "mpt/amp/unscale.hpp"
#include "mpt/formats/explain.hpp"

namespace mpt {

namespace {

using Records = std::map<const Optimizer*, detail::OptimizerRecord>;

std::string num(float x) { return shortest_decimal(x); }
std::string num(double x) { return shortest_decimal(x); }

// The constructor's rules, shared with load_state_dict so that both accept
// exactly the same states. The first two sentences are PyTorch's asserts.
void check_options(float init_scale, double growth_factor, double backoff_factor,
                   std::int64_t growth_interval) {
  if (!(growth_factor > 1.0))
    throw std::invalid_argument("The growth factor must be > 1.0 (got growth_factor = " + num(growth_factor) +
                                ")");
  if (!(backoff_factor < 1.0))
    throw std::invalid_argument(
        "The backoff factor must be < 1.0 (got backoff_factor = " + num(backoff_factor) + ")");
  // Beyond PyTorch: values it accepts but that cannot work (see the header).
  if (!std::isfinite(growth_factor))
    throw std::invalid_argument(
        "The growth factor must be finite (got growth_factor = " + num(growth_factor) + ")");
  if (!(backoff_factor > 0.0))
    throw std::invalid_argument(
        "The backoff factor must be > 0 (got backoff_factor = " + num(backoff_factor) +
        "; 0 or less would zero or negate the scale at the first overflow)");
  if (growth_interval < 1)
    throw std::invalid_argument("The growth interval must be >= 1 (got growth_interval = " +
                                std::to_string(growth_interval) + "; the scale could never grow)");
  if (!(std::isfinite(init_scale) && init_scale > 0.0f))
    throw std::invalid_argument(
        "The initial scale must be finite and > 0 in FP32 (got init_scale = " + num(init_scale) + ")");
}

// Unscale every gradient of `optimizer` by inv_scale and report whether any
// was non-finite: one fused pass per tensor (unscale.hpp's multi-tensor
// unscale_and_check, element for element scaler_math.hpp's), every element
// multiplied even after an inf, as PyTorch's
// _amp_foreach_non_finite_check_and_unscale_ does. Empty when there is
// nothing to check: PyTorch then records no found_inf for this optimizer
// (its found_inf_per_device stays empty).
std::optional<bool> unscale_grads(Optimizer& optimizer, float inv_scale) {
  if (optimizer.params().empty()) return std::nullopt;
  TensorList grads;
  grads.reserve(optimizer.params().size());
  for (Parameter* p : optimizer.params())
    grads.emplace_back(p->grad.f32_data(), static_cast<std::size_t>(p->grad.numel()));
  return unscale_and_check(grads, inv_scale);
}

// The unscale_ part of the state machine; `who` is "GradScaler" or "StaticScaler".
// `reduce` (GradScaler's seam, may be empty) turns the local verdict into the recorded one.
void unscale_recorded(Records& records, Optimizer& optimizer, float scale, const char* who,
                      const GradScaler::FoundInfReduction* reduce = nullptr) {
  detail::OptimizerRecord& r = records[&optimizer];
  const std::string name = who;
  if (r.stage == OptState::unscaled)
    throw std::logic_error(name +
                           "::unscale() has already been called on this optimizer since the last "
                           "update(); unscale once per iteration, after all gradients are "
                           "accumulated, then step() and update()");
  if (r.stage == OptState::stepped)
    throw std::logic_error(name +
                           "::unscale() is being called after step(); call update() to end the "
                           "iteration, and unscale the next iteration's gradients before its step()");
  //! [found-inf-seam]
  r.found_inf = unscale_grads(optimizer, inverse_scale(scale));
  if (reduce != nullptr && *reduce) r.found_inf = (*reduce)(r.found_inf.value_or(false));
  //! [found-inf-seam]
  r.stage = OptState::unscaled;
}

// The step part of the state machine, after the caller's own checks.
bool step_recorded(Records& records, Optimizer& optimizer, float scale, bool skip_on_inf, const char* who,
                   const GradScaler::FoundInfReduction* reduce = nullptr) {
  const std::string name = who;
  if (records[&optimizer].stage == OptState::stepped)
    throw std::logic_error(name +
                           "::step() has already been called since the last update(); call "
                           "update() once at the end of every iteration, after step()");
  if (records[&optimizer].stage == OptState::ready) unscale_recorded(records, optimizer, scale, who, reduce);
  detail::OptimizerRecord& r = records[&optimizer];
  if (!r.found_inf)
    throw std::logic_error(name +
                           "::step(): No inf checks were recorded for this optimizer; it has no "
                           "parameters, so there are no gradients to check or step");
  const bool run = !(skip_on_inf && *r.found_inf);
  if (run) optimizer.step();
  r.stage = OptState::stepped;
  return run;
}

OptState stage_of(const Records& records, const Optimizer& optimizer) {
  const auto it = records.find(&optimizer);
  return it == records.end() ? OptState::ready : it->second.stage;
}

std::optional<bool> found_inf_of(const Records& records, const Optimizer& optimizer) {
  const auto it = records.find(&optimizer);
  return it == records.end() ? std::nullopt : it->second.found_inf;
}

}  // namespace

const char* opt_state_name(OptState s) {
  switch (s) {
    case OptState::ready: return "READY";
    case OptState::unscaled: return "UNSCALED";
    case OptState::stepped: return "STEPPED";
  }
  return "?";
}

// ---------------------------------------------------------------------------
// GradScaler

GradScaler::GradScaler() : GradScaler(Options{}) {}

GradScaler::GradScaler(const Options& options) : options_(options), scale_(options.init_scale) {
  if (options_.enabled)
    check_options(options_.init_scale, options_.growth_factor, options_.backoff_factor,
                  options_.growth_interval);
}

void GradScaler::require_started(const char* call) const {
  // PyTorch's _check_scale_growth_tracker: its scale tensor only exists
  // after the first scale(), and these calls assert that it does.
  if (!started_)
    throw std::logic_error(std::string("GradScaler::") + call +
                           "() was called before any scale(); this may indicate your script did "
                           "not use scaler.scale(loss) earlier in the iteration: backpropagate "
                           "from the scaled loss, then unscale/step/update");
}

float GradScaler::scale(float loss) {
  if (!options_.enabled) return loss;
  started_ = true;
  return loss * scale_;
}

void GradScaler::unscale(Optimizer& optimizer) {
  if (!options_.enabled) return;
  require_started("unscale");
  unscale_recorded(per_optimizer_, optimizer, scale_, "GradScaler", &reduction_);
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  require_started("step");
  return step_recorded(per_optimizer_, optimizer, scale_, /*skip_on_inf=*/true, "GradScaler", &reduction_);
}

void GradScaler::update() {
  if (!options_.enabled) return;
  require_started("update");
  bool any_check = false, found_inf = false;
  for (const auto& entry : per_optimizer_) {
    if (!entry.second.found_inf) continue;
    any_check = true;
    found_inf = found_inf || *entry.second.found_inf;  // PyTorch sums the flags: any counts
  }
  if (!any_check)
    throw std::logic_error(
        "GradScaler::update(): No inf checks were recorded prior to update(); call "
        "scaler.step(optimizer) (or scaler.unscale(optimizer)) for each optimizer this iteration "
        "before update(), or set the scale yourself with update(new_scale)");
  update_scale(scale_, growth_tracker_, found_inf, options_.growth_factor, options_.backoff_factor,
               options_.growth_interval);
  per_optimizer_.clear();
}

void GradScaler::update(float new_scale) {
  if (!options_.enabled) return;
  require_started("update");
  scale_ = new_scale;  // PyTorch's _scale.fill_(new_scale): the tracker is left alone
  per_optimizer_.clear();
}

float GradScaler::get_scale() const { return options_.enabled ? scale_ : 1.0f; }

std::int32_t GradScaler::growth_tracker() const { return options_.enabled ? growth_tracker_ : 0; }

OptState GradScaler::stage(const Optimizer& optimizer) const { return stage_of(per_optimizer_, optimizer); }

std::optional<bool> GradScaler::found_inf(const Optimizer& optimizer) const {
  return found_inf_of(per_optimizer_, optimizer);
}

std::string GradScaler::state_dict() const {
  if (!options_.enabled) return "{}";
  // Doubles holding FP32 values: the shortest double spelling reads back to
  // the same double, hence to the same float.
  nlohmann::ordered_json j;
  j["scale"] = static_cast<double>(scale_);
  j["growth_factor"] = options_.growth_factor;
  j["backoff_factor"] = options_.backoff_factor;
  j["growth_interval"] = options_.growth_interval;
  j["_growth_tracker"] = growth_tracker_;
  return j.dump();
}

namespace {

constexpr const char* kStateKeys = "scale, growth_factor, backoff_factor, growth_interval, _growth_tracker";

[[noreturn]] void load_error(const std::string& what) {
  throw std::invalid_argument("GradScaler::load_state_dict: " + what);
}

const nlohmann::json& require_key(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end())
    load_error(std::string("missing key '") + key + "' (a state_dict has the keys " + kStateKeys + ")");
  return *it;
}

double number_field(const nlohmann::json& j, const char* key) {
  const nlohmann::json& v = require_key(j, key);
  if (!v.is_number())
    load_error(std::string("'") + key + "' must be a number, got " + v.type_name() + " " + v.dump());
  return v.get<double>();
}

std::int64_t int32_field(const nlohmann::json& j, const char* key) {
  const nlohmann::json& v = require_key(j, key);
  if (!v.is_number_integer())
    load_error(std::string("'") + key + "' must be an integer, got " +
               (v.is_number() ? "the non-integer " : std::string(v.type_name()) + " ") + v.dump());
  constexpr std::int64_t lo = std::numeric_limits<std::int32_t>::min();
  constexpr std::int64_t hi = std::numeric_limits<std::int32_t>::max();
  const bool fits = v.is_number_unsigned() ? v.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi)
                                           : v.get<std::int64_t>() >= lo && v.get<std::int64_t>() <= hi;
  if (!fits) load_error(std::string("'") + key + "' = " + v.dump() + " does not fit in an int32");
  return v.get<std::int64_t>();
}

}  // namespace

void GradScaler::load_state_dict(const std::string& json) {
  if (!options_.enabled) return;  // PyTorch: a no-op on a disabled scaler
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for a number beyond double (1e400).
    load_error(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object())
    load_error(std::string("expected a JSON object with the keys ") + kStateKeys + ", got " + j.type_name());
  if (j.empty())
    load_error(
        "The source state dict is empty, possibly because it was saved from a disabled instance "
        "of GradScaler; save the state of an enabled scaler, or build this one with "
        "enabled = false");

  // Read and check everything first; assign only when all of it is good.
  const double scale_d = number_field(j, "scale");
  const double growth_d = number_field(j, "growth_factor");
  const double backoff_d = number_field(j, "backoff_factor");
  const std::int64_t interval = int32_field(j, "growth_interval");
  const std::int64_t tracker = int32_field(j, "_growth_tracker");

  const float scale = static_cast<float>(scale_d);
  if (!(std::isfinite(scale) && scale > 0.0f))
    load_error("'scale' must be finite and > 0 in FP32, got " + shortest_decimal(scale_d) +
               (static_cast<double>(scale) != scale_d ? " (" + num(scale) + " in FP32)" : "") +
               "; a scale of 0 means repeated overflow drove it to nothing: start from a fresh "
               "init_scale instead");
  // Factors stay doubles, as in PyTorch (Python floats), so 0.3 means 0.3.
  const double growth = growth_d;
  const double backoff = backoff_d;
  try {
    check_options(scale, growth, backoff, interval);
  } catch (const std::invalid_argument& e) {
    load_error(e.what());
  }
  if (tracker < 0 || tracker >= interval)
    load_error("'_growth_tracker' must be in [0, growth_interval) = [0, " + std::to_string(interval) +
               "), got " + std::to_string(tracker) +
               "; the tracker counts clean steps up to growth_interval");

  scale_ = scale;
  options_.growth_factor = growth;
  options_.backoff_factor = backoff;
  options_.growth_interval = static_cast<std::int32_t>(interval);
  growth_tracker_ = static_cast<std::int32_t>(tracker);
}

// ---------------------------------------------------------------------------
// StaticScaler

StaticScaler::StaticScaler(float scale, bool skip_nonfinite_steps)
    : scale_(scale), skip_nonfinite_steps_(skip_nonfinite_steps) {
  if (!(std::isfinite(scale) && scale > 0.0f))
    throw std::invalid_argument("StaticScaler: the scale must be finite and > 0 in FP32 (got " + num(scale) +
                                ")");
}

float StaticScaler::scale(float loss) const { return loss * scale_; }

void StaticScaler::unscale(Optimizer& optimizer) {
  unscale_recorded(per_optimizer_, optimizer, scale_, "StaticScaler");
}

bool StaticScaler::step(Optimizer& optimizer) {
  return step_recorded(per_optimizer_, optimizer, scale_, skip_nonfinite_steps_, "StaticScaler");
}

void StaticScaler::update() { per_optimizer_.clear(); }

OptState StaticScaler::stage(const Optimizer& optimizer) const { return stage_of(per_optimizer_, optimizer); }

std::optional<bool> StaticScaler::found_inf(const Optimizer& optimizer) const {
  return found_inf_of(per_optimizer_, optimizer);
}

}  // namespace mpt
