// Chapters 01 onwards — small helpers shared by the CPU test suites: float
// bit patterns, an XML well-formedness check and a substring count (the SVG
// tests), and what the pitfall suites assert of every registered pitfall
// (check_pitfall, check_chapter_registration) with their failure messages.
// Header-only (the CMake glob picks up test_ch*_*.cpp only). Depends on: the
// standard library, doctest (for the shared pitfall assertions), mpt/pitfall.hpp.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "mpt/registry/pitfall.hpp"

namespace mpt_test {

/// The bit pattern of x.
inline std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

/// The float whose bit pattern is u.
inline float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

/// A small XML well-formedness check: every tag closes in order, attributes
/// are quoted, no stray '<' or '&'. Enough to catch a broken SVG renderer;
/// `why` says what was wrong.
inline bool well_formed_xml(const std::string& s, std::string& why) {
  std::vector<std::string> stack;
  std::size_t i = 0;
  while (i < s.size()) {
    if (s[i] == '&') {
      const std::size_t semi = s.find(';', i);
      const std::string entity = s.substr(i, semi == std::string::npos ? 0 : semi - i + 1);
      if (entity != "&amp;" && entity != "&lt;" && entity != "&gt;" && entity != "&quot;") {
        why = "bad entity at " + std::to_string(i);
        return false;
      }
      i = semi + 1;
      continue;
    }
    if (s[i] != '<') {
      ++i;
      continue;
    }
    const std::size_t close = s.find('>', i);
    if (close == std::string::npos) {
      why = "unterminated tag at " + std::to_string(i);
      return false;
    }
    std::string tag = s.substr(i + 1, close - i - 1);
    i = close + 1;
    if (tag.find('<') != std::string::npos) {
      why = "'<' inside a tag: " + tag;
      return false;
    }
    std::size_t quotes = 0;
    for (char c : tag) quotes += c == '"';
    if (quotes % 2) {
      why = "unbalanced quotes in <" + tag + ">";
      return false;
    }
    if (!tag.empty() && tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (stack.empty() || stack.back() != name) {
        why = "</" + name + "> does not close " + (stack.empty() ? "anything" : "<" + stack.back() + ">");
        return false;
      }
      stack.pop_back();
    } else if (!tag.empty() && tag.back() == '/') {
      // self-closing
    } else {
      stack.push_back(tag.substr(0, tag.find_first_of(" \n\t")));
    }
  }
  if (!stack.empty()) {
    why = "<" + stack.back() + "> never closed";
    return false;
  }
  return true;
}

/// How often `needle` occurs in `haystack` (overlapping occurrences count).
inline std::size_t count_of(const std::string& haystack, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t p = haystack.find(needle); p != std::string::npos; p = haystack.find(needle, p + 1)) ++n;
  return n;
}

/// A pitfall's checks: each claim and whether it held.
using Checks = std::vector<std::pair<std::string, bool>>;

/// The claims that did not hold, one a line, for failure messages.
inline std::string failed_claims(const Checks& checks) {
  std::string out;
  for (const auto& c : checks)
    if (!c.second) out += "\n  - " + c.first;
  return out.empty() ? std::string(" (none; no checks ran?)") : out;
}

/// True when any claim did not hold.
inline bool any_fails(const Checks& checks) {
  for (const auto& c : checks)
    if (!c.second) return true;
  return false;
}

/// The separation every chapter's pitfall suite asserts, check by check:
/// each symptom check fails on the fixed run and each cure check fails on
/// the broken run (what both runs share belongs in Pitfall::preconditions),
/// and a check fails because its predicate is false, not because it reads an
/// outcome the other run lacks.
inline void check_separates(const mpt::Pitfall& p, const mpt::RunResult& broken,
                            const mpt::RunResult& fixed) {
  for (const auto& c : mpt::evaluate_checks(p.symptom, fixed)) {
    CHECK_MESSAGE(!c.second, p.id << ": the symptom check '" << c.first
                                  << "' also holds on the FIXED run (if both runs share it, it is a "
                                     "precondition)");
    CHECK(c.first.find("[check failed:") == std::string::npos);
  }
  for (const auto& c : mpt::evaluate_checks(p.cure, broken)) {
    CHECK_MESSAGE(!c.second, p.id << ": the cure check '" << c.first
                                  << "' also holds on the BROKEN run (if both runs share it, it is a "
                                     "precondition)");
    CHECK(c.first.find("[check failed:") == std::string::npos);
  }
}

/// The shared preconditions of a pitfall hold on both of its runs.
inline void check_preconditions(const mpt::Pitfall& p, const mpt::RunResult& broken,
                                const mpt::RunResult& fixed) {
  for (const auto* run : {&broken, &fixed}) {
    const std::string side = run == &broken ? "broken" : "fixed";
    for (const auto& c : mpt::evaluate_checks(p.preconditions, *run))
      CHECK_MESSAGE(c.second,
                    p.id << ": the precondition '" << c.first << "' does not hold on the " << side << " run");
  }
}

