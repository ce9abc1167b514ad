#!/usr/bin/env bash
# Chapter 02 — `mpt trace`, checked as a user sees it: where each value of
# the Chapter 2 MLP is stored in which dtype, and every cast it costs.
# Depends on: cli_lib.sh (the shared harness), bash, grep, awk; python3 for
# the JSON case (it exits 77, Skipped, without it).
#
# Usage: trace_checks.sh PATH/TO/mpt CASE. Exit 0 pass, 1 fail, 77 skipped.
set -u

MPT=$1
CASE=$2
. "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"

# count_lines REGEX: lines of stdout matching the extended regex.
count_lines() { grep -cE -- "$1" "$OUT"; }

case "$CASE" in

uniform_f16_has_one_cast)
  # A uniform f16 model casts exactly once: the f32 input, at fc1's boundary.
  run trace --dtype f16
  expect_rc 0
  expect_out "policy: uniform f16"
  [ "$(count_lines '^[0-9]+ +(forward|backward) +[a-z0-9]+ +cast ')" -eq 1 ] || fail "expected exactly one cast line"
  expect_out_regex '^1 +forward +fc1 +cast +x f32 4x8 +f16 +x f16 4x8 +64$'
  expect_out "1 cast(s) at op boundaries, 64 bytes written by them"
  # Every Linear computes in f32 and stores f16; its weights are f16 copies.
  expect_out_regex 'forward +fc2 +linear +x f16 4x32, weight f16 32x32, bias f16 32 +f32 +y f16 4x32 +256$'
  expect_out_regex '^fc2.weight +32x32 +f16 +2048 +f32 4096 +f32 4096$'
  # The first layer computes no input gradient.
  expect_out_regex 'backward +fc1 +linear .* weight.grad f16 32x8, bias.grad f16 32 +576$'
  # f32: no cast at all.
  run trace --dtype f32
  expect_rc 0
  expect_out "0 cast(s) at op boundaries, 0 bytes written by them"
  ;;

keep_f32_island)
  # fc3 kept in f32: its input is cast up at its boundary, its input gradient
  # cast back down (the cast's backward), and its weights are the masters.
  run trace --dtype f16 --keep-f32 fc3
  expect_rc 0
  expect_out "policy: uniform f16; f32 at fc3"
  expect_out_regex '^[0-9]+ +forward +fc3 +cast +x f16 4x32 +f32 +x f32 4x32 +512$'
  expect_out_regex 'forward +fc3 +linear +x f32 4x32, weight f32 4x32, bias f32 4 +f32 +y f32 4x4 +64$'
  expect_out_regex '^[0-9]+ +backward +fc3 +cast +dx f32 4x32 +f16 +dx f16 4x32 +256$'
  expect_out "3 cast(s) at op boundaries, 832 bytes written by them"
  expect_out_regex '^fc3.weight +4x32 +f32 \(the master\) +0 +f32 512 +f32 512$'
  expect_out_regex '^fc2.weight +32x32 +f16 +2048'
  # Nested paths keep their parent's island: a prefix that is no layer is refused.
  run trace --dtype bf16 --keep-f32 fc1,fc3 --forward-only
  expect_rc 0
  [ "$(count_lines ' backward ')" -eq 0 ] || fail "--forward-only printed backward entries"
  expect_out_regex 'forward +fc1 +linear +x f32 4x8'
  ;;

cnn_model_half)
  # Chapter 3's CNN under a uniform f16 policy: what model.half() does to a
  # BatchNorm -- the statistics are computed in f32, but the running
  # estimates and the affine copies are stored in f16.
  run trace --model cnn --dtype f16 --batch 2 --forward-only
  expect_rc 0
  expect_out "digits CNN"
  expect_out_regex 'forward +bn1 +batch_norm +x f16 2x8x8x8, weight f16 8, bias f16 8 +f32 +y f16 2x8x8x8, mean f32 8, invstd f32 8, running_mean f16 8, running_var f16 8 '
  expect_out "1 cast(s) at op boundaries"
  expect_out_regex '^bn2.weight +16 +f16 +32 '
  ;;

