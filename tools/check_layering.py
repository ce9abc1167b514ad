#!/usr/bin/env python3
# All chapters — the layering check (CTest `layering`, label lint).
# Depends on: Python 3 only.
#
# The project has two orders, and an #include must respect both:
#
#  1. Tiers. src/mpt/<tier>/ and kernels/<tier>/ are ordered lowest first
#     (the list comes from src/mpt/CMakeLists.txt, MPT_TIERS). A file may
#     include its own tier and the tiers below, never a later one. The
#     library (src/mpt) includes nothing outside src/mpt; a kernel includes
#     only src/mpt and kernels/.
#  2. Chapters. Every C++/CUDA source under src/, kernels/, chapters/, tests/
#     and docs/ names its chapter in its first lines: "Chapter NN",
#     "Chapters NN onwards" (NN) or "All chapters" (no chapter of its own). A
#     file of Chapter N may not include a file of a later chapter.
#
#   tools/check_layering.py ROOT [--tiers formats,core,...]   check a tree
#   tools/check_layering.py --self-test                      prove the checks bite
#
# Exit status 0 when clean, 1 with one line per violation otherwise.
import argparse
import os
import re
import sys
import tempfile

SOURCE_DIRS = ("src", "kernels", "chapters", "tests", "docs")
EXTENSIONS = (".cpp", ".hpp", ".cu", ".cuh", ".h")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
TAG = re.compile(r"\b(All chapters)\b|\bChapters? (\d\d)\b")
TIERS_IN_CMAKE = re.compile(r"set\(MPT_TIERS ([a-z0-9_ ]+?) CACHE")


def tiers_from_cmake(root):
    path = os.path.join(root, "src", "mpt", "CMakeLists.txt")
    with open(path, encoding="utf-8") as f:
        m = TIERS_IN_CMAKE.search(f.read())
    if not m:
        sys.exit(f"check_layering: no 'set(MPT_TIERS ... CACHE' line in {path}")
    return m.group(1).split()


def chapter_tag(path):
    """0 for 'All chapters', N for 'Chapter(s) NN', None when untagged."""
    with open(path, encoding="utf-8", errors="replace") as f:
        head = "".join(f.readline() for _ in range(3))
    m = TAG.search(head)
    if not m:
        return None
    return 0 if m.group(1) else int(m.group(2))


def tier_of(rel, tiers):
    """(area, tier) for src/mpt/<tier>/... and kernels/<tier>/..., else (None, None)."""
    parts = rel.split("/")
    if len(parts) >= 4 and parts[0] == "src" and parts[1] == "mpt" and parts[2] in tiers:
        return "src", parts[2]
    if len(parts) >= 3 and parts[0] == "kernels" and parts[1] in tiers:
        return "kernels", parts[1]
    return None, None


def resolve(root, rel, target):
    """The project file an #include "target" in `rel` means, or None (system/third party)."""
    candidates = [
        os.path.join(os.path.dirname(rel), target),  # next to the includer
        os.path.join("src", target),                 # "mpt/<tier>/x.hpp"
        target,                                      # "kernels/<tier>/x.hpp", "chapters/..."
        os.path.join("tests", "cuda_host", target),  # the shared GPU test inputs
    ]
    for c in candidates:
        c = os.path.normpath(c)
        if os.path.isfile(os.path.join(root, c)):
            return c.replace(os.sep, "/")
    return None


def sources(root):
    for top in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "generated"]
            for name in sorted(filenames):
                if name.endswith(EXTENSIONS):
                    yield os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")


