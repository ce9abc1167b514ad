// All chapters — the exercise kit: the grader's main(): runs the doctest test
// cases, scores the points of every test case passed (its exercise's points
// per test case, or the "[N points]" its name ends with), prints points per
// exercise and a total, and lets a student run one exercise (--exercise N.M).
// Depends on: doctest, grader_kit.hpp, and the chapter's grader/grader.hpp,
// which defines the exercise list mpt::exercise_kit::kChapter.
// Shipped in every handout as grader/grader_main.cpp.
#define DOCTEST_CONFIG_IMPLEMENT
#include "grader.hpp"  // this chapter's: kChapter
#include "grader_kit.hpp"

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

using mpt::exercise_kit::Exercise;
using mpt::exercise_kit::kChapter;

// The chapter's exercises, for range-for.
struct ExerciseList {
  const Exercise* begin() const { return kChapter.exercises; }
  const Exercise* end() const { return kChapter.exercises + kChapter.count; }
};
constexpr ExerciseList kExercises{};

// "grader_ch02", the executable's name in messages.
std::string grader_name() {
  char buf[32];
  std::snprintf(buf, sizeof buf, "grader_ch%02d", kChapter.number);
  return buf;
}

constexpr const char* kSuitePrefix = "exercise-";

struct CaseResult {
  std::string name;  // without its "[N points]"
  int points;        // what it is worth
  bool passed;
};

struct SuiteScore {
  std::vector<CaseResult> cases;
  std::string not_implemented;  // the stub's message, when one was thrown
};

// Filled by the listener while doctest runs; read by main() afterwards.
struct Scores {
  std::map<std::string, SuiteScore> by_suite;  // suite name -> results, sorted
  std::string current_suite;
  std::string current_case;
  bool crashed = false;
};

Scores& scores() {
  static Scores s;
  return s;
}

std::string exercise_id(const std::string& suite) {
  const std::size_t k = std::strlen(kSuitePrefix);
  return suite.compare(0, k, kSuitePrefix) == 0 ? suite.substr(k) : suite;
}

const Exercise* find_exercise(const std::string& id) {
  for (const auto& e : kExercises)
    if (id == e.id) return &e;
  return nullptr;
}

// "the loss scale's update rule", or "diagnose: ..." for a diagnose exercise.
std::string exercise_title(const std::string& id) {
  const Exercise* e = find_exercise(id);
  if (e == nullptr) return "not an exercise of this chapter";
  return std::string(e->kind == mpt::exercise_kit::Kind::diagnose ? "diagnose: " : "") + e->title;
}

// What a test case of `suite` is worth: the number in a trailing "[N point]"
// or "[N points]" of its name (which is then taken off the name), else its
// exercise's points per test case, else 1 (a test case outside any exercise).
int case_points(const std::string& suite, std::string& name) {
  const std::size_t open = name.rfind(" [");
  if (open != std::string::npos && name.back() == ']') {
    const std::string inside = name.substr(open + 2, name.size() - open - 3);
    const std::size_t space = inside.find(' ');
    const std::string unit = space == std::string::npos ? "" : inside.substr(space + 1);
    const std::string digits = inside.substr(0, space);
    if ((unit == "point" || unit == "points") && !digits.empty() && digits.size() <= 3 &&
        digits.find_first_not_of("0123456789") == std::string::npos) {
      name.erase(open);
      return std::stoi(digits);
    }
  }
  const Exercise* e = find_exercise(exercise_id(suite));
  return e != nullptr && exercise_id(suite) != suite ? e->points : 1;
}

