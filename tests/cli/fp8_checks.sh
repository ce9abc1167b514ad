#!/usr/bin/env bash
# Chapter 07 — `mpt fp8 quantize` and `mpt fp8 simulate`, checked as a user
# sees them, on inputs whose codes and scales are worked out by hand in
# tests/cpu/test_ch07_*.cpp.
# Depends on: cli_lib.sh (the shared harness), bash, grep; python3 for the
# JSON checks (those cases exit 77, Skipped, without it).
#
# Usage: fp8_checks.sh PATH/TO/mpt CASE. Exit 0 pass, 1 fail, 77 skipped.
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

# A block of 32: the given values, then zeros.
block32() {
  local n=$#
  printf '%s ' "$@"
  for ((i = n; i < 32; i++)); do printf '0 '; done
}

case "$CASE" in

quantize_current_text)
  # amax 3.5: scale 448 / 3.5 = 128; 1 -> 2^7 = 0x70, -2 -> -2^8 = 0xf8, 3.5 -> 448 = 0x7e.
  run "1 -2 3.5" fp8 quantize --format e4m3 --recipe current
  expect_rc 0
  expect_out_exactly "current scaling (Transformer Engine's Float8CurrentScaling), e4m3 (max 448), saturating: scale = 448 / amax (amax 0, inf or NaN: scale 1)
amax 3.5, scale 128 (stored = value x scale; read back = code x (1 / scale))

i  input  scaled  code  value  error
0      1     128  0x70      1      0
1     -2    -256  0xf8     -2      0
2    3.5     448  0x7e    3.5      0

3 values: 0 saturated to ±448, 0 overflowed (NaN), 0 NaN, 0 flushed to zero"
  ;;

quantize_saturation_counted)
  # Pitfall 6: saturation hides overflow. 465 and ±inf read back as ±448,
  # and only the count (and the warning) says so; 464 is a tie that rounds
  # to 448 and is not counted; 2^-10 flushes to zero.
  run "448 464 465 inf -inf nan 0x1p-10" fp8 quantize -f e4m3 --recipe current --margin 0
  expect_rc 0
  expect_out "amax inf, scale 1 "
  expect_out_regex '^1 +464 +464 +0x7e +448 +-16$'
  expect_out_regex '^2 +465 +465 +0x7e +448 +-17$'
  expect_out_regex '^3 +inf +inf +0x7e +448 +-inf$'
  expect_out_regex '^4 +-inf +-inf +0xfe +-448 +inf$'
  expect_out_regex '^5 +nan +nan +0x7f +nan +nan$'
  expect_out "7 values: 3 saturated to ±448, 0 overflowed (NaN), 1 NaN, 1 flushed to zero"
  expect_out "warning: 3 values were beyond ±448 (inf included) and now read back as ±448"
  # Without saturation they become NaN, and nothing is hidden.
  run "448 464 465 inf -inf" fp8 quantize -f e4m3 --recipe current --overflow inf
  expect_rc 0
  expect_out_regex '^2 +465 +465 +0x7f +nan +nan$'
  expect_out_regex '^4 +-inf +-inf +0xff +nan +nan$'
  expect_out "5 values: 0 saturated to ±448, 3 overflowed (NaN), 0 NaN, 0 flushed to zero"
  grep -q '^warning' "$OUT" && fail "no warning without saturation"
  # E5M2: 61440 is a tie that rounds UP, to 2^16: beyond the range; inf
  # without saturation. (The inf keeps the scale at 1.)
  run "61440 61439 inf" fp8 quantize -f e5m2 --recipe current --overflow inf
  expect_rc 0
  expect_out_regex '^0 +61440 +61440 +0x7c +inf +inf$'
  expect_out_regex '^1 +61439 +61439 +0x7b +57344 +-4095$'
  ;;

