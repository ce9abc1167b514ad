#!/usr/bin/env python3
# All chapters — the static-check half of the lint test (tools/lint.sh calls
# it): clang-tidy over every C++ translation unit of a build, grouped, plus
# the one check clang-tidy cannot do on a group (unused using-declarations
# and namespace aliases, which clang-tidy 14 looks for in the main file only).
# Depends on: Python 3, clang-tidy (Debian: clang-tidy),
# the build's compile_commands.json.
#
#   tools/lint_tidy.py BUILD_DIR [--jobs N] [--part NAME]  (NAME: a part of PARTS below)
#                                             check (exit 1 with the findings)
#   tools/lint_tidy.py --self-test            prove that a group still reports
#                                             what each of its files would
#
# Why groups. clang-tidy's time goes into matching its checks against the
# whole syntax tree of a unit, and nearly all of that tree is the standard
# library, Eigen and doctest, the same in every unit: about 300 units each
# took 5 to 40 s alone. Units compiled with the same flags are checked
# together, a generated file that #includes up to GROUP_SIZE of them, so the
# shared headers are parsed and matched once per group (about four times
# less work). What is checked is unchanged: every line of every unit, and
# the project headers they include, against the same .clang-tidy; findings
# name the real file and line, and NOLINT comments hold as before.
#
# Three things a group changes, and how each is handled:
#  - Two units may each define a file-local name (an anonymous-namespace
#    helper, a static constant) that clash when they meet in one group. Each
#    group is first compiled alone; a unit an error is
#    reported in moves on to a later group, until every group compiles (the
#    compile is clang-tidy's parse with one cheap check). A unit that does not
#    compile even alone is reported as it is.
#  - Every test, benchmark and fuzz target defines main() (or libFuzzer's
#    entry points): in a group, each such unit's are renamed by a macro
#    around its #include, so that programs can share a group.
#  - clang-tidy 14's misc-unused-using-decls and misc-unused-alias-decls look
#    at the main file only, which in a group is the generated file. So this
#    script does their job on every unit's own text: a using-declaration whose
#    name is never used unqualified in its file, and a namespace alias never
#    used as a qualifier, are reported (a subset of what clang-tidy reports:
#    a name that is written elsewhere in another meaning passes here). A unit
#    that ends up alone in its group gets clang-tidy's own check as well.
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

GROUP_SIZE = 24
INCLUDE_LINE = '#include "{}"  // NOLINT(bugprone-suspicious-include): a lint group\n'


def say(msg):
    print(f"lint: {msg}", flush=True)


# --- the units of a build ---------------------------------------------------

# The exercises' wrong answers on purpose (trivial/: stubs that return a
# constant; near-misses/: one classic mistake each) are inputs of the
# graders' own tests, not code anyone should copy: they are compiled with the
# warnings on and laid out by clang-format, but not checked here (about 170 s
# of CI's clang-tidy time, for 24 small units each checked alone).
NOT_CHECKED = re.compile(r"chapters/[^/]+/exercises/(trivial|near-misses)/")


def units_of(build, root):
    """[(file, directory, flags)] for every project .cpp of compile_commands.json
    (but NOT_CHECKED)."""
    db_path = os.path.join(build, "compile_commands.json")
    if not os.path.isfile(db_path):
        sys.exit(f"lint: {db_path} is missing; configure with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON")
    with open(db_path) as f:
        db = json.load(f)
    root = root.rstrip("/") + "/"
    seen, units = set(), []
    for e in db:
        for path in sources_of(e["file"]):
            if not path.endswith(".cpp") or not path.startswith(root) or "/build" in path[len(root):]:
                continue
            if NOT_CHECKED.match(path[len(root):]):
                continue
            if path in seen:  # a file compiled by several targets: clang-tidy -p takes the first too
                continue
            seen.add(path)
            units.append((path, e["directory"], flags_of(e, e["file"])))
    return units


UNITY_INCLUDE = re.compile(r'^#include "([^"]+)"\s*$')


def sources_of(path):
    """The project sources an entry compiles: the file itself, or, for one of
    CMake's unity files (BUILD/.../Unity/unity_N_cxx.cxx), the sources it
    #includes (each is checked as a unit of its own here)."""
    if re.search(r"/Unity/unity_[^/]*\.cxx$", path):
        with open(path) as f:
            return [m.group(1) for m in map(UNITY_INCLUDE.match, f) if m]
    return [path]


