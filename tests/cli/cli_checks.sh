#!/usr/bin/env bash
# Chapter 01 — the `mpt` command line, checked as a user sees it.
# Depends on: cli_lib.sh (the shared harness), bash, grep, awk; python3 for
# the JSON and XML checks.
#
# Usage: cli_checks.sh PATH/TO/mpt CASE. Exit 0 pass, 1 fail, 77 skipped.
# On failure the case prints what it expected and what mpt printed.
set -u

MPT=$1
CASE=$2
. "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"

# run STDIN ARGS...: run mpt with STDIN as its standard input.
run() {
  local input=$1
  shift
  ARGS="$*"
  printf '%s' "$input" | "$MPT" "$@" >"$OUT" 2>"$ERR"
  RC=$?
}

# The format names, from the first column of `mpt formats`.
format_names() {
  "$MPT" formats | awk 'NR > 1 && NF == 0 { exit } NR > 1 { print $1 }'
}

# The pitfall ids, from the first column of `mpt pitfalls`.
pitfall_ids() {
  "$MPT" pitfalls | awk 'NR > 1 && NF == 0 { exit } NR > 1 { print $1 }'
}

case "$CASE" in

formats_table)
  run "" formats
  expect_rc 0
  for v in 65504 448 57344 2^-24 2^-14 2^-10 3.3895314e+38; do expect_out "$v"; done
  [ "$(format_names | wc -l)" -eq 6 ] || fail "expected six formats"
  for f in fp32 tf32 bf16 fp16 e4m3 e5m2; do expect_out_regex "^$f "; done
  ;;

round_fp16_lines)
  run "65504 65519.996 65520 1e-8 0x1p-24" round --format fp16
  expect_rc 0
  expect_out_exactly "65504 0x7bff
65504 0x7bff
inf 0x7c00
0 0x0000
5.9604645e-08 0x0001"
  run $'-65520\n-0\t0x1.ffcp+15\n  1.5e-3\n' round --format fp16
  expect_rc 0
  expect_out_exactly "-inf 0xfc00
-0 0x8000
65504 0x7bff
0.0015001297 0x1625"
  # e4m3 saturates by default; 0.001 is above half its min subnormal 2^-9.
  run "448 1000 -1e9 nan 0.001" round --format e4m3
  expect_rc 0
  expect_out_exactly "448 0x7e
448 0x7e
-448 0xfe
nan 0x7f
0.001953125 0x01"
  run "" round --format fp16
  expect_rc 0
  [ ! -s "$OUT" ] || fail "no input should give no output"
  ;;

round_modes_and_overflow)
  run "65520" round -f fp16 --mode rtz
  expect_rc 0
  expect_out_exactly "65504 0x7bff"
  run "1.99" round -f e4m3 --mode rtz
  expect_out_exactly "1.875 0x3f"
  run "1e6" round -f fp16 --saturate
  expect_out_exactly "65504 0x7bff"
  run "1e6" round -f fp16 --overflow sat
  expect_out_exactly "65504 0x7bff"
  run "1e6" round -f e4m3 --overflow inf
  expect_out_exactly "nan 0x7f"
  run "0x1p-24 0x1p-14" round -f fp16 --flush-subnormals
  expect_out_exactly "0 0x0000
6.1035156e-05 0x0400"
  run "1" round -f fp16 --mode xx
  expect_usage_error "'xx'" rne rtz sr
  run "1" round -f fp16 --overflow wrap
  expect_usage_error "'wrap'" inf sat
  ;;