quantize_current_options)
  # amax 3: 448 / 3 rounded down to a power of two is 128, and 3 -> 384 = 0x7c.
  run "3" fp8 quantize -f e4m3 --recipe current --power-of-2
  expect_rc 0
  expect_out "448 / amax, rounded down to a power of two"
  expect_out_regex '^0 +3 +384 +0x7c +3 +0$'
  # amax 0.25 raised to the epsilon 0.5: scale 896, not 1792.
  run "0.25" fp8 quantize -f e4m3 --recipe current --amax-epsilon 0.5
  expect_rc 0
  expect_out "amax 0.25, scale 896 "
  # margin 2: 448 / 4 / 3.5 = 32; E5M2: 57344 / 3.5 = 16384.
  run "3.5" fp8 quantize -f e4m3 --recipe current --margin 2
  expect_out "scale = 112 / amax"
  expect_out "amax 3.5, scale 32 "
  run "3.5" fp8 quantize -f e5m2 --recipe current
  expect_out "amax 3.5, scale 16384 "
  # An all-zero tensor: scale 1.
  run "0 0" fp8 quantize -f e4m3 --recipe current
  expect_out "amax 0, scale 1 "
  ;;

quantize_mx_floor_vs_rceil)
  # Block [480, 2^-9, 0 x 30]. FLOOR: e = 8 - 8 = 0, 480 saturates to 448,
  # 2^-9 stays. RCEIL: e = ceil(log2(480 / 448)) = 1, 480 -> 240 = 0x77
  # exact, 2^-9 -> 2^-10 flushes.
  run "$(block32 480 0x1p-9)" fp8 quantize -f e4m3 --recipe mx-floor
  expect_rc 0
  expect_out "FLOOR (OCP MX v1.0): e = floor(log2 amax) - 8"
  expect_out_regex '^ +0 +0-31 +480 +0x7f \(2\^0\) +2\^0$'
  expect_out_regex '^ 0 +480 +480 +0x7e +448 +-32$'
  expect_out_regex '^ 1 +0.001953125 +0.001953125 +0x01 +0.001953125 +0$'
  expect_out "32 values: 1 saturated to ±448, 0 overflowed (NaN), 0 NaN, 0 flushed to zero"
  run "$(block32 480 0x1p-9)" fp8 quantize -f e4m3 --recipe mx-rceil
  expect_rc 0
  expect_out "RCEIL (NVIDIA): e = ceil(log2(amax / 448))"
  expect_out_regex '^ +0 +0-31 +480 +0x80 \(2\^1\) +2\^-1$'
  expect_out_regex '^ 0 +480 +240 +0x77 +480 +0$'
  expect_out_regex '^ 1 +0.001953125 +0.0009765625 +0x00 +0 +-0.001953125$'
  expect_out "32 values: 0 saturated to ±448, 0 overflowed (NaN), 0 NaN, 1 flushed to zero"
  # 35 values: a second, shorter block (values 32-34), scaled by its own amax 7:
  # FLOOR e = 2 - 8 = -6.
  run "$(block32 480) 0 0 7" fp8 quantize -f e4m3 --recipe mx-floor
  expect_out_regex '^ +1 +32-34 +7 +0x79 \(2\^-6\) +2\^6$'
  ;;

quantize_json)
  need_python
  run "$(block32 480 0x1p-9) 7 inf" fp8 quantize -f e4m3 --recipe mx-rceil --json
  expect_rc 0
  python3 - "$OUT" <<'PY' || fail "JSON check failed"
import json, struct, sys
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
d = json.load(open(sys.argv[1]))
assert list(d) == ["format", "recipe", "saturate", "block", "scales", "amax", "e8m0", "codes", "values",
                   "errors", "counts"], list(d)
assert d["format"] == "e4m3" and d["recipe"] == "mx-rceil" and d["saturate"] is True and d["block"] == 32
# Block 1 holds 7 and inf: RCEIL saturates inf's E8M0 at 2^127 (code 254).
assert d["e8m0"] == [128, 254], d["e8m0"]
assert [f32(s) for s in d["scales"]] == [0.5, 2.0 ** -127], d["scales"]
assert d["amax"] == [480.0, None], d["amax"]
assert len(d["codes"]) == len(d["values"]) == len(d["errors"]) == 34
assert d["codes"][:2] == [0x77, 0x00] and d["values"][:2] == [480.0, 0.0]
assert d["errors"][1] == -2.0 ** -9
# 7 x 2^-127 flushes; inf saturates to 448 and reads back as 448 x 2^127: inf, null in JSON.
assert d["codes"][32:] == [0x00, 0x7E] and d["values"][33] is None
assert d["counts"] == {"saturated": 1, "overflowed": 0, "nan": 0, "flushed": 2}, d["counts"]
PY
  run "1 -2 3.5" fp8 quantize -f e4m3 --recipe current --json
  expect_rc 0
  python3 - "$OUT" <<'PY' || fail "JSON (current) check failed"