def check(root, tiers):
    problems = []
    rank = {t: i for i, t in enumerate(tiers)}
    tags = {}
    files = list(sources(root))
    for rel in files:
        tags[rel] = chapter_tag(os.path.join(root, rel))
        if tags[rel] is None:
            problems.append(f"{rel}:1: no chapter tag in the first lines "
                            "(write 'Chapter NN', 'Chapters NN onwards' or 'All chapters')")
    for rel in files:
        area, tier = tier_of(rel, tiers)
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
        for number, line in enumerate(lines, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            dep = resolve(root, rel, target)
            where = f"{rel}:{number}"
            if dep is None:
                if target.startswith(("mpt/", "kernels/")):
                    problems.append(f"{where}: includes \"{target}\", which is not in the tree")
                continue
            dep_area, dep_tier = tier_of(dep, tiers)
            if area == "src" and not dep.startswith("src/mpt/"):
                problems.append(f"{where}: the library includes {dep}; src/mpt may include only src/mpt")
            if area == "kernels" and not dep.startswith(("src/mpt/", "kernels/")):
                problems.append(f"{where}: a kernel includes {dep}; kernels/ may include only "
                                "src/mpt and kernels/")
            if tier and dep_tier and rank[dep_tier] > rank[tier]:
                problems.append(f"{where}: tier '{tier}' includes {dep} of the later tier "
                                f"'{dep_tier}' (order: {', '.join(tiers)})")
            mine, theirs = tags.get(rel), tags.get(dep, chapter_tag(os.path.join(root, dep)))
            if mine and theirs and theirs > mine:
                problems.append(f"{where}: a Chapter {mine:02d} file includes {dep}, "
                                f"which belongs to the later Chapter {theirs:02d}")
    return problems


def self_test():
    """Build a small tree with one violation of each kind and a clean file; all must be caught."""
    tree = {
        "src/mpt/CMakeLists.txt": "set(MPT_TIERS low high CACHE INTERNAL \"\")\n",
        "src/mpt/low/a.hpp": "// Chapter 01 — a\n#pragma once\n",
        "src/mpt/low/up.hpp": "// Chapter 02 — x\n#include \"mpt/high/b.hpp\"\n",
        "src/mpt/high/b.hpp": "// Chapter 02 — b\n#include \"mpt/low/a.hpp\"\n",
        "src/mpt/high/late.hpp": "// Chapter 03 — late\n#pragma once\n",
        "src/mpt/high/early.hpp": "// Chapter 02 — early\n#include \"mpt/high/late.hpp\"\n",
        "src/mpt/high/untagged.hpp": "#pragma once\n",
        "src/mpt/high/demo.hpp": "// Chapter 02 — d\n#include \"chapters/x.hpp\"\n",
        "src/mpt/high/missing.hpp": "// Chapter 02 — m\n#include \"mpt/high/nothing.hpp\"\n",
        "chapters/x.hpp": "// All chapters — x\n#include \"mpt/high/late.hpp\"\n",
        "kernels/low/k.cu": "// Chapter 01 — k\n#include \"kernels/high/h.hpp\"\n",
        "kernels/high/h.hpp": "// Chapter 02 — h\n#include \"mpt/low/a.hpp\"\n",
    }
    expected = [
        "src/mpt/low/up.hpp:2: tier 'low' includes src/mpt/high/b.hpp",
        "src/mpt/high/early.hpp:2: a Chapter 02 file includes src/mpt/high/late.hpp",
        "src/mpt/high/untagged.hpp:1: no chapter tag",
        "src/mpt/high/demo.hpp:2: the library includes chapters/x.hpp",
        "src/mpt/high/missing.hpp:2: includes \"mpt/high/nothing.hpp\", which is not in the tree",
        "kernels/low/k.cu:2: tier 'low' includes kernels/high/h.hpp",
        "kernels/low/k.cu:2: a Chapter 01 file includes kernels/high/h.hpp",
    ]
    with tempfile.TemporaryDirectory() as root:
        for rel, text in tree.items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
                f.write(text)
        found = check(root, tiers_from_cmake(root))
    missed = [e for e in expected if not any(p.startswith(e) for p in found)]
    extra = [p for p in found if not any(p.startswith(e) for e in expected)]
    for m in missed:
        print(f"self-test: NOT caught: {m}")
    for e in extra:
        print(f"self-test: unexpected: {e}")
    if missed or extra:
        return 1
    print(f"self-test: all {len(expected)} planted violations caught, nothing else")
    return 0


def main():
    ap = argparse.ArgumentParser(description="Check that #includes respect the tiers and chapters.")
    ap.add_argument("root", nargs="?", help="the repository root")
    ap.add_argument("--tiers", help="comma-separated tiers, lowest first (default: src/mpt/CMakeLists.txt)")
    ap.add_argument("--self-test", action="store_true", help="check the checker on a planted tree")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.root:
        ap.error("give the repository root, or --self-test")
    tiers = a.tiers.split(",") if a.tiers else tiers_from_cmake(a.root)
    problems = check(a.root, tiers)
    for p in problems:
        print(p)
    if problems:
        print(f"layering: {len(problems)} violation(s)")
        return 1
    print(f"layering: clean (tiers {', '.join(tiers)}; every file tagged with its chapter)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