def flags_of(e, path):
    """The entry's compiler arguments without the compiler, -o, -c, the
    dependency-file options and the source file itself."""
    args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
    source = os.path.realpath(os.path.join(e["directory"], path))
    flags, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a in ("-o", "-c", "-MF", "-MT", "-MQ"):
            skip = True
        elif a in ("-MD", "-MMD") or os.path.realpath(os.path.join(e["directory"], a)) == source:
            pass
        else:
            flags.append(a)
    return tuple(flags)


# What a unit defines at file scope, read from its text: the names that
# could clash with another unit's in a group (a guess, made to avoid most
# clashes before anything is compiled; the compile of each group is still
# what decides, see settle_groups). Lines that start in column 0 (the
# project's .clang-format indents nothing at namespace scope) and define
# something: a function, a variable, a class, a macro, each with the
# namespaces around it (a line "namespace X {" opens one, "}  // namespace"
# closes it, as clang-format writes them). A type alias is recorded with its
# whole text, because two units may repeat the same alias.
NOT_A_DEFINITION = re.compile(r"(#|//|/\*|\*|\}|\{|namespace\b|using\s+namespace\b|using\s+[\w:]+\s*;|"
                              r"template\b|public:|private:|protected:|extern\s+\"C\")")
TAG_DEFINITION = re.compile(r"(?:(?:static|inline|constexpr|const)\s+)*(?:struct|class|union|enum(?:\s+class)?)\s+(\w+)")


def defined_names(path, cache={}):
    if path in cache:
        return cache[path]
    names, scope = set(), []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line or line[0].isspace():
                continue
            m = re.match(r"namespace\s*([\w:]*)\s*\{\s*(//.*)?$", line)
            if m:  # every anonymous namespace of a unit (and of a group) is one
                scope.append(m.group(1) or "(anonymous)")
                continue
            if re.match(r"\}\s*//\s*namespace\b", line) and scope:
                scope.pop()
                continue
            prefix = "::".join(scope + [""])
            m = re.match(r"#\s*define\s+(\w+)", line)
            if m:
                names.add(m.group(1))  # a macro has no scope
                continue
            if NOT_A_DEFINITION.match(line):
                continue
            m = TAG_DEFINITION.match(line)
            if m:
                names.add(prefix + m.group(1))
                continue
            if re.match(r"using\s+\w+\s*=", line):
                names.add(prefix + line.strip())
                continue
            # the last (qualified) name before "(", "=", "{", ";" or "[":
            # Linear::forward for a member defined out of its class
            ids = re.findall(r"[A-Za-z_][\w:]*", re.split(r"[(={;\[]", line, maxsplit=1)[0])
            name = ids[-1] if ids else ""
            if name and name not in ("main", "operator") and not re.fullmatch(r"[A-Z0-9_]+", name):
                names.add(prefix + name)
    cache[path] = names
    return names


def relative_paths(flags):
    """True when an include flag names a relative path (it depends on the
    folder clang-tidy runs in)."""
    for i, a in enumerate(flags):
        if a in ("-I", "-isystem", "-iquote", "-include"):
            if i + 1 < len(flags) and not flags[i + 1].startswith("/"):
                return True
        elif a.startswith("-I") and not a[2:].startswith("/"):
            return True
    return False


def initial_groups(units):
    """Units compiled with the same flags (in the same build folder, when a
    flag names a relative path), in order,
    up to GROUP_SIZE in a group, a unit joining the first group that defines
    none of its file-scope names (defined_names). An exercise's units group
    only with units of their own folder: the exercises keep alternative
    bodies of the same functions in student/, solution/, trivial/, which
    must never meet."""
    by_key = {}
    for path, directory, flags in units:
        folder = os.path.dirname(path) if "/exercises/" in path else ""
        # the build folder matters only to flags with relative paths
        where = directory if relative_paths(flags) else ""
        by_key.setdefault((where, flags, folder), []).append(path)
    groups = []
    for (_, flags, _), paths in sorted(by_key.items(), key=lambda kv: kv[1][0]):
        directory = next(d for p, d, _ in units if p == paths[0])
        mine = []
        for path in sorted(paths):
            names = defined_names(path)
            home = next((g for g in mine if len(g["files"]) < GROUP_SIZE and not (g["names"] & names)), None)
            if home is None:
                home = {"directory": directory, "flags": list(flags), "files": [], "names": set()}
                mine.append(home)
            home["files"].append(path)
            home["names"] |= names
        groups += [{k: v for k, v in g.items() if k != "names"} for g in mine]
    return groups