round_stochastic_is_reproducible)
  input=$(for i in $(seq 200); do printf '1.000244140625 '; done)
  run "$input" round -f fp16 --mode sr --seed 5
  expect_rc 0
  cp "$OUT" "$WORK/first"
  [ "$(wc -l <"$OUT")" -eq 200 ] || fail "expected 200 lines"
  expect_out "1 0x3c00"
  expect_out "1.0009766 0x3c01"
  run "$input" round -f fp16 --mode sr --seed 5
  cmp -s "$WORK/first" "$OUT" || fail "the same seed gave different results"
  run "$input" round -f fp16 --mode sr --seed 6
  ! cmp -s "$WORK/first" "$OUT" || fail "seeds 5 and 6 gave identical results"
  # Element i uses index i: the first element alone rounds as in the stream.
  run "1.000244140625" round -f fp16 --mode sr --seed 5
  [ "$(cat "$OUT")" = "$(head -n 1 "$WORK/first")" ] || fail "element 0 differs when alone"
  ;;

round_unknown_format)
  run "1" round --format fp17
  expect_usage_error "mpt: unknown format 'fp17'; valid formats: "
  for f in $(format_names); do expect_err "$f"; done
  run "1" range --format fp17
  expect_usage_error "'fp17'" "valid formats"
  run "" explain 1 --format fp17
  expect_usage_error "'fp17'" "valid formats"
  ;;

round_bad_number)
  run "1 2 1.2.3 4" round --format fp16
  expect_usage_error "mpt: cannot parse '1.2.3' (input 3) as a number; use decimal" "hex-float"
  for bad in abc 0x 1e 1,5 --; do
    run "0.5 $bad" round --format fp16
    expect_usage_error "'$bad' (input 2)"
  done
  ;;

explain_fp16)
  run "" explain 65504 --format fp16
  expect_rc 0
  expect_out "0 11110 1111111111"
  expect_out "0x7bff"
  expect_out_regex "next below +65472$"
  expect_out_regex "next above +inf$"
  run "" explain 0.1 -f fp16
  expect_rc 0
  expect_out "0.0999755859375"
  expect_out "0.1000000000000000055511151231257827021181583404541015625"
  expect_out_regex "ulp +2\^-14 "
  run "" explain 0x1p-24 -f fp16
  expect_out "subnormal"
  run "" explain 1.2.3 --format fp16
  expect_usage_error "'1.2.3'" "hex-float"
  ;;

explain_all_formats)
  run "" explain 0.1
  expect_rc 0
  for f in $(format_names); do expect_out_regex "^$f "; done
  expect_out_regex "^fp16 +0.099975586 +0 01011 1001100110 +0x2e66 +rounded"
  run "" explain -1.5
  expect_rc 0
  expect_out_regex "^fp16 +-1.5 +1 01111 1000000000 +0xbe00 +exact"
  ;;

pitfalls_list)
  run "" pitfalls
  expect_rc 0
  expect_out_regex "^id +chapter +title"
  n=$(pitfall_ids | wc -l)
  [ "$n" -ge 5 ] || fail "expected at least the five Chapter 1 pitfalls, found $n"
  for id in $(pitfall_ids); do
    [[ $id =~ ^[a-z0-9]+(-[a-z0-9]+)*$ ]] || fail "id '$id' is not kebab-case"
  done
  ;;

pitfall_unknown_id)
  first=$(pitfall_ids | head -n 1)
  run "" pitfall no-such-id
  expect_usage_error "mpt: unknown pitfall 'no-such-id'; valid ids: " "$first"
  run "" pitfall
  expect_usage_error "ID" "valid ids"
  ;;

pitfall_json)
  need_python
  first=$(pitfall_ids | head -n 1)
  run "" pitfall "$first"
  [ "$RC" -eq 0 ] || [ "$RC" -eq 1 ] || fail "exit status must be 0 or 1"
  text_rc=$RC
  expect_out "$first"
  expect_out_regex "^outcome +broken +fixed"
  expect_out_regex "^  (✓|✗) "
  expect_out "verdict: "
  run "" pitfall "$first" --json
  [ "$RC" -eq "$text_rc" ] || fail "--json changed the exit status"
  python3 - "$OUT" "$RC" "$first" <<'PY' || fail "JSON check failed"