cnn_keep_batch_norm)
  # The norms kept in f32 by op (or by path: the same layers) -- running
  # estimates and affine parameters f32, the input cast up at bn's boundary
  # and its output cast down at the next op.
  for keep in "--keep-f32-ops batch_norm" "--keep-f32 bn1,bn2"; do
    # shellcheck disable=SC2086  # two words on purpose
    run trace --model cnn --dtype f16 --batch 2 --forward-only $keep
    expect_rc 0
    expect_out_regex 'forward +bn1 +cast +x f16 2x8x8x8 +f32 +x f32 2x8x8x8 +4096$'
    expect_out_regex 'forward +bn2 +batch_norm +x f32 2x16x4x4, weight f32 16, bias f32 16 +f32 +y f32 2x16x4x4, mean f32 16, invstd f32 16, running_mean f32 16, running_var f32 16 '
    expect_out_regex 'forward +relu1 +cast +x f32 2x8x8x8 +f16 +x f16 2x8x8x8 +2048$'
    expect_out_regex '^bn1.weight +8 +f32 \(the master\) +0 '
    expect_out_regex '^conv2.weight +16x8x3x3 +f16 '
  done
  # The chapter's picture: the same trace as a graph, top to bottom.
  run trace --model cnn --dtype f16 --batch 2 --forward-only --keep-f32-ops batch_norm --rankdir TB \
    --dot "$WORK/cnn.dot"
  expect_rc 0
  grep -q 'rankdir=TB' "$WORK/cnn.dot" || fail "--rankdir TB did not lay the graph out top to bottom"
  grep -q 'bn1: batch_norm' "$WORK/cnn.dot" || fail "the graph lacks bn1's batch_norm node"
  run trace --model cnn --rankdir XY
  expect_usage_error "--rankdir"
  ;;

json)
  need_python
  run trace --dtype f16 --keep-f32 fc3 --json
  expect_rc 0
  python3 - "$OUT" <<'PY' || fail "the JSON does not hold what the text shows"
import json, sys
j = json.load(open(sys.argv[1]))
entries = j["trace"]["entries"]
casts = [e for e in entries if e["op"] == "cast"]
assert j["trace"]["casts"] == len(casts) == 3, j["trace"]["casts"]
assert j["trace"]["cast_bytes"] == sum(e["bytes_written"] for e in casts) == 832
assert all(e["bytes_written"] == sum(o["bytes"] for o in e["outputs"]) for e in entries)
fc3 = [e for e in entries if e["path"] == "fc3" and e["op"] == "linear" and e["phase"] == "forward"][0]
assert [i["dtype"] for i in fc3["inputs"]] == ["f32", "f32", "f32"], fc3
assert fc3["outputs"][0]["shape"] == [4, 4]
params = {p["name"]: p for p in j["parameters"]}
assert params["fc3.weight"]["model_dtype"] == "f32" and params["fc3.weight"]["model_bytes"] == 0
assert params["fc1.weight"]["model_dtype"] == "f16" and params["fc1.weight"]["model_bytes"] == 512
assert j["policy"] == "uniform f16; f32 at fc3"
PY
  ;;

dot_written_atomically)
  run trace --dtype f16 --keep-f32 fc3 --dot "$WORK/mlp.dot"
  expect_rc 0
  [ -s "$WORK/mlp.dot" ] || fail "no graph written"
  [ ! -e "$WORK/mlp.dot.tmp" ] || fail "the temporary file was left behind"
  grep -q '^digraph precision {' "$WORK/mlp.dot" || fail "not a Graphviz digraph"
  grep -q 'cast\\nf16 → f32' "$WORK/mlp.dot" || fail "the upcast at fc3 is not drawn"
  expect_out "graph written to $WORK/mlp.dot"
  if command -v dot >/dev/null; then
    dot -Tsvg "$WORK/mlp.dot" >"$WORK/mlp.svg" 2>"$WORK/dot.err" || fail "dot rejects the graph: $(cat "$WORK/dot.err")"
  fi
  # An unwritable path: one line, status 2, nothing half-written.
  run trace --dot "$WORK/missing/mlp.dot"
  expect_usage_error "cannot write" "$WORK/missing/mlp.dot"
  ;;