# --- compiling a group ------------------------------------------------------

# A program's entry points: every test, benchmark and fuzz target defines one,
# so two of them could never share a group. In the group each gets a name of
# its own (a macro around that unit's #include only).
ENTRY_POINT = re.compile(r"\bint\s+main\s*\(|\bBENCHMARK_MAIN\s*\(|\bLLVMFuzzerTestOneInput\b|"
                         r"\bLLVMFuzzerInitialize\b")
ENTRY_NAMES = ("main", "LLVMFuzzerTestOneInput", "LLVMFuzzerInitialize")


def defines_entry_point(path, cache={}):
    if path not in cache:
        with open(path, encoding="utf-8", errors="replace") as f:
            cache[path] = bool(ENTRY_POINT.search(f.read()))
    return cache[path]


def write_group(work, index, group):
    path = os.path.join(work, f"group_{index:03d}.cpp")
    with open(path, "w") as f:
        f.write("// Generated by tools/lint_tidy.py: units checked together (see its header).\n")
        for n, unit in enumerate(group["files"]):
            renamed = len(group["files"]) > 1 and defines_entry_point(unit)
            if renamed:
                for name in ENTRY_NAMES:
                    f.write(f"#define {name} {name}_of_unit_{n}\n")
            f.write(INCLUDE_LINE.format(unit))
            if renamed:
                for name in ENTRY_NAMES:
                    f.write(f"#undef {name}\n")
    return path


ERROR = re.compile(r"^(.*?):\d+:\d+: (?:fatal )?error: .*\[clang-diagnostic-error\]$")


def clashing_units(group, output):
    """The units of the group a compile error was reported in, or None when an
    error is in a file that is not one of them (a header)."""
    bad = set()
    members = {os.path.abspath(f) for f in group["files"]}
    for line in output.splitlines():
        m = ERROR.match(line)
        if m:
            where = os.path.abspath(os.path.join(group["directory"], m.group(1)))
            if where not in members:
                return None
            bad.add(where)
    return bad


def tidy(group, group_file, config):
    target = group["files"][0] if len(group["files"]) == 1 else group_file
    t = time.monotonic()
    r = subprocess.run(["clang-tidy", "--quiet", f"--config-file={config}", target, "--", *group["flags"]],
                       cwd=group["directory"], capture_output=True, text=True)
    return r.returncode, r.stdout, time.monotonic() - t