import json, sys
d = json.load(open(sys.argv[1]))
rc, pid = int(sys.argv[2]), sys.argv[3]
for k in ("id", "chapter", "title", "mechanism", "broken", "fixed", "symptom", "cure", "reproduced"):
    assert k in d, "missing key " + k
assert d["id"] == pid
for side in ("broken", "fixed"):
    assert isinstance(d[side]["setup"], str)
    assert isinstance(d[side]["outcomes"], dict) and d[side]["outcomes"]
    for v in d[side]["outcomes"].values():
        assert v is None or isinstance(v, (int, float))
for c in d["symptom"] + d["cure"]:
    assert isinstance(c["claim"], str) and isinstance(c["held"], bool)
assert isinstance(d["reproduced"], bool)
assert d["reproduced"] == (rc == 0), "exit status does not match 'reproduced'"
PY
  ;;

pitfall_measured_only)
  # The chapter texts show `--measured-only`: the same measurements and
  # checks, the same exit status, without the title and mechanism lines.
  first=$(pitfall_ids | head -n 1)
  run "" pitfall "$first"
  full_rc=$RC
  grep -v -e "^$first (chapter " -e '^mechanism: ' "$OUT" | sed '/./,$!d' >"$WORK/expected"
  run "" pitfall "$first" --measured-only
  [ "$RC" -eq "$full_rc" ] || fail "--measured-only changed the exit status"
  if grep -qE -e '^mechanism: ' -e "^$first \(chapter " "$OUT"; then
    fail "--measured-only still prints the title or the mechanism"
  fi
  expect_out_regex "^outcome +broken +fixed"
  expect_out "verdict: "
  cmp -s "$WORK/expected" "$OUT" || fail "--measured-only differs from the full report by more than its first lines:
$(diff "$WORK/expected" "$OUT" | head -n 20)"
  run "" pitfall "$first" --measured-only --json
  expect_usage_error
  ;;

tour_json)
  # Chapter 1's pitfalls only: the JSON form and the exit status are what is
  # checked here; that every pitfall reproduces is the pitfall suites' job
  # (test_chNN_pitfalls), and the whole tour runs in the chapters' docs
  # checks (generate.sh --check).
  need_python
  run "" tour --chapter 1 --json
  [ "$RC" -eq 0 ] || [ "$RC" -eq 1 ] || fail "exit status must be 0 or 1"
  n=$("$MPT" pitfalls --chapter 1 | awk 'NR > 1 && NF == 0 { exit } NR > 1 { print $1 }' | wc -l)
  [ "$n" -ge 2 ] || fail "chapter 1 lists $n pitfalls; the check needs at least 2"
  progress=$(grep -c '^\[[0-9]*/[0-9]*\] ' "$ERR")
  [ "$progress" -eq "$n" ] || fail "expected $n progress lines on stderr, found $progress"
  python3 - "$OUT" "$RC" "$n" <<'PY' || fail "JSON check failed"
import json, sys
d = json.load(open(sys.argv[1]))
rc, n = int(sys.argv[2]), int(sys.argv[3])
assert isinstance(d["pitfalls"], list) and len(d["pitfalls"]) == n
assert isinstance(d["all_reproduced"], bool)
assert d["all_reproduced"] == all(p["reproduced"] for p in d["pitfalls"])
assert d["all_reproduced"] == (rc == 0), "exit status does not match all_reproduced"
for p in d["pitfalls"]:
    for k in ("id", "chapter", "title", "mechanism", "broken", "fixed", "symptom", "cure", "reproduced"):
        assert k in p, "missing key " + k
PY
  ;;

