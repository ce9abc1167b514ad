#!/usr/bin/env bash
# Chapter 01 — regenerates the outputs the chapter text shows (generated/*.txt)
# and splices each into README.md between its markers.
# Depends on: a build of the project (BUILD_DIR/src/cli/mpt and
# BUILD_DIR/chapters/ch01_numbers), bash, awk, diff.
#
# usage: generate.sh BUILD_DIR           regenerate in place (then commit the result)
#        generate.sh --check BUILD_DIR   regenerate into a scratch copy and fail if
#                                        the committed files differ (the docs test)
#        generate.sh --bench BUILD_DIR   rerun the rounding benchmark (about a
#                                        minute, on an otherwise idle machine) and
#                                        splice its table into the text
#
# In README.md a block
#   <!-- generated: generated/NAME.txt -->
#   ...anything...
#   <!-- end generated -->
# is replaced by the marker lines around a fenced copy of generated/NAME.txt.
# generated/bench.txt is the benchmark record: timings belong to the machine
# that ran them, so only --bench rewrites it and --check leaves it alone.
set -euo pipefail

usage() {
  echo "usage: $0 [--check] BUILD_DIR" >&2
  exit 2
}

check=0
bench=0
if [[ "${1:-}" == "--check" ]]; then
  check=1
  shift
elif [[ "${1:-}" == "--bench" ]]; then
  bench=1
  shift
