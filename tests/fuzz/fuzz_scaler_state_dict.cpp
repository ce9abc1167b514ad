// Chapter 02 — fuzz target: the GradScaler's state_dict loader
// (mpt::GradScaler::load_state_dict).
// Depends on: the mpt library's amp tier (grad_scaler.hpp), nlohmann_json
// (to read an accepted state back), fuzz_check.hpp.
//
// The input is the JSON text handed to a scaler that already has a state of
// its own (not the defaults, so that a refused load that assigned anything
// would show). Properties:
//  - refused: std::invalid_argument and nothing else, with one line that
//    starts "GradScaler::load_state_dict: ", and the scaler unchanged (its
//    state_dict() text and its getters are what they were);
//  - accepted: the state is one the constructor accepts (scale finite and
//    > 0, growth factor finite and > 1, backoff factor in (0, 1), interval
//    >= 1, tracker in [0, interval)); the getters say what the input said
//    (the scale rounded to FP32); and state_dict() loads into a fresh scaler
//    that writes the identical text.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fuzz_check.hpp"
#include "mpt/amp/grad_scaler.hpp"

namespace {

using mpt::fuzz::fuzz_require;

struct Seen {
  std::string text;
  float scale;
  double growth, backoff;
  std::int32_t interval, tracker;
};

Seen seen(const mpt::GradScaler& s) {
  return {s.state_dict(),         s.get_scale(),           s.get_growth_factor(),
          s.get_backoff_factor(), s.get_growth_interval(), s.growth_tracker()};
}

bool same(const Seen& a, const Seen& b) {
  return a.text == b.text && a.scale == b.scale && a.growth == b.growth && a.backoff == b.backoff &&
         a.interval == b.interval && a.tracker == b.tracker;
}

mpt::GradScaler own_state() {
  mpt::GradScaler::Options o;
  o.init_scale = 1024.0f;
  o.growth_factor = 3.0;
  o.backoff_factor = 0.25;
  o.growth_interval = 7;
  mpt::GradScaler s(o);
  (void)s.scale(1.0f);
  s.update(4096.0f);
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text = mpt::fuzz::input_text(data, size);
  mpt::GradScaler s = own_state();
  const Seen before = seen(s);
  try {
    s.load_state_dict(text);
  } catch (const std::invalid_argument& e) {
    const std::string line = e.what();
    fuzz_require(line.rfind("GradScaler::load_state_dict: ", 0) == 0,
                 "the error does not name the loader: " + line);
    fuzz_require(mpt::fuzz::is_one_line(line), "the error is not one line: " + line);
    fuzz_require(same(seen(s), before), "a refused state changed the scaler: " + seen(s).text);
    return 0;
  }
  const Seen after = seen(s);
  fuzz_require(std::isfinite(after.scale) && after.scale > 0.0f,
               "accepted a scale that is not finite and > 0");
  fuzz_require(std::isfinite(after.growth) && after.growth > 1.0,
               "accepted a growth factor not finite and > 1");
  fuzz_require(after.backoff > 0.0 && after.backoff < 1.0, "accepted a backoff factor outside (0, 1)");
  fuzz_require(after.interval >= 1, "accepted a growth interval below 1");
  fuzz_require(after.tracker >= 0 && after.tracker < after.interval,
               "accepted a tracker outside [0, interval)");

  // What the input said, read independently.
  const nlohmann::json j = nlohmann::json::parse(text);
  fuzz_require(after.scale == static_cast<float>(j.at("scale").get<double>()),
               "the scale is not the input's");
  fuzz_require(after.growth == j.at("growth_factor").get<double>(), "the growth factor is not the input's");
  fuzz_require(after.backoff == j.at("backoff_factor").get<double>(),
               "the backoff factor is not the input's");
  fuzz_require(after.interval == j.at("growth_interval").get<std::int64_t>(),
               "the interval is not the input's");
  fuzz_require(after.tracker == j.at("_growth_tracker").get<std::int64_t>(),
               "the tracker is not the input's");

  mpt::GradScaler fresh;
  fresh.load_state_dict(after.text);
  fuzz_require(same(seen(fresh), after), "state_dict() " + after.text + " reloads as " + seen(fresh).text);
  return 0;
}