tour_reports_match_pitfall)
  # mpt tour --reports DIR writes, per pitfall, what `mpt pitfall ID
  # --measured-only` prints (the chapters' generate.sh shows these files
  # under that command): byte for byte, for every pitfall of chapter 1.
  mkdir "$WORK/reports"
  run "" tour --chapter 1 --reports "$WORK/reports"
  expect_rc 0
  ids=$("$MPT" pitfalls --chapter 1 | awk 'NR > 1 && NF == 0 { exit } NR > 1 { print $1 }')
  [ -n "$ids" ] || fail "no chapter 1 pitfalls listed"
  for id in $ids; do
    [ -f "$WORK/reports/$id.txt" ] || fail "no report $id.txt"
    "$MPT" pitfall "$id" --measured-only >"$WORK/one.txt" 2>/dev/null
    cmp -s "$WORK/one.txt" "$WORK/reports/$id.txt" ||
      fail "reports/$id.txt differs from 'mpt pitfall $id --measured-only': $(diff "$WORK/one.txt" "$WORK/reports/$id.txt" | head -5)"
  done
  [ "$(find "$WORK/reports" -type f | wc -l)" -eq "$(echo "$ids" | wc -l)" ] || fail "extra files in the reports folder"
  ;;

range_report_and_svg)
  data="0 1 65504 65519 65520 1e5 0x1p-24 1e-8 3e-6 inf nan 0.1"
  run "$data" range --format fp16 --svg "$WORK/h.svg"
  expect_rc 0
  expect_out "range report: 12 values stored as fp16"
  expect_out_regex "^  overflow +2 +16.67%$"
  expect_out "min subnormal 2^-24"
  [ -s "$WORK/h.svg" ] || fail "no SVG written"
  [ ! -e "$WORK/h.svg.tmp" ] || fail "temporary file left behind"
  head -c 4 "$WORK/h.svg" | grep -q '<svg' || fail "the SVG does not start with <svg"
  for m in min-subnormal min-normal max; do
    grep -q "class=\"marker $m\"" "$WORK/h.svg" || fail "SVG lacks the $m marker"
  done
  if command -v python3 >/dev/null; then
    python3 -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' "$WORK/h.svg" ||
      fail "the SVG is not well-formed XML"
  fi
  run "1 x" range --format fp16 --svg "$WORK/bad.svg"
  expect_usage_error "'x' (input 2)"
  [ ! -e "$WORK/bad.svg" ] || fail "bad input still wrote the SVG"
  run "1" range --format fp16 --svg "$WORK/no/such/dir/h.svg"
  expect_usage_error "cannot write"
  ;;

usage_errors)
  run "" ; expect_usage_error "missing subcommand" "formats" "explain" "round" "tour"
  run "" frobnicate; expect_usage_error "'frobnicate'" "valid subcommands" "formats"
  run "" --frobnicate; expect_usage_error "'--frobnicate'" "formats"
  run "1" round --fromat fp16; expect_usage_error "'--fromat'" "--format"
  run "1" round; expect_usage_error "--format" "fp16"
  run "1" round --format; expect_usage_error "--format" "fp16"
  run "1" round -f fp16 --seed abc; expect_usage_error "--seed"
  run "1" round -f fp16 --saturate --overflow inf; expect_usage_error "--saturate" "--overflow"
  run "" explain; expect_usage_error "VALUE"
  run "" explain 1 2; expect_usage_error "'2'"
  run "" formats extra; expect_usage_error "'extra'"
  run "" tour --verbose; expect_usage_error "'--verbose'" "--json"
  ;;

help_exits_zero)
  run "" --help
  expect_rc 0
  for s in formats explain round range pitfalls pitfall tour; do expect_out "$s"; done
  [ ! -s "$ERR" ] || fail "help wrote to stderr"
  run "" round --help
  expect_rc 0
  expect_out "--format"
  expect_out "--seed"
  run "" pitfall --help
  expect_rc 0
  expect_out "null"   # the help documents how NaN/inf outcomes appear in JSON
  ;;

*)
  echo "unknown case '$CASE'"
  exit 1
  ;;
esac
exit 0