fi
[[ $# -eq 1 ]] || usage
build=$(cd "$1" && pwd) || usage
chapter=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

mpt="$build/src/cli/mpt"
numbers="$build/chapters/ch01_numbers"
for program in "$mpt" "$numbers"; do
  if [[ ! -x "$program" ]]; then
    echo "generate.sh: $program is missing; build the project first (cmake --build $build)" >&2
    exit 2
  fi
done

# The tour's progress lines carry timings, which differ run to run; they go
# to stderr, and stay out of the text.
tour_without_progress() { "$mpt" tour 2>/dev/null; }

# Everything the chapter shows. Each output file starts with the command a
# reader would type, so the text shows how to reproduce it.
# generate_all DIR writes DIR/generated/*.txt.
generate_all() {
  local out="$1/generated"
  mkdir -p "$out"
  # Start clean (except the hand-kept benchmark record), so an output that
  # is no longer produced cannot linger.
  find "$out" -maxdepth 1 -name '*.txt' ! -name 'bench.txt' -delete

  # run NAME DISPLAY COMMAND...: write "$ DISPLAY" and the output of COMMAND.
  # A failing command (e.g. a pitfall that no longer reproduces) stops
  # everything: the text must not show output of a broken build.
  run() {
    local name="$1" display="$2" rc=0
    shift 2
    { echo "\$ $display"; "$@"; } >"$out/$name.txt" || rc=$?
    if [[ $rc -ne 0 ]]; then
      echo "generate.sh: '$display' failed (exit status $rc); see $out/$name.txt" >&2
      exit 1
    fi
  }
  # run_with_input NAME INPUT DISPLAY COMMAND...: like run, INPUT on stdin.
  run_with_input() {
    local name="$1" input="$2" display="$3" rc=0
    shift 3
    { echo "\$ echo $input | $display"; echo "$input" | "$@"; } >"$out/$name.txt" || rc=$?
    if [[ $rc -ne 0 ]]; then
      echo "generate.sh: '$display' failed (exit status $rc)" >&2
      exit 1
    fi
  }

  run formats "mpt formats" "$mpt" formats
  run layouts "ch01_numbers layouts" "$numbers" layouts
  run derivation "ch01_numbers derivation" "$numbers" derivation
  run explain-65504-fp16 "mpt explain 65504 --format fp16" "$mpt" explain 65504 --format fp16
  run explain-65520-fp16 "mpt explain 65520 --format fp16" "$mpt" explain 65520 --format fp16
  run explain-0.1 "mpt explain 0.1" "$mpt" explain 0.1
  run rounding "ch01_numbers rounding" "$numbers" rounding
  run_with_input round-fp16 "65504 65519.996 65520 65536 0.1 1e-7 3e-8 2e-8" \
    "mpt round --format fp16" "$mpt" round --format fp16
  run fp8 "ch01_numbers fp8" "$numbers" fp8
  run pitfalls "mpt pitfalls" "$mpt" pitfalls
  local id
  for id in fp16-overflow fp16-lost-update fp16-sum-stagnation fp16-gradient-underflow fp16-vs-bf16; do
    run "pitfall-$id" "mpt pitfall $id" "$mpt" pitfall "$id"
  done
  run tour "mpt tour" tour_without_progress
  run claims "ch01_numbers claims" "$numbers" claims
}

# splice DIR: rewrite DIR/README.md with the current DIR/generated files.
splice() {
  local dir="$1"
  if ! awk -v dir="$dir" -v bench="$bench" '
    function fail(msg) { print "generate.sh: README.md line " NR ": " msg > "/dev/stderr"; failed = 1; exit 1 }
    inside {
      if ($0 ~ /^<!-- end generated -->[ \t]*$/) { inside = 0; print }
      else if (keep) print
      next
    }
    /^<!-- generated: [^ ]+ -->[ \t]*$/ {
      print
      file = $3
      inside = 1
      keep = (file == "generated/bench.txt" && !bench)
      if (keep) next
      path = dir "/" file
      print "```text"
      n = 0
      while ((status = (getline line < path)) > 0) { print line; n++ }
      if (status < 0) fail("cannot read " file)
      close(path)
      print "```"
      next
    }
    { print }
    END {
      if (failed) exit 1
      if (inside) { print "generate.sh: README.md: a generated block is not closed by <!-- end generated -->" > "/dev/stderr"; exit 1 }
    }
  ' "$dir/README.md" >"$dir/README.md.new"; then
    rm -f "$dir/README.md.new"
    exit 1
  fi
  mv "$dir/README.md.new" "$dir/README.md"

  # Every output must appear in the text, or it is not worth generating.
  local f missing=0
  for f in "$dir"/generated/*.txt; do
    if ! grep -qF "<!-- generated: generated/$(basename "$f") -->" "$dir/README.md"; then
      echo "generate.sh: generated/$(basename "$f") is not shown in README.md" >&2
      missing=1
    fi
  done
  return $missing
}

if [[ $bench -eq 1 ]]; then
  b="$build/tests/bench/bench_ch01_round"
  if [[ ! -x "$b" ]]; then
    echo "generate.sh: $b is missing; configure with -DMPT_BENCHMARKS=ON and build it" >&2
    exit 2
  fi
  cmd="bench_ch01_round --benchmark_min_time=0.5"
  {
    echo "\$ $cmd    # $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(date -u +%Y-%m-%d)"
    # Google Benchmark's per-run lines go to stdout too; the summary table
    # starts at the "n = " line.
    "$b" --benchmark_min_time=0.5 2>/dev/null | sed -n '/^n = /,$p'
  } >"$chapter/generated/bench.txt.new"
  mv "$chapter/generated/bench.txt.new" "$chapter/generated/bench.txt"
  splice "$chapter"
  echo "reran the benchmark into $chapter/generated/bench.txt and the README.md block"
  exit 0
fi

if [[ $check -eq 0 ]]; then
  generate_all "$chapter"
  splice "$chapter"
  echo "regenerated $chapter/generated/ and the README.md blocks"
  exit 0
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/chapter/generated"
cp "$chapter/README.md" "$scratch/chapter/"
if [[ -f "$chapter/generated/bench.txt" ]]; then
  cp "$chapter/generated/bench.txt" "$scratch/chapter/generated/"
fi
generate_all "$scratch/chapter"
splice "$scratch/chapter"

status=0
if ! diff -ru "$chapter/generated" "$scratch/chapter/generated"; then status=1; fi
if ! diff -u "$chapter/README.md" "$scratch/chapter/README.md"; then status=1; fi
if [[ $status -ne 0 ]]; then
  echo >&2
  echo "chapter 01: the committed outputs differ from what the code produces now (diff above:" >&2
  echo "committed first, fresh second). Regenerate and commit:" >&2
  echo "  chapters/01-floating-point-formats/generate.sh BUILD_DIR" >&2
  exit 1
fi
echo "chapter 01: README.md and generated/ match the code"
