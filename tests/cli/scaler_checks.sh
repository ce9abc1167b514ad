#!/usr/bin/env bash
# Chapter 02 — `mpt scaler simulate`, checked as a user sees it.
# Depends on: cli_lib.sh (the shared harness), bash, grep, cmp; python3 for
# the JSON and XML checks (those cases exit 77, Skipped, without it; the plot
# case then skips only its XML parse).
#
# Usage: scaler_checks.sh PATH/TO/mpt CASE. Exit 0 pass, 1 fail, 77 skipped.
# On failure the case prints what it expected and what mpt printed.
set -u

MPT=$1
CASE=$2
. "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"

case "$CASE" in

simulate_overflow_rows)
  # Backoff halves the scale at each overflow step and resets the tracker;
  # two clean steps in a row (growth_interval 2) double it.
  run scaler simulate --steps 10 --overflow-at 3,7,8 --growth-interval 2
  expect_rc 0
  expect_out_exactly "GradScaler(init_scale=65536, growth_factor=2, backoff_factor=0.5, growth_interval=2)
10 steps; overflow at steps 3, 7, 8

step  overflow   scale  growth_tracker  skipped
   1         0   65536               1        0
   2         0  131072               0        0
   3         1   65536               0        1
   4         0   65536               1        0
   5         0  131072               0        0
   6         0  131072               1        0
   7         1   65536               0        1
   8         1   32768               0        1
   9         0   32768               1        0
  10         0   65536               0        0

3 of 10 optimizer steps skipped; final scale 65536"
  # PyTorch's defaults: no growth within 2000 clean steps; listed in any order.
  run scaler simulate --steps 4 --overflow-at 2,1
  expect_rc 0
  expect_out "GradScaler(init_scale=65536, growth_factor=2, backoff_factor=0.5, growth_interval=2000)"
  grep -qE '^ +1 +1 +32768 +0 +1$' "$OUT" || fail "step 1 should back off to 32768"
  grep -qE '^ +2 +1 +16384 +0 +1$' "$OUT" || fail "step 2 should back off to 16384"
  grep -qE '^ +4 +0 +16384 +2 +0$' "$OUT" || fail "step 4 should count 2 clean steps"
  ;;

simulate_growth_and_shortest_scale)
  # Growth exactly on the growth_interval-th clean step; scales that are not
  # powers of two print as the shortest decimal that reads back to the float.
  run scaler simulate --steps 6 --growth-interval 3 --init-scale 0.1 --growth-factor 1.5 --backoff-factor 0.25
  expect_rc 0
  grep -qE '^ +2 +0 +0\.1 +2 +0$' "$OUT" || fail "step 2: scale 0.1, tracker 2"
  grep -qE '^ +3 +0 +0\.15 +0 +0$' "$OUT" || fail "step 3: grown to 0.15 (1.5 * 0.1f)"
  grep -qE '^ +6 +0 +0\.22500001 +0 +0$' "$OUT" || fail "step 6: grown to 0.22500001"
  run scaler simulate --steps 1 --init-scale 0x1p-149 --overflow-at 1
  expect_rc 0
  grep -qE '^ +1 +1 +0 +0 +1$' "$OUT" || fail "no floor: 2^-149 backs off to 0"
  ;;

simulate_json)
  need_python
  run scaler simulate --steps 10 --overflow-at 3,7,8 --growth-interval 2
  cp "$OUT" "$WORK/text"
  run scaler simulate --steps 10 --overflow-at 3,7,8 --growth-interval 2 --json
  expect_rc 0
  python3 - "$OUT" "$WORK/text" <<'PY' || fail "JSON check failed"
import json, re, struct, sys
d = json.load(open(sys.argv[1]))
text = [l.split() for l in open(sys.argv[2]) if re.match(r"^ +\d+ ", l)]
assert d["steps"] == 10 and d["overflow_at"] == [3, 7, 8]
assert d["options"] == {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                        "growth_interval": 2}
assert len(d["rows"]) == 10 == len(text)
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
for r, t in zip(d["rows"], text):
    assert list(r) == ["step", "overflow", "scale", "growth_tracker", "skipped"], list(r)
    assert [r["step"], r["overflow"], r["growth_tracker"], r["skipped"]] == \
        [int(t[0]), int(t[1]), int(t[3]), int(t[4])], (r, t)
    assert f32(r["scale"]) == f32(float(t[2])), (r, t)
assert d["skipped_steps"] == 3 and d["final_scale"] == 65536.0
PY
  run scaler simulate --steps 50 --overflow-prob 0.2 --seed 7 --json
  expect_rc 0
  python3 - "$OUT" <<'PY' || fail "JSON (drawn) check failed"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["overflow_probability"] == 0.2 and d["seed"] == 7 and "overflow_at" not in d
assert d["skipped_steps"] == sum(r["overflow"] for r in d["rows"]) > 0
PY
  ;;