import json, sys
d = json.load(open(sys.argv[1]))
assert list(d) == ["format", "recipe", "saturate", "margin", "power_of_2", "amax_epsilon", "block", "scales",
                   "amax", "codes", "values", "errors", "counts"], list(d)
assert d["block"] is None and d["scales"] == [128.0] and d["amax"] == [3.5]
assert d["codes"] == [0x70, 0xF8, 0x7E] and d["values"] == [1.0, -2.0, 3.5] and d["errors"] == [0.0] * 3
PY
  ;;

simulate_delayed_spike)
  # tests/cpu/test_ch07_fp8_recipes.cpp works this sequence out by hand.
  run "1 1 8 1 1 1 1" fp8 simulate --recipe delayed --format e4m3 --history 3
  expect_rc 0
  expect_out_exactly "delayed scaling (Transformer Engine's DelayedScaling, its fused update), e4m3 (max 448), amax_history_len 3, amax_compute_algo max, margin 0
step 1 quantizes with scale 1; after each step scale = 448 / amax (the largest of the last 3 steps); a step whose amax is 0 leaves history and scale alone; an inf amax keeps the scale

step  amax  scale  amax x scale  saturated  update amax  next scale
   1     1      1             1     no                1         448
   2     1    448           448     no                1         448
   3     8    448          3584     yes               8          56
   4     1     56            56     no                8          56
   5     1     56            56     no                8          56
   6     1     56            56     no                1         448
   7     1    448           448     no                1         448

1 of 7 steps saturated their largest value (amax x scale beyond ±448)"
  ;;

simulate_algo_margin_format)
  need_python
  check_scales() {  # EXPECTED (a Python list) ARGS...
    local expected=$1
    shift
    run "1 1 8 1 1 1 1" fp8 simulate --recipe delayed "$@" --json
    expect_rc 0
    python3 -c "import json, sys; d = json.load(open(sys.argv[1])); assert d['scales'] == $expected, d['scales']" \
      "$OUT" || fail "scales are not $expected"
  }
  check_scales "[1, 448, 448, 56, 448, 448, 448]" --format e4m3 --history 3 --algo most_recent
  check_scales "[1, 224, 224, 28, 28, 28, 224]" --format e4m3 --history 3 --margin 1
  check_scales "[1, 57344, 57344, 7168, 7168, 7168, 57344]" --format e5m2 --history 3
  # TE's default history (1024) remembers the spike for the rest of this run.
  check_scales "[1, 448, 448, 56, 56, 56, 56]" --format e4m3
  python3 - "$OUT" <<'PY' || fail "JSON keys"
import json, sys
d = json.load(open(sys.argv[1]))
assert list(d) == ["format", "recipe", "amax_history_len", "amax_compute_algo", "margin", "amax", "scales",
                   "saturated", "update_amax", "next_scale"], list(d)
assert d["amax_history_len"] == 1024 and d["amax_compute_algo"] == "max" and d["margin"] == 0
assert d["saturated"] == [False, False, True, False, False, False, False]
assert d["update_amax"] == [1, 1, 8, 8, 8, 8, 8] and d["next_scale"] == 56
PY
  ;;

simulate_zero_and_inf_amax)
  # An amax of 0 leaves the history alone (TE's fused update): the 8 is still
  # remembered at step 3. An inf amax saturates and keeps the scale while the
  # history holds it.
  run "8 0 1" fp8 simulate --recipe delayed -f e4m3 --history 2
  expect_rc 0
  expect_out_regex '^ +2 +0 +56 +0 +no +0 +56$'
  expect_out_regex '^ +3 +1 +56 +56 +no +8 +56$'
  run "4 inf 1 1" fp8 simulate --recipe delayed -f e4m3 --history 2
  expect_rc 0
  expect_out_regex '^ +2 +inf +112 +inf +yes +inf +112$'
  expect_out_regex '^ +3 +1 +112 +112 +no +inf +112$'
  expect_out_regex '^ +4 +1 +112 +112 +no +1 +448$'
  ;;