transformer_every_op)
  # Chapter 4's tiny Transformer: every op of one step, forward and backward.
  run trace --model transformer --batch 2
  expect_rc 0
  expect_out "tiny Transformer V 96, D 64, 4 heads, 2 blocks, 8 tokens per sequence, batch 2, policy: uniform f16"
  # 2 lookups, their sum; per block 2 norms, 6 linears, attention, GELU, 2 sums; ln_f, lm_head, the loss.
  [ "$(count_lines '^[0-9]+ +forward +[a-z0-9_.]+ +[a-z_]+ ' )" -eq 30 ] || fail "expected 30 forward entries"
  [ "$(count_lines '^[0-9]+ +backward +[a-z0-9_.]+ +[a-z_]+ ' )" -eq 30 ] || fail "expected 30 backward entries"
  expect_out_regex '^1 +forward +tok_emb +embedding +ids f32 2x8, weight f16 96x64 +f32 +y f16 2x8x64 +2048$'
  expect_out_regex 'forward +block1.attn +scaled_dot_product_attention +q f16 2x4x8x16'
  expect_out_regex 'forward +block0.residual2 +add +a f16 2x8x64, b f16 2x8x64 +f32 +y f16 2x8x64 +2048$'
  expect_out_regex 'forward +lm_head +linear +h f16 16x64, weight f16 96x64 +f32 +y f16 16x96 +3072$'
  expect_out_regex 'backward +pos_emb +embedding +dy f16 8x64'
  expect_out "0 cast(s) at op boundaries"
  # The tied table is listed once.
  [ "$(count_lines '^tok_emb.weight ')" -eq 1 ] || fail "the tied table should be listed once"
  # layer_norm kept in f32: each norm's input is cast up at its boundary.
  run trace --model transformer --batch 2 --keep-f32-ops layer_norm
  expect_rc 0
  expect_out "policy: uniform f16; f32 for layer_norm"
  expect_out_regex 'forward +block0.ln1 +layer_norm +x f32 2x8x64, weight f32 64, bias f32 64 +f32 +y f32 2x8x64'
  expect_out_regex '^block0.ln1.weight +64 +f32 \(the master\)'
  ;;

bad_options)
  run trace --model cnn --sizes 8,4
  expect_usage_error "--model cnn" "--sizes" "mlp only"
  run trace --model cnn --keep-f32-ops batchnorm
  expect_usage_error "--keep-f32-ops" "unknown op 'batchnorm'" "batch_norm"
  run trace --model cnn --keep-f32 fc3
  expect_usage_error "--keep-f32" "'fc3'" "bn1"
  run trace --dtype fp8
  expect_usage_error "--dtype: unknown dtype 'fp8'" "valid dtypes: f32, bf16, f16, e4m3, e5m2"
  run trace --keep-f32 fc9
  expect_usage_error "--keep-f32: 'fc9' is not a layer of this model" "valid layers: fc1, relu1, fc2, relu2, fc3"
  run trace --sizes 8
  expect_usage_error "--sizes: '8' names 1 size(s)"
  run trace --sizes 8,0,4
  expect_usage_error "--sizes: '0' is not a layer size"
  run trace --batch 0
  expect_usage_error "--batch: '0' is not a batch size"
  run trace --model rnn
  expect_usage_error "--model: unknown model 'rnn'; valid models: mlp, cnn, transformer"
  run trace --model transformer --sizes 3,4
  expect_usage_error "--model transformer: --sizes applies to --model mlp only"
  run trace --activation tanh
  expect_usage_error "--activation: unknown activation 'tanh'; valid: relu, gelu, gelu_tanh"
  ;;

*)
  echo "unknown case '$CASE'"
  exit 2
  ;;
esac
exit 0