simulate_drawn_is_reproducible)
  run scaler simulate --steps 300 --overflow-prob 0.1 --seed 5
  expect_rc 0
  expect_out "each overflows with probability 0.1 (seed 5)"
  cp "$OUT" "$WORK/first"
  run scaler simulate --steps 300 --overflow-prob 0.1 --seed 5
  cmp -s "$WORK/first" "$OUT" || fail "the same seed gave different runs"
  run scaler simulate --steps 300 --overflow-prob 0.1 --seed 6
  ! cmp -s "$WORK/first" "$OUT" || fail "seeds 5 and 6 gave identical runs"
  run scaler simulate --steps 300 --overflow-prob 0.1
  expect_rc 0
  expect_out "(seed 0)"
  ;;

simulate_bad_options)
  S="scaler simulate"
  run $S --steps 5 --growth-factor 1; expect_usage_error "The growth factor must be > 1.0"
  run $S --steps 5 --backoff-factor 1.5; expect_usage_error "The backoff factor must be < 1.0"
  run $S --steps 5 --init-scale abc; expect_usage_error "--init-scale" "'abc'" "hex-float"
  run $S --steps 5 --init-scale 0; expect_usage_error "The initial scale must be finite and > 0"
  run $S --steps 5 --growth-interval 2.5; expect_usage_error "--growth-interval" "'2.5'" "from 1 to"
  run $S; expect_usage_error "missing --steps" "from 1 to"
  run $S --steps 0; expect_usage_error "--steps" "'0'" "from 1 to"
  run $S --steps ten; expect_usage_error "--steps" "'ten'"
  run $S --steps 10 --overflow-at 3,x; expect_usage_error "--overflow-at" "'x'" "3,7,8"
  run $S --steps 10 --overflow-at 11; expect_usage_error "step 11" "valid steps: 1 to 10"
  run $S --steps 10 --overflow-at 0; expect_usage_error "--overflow-at" "'0'"
  run $S --steps 10 --overflow-at 3 --overflow-prob 0.1
  expect_usage_error "cannot be combined" "--overflow-at 3,7,8" "--overflow-prob P --seed N"
  run $S --steps 10 --seed 4; expect_usage_error "--seed" "--overflow-prob"
  run $S --steps 10 --overflow-prob 1.5; expect_usage_error "--overflow-prob" "from 0 to 1"
  run $S --steps 10 --overflow-prob 0.5 --seed -2; expect_usage_error "--seed" "unsigned integer"
  run $S --steps 10 --frobnicate; expect_usage_error "'--frobnicate'" "--overflow-at" "--json"
  run $S --steps 10 extra; expect_usage_error "'extra'" "valid options"
  run scaler; expect_usage_error "mpt scaler: missing subcommand" "simulate"
  run scaler simulat; expect_usage_error "'simulat'" "valid subcommands: simulate"
  run $S --steps 3 --plot "$WORK/no/such/dir/p.svg"; expect_usage_error "cannot write"
  ;;

simulate_plot)
  # Drawn by the library's SVG writer (no external program): the same run
  # gives the same bytes, written to FILE.tmp and renamed into place.
  svg=$WORK/scale.svg
  echo "an old file" >"$svg"
  run scaler simulate --steps 3000 --growth-interval 500 --overflow-at 5,6,1200 --plot "$svg"
  expect_rc 0
  expect_out "plot written to $svg"
  [ -s "$svg" ] || fail "no SVG written"
  [ ! -e "$svg.tmp" ] || fail "temporary file left behind"
  head -c 4 "$svg" | grep -q '<svg' || fail "the file does not start with <svg"
  tail -n 1 "$svg" | grep -qx '</svg>' || fail "the file does not end with </svg>"
  ! grep -q "an old file" "$svg" || fail "the old file's content survived"
  grep -q 'overflow: step skipped' "$svg" || fail "the overflow marks have no legend"
  [ "$(grep -c '<circle class="overflow"' "$svg")" -eq 3 ] || fail "expected 3 overflow marks"
  if command -v python3 >/dev/null; then
    python3 -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' "$svg" ||
      fail "the SVG is not well-formed XML"
  fi
  cp "$svg" "$WORK/first.svg"
  run scaler simulate --steps 3000 --growth-interval 500 --overflow-at 5,6,1200 --plot "$svg"
  expect_rc 0
  cmp -s "$WORK/first.svg" "$svg" || fail "the same run drew different bytes"
  run scaler simulate --steps 20 --json --plot "$svg"
  expect_rc 0
  ! grep -q "plot written" "$OUT" || fail "--json output must stay pure JSON"
  run scaler simulate --steps 3 --plot "$WORK/no/such/dir/p.svg"
  expect_usage_error "cannot write '$WORK/no/such/dir/p.svg.tmp'" "No such file or directory"
  [ ! -e "$WORK/no/such/dir/p.svg.tmp" ] || fail "a temporary file was left behind"
  ;;

help_lists_scaler)
  run --help
  expect_rc 0
  expect_out "scaler"
  run scaler simulate --help
  expect_rc 0
  for o in --init-scale --growth-factor --backoff-factor --growth-interval --steps --overflow-at \
           --overflow-prob --seed --json --plot; do
    expect_out "$o"
  done
  [ ! -s "$ERR" ] || fail "help wrote to stderr"
  ;;

*)
  echo "unknown case '$CASE'"
  exit 1
  ;;
esac
exit 0