bad_input)
  run "1" fp8 quantize --recipe current
  expect_usage_error "missing --format" "e4m3" "e5m2"
  run "1" fp8 quantize -f e4m3
  expect_usage_error "missing --recipe" "valid recipes: current, mx-floor, mx-rceil"
  run "1" fp8 quantize -f fp16 --recipe current
  expect_usage_error "unknown FP8 format 'fp16'" "valid formats: e4m3, e5m2"
  run "1" fp8 quantize -f e4m3 --recipe mx-floor --margin 1
  expect_usage_error "--margin applies to --recipe current only"
  run "1 2 x" fp8 quantize -f e4m3 --recipe current
  expect_usage_error "stdin: cannot parse 'x' (value 3)"
  run "" fp8 quantize -f e4m3 --recipe current
  expect_usage_error "stdin: no values to quantize"
  run "1" fp8 simulate --recipe delayed -f e4m3 --history 0
  expect_usage_error "--history: '0' is not a whole number from 1 to 1048576"
  run "1 -2" fp8 simulate --recipe delayed -f e4m3
  expect_usage_error "amax -2 (step 2) is not an amax" ">= 0"
  run "1" fp8 simulate --recipe current -f e4m3
  expect_usage_error "'current' cannot be simulated" "valid recipes: delayed"
  ;;

help_lists_fp8)
  run "" --help
  expect_rc 0
  expect_out "fp8"
  run "" fp8 quantize --help
  expect_rc 0
  for o in --format --recipe --margin --power-of-2 --amax-epsilon --overflow --json '"scales"' '"amax"' \
           '"codes"' '"values"' '"errors"' '"counts"' '"e8m0"'; do
    expect_out "$o"
  done
  run "" fp8 simulate --help
  expect_rc 0
  for o in --recipe --format --history --algo --margin --json '"scales"' '"next_scale"'; do expect_out "$o"; done
  [ ! -s "$ERR" ] || fail "help wrote to stderr"
  ;;

policy_show_and_trace)
  # fp8:delayed: a Linear layer's GEMM reads e4m3, F.linear and the rest bf16,
  # no scaler; the traced step's Linears read e4m3 forward and dy e5m2 backward.
  run "" policy show fp8:delayed
  expect_rc 0
  expect_out_regex '^linear \(Linear layer\) +- +e4m3 +f32 +bf16$'
  expect_out_regex '^linear +- +bf16 +f32 +bf16$'
  expect_out_regex '^layer_norm +- +bf16 +f32 +bf16$'
  expect_out "asks a run for: FP32 master weights, scaler none"
  expect_out "dy e5m2 backward (HYBRID)"
  run "" trace --policy fp8:current
  expect_rc 0
  expect_out_regex 'forward +fc2 +linear +x e4m3 4x32, weight e4m3 32x32, bias bf16 32 +f32 +y bf16 4x32'
  expect_out_regex 'backward +fc2 +linear +dy e5m2 4x32, x e4m3 4x32, weight e4m3 32x32 +f32 +dx bf16 4x32, weight.grad f32'
  run "" trace --policy fp8:mx-rceil
  expect_rc 0
  expect_out_regex 'backward +fc2 +linear +dy e4m3 4x32, x e4m3 4x32, weight e4m3 32x32 +f32'
  # The cost model reads the layer's shapes from it: every Linear's FLOPs
  # under MX are those under per-tensor scaling.
  flops() { awk '$3 == "linear" && $4 ~ /^[0-9]+$/ { print $1, $2, $5 }' "$OUT"; }
  run "" trace --policy fp8:mx-rceil --gpu h100-sxm
  expect_rc 0
  mx=$(flops)
  run "" trace --policy fp8:delayed --gpu h100-sxm
  expect_rc 0
  [ -n "$mx" ] && [ "$mx" = "$(flops)" ] || fail "the Linears' FLOPs differ under MX: $mx"
  [ "$(printf '%s\n' "$mx" | wc -l)" -eq 6 ] || fail "expected 6 Linear rows in the cost table, got: $mx"
  run "" policy show bf16
  expect_rc 0
  grep -q 'Linear layer' "$OUT" && fail "policy show bf16 lists an FP8 row"
  ;;

*)
  echo "unknown case $CASE"
  exit 2
  ;;
esac
exit 0
