// Chapter 01 — the pitfall registry from the `mpt` program: pitfalls, pitfall, tour.
// Depends on: command.hpp (registry), cli_support.hpp, CLI11, nlohmann_json,
// the mpt library's pitfall registry and InputFileError, and mpt_chapters (which fills it).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "cli_support.hpp"
#include "command.hpp"
#include "mpt/io/input_error.hpp"
#include "mpt/registry/pitfall.hpp"

namespace {

using Json = nlohmann::ordered_json;  // keeps outcomes in their display order
using mpt::cli::joined;
using mpt::cli::outcome_text;
using mpt::cli::table;
using mpt::cli::UsageError;

// ---------------------------------------------------------------------------
// The subcommands.

/// Runs `f`; a data file a pitfall needs that is missing or malformed
/// (mpt::InputFileError, one line) becomes a UsageError.
template <typename F>
decltype(auto) input_file_error_is_usage_error(F&& f) {
  try {
    return f();
  } catch (const mpt::InputFileError& e) {
    throw UsageError(e.what());
  }
}

/// The registered pitfalls of one chapter, or all of them for chapter 0.
/// A chapter without pitfalls is a usage error naming the chapters that have some.
std::vector<const mpt::Pitfall*> pitfalls_of_chapter(int chapter) {
  std::vector<const mpt::Pitfall*> out;
  std::vector<std::string> chapters;  // those with pitfalls, in registry order
  for (const mpt::Pitfall& p : mpt::pitfall_registry().all()) {
    const std::string c = std::to_string(p.chapter);
    if (chapters.empty() || chapters.back() != c) chapters.push_back(c);
    if (chapter == 0 || p.chapter == chapter) out.push_back(&p);
  }
  if (out.empty())
    throw UsageError(
        "--chapter " + std::to_string(chapter) +
        ": no pitfalls registered for that chapter; chapters with pitfalls: " + joined(chapters));
  return out;
}

int cmd_pitfalls(int chapter) {
  std::vector<std::vector<std::string>> rows = {{"id", "chapter", "title"}};
  for (const mpt::Pitfall* p : pitfalls_of_chapter(chapter))
    rows.push_back({p->id, std::to_string(p->chapter), p->title});
  std::cout << table(rows, "lrl");
  std::cout << "\nrun one: mpt pitfall ID    run all: mpt tour\n";
  return 0;
}

const mpt::Pitfall& pitfall_or_usage_error(const std::string& id) {
  const mpt::Registry& reg = mpt::pitfall_registry();
  if (const mpt::Pitfall* p = reg.find(id)) return *p;
  throw UsageError("unknown pitfall '" + id + "'; valid ids: " + reg.ids());
}

// Outcome names of both runs, broken's order first.
std::vector<std::string> outcome_names(const mpt::Verdict& v) {
  std::vector<std::string> names;
  for (const auto* run : {&v.broken, &v.fixed})
    for (const mpt::Outcome& o : run->outcomes)
      if (std::find(names.begin(), names.end(), o.name) == names.end()) names.push_back(o.name);
  return names;
}

const mpt::Outcome* find_outcome(const mpt::RunResult& r, const std::string& name) {
  for (const mpt::Outcome& o : r.outcomes)
    if (o.name == name) return &o;
  return nullptr;
}

// JSON cannot hold NaN or inf: nlohmann writes them as null (documented in --help).
Json run_json(const mpt::RunResult& r) {
  Json outcomes = Json::object();
  for (const mpt::Outcome& o : r.outcomes) outcomes[o.name] = o.value;
  Json what = Json::object();
  for (const mpt::Outcome& o : r.outcomes) what[o.name] = o.what;
  Json j = {{"setup", r.setup}, {"outcomes", outcomes}, {"what", what}};
  if (!r.explanation.empty()) j["explanation"] = r.explanation;
  return j;
}

Json checks_json(const std::vector<std::pair<std::string, bool>>& checks) {
  Json a = Json::array();
  for (const auto& c : checks) a.push_back({{"claim", c.first}, {"held", c.second}});
  return a;
}

// Each precondition with whether it held on the broken and on the fixed run.
Json preconditions_json(const mpt::Verdict& v) {
  Json a = Json::array();
  const auto& b = v.precondition_checks_broken;
  const auto& f = v.precondition_checks_fixed;
  for (std::size_t i = 0; i < std::max(b.size(), f.size()); ++i) {
    const std::string claim = i < b.size() ? b[i].first : f[i].first;
    a.push_back({{"claim", claim},
                 {"held_broken", i < b.size() && b[i].second},
                 {"held_fixed", i < f.size() && f[i].second}});
  }
  return a;
}

Json verdict_json(const mpt::Verdict& v) {
  const mpt::Pitfall& p = *v.pitfall;
  return {{"id", p.id},
          {"chapter", p.chapter},
          {"title", p.title},
          {"mechanism", p.mechanism},
          {"broken", run_json(v.broken)},
          {"fixed", run_json(v.fixed)},
          {"symptom", checks_json(v.symptom_checks)},
          {"cure", checks_json(v.cure_checks)},
          {"preconditions", preconditions_json(v)},
          {"symptom_shown", v.symptom_shown()},
          {"fix_works", v.fix_works()},
          {"preconditions_hold", v.preconditions_hold()},
          {"reproduced", v.reproduced()}};
}

/// `prefix` then `text` wrapped at word boundaries to lines of at most
/// `width` columns (a word longer than a line stays whole), every line after
/// the first indented by the prefix's width: the "why" explanations and the
/// set-ups run to hundreds of characters, and a text block in a chapter
/// README does not wrap them. Columns are counted in UTF-8 characters.
std::string wrapped(const std::string& prefix, const std::string& text, std::size_t width = 78) {
  auto columns = [](const std::string& w) {
    std::size_t n = 0;
    for (const unsigned char c : w) n += (c & 0xC0) != 0x80;
    return n;
  };
  const std::size_t indent = columns(prefix);
  std::string out = prefix, word;
  std::size_t at = indent;
  bool line_empty = true;
  std::istringstream words(text);
  while (words >> word) {
    const std::size_t w = columns(word);
    if (!line_empty && at + 1 + w > width) {
      out += "\n" + std::string(indent, ' ');
      at = indent;
      line_empty = true;
    }
    if (!line_empty) {
      out += ' ';
      ++at;
    }
    out += word;
    at += w;
    line_empty = false;
  }
  return out + "\n";
}

/// The report of one pitfall; `measured_only` leaves out the title and
/// mechanism lines (the chapter text tells the mechanism, once).
std::string verdict_text(const mpt::Verdict& v, bool measured_only) {
  const mpt::Pitfall& p = *v.pitfall;
  std::ostringstream o;
  if (!measured_only) {
    o << p.id << " (chapter " << p.chapter << "): " << p.title << "\n";
    o << "mechanism: " << p.mechanism << "\n\n";
  }
  o << wrapped("broken: ", v.broken.setup);
  o << wrapped("fixed:  ", v.fixed.setup) << "\n";
  std::vector<std::vector<std::string>> rows = {{"outcome", "broken", "fixed", "what"}};
  for (const std::string& name : outcome_names(v)) {
    const mpt::Outcome* b = find_outcome(v.broken, name);
    const mpt::Outcome* f = find_outcome(v.fixed, name);
    rows.push_back(
        {name, b ? outcome_text(b->value) : "-", f ? outcome_text(f->value) : "-", b ? b->what : f->what});
  }
  o << table(rows, "lrrl");
  if (!v.broken.explanation.empty()) o << "\n" << wrapped("why (broken): ", v.broken.explanation);
  if (!v.fixed.explanation.empty()) o << wrapped("why (fixed):  ", v.fixed.explanation);
  auto checks = [&](const char* heading, const std::vector<std::pair<std::string, bool>>& cs) {
    o << "\n" << heading << "\n";
    for (const auto& c : cs) o << wrapped(std::string("  ") + (c.second ? "✓ " : "✗ "), c.first);
  };
  checks("symptom (the broken run must show it):", v.symptom_checks);
  checks("cure (the fixed run must show it):", v.cure_checks);
  if (!v.precondition_checks_broken.empty() || !v.precondition_checks_fixed.empty()) {
    // Two marks per claim: held on the broken run, held on the fixed run.
    o << "\npreconditions (both runs must show them; marks: broken, fixed):\n";
    for (const Json& c : preconditions_json(v))
      o << wrapped(std::string("  ") + (c["held_broken"].get<bool>() ? "✓" : "✗") +
                       (c["held_fixed"].get<bool>() ? "✓ " : "✗ "),
                   c["claim"].get<std::string>());
  }
  std::vector<std::string> failures;
  if (!v.symptom_shown()) failures.push_back("the symptom did not show");
  if (!v.fix_works()) failures.push_back("the fix did not work");
  if (!v.preconditions_hold()) failures.push_back("a shared precondition did not hold");
  o << "\nverdict: "
    << (failures.empty()
            ? std::string("reproduced: the broken run shows the symptom and the fix works") +
                  (v.pitfall->preconditions.empty() ? "" : ", and both runs meet the preconditions")
            : "NOT reproduced: " + joined(failures))
    << "\n";
  return o.str();
}

int cmd_pitfall(const std::string& id, bool json, bool measured_only) {
  const mpt::Pitfall& p = pitfall_or_usage_error(id);
  const mpt::Verdict v = input_file_error_is_usage_error([&] { return mpt::run_pitfall(p); });
  if (json) std::cout << verdict_json(v).dump(2) << "\n";
  else std::cout << verdict_text(v, measured_only);
  return v.reproduced() ? 0 : 1;
}

// DIR/ID.txt: where the tour writes a pitfall's report.
std::string report_path(const std::string& dir, const mpt::Pitfall& p) { return dir + "/" + p.id + ".txt"; }

// --reports DIR: an existing, writable folder in which no report's name is
// taken by something the atomic write would refuse (a folder, a FIFO),
// checked before any pitfall runs.
void check_reports_dir(const std::string& dir, const std::vector<const mpt::Pitfall*>& all) {
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw UsageError("--reports " + mpt::cli::one_line(dir) +
                     ": not an existing folder; give a folder to write each pitfall's report into");
  if (access(dir.c_str(), W_OK) != 0)
    throw UsageError("--reports " + mpt::cli::one_line(dir) + ": the folder is not writable");
  for (const mpt::Pitfall* p : all) mpt::cli::check_output_path("--reports", report_path(dir, *p));
}

int cmd_tour(bool json, int chapter, const std::string& reports) {
  const std::vector<const mpt::Pitfall*> all = pitfalls_of_chapter(chapter);
  if (!reports.empty()) check_reports_dir(reports, all);
  std::vector<mpt::Verdict> verdicts;
  for (std::size_t i = 0; i < all.size(); ++i) {
    std::cerr << "[" << i + 1 << "/" << all.size() << "] " << all[i]->id << " ... " << std::flush;
    const auto t0 = std::chrono::steady_clock::now();
    verdicts.push_back(input_file_error_is_usage_error([&] { return mpt::run_pitfall(*all[i]); }));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.2f s", s);
    std::cerr << (verdicts.back().reproduced() ? "reproduced" : "NOT REPRODUCED") << " (" << secs << ")"
              << std::endl;
  }
  bool all_ok = true;
  for (const auto& v : verdicts) all_ok = all_ok && v.reproduced();
  // Each report is what `mpt pitfall ID --measured-only` prints for the same
  // (deterministic) runs: the chapters' generate.sh shows them without a
  // second run of every pitfall.
  for (const auto& v : verdicts)
    if (!reports.empty()) mpt::cli::write_atomically(report_path(reports, *v.pitfall), verdict_text(v, true));
  if (json) {
    Json list = Json::array();
    for (const auto& v : verdicts) list.push_back(verdict_json(v));
    std::cout << Json{{"pitfalls", list}, {"all_reproduced", all_ok}}.dump(2) << "\n";
    return all_ok ? 0 : 1;
  }
  std::vector<std::vector<std::string>> rows = {
      {"id", "chapter", "symptom shown", "fix works", "preconditions", "title"}};
  std::size_t failed = 0;
  for (const auto& v : verdicts) {
    failed += !v.reproduced();
    // "-": the entry declares no shared preconditions.
    const std::string pre = v.pitfall->preconditions.empty() ? "-" : v.preconditions_hold() ? "✓" : "✗";
    rows.push_back({v.pitfall->id, std::to_string(v.pitfall->chapter), v.symptom_shown() ? "✓" : "✗",
                    v.fix_works() ? "✓" : "✗", pre, v.pitfall->title});
  }
  std::cout << table(rows, "lrcccl") << "\n";
  if (failed == 0) std::cout << "all " << verdicts.size() << " pitfalls reproduced, and every fix works\n";
  else
    std::cout << failed << " of " << verdicts.size()
              << " pitfalls did not reproduce; run 'mpt pitfall ID' for details\n";
  return all_ok ? 0 : 1;
}

// ---------------------------------------------------------------------------
// Their command lines.

void add_pitfall_commands(CLI::App& app, mpt::cli::Handlers& handlers) {
  constexpr const char* kChapterHelp = "only this chapter's pitfalls (default: all)";

  // pitfalls
  auto* pitfalls = app.add_subcommand("pitfalls", "List the registered pitfalls: id, chapter, title");
  auto pitfalls_chapter = std::make_shared<int>(0);
  pitfalls->add_option("--chapter", *pitfalls_chapter, kChapterHelp);
  handlers.on(pitfalls, [pitfalls_chapter] { return cmd_pitfalls(*pitfalls_chapter); });

  // pitfall
  struct PitfallArgs {
    std::string id;
    bool json = false;
    bool measured_only = false;
  };
  auto p = std::make_shared<PitfallArgs>();
  auto* pitfall = app.add_subcommand(
      "pitfall",
      "Run one pitfall: its broken and its fixed run side by side, every symptom and cure check, and "
      "the preconditions both runs share. Exit status 0 when reproduced (symptom shown, fix works, "
      "preconditions held on both runs), 1 when not.");
  pitfall->add_option("ID", p->id, "pitfall id (see 'mpt pitfalls')")->required();
  auto* json_flag = pitfall->add_flag(
      "--json", p->json, "machine-readable output; outcome values that are NaN or inf are written as null");
  pitfall
      ->add_flag("--measured-only", p->measured_only,
                 "leave out the title and the mechanism: only what the two runs measured, and the checks "
                 "(the chapter texts show this; they tell the mechanism in prose)")
      ->excludes(json_flag);
  handlers.on(pitfall, [p] { return cmd_pitfall(p->id, p->json, p->measured_only); });

  // tour
  struct TourArgs {
    int chapter = 0;
    bool json = false;
    std::string reports;
  };
  auto t = std::make_shared<TourArgs>();
  auto* tour = app.add_subcommand(
      "tour",
      "Run every registered pitfall (progress on stderr) and print a summary table. Exit status 1 "
      "if any pitfall failed to reproduce.");
  tour->add_option("--chapter", t->chapter, kChapterHelp);
  tour->add_flag("--json", t->json,
                 "machine-readable output: {\"pitfalls\": [...], \"all_reproduced\": bool}; NaN/inf "
                 "outcome values are written as null");
  tour->add_option("--reports", t->reports,
                   "also write each pitfall's report, as 'mpt pitfall ID --measured-only' prints it, to "
                   "DIR/ID.txt (DIR must exist)")
      ->check(mpt::cli::non_empty("a folder"));
  handlers.on(tour, [t] { return cmd_tour(t->json, t->chapter, t->reports); });
}

// Chapter 1, second family: after the number tools in `mpt --help`.
const mpt::cli::Registration pitfall_registered{{1, 2}, "pitfall", add_pitfall_commands};

}  // namespace