def settle_groups(groups, work, jobs, config):
    """Check every group with clang-tidy; a group whose units do not compile
    together (a compile error in one of its units) is split and its parts
    checked again, until every group compiles or is a lone unit (whose errors
    are clang-tidy's to report). Returns ([(group, (rc, output, seconds))],
    units moved apart)."""
    moved = 0
    pending = groups
    done = []
    rounds = 0
    while pending:
        rounds += 1
        if rounds > 50:
            sys.exit("lint: the lint groups did not settle in 50 rounds (a bug in tools/lint_tidy.py)")
        pending.sort(key=lambda g: -len(g["files"]))  # the largest first: the last to finish are short
        files = [write_group(work, 1000 * rounds + i, g) for i, g in enumerate(pending)]
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(lambda gf: tidy(gf[0], gf[1], config), zip(pending, files)))
        retry = []
        for group, result in zip(pending, results):
            if len(group["files"]) == 1 or not any(ERROR.match(line) for line in result[1].splitlines()):
                done.append((group, result))
                continue
            bad = clashing_units(group, result[1])
            if not bad:  # no unit to blame: split the group in two
                bad = set(group["files"][len(group["files"]) // 2:])
            keep = [f for f in group["files"] if f not in bad]
            out = [f for f in group["files"] if f in bad]
            moved += len(out)
            if keep:
                retry.append(dict(group, files=keep))
            retry.append(dict(group, files=out))
        pending = retry
    return done, moved


# --- clang-tidy's findings --------------------------------------------------

FINDING = re.compile(r"^\S.*:\d+:\d+: (warning|error): ")


# --- the unused using-declarations and namespace aliases ---------------------

def strip_comments_and_literals(text):
    """The text with comments, string and character literals blanked (lines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if m:
                end = text.find(")" + m.group(1) + '"', i)
                j = n if end < 0 else end + len(m.group(1)) + 2
                out.append(" " + "\n" * text.count("\n", i, j))
                i = j
            else:
                out.append(c)
                i += 1
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(" ")
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def unqualified(code, at):
    """True when the token at `at` is not written after ::, . or -> (a use a
    using-declaration can serve)."""
    before = code[:at].rstrip()
    return not before.endswith(("::", ".", "->"))


USING_DECL = re.compile(r"\busing\s+(?!namespace\b)((?:::\s*)?[A-Za-z_]\w*(?:\s*::\s*[A-Za-z_]\w*)+)\s*;")
ALIAS_DECL = re.compile(r"\bnamespace\s+([A-Za-z_]\w*)\s*=\s*[A-Za-z_:][\w:\s]*;")


def unused_declarations(path):
    """["FILE:LINE: ..."] for each using-declaration or namespace alias of FILE never used."""
    with open(path, encoding="utf-8", errors="replace") as f:
        code = strip_comments_and_literals(f.read())
    found = []
    for m in USING_DECL.finditer(code):
        name = re.split(r"\s*::\s*", m.group(1))[-1]
        rest = code[:m.start()] + " " * (m.end() - m.start()) + code[m.end():]
        if not any(unqualified(rest, k.start()) for k in re.finditer(r"\b" + re.escape(name) + r"\b", rest)):
            line = code.count("\n", 0, m.start()) + 1
            found.append(f"{path}:{line}: using-declaration of '{name}' is unused "
                         "(misc-unused-using-decls, checked by tools/lint_tidy.py)")
    for m in ALIAS_DECL.finditer(code):
        name = m.group(1)
        rest = code[:m.start()] + code[m.end():]
        if not re.search(r"(?<![\w:])\b" + re.escape(name) + r"\s*::", rest):
            line = code.count("\n", 0, m.start()) + 1
            found.append(f"{path}:{line}: namespace alias '{name}' is unused "
                         "(misc-unused-alias-decls, checked by tools/lint_tidy.py)")
    return found


# --- the check ----------------------------------------------------------------

# The parts CTest runs as separate tests (lint_tidy_NAME), so that they share
# the machine with the other tests and none nears CTest's five-minute limit:
# a unit belongs to the first part whose pattern matches its path (relative
# to the root), and "rest" holds every unit the others do not, so a new
# folder is never left out. The CLI, the chapters' pitfalls, their
# exercises (two parts) and the CPU tests of Chapters 1-3 are parts of their
# own because each took most of its folder's time (the pitfalls, the
# exercises' alternative bodies and the tests share file-local names, so
# they check apart from each other): with Chapter 5, "library" took 289 s
# and "chapters" ran past 300 s beside the other tests; split in nine, the
# largest still took 230 s, hence eleven. On a clean clone beside the other
# tests "rest" then took 259 s and the CPU tests of Chapters 1-3 240 s of
# their 300: the benchmarks (each target has flags of its own, so each unit
# is checked alone), the CUDA tests' host units and the CPU tests by two
# chapters are parts of their own, fourteen in all.
PARTS = [("cli", r"src/cli/"),
         ("library_nn", r"src/mpt/nn/"),
         ("library", r"(src|docs)/"),
         ("pitfalls", r"chapters/[^/]+/pitfalls/"),
         ("exercises_ch01_02", r"chapters/0[12][^/]*/exercises/"),
         ("exercises_ch03_04", r"chapters/0[34][^/]*/exercises/"),
         ("exercises", r"chapters/[^/]+/exercises/"),
         ("chapters", r"chapters/"),
         ("tests_cpu_ch01_02", r"tests/cpu/test_ch0[12]_"),
         ("tests_cpu_ch03_04", r"tests/cpu/test_ch0[34]_"),
         ("tests_cpu", r"tests/cpu/"),
         ("tests_bench", r"tests/bench/"),
         ("tests_cuda", r"tests/cuda"),
         ("rest", None)]


def part_of(path, root):
    rel = os.path.relpath(path, root)
    for name, pattern in PARTS:
        if pattern is None or re.match(pattern, rel):
            return name
    return "rest"


def check(build, root, jobs, config, quiet=False, part=None):
    """0 when every unit passes, 1 with the findings printed. `part`: check
    only that part's units (PARTS); None for all."""
    if not shutil.which("clang-tidy"):
        sys.exit("lint: clang-tidy not found (Debian: apt-get install clang-tidy)")
    units = units_of(build, root)
    if part is not None:
        units = [u for u in units if part_of(u[0], root) == part]
    if not units:
        sys.exit(f"lint: no project .cpp units{' in part ' + part if part else ''} in {build}/compile_commands.json")
    work = os.path.join(build, "lint-groups", part or "all")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    t0 = time.monotonic()
    checked, moved = settle_groups(initial_groups(units), work, jobs, config)
    groups = [g for g, _ in checked]
    results = [r for _, r in checked]
    findings, failed = [], 0
    for group, (rc, out, _) in checked:
        lines = [l for l in out.splitlines() if FINDING.match(l)]
        if rc != 0:
            failed += 1
            findings += lines or [f"clang-tidy failed (exit {rc}) on {', '.join(group['files'])}"]
    for path, _, _ in units:
        findings += unused_declarations(path)
    if not quiet:
        slowest = max(r[2] for r in results)
        say(f"{len(units)} translation units in {len(groups)} groups ({moved} moved apart after a compile "
            f"found clashing file-local names; clang-tidy {time.monotonic() - t0:.0f} s on {jobs} jobs, "
            f"the slowest group {slowest:.0f} s)")
        ranked = sorted(zip(results, groups), key=lambda rg: -rg[0][2])
        with open(os.path.join(work, "times.txt"), "w") as f:  # every group, slowest first
            for (rc, out, seconds), group in ranked:
                f.write(f"{seconds:6.1f}  {' '.join(os.path.relpath(u, root) for u in group['files'])}\n")
        for (rc, out, seconds), group in ranked[:5]:
            names = [os.path.relpath(f, root) for f in group["files"]]
            say(f"  {seconds:5.1f} s  {len(names)} unit(s): {names[0]}{' ...' if len(names) > 1 else ''}")
    if findings:
        print("lint: clang-tidy found problems (.clang-tidy's checks are errors):")
        for line in sorted(set(findings))[:60]:
            print("  " + line)
        return 1
    if not quiet:
        say(f"{len(units)} translation units pass .clang-tidy")
    return 0


# --- the self test --------------------------------------------------------------

SELF_TEST_FILES = {
    # a.cpp and c.cpp both define the file-local kLimit: they cannot share a group.
    "src/a.cpp": """#include <string>
namespace {
constexpr int kLimit = 1;
}
int a_limit() { return kLimit; }
""",
    "src/b.cpp": """#include <string>
#include <utility>
#include <numeric>
#include <vector>
namespace nothing_here {}
using std::accumulate;
namespace alias = nothing_here;
std::size_t by_value(const std::vector<int> v) { return v.size(); }
std::size_t moved(std::string s) {
  std::string t = std::move(s);
  return s.size() + t.size();
}
""",
    "src/c.cpp": """#include <string>
namespace {
constexpr int kLimit = 2;
}
bool emptiness(const std::string& s) { return s.size() == 0 && kLimit > 0; }
int* null_literal() { return 0; }
""",
    # e.cpp and f.cpp are two programs: each defines main(), yet they may share a group.
    "src/e.cpp": """int main() { return 0; }
""",
    "src/f.cpp": """int main(int argc, char** argv) { return argc > 1 && argv != nullptr ? 1 : 0; }
""",
    # g.cpp and h.cpp clash in a way defined_names cannot see (a name made by
    # a macro): only the compile of their group finds it.
    "src/g.cpp": """#define MAKE_HELPER(name) int name() { return 1; }
MAKE_HELPER(helper)
""",
    "src/h.cpp": """int helper() { return 2; }
""",
    "src/d.cpp": """#include <string>
#include <vector>
namespace fs_alias = std;
using std::vector;
std::size_t used(const vector<int>& v) { return v.size() + fs_alias::string("x").size(); }
""",
}

# (file, what must be reported about it)
SELF_TEST_EXPECT = [
    ("src/b.cpp", "misc-unused-using-decls"),
    ("src/b.cpp", "misc-unused-alias-decls"),
    ("src/b.cpp", "performance-unnecessary-value-param"),
    ("src/b.cpp", "bugprone-use-after-move"),
    ("src/c.cpp", "readability-container-size-empty"),
    ("src/c.cpp", "modernize-use-nullptr"),
]


def self_test(config):
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "tree")
        build = os.path.join(root, "build")
        os.makedirs(build)
        db = []
        for name, text in SELF_TEST_FILES.items():
            path = os.path.join(root, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            if name == "src/b.cpp":  # compiled through a CMake unity file, as the library is
                unity = os.path.join(build, "CMakeFiles", "t.dir", "Unity", "unity_0_cxx.cxx")
                os.makedirs(os.path.dirname(unity))
                with open(unity, "w") as f:
                    f.write(f'/* generated by CMake */\n\n#include "{path}"\n\n')
                path = unity
            db.append({"directory": build, "file": path,
                       "command": f"c++ -std=c++17 -O2 -o {name}.o -c {path}"})
        with open(os.path.join(build, "compile_commands.json"), "w") as f:
            json.dump(db, f)
        # The units (b.cpp read out of its unity file) share their flags and
        # folder: a.cpp and c.cpp (both define kLimit) start apart, g.cpp and
        # h.cpp together, e.cpp and f.cpp together (main is renamed).
        units = units_of(build, root)
        problems = []
        if len(units) != len(SELF_TEST_FILES):
            problems.append(f"expected {len(SELF_TEST_FILES)} units, got {[u[0] for u in units]}")
        groups = initial_groups(units)

        def together(gs, a, b):
            return any({a, b} <= {os.path.relpath(f, root) for f in g["files"]} for g in gs)

        if together(groups, "src/a.cpp", "src/c.cpp"):
            problems.append(f"a.cpp and c.cpp both define kLimit but start in one group: {groups}")
        if not together(groups, "src/g.cpp", "src/h.cpp"):
            problems.append(f"g.cpp and h.cpp look clash-free but start apart: {groups}")
        work = os.path.join(build, "lint-groups")
        os.makedirs(work)
        settled, moved = settle_groups(groups, work, 2, config)
        settled = [g for g, _ in settled]
        if moved < 1 or together(settled, "src/g.cpp", "src/h.cpp"):
            problems.append(f"g.cpp and h.cpp do not compile together but were not put apart: {settled}")
        if not any(len(g["files"]) > 1 for g in settled):
            problems.append("no group of more than one unit was left: the grouping proves nothing")
        if not together(settled, "src/e.cpp", "src/f.cpp"):
            problems.append(f"e.cpp and f.cpp (two main()s) were put apart: {settled}")
        # Run the check and read what it reported.
        import contextlib
        import io
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = check(build, root, 2, config, quiet=True)
        out = buf.getvalue()
        if rc != 1:
            problems.append(f"the check returned {rc} on a tree with findings, not 1")
        for name, what in SELF_TEST_EXPECT:
            if not any(name in line and what in line for line in out.splitlines()):
                problems.append(f"{what} in {name} was not reported")
        if "src/d.cpp" in out:
            problems.append("src/d.cpp uses its using-declaration and alias, but was reported")
        if "src/a.cpp" in out:
            problems.append("src/a.cpp is clean, but was reported")
        if problems:
            print("lint_tidy self test: FAILED\n  " + "\n  ".join(problems) + "\n--- the check printed:\n" + out)
            return 1
    print(f"lint_tidy self test: passed ({len(SELF_TEST_EXPECT)} findings in grouped units reported, "
          "clashing units put apart, clean units left alone)")
    return 0


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser(description="clang-tidy over a build's units, in groups")
    ap.add_argument("build", nargs="?")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--self-test", action="store_true")
    names = [n for n, _ in PARTS]
    ap.add_argument("--part", choices=names,
                    help="check only this part of the tree (CTest runs each as a test of its own)")
    args = ap.parse_args()
    config = os.path.join(root, ".clang-tidy")
    if args.self_test:
        return self_test(config)
    if not args.build:
        ap.error("BUILD_DIR is required (or --self-test)")
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    return check(os.path.abspath(args.build), root, args.jobs, config, part=args.part)


if __name__ == "__main__":
    sys.exit(main())
