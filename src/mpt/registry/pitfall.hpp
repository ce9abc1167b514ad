// Chapter 01 introduces it; every later chapter adds entries.
// Depends on: the standard library only.
//
// The pitfall registry: each documented failure mode is
// defined once — a broken run, a fixed run, their measured outcomes, and
// the predicates the broken run must satisfy (the symptom), the fixed run
// must satisfy (the fix), and both must satisfy (the shared preconditions of
// the story). The CLI, the tests, the docs and the notebooks all read this
// registry.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mpt {

/// One measured number of a run, e.g. {"final_sum", 256, "value of the fp16 sum"}.
struct Outcome {
  std::string name;  ///< identifier, snake_case; stable: tests and JSON use it
  double value;      ///< the measurement
  std::string what;  ///< one line for humans
};

/// What one run (broken or fixed) measured.
struct RunResult {
  std::string setup;              ///< one line: what this run did
  std::vector<Outcome> outcomes;  ///< measurements, in display order
  /// Optional: one or two sentences saying why the numbers came out as they
  /// did, built from the measurements (never typed-in numbers). Empty when
  /// the outcomes speak for themselves.
  std::string explanation;
  /// The named outcome's value; throws std::out_of_range naming the
  /// outcomes that exist when `name` is not one of them.
  double get(std::string_view name) const;
};

/// A predicate over a run, with the sentence it checks.
struct Check {
  std::string claim;                            ///< e.g. "the sum stalls below 300"
  std::function<bool(const RunResult&)> holds;  ///< true when the claim holds on the run
};

/// A registered failure mode. Its broken and fixed runs measure the same
/// quantities (same outcome names, same order) on two configurations, so
/// they can be shown side by side and every check can be evaluated on
/// either run.
///
/// The checks separate the two runs: every symptom check holds on the
/// broken run and fails on the fixed one, every cure check holds on the
/// fixed run and fails on the broken one (the tests assert both, check by
/// check). What the story needs of both runs alike — the same inputs, the
/// same behaviour up to the point where the fix acts — is a precondition:
/// it must hold on both runs, and it is shown apart from the symptom and
/// the cure.
struct Pitfall {
  std::string id;                     ///< kebab-case, e.g. "fp16-overflow"
  int chapter = 0;                    ///< chapter that introduces it
  std::string title;                  ///< short title
  std::string mechanism;              ///< the mechanism in one sentence
  std::function<RunResult()> broken;  ///< the run that shows the failure
  std::function<RunResult()> fixed;   ///< the same measurement with the fix applied
  std::vector<Check> symptom;         ///< must all hold on the broken run, and each fail on the fixed run
  std::vector<Check> cure;            ///< must all hold on the fixed run, and each fail on the broken run
  /// Shared preconditions: must all hold on both runs (optional; none by
  /// default). Not a symptom and not a cure: what both sides have in common.
  std::vector<Check> preconditions;
};

/// The result of running one pitfall and checking both sides.
struct Verdict {
  const Pitfall* pitfall = nullptr;  ///< the entry that was run
  /// What the broken and the fixed run measured.
  ///@{
  RunResult broken, fixed;
  ///@}
  std::vector<std::pair<std::string, bool>> symptom_checks;  ///< claim, held on the broken run?
  std::vector<std::pair<std::string, bool>> cure_checks;     ///< claim, held on the fixed run?
  /// The preconditions on each run: claim, held? (in the entry's order).
  ///@{
  std::vector<std::pair<std::string, bool>> precondition_checks_broken, precondition_checks_fixed;
  ///@}
  bool symptom_shown() const;  ///< every symptom check held on the broken run
  bool fix_works() const;      ///< every cure check held on the fixed run
  /// Every precondition held on both runs (true for an entry without any).
  bool preconditions_hold() const;
  /// The pitfall reproduces: the symptom shows, the fix works, and the
  /// shared preconditions hold on both runs.
  bool reproduced() const { return symptom_shown() && fix_works() && preconditions_hold(); }
};

/// The set of pitfalls, in registration (chapter) order.
class Registry {
 public:
  /// Adds a pitfall; throws std::invalid_argument on a duplicate or
  /// malformed id, or an entry without runs or checks.
  void add(Pitfall p);
  /// Every registered pitfall, in registration order.
  const std::vector<Pitfall>& all() const { return pitfalls_; }
  /// The pitfall with this id; nullptr when there is none.
  const Pitfall* find(std::string_view id) const;
  /// Throws std::invalid_argument naming the valid ids when unknown.
  const Pitfall& get(std::string_view id) const;
  /// "id1, id2, ..." for error messages.
  std::string ids() const;

 private:
  std::vector<Pitfall> pitfalls_;
};

/// Evaluate checks against one result: (claim, held?) in order. A check
/// that throws (e.g. it asks for an outcome the result lacks) did not hold;
/// its claim then ends with " [check failed: <message>]".
std::vector<std::pair<std::string, bool>> evaluate_checks(const std::vector<Check>& checks,
                                                          const RunResult& result);

/// Run both sides of a pitfall and evaluate its checks: the symptom on the
/// broken run, the cure on the fixed run, the preconditions on both. A run
/// that throws is reported as a failed check carrying the exception's
/// message (in the symptom or cure list, and in its preconditions list);
/// except an InputFileError (input_error.hpp: a data file the run needs is
/// missing or malformed), which propagates: it is bad input, not a failed
/// reproduction.
Verdict run_pitfall(const Pitfall& p);

/// The project's registry with every chapter's pitfalls (defined in
/// chapters/, library mpt::chapters).
const Registry& pitfall_registry();

}  // namespace mpt
