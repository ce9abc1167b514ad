// Chapter 01 — the pitfall registry; later chapters add entries.
// Depends on: pitfall.hpp, input_error.hpp (InputFileError, let through) and the
// standard library only.
//
// Validation lives here so that a malformed entry fails at registration,
// where its author is looking, rather than deep inside the CLI or a test.
#include "mpt/registry/pitfall.hpp"

#include <exception>
#include <stdexcept>

#include "mpt/io/input_error.hpp"

namespace mpt {

namespace {

// Kebab-case: lowercase words of [a-z0-9] joined by single hyphens. The id is
// typed on command lines and used in file names, so nothing else is allowed.
bool is_kebab_case(std::string_view id) {
  if (id.empty() || id.front() == '-' || id.back() == '-') return false;
  char previous = 0;
  for (char c : id) {
    const bool word_char = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!word_char && c != '-') return false;
    if (c == '-' && previous == '-') return false;
    previous = c;
  }
  return true;
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// Run one side and evaluate its checks and the preconditions on it; on an
// exception return an empty result whose only check entry (in each list)
// says what went wrong, so the verdict is "not reproduced" instead of a
// crash of the whole tour.
void run_side(const std::function<RunResult()>& run, const std::vector<Check>& checks,
              const std::vector<Check>& preconditions, const char* side, RunResult& result,
              std::vector<std::pair<std::string, bool>>& verdicts,
              std::vector<std::pair<std::string, bool>>& precondition_verdicts) {
  std::exception_ptr failure;
  try {
    result = run();
  } catch (const InputFileError&) {
    throw;  // bad input (a data file), the caller's to report: not a failed reproduction
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure) {
    const std::string message = what_of(failure);
    result = RunResult{};
    result.setup = std::string("the ") + side + " run threw an exception";
    result.explanation = message;
    verdicts = {{std::string("the ") + side + " run completes [it threw: " + message + "]", false}};
    precondition_verdicts.clear();
    if (!preconditions.empty()) precondition_verdicts = verdicts;
    return;
  }
  verdicts = evaluate_checks(checks, result);
  precondition_verdicts = evaluate_checks(preconditions, result);
}

bool all_hold(const std::vector<std::pair<std::string, bool>>& checks) {
  if (checks.empty()) return false;  // nothing shown is not a symptom shown
  for (const auto& c : checks)
    if (!c.second) return false;
  return true;
}

}  // namespace

double RunResult::get(std::string_view name) const {
  for (const auto& o : outcomes)
    if (o.name == name) return o.value;
  std::string names;
  for (const auto& o : outcomes) names += (names.empty() ? "" : ", ") + o.name;
  throw std::out_of_range("no outcome named '" + std::string(name) +
                          "'; this run measured: " + (names.empty() ? std::string("nothing") : names));
}

bool Verdict::symptom_shown() const { return all_hold(symptom_checks); }
bool Verdict::fix_works() const { return all_hold(cure_checks); }
bool Verdict::preconditions_hold() const {
  // Nothing to hold for an entry without preconditions; a run that threw
  // left a failed entry in its list (run_side).
  for (const auto* checks : {&precondition_checks_broken, &precondition_checks_fixed})
    for (const auto& c : *checks)
      if (!c.second) return false;
  return true;
}

void Registry::add(Pitfall p) {
  const std::string who = "pitfall '" + p.id + "': ";
  if (!is_kebab_case(p.id))
    throw std::invalid_argument(who +
                                "id must be kebab-case (lowercase letters and digits in words "
                                "joined by single hyphens, e.g. fp16-overflow)");
  if (find(p.id) != nullptr) throw std::invalid_argument(who + "id is already registered");
  if (p.chapter < 1) throw std::invalid_argument(who + "chapter must be 1 or more");
  if (p.title.empty()) throw std::invalid_argument(who + "title is empty");
  if (p.mechanism.empty()) throw std::invalid_argument(who + "mechanism is empty");
  if (!p.broken) throw std::invalid_argument(who + "has no broken run");
  if (!p.fixed) throw std::invalid_argument(who + "has no fixed run");
  if (p.symptom.empty()) throw std::invalid_argument(who + "has no symptom check");
  if (p.cure.empty()) throw std::invalid_argument(who + "has no cure check");
  for (const auto* checks : {&p.symptom, &p.cure, &p.preconditions})
    for (const auto& c : *checks) {
      if (c.claim.empty()) throw std::invalid_argument(who + "a check has an empty claim");
      if (!c.holds) throw std::invalid_argument(who + "check '" + c.claim + "' has no predicate");
    }
  pitfalls_.push_back(std::move(p));
}

const Pitfall* Registry::find(std::string_view id) const {
  for (const auto& p : pitfalls_)
    if (p.id == id) return &p;
  return nullptr;
}

const Pitfall& Registry::get(std::string_view id) const {
  if (const Pitfall* p = find(id)) return *p;
  throw std::invalid_argument("unknown pitfall '" + std::string(id) + "'; valid ids: " + ids());
}

std::string Registry::ids() const {
  std::string out;
  for (const auto& p : pitfalls_) out += (out.empty() ? "" : ", ") + p.id;
  return out;
}

std::vector<std::pair<std::string, bool>> evaluate_checks(const std::vector<Check>& checks,
                                                          const RunResult& result) {
  std::vector<std::pair<std::string, bool>> out;
  out.reserve(checks.size());
  for (const auto& c : checks) {
    std::exception_ptr failure;
    bool held = false;
    try {
      held = c.holds && c.holds(result);
    } catch (...) {
      failure = std::current_exception();
    }
    if (failure) out.emplace_back(c.claim + " [check failed: " + what_of(failure) + "]", false);
    else out.emplace_back(c.claim, held);
  }
  return out;
}

Verdict run_pitfall(const Pitfall& p) {
  Verdict v;
  v.pitfall = &p;
  run_side(p.broken, p.symptom, p.preconditions, "broken", v.broken, v.symptom_checks,
           v.precondition_checks_broken);
  run_side(p.fixed, p.cure, p.preconditions, "fixed", v.fixed, v.cure_checks, v.precondition_checks_fixed);
  return v;
}

}  // namespace mpt