/// The assertions every chapter's pitfall suite makes about a pitfall's two
/// runs: the same outcome names in the same order (so the text and the JSON
/// can put them side by side), and both runs described.
inline void check_runs_comparable(const mpt::RunResult& broken, const mpt::RunResult& fixed) {
  REQUIRE(broken.outcomes.size() == fixed.outcomes.size());
  for (std::size_t i = 0; i < broken.outcomes.size(); ++i)
    CHECK(broken.outcomes[i].name == fixed.outcomes[i].name);
  CHECK(!broken.setup.empty());
  CHECK(!fixed.setup.empty());
  CHECK(!broken.explanation.empty());
  CHECK(!fixed.explanation.empty());
}

/// Both runs of a pitfall, run once per test program (they are deterministic).
struct PitfallRuns {
  mpt::RunResult broken;  ///< what Pitfall::broken() measured
  mpt::RunResult fixed;   ///< what Pitfall::fixed() measured
};
/// The runs of p, run on first use and kept.
inline const PitfallRuns& pitfall_runs(const mpt::Pitfall& p) {
  static std::map<std::string, PitfallRuns> cache;
  auto it = cache.find(p.id);
  if (it == cache.end()) it = cache.emplace(p.id, PitfallRuns{p.broken(), p.fixed()}).first;
  return it->second;
}
/// The runs of the registered pitfall `id`.
inline const PitfallRuns& pitfall_runs(const std::string& id) {
  return pitfall_runs(mpt::pitfall_registry().get(id));
}

/// The registered pitfalls of one chapter, in registration order.
inline std::vector<const mpt::Pitfall*> chapter_pitfalls(int chapter) {
  std::vector<const mpt::Pitfall*> out;
  for (const mpt::Pitfall& p : mpt::pitfall_registry().all())
    if (p.chapter == chapter) out.push_back(&p);
  return out;
}

/// Whether a and b are the same double, bit for bit (NaN payloads included).
inline bool same_bits(double a, double b) {
  std::uint64_t ua = 0, ub = 0;
  std::memcpy(&ua, &a, sizeof a);
  std::memcpy(&ub, &b, sizeof b);
  return ua == ub;
}

/// Whether two float vectors have the same length and the same values, bit
/// for bit (signed zeros and NaN payloads included).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (bits(a[i]) != bits(b[i])) return false;
  return true;
}

/// What every chapter's suite asserts of each pitfall: the broken run shows
/// the symptom, the fixed run the cure, both the preconditions; every check
/// separates the runs (check_separates); both runs measure the same
/// outcomes, and a rerun gives the same explanation and the same numbers,
/// bit for bit, none of them NaN (a NaN would say nothing: runs report what
/// was not finite as inf or as counts).
inline void check_pitfall(const mpt::Pitfall& p) {
  const PitfallRuns& r = pitfall_runs(p);
  const auto symptom = mpt::evaluate_checks(p.symptom, r.broken);
  const auto cure = mpt::evaluate_checks(p.cure, r.fixed);
  CHECK_MESSAGE(!any_fails(symptom), p.id << ": the broken run does not show the symptom; failed claims:"
                                          << failed_claims(symptom));
  CHECK_MESSAGE(!any_fails(cure),
                p.id << ": the fixed run does not show the fix; failed claims:" << failed_claims(cure));
  check_preconditions(p, r.broken, r.fixed);
  check_separates(p, r.broken, r.fixed);
  check_runs_comparable(r.broken, r.fixed);
  const mpt::RunResult broken_again = p.broken(), fixed_again = p.fixed();
  REQUIRE(broken_again.outcomes.size() == r.broken.outcomes.size());
  REQUIRE(fixed_again.outcomes.size() == r.fixed.outcomes.size());
  CHECK(broken_again.explanation == r.broken.explanation);
  CHECK(fixed_again.explanation == r.fixed.explanation);
  for (std::size_t i = 0; i < r.broken.outcomes.size(); ++i) {
    INFO(p.id << ": " << r.broken.outcomes[i].name);
    CHECK(same_bits(broken_again.outcomes[i].value, r.broken.outcomes[i].value));
    CHECK(same_bits(fixed_again.outcomes[i].value, r.fixed.outcomes[i].value));
    CHECK(!std::isnan(r.broken.outcomes[i].value));
    CHECK(!std::isnan(r.fixed.outcomes[i].value));
  }
}

/// A chapter registers exactly `ids`, in that order, and the registry as a
/// whole is ordered by chapter.
inline void check_chapter_registration(int chapter, const std::vector<std::string>& ids) {
  std::vector<std::string> got;
  for (const mpt::Pitfall* p : chapter_pitfalls(chapter)) got.push_back(p->id);
  CHECK(got == ids);
  int last_chapter = 0;
  for (const mpt::Pitfall& p : mpt::pitfall_registry().all()) {
    CHECK(p.chapter >= last_chapter);
    last_chapter = p.chapter;
  }
  CHECK(last_chapter >= chapter);
}

}  // namespace mpt_test