// A doctest listener: it sees every test case start and end next to the
// normal console reporter, and only records.
struct PointsListener : doctest::IReporter {
  explicit PointsListener(const doctest::ContextOptions&) {}

  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {
    // After a crash doctest ends the run from its signal handler and main()
    // never gets control back: say so here, and print no total, so that
    // nobody (and no CI check) mistakes a crash for a score.
    if (scores().crashed) {
      std::printf(
          "\ngrading stopped: test case \"%s\" crashed; no total. Run one exercise at a "
          "time (--exercise N.M) to score the others.\n",
          scores().current_case.c_str());
      std::fflush(stdout);
    }
  }
  void test_case_start(const doctest::TestCaseData& tc) override {
    scores().current_suite = tc.m_test_suite ? tc.m_test_suite : "";
    scores().current_case = tc.m_name;
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats& st) override {
    std::string name = scores().current_case;
    const int points = case_points(scores().current_suite, name);
    scores().by_suite[scores().current_suite].cases.push_back({name, points, st.testCaseSuccess});
  }
  void test_case_exception(const doctest::TestCaseException& e) override {
    if (e.is_crash) scores().crashed = true;
    const std::string what = e.error_string.c_str();
    if (what.find("not implemented") != std::string::npos)
      scores().by_suite[scores().current_suite].not_implemented = what;
  }
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("points", 1, PointsListener);

// Prints the table; returns true when every test case that ran passed.
bool print_scores() {
  int total = 0;
  int total_max = 0;
  std::printf("\n==== grade: chapter %d exercises (each test case passed scores the points beside it) ====\n",
              kChapter.number);
  for (const auto& [suite, s] : scores().by_suite) {
    const std::string id = exercise_id(suite);
    int points = 0;
    int max = 0;
    for (const auto& c : s.cases) {
      points += c.passed ? c.points : 0;
      max += c.points;
    }
    if (id == suite) {  // a test case outside the exercise-N.M suites (a hidden test's slip)
      std::printf("tests outside any exercise suite (%s): %d/%d points",
                  suite.empty() ? "no suite" : suite.c_str(), points, max);
    } else {
      std::printf("exercise %s (%s): %d/%d points", id.c_str(), exercise_title(id).c_str(), points, max);
    }
    if (!s.not_implemented.empty()) std::printf("  [%s]", s.not_implemented.c_str());
    std::printf("\n");
    for (const auto& c : s.cases)
      std::printf("  %s  %s  (%d point%s)\n", c.passed ? "pass" : "FAIL", c.name.c_str(), c.points,
                  c.points == 1 ? "" : "s");
    total += points;
    total_max += max;
  }
  std::printf("total: %d/%d points\n", total, total_max);
  return total_max > 0 && total == total_max;
}

void print_usage_extra() {
  std::printf(
      "%s: the Chapter %d exercise grader.\n"
      "  --exercise N.M   run only exercise N.M (may be repeated); same as -ts=exercise-N.M\n"
      "  exercises:",
      grader_name().c_str(), kChapter.number);
  for (const auto& e : kExercises) std::printf(" %s", e.id);
  std::printf(
      "\n  Every doctest option works too, e.g. -ltc to list the test cases, "
      "-tc=\"*ties*\" to run matching ones.\n\n");
}

}  // namespace

int main(int argc, char** argv) {
  // Take out --exercise N.M / --exercise=N.M; pass everything else to doctest.
  std::vector<char*> rest{argv[0]};
  std::vector<std::string> chosen;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--exercise" || a == "-e") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: --exercise needs a value, e.g. --exercise %s\n", grader_name().c_str(),
                     kChapter.count > 0 ? kChapter.exercises[0].id : "N.M");
        return 2;
      }
      chosen.push_back(argv[++i]);
    } else if (a.rfind("--exercise=", 0) == 0) {
      chosen.push_back(a.substr(std::strlen("--exercise=")));
    } else {
      if (a == "--help" || a == "-h" || a == "-?") print_usage_extra();
      rest.push_back(argv[i]);
    }
  }
  std::string valid;
  for (const auto& e : kExercises) valid += std::string(valid.empty() ? "" : ", ") + e.id;
  for (const auto& id : chosen) {
    bool known = false;
    for (const auto& e : kExercises) known = known || id == e.id;
    if (!known) {
      std::fprintf(stderr, "%s: unknown exercise '%s'; valid: %s\n", grader_name().c_str(), id.c_str(),
                   valid.c_str());
      return 2;
    }
  }

  doctest::Context context;
  context.applyCommandLine(static_cast<int>(rest.size()), rest.data());
  for (const auto& id : chosen) context.addFilter("test-suite", (kSuitePrefix + id).c_str());

  const int rc = context.run();
  if (context.shouldExit()) return rc;  // --help, --list-test-cases and the like
  std::fflush(stdout);
  const bool full_marks = print_scores();
  return full_marks ? 0 : 1;
}
