#!/usr/bin/env bash
# Chapter 06 — `mpt policy show`, `mpt policy search`, the presets in
# `mpt train` and `mpt trace --gpu`, checked as a user sees them.
# Depends on: cli_lib.sh (the shared harness), bash, grep; python3 for the
# JSON checks (those cases exit 77, Skipped, without it).
#
# Usage: policy_checks.sh PATH/TO/mpt CASE. Exit 0 pass, 1 fail, 77 skipped.
set -u

MPT=$1
CASE=$2
. "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"

case "$CASE" in

show_cuda_and_cpu_lists_differ)
  # layer_norm and softmax: f32 under CUDA autocast, bf16 through under CPU autocast.
  need_python
  run policy show autocast:cuda:bf16 --inputs bf16 --json
  expect_rc 0
  cp "$OUT" "$WORK/cuda.json"
  run policy show autocast:cpu:bf16+keep-f32:gelu --inputs bf16 --json
  expect_rc 0
  cp "$OUT" "$WORK/cpu_wrapped.json"
  run policy show autocast:cpu:bf16 --inputs bf16 --json
  expect_rc 0
  python3 - "$WORK/cpu_wrapped.json" "$OUT" <<'PY' || fail "a clause hides the CPU lists"
import json, sys
wrapped, plain = (json.load(open(p)) for p in sys.argv[1:3])
assert [o["list"] for o in wrapped["ops"]] == [o["list"] for o in plain["ops"]]
PY
  python3 - "$WORK/cuda.json" "$OUT" <<'PY' || fail "JSON check failed"
import json, sys
cuda, cpu = (json.load(open(p)) for p in sys.argv[1:3])
assert cuda["policy"] == "autocast:cuda:bf16" and cpu["policy"] == "autocast:cpu:bf16"
by = lambda d: {o["op"]: o for o in d["ops"]}
c, p = by(cuda), by(cpu)
for op in ("layer_norm", "softmax"):
    assert c[op]["output"] == "f32" and p[op]["output"] == "bf16", (op, c[op], p[op])
    assert p[op]["list"] == "none", p[op]
assert c["layer_norm"]["list"] == "fp32" and c["softmax"]["list"] == "fp32_set_opt_dtype"
assert c["linear"]["output"] == p["linear"]["output"] == "bf16"
assert "refused" in c["binary_cross_entropy"] and "unsafe to autocast" in c["binary_cross_entropy"]["refused"]
assert p["binary_cross_entropy"]["output"] == "f32"
assert [o["op"] for o in cuda["ops"]][:2] == ["linear", "matmul"]
assert c["bmm"]["runs"] is False and c["linear"]["runs"] is True
PY
  ;;

show_text_table)
  run policy show O1
  expect_rc 0
  expect_out "policy O1: autocast cuda f16"
  expect_out "apex opt_level O1: cast_model_type=None, patch_torch_functions=True"
  expect_out "scaler dynamic"
  expect_out_regex "^layer_norm +fp32 +f32 +f32 +f32$"
  expect_out_regex "^binary_cross_entropy \* +banned +refused: binary_cross_entropy is unsafe to autocast"
  ;;

show_with_a_model)
  # --model: the model's traced step under the policy, the same bytes as
  # mpt trace prints; the rule's layers in FP32 and the others in f16.
  run trace --model transformer --policy 'f16+block*.mlp=f32'
  expect_rc 0
  cp "$OUT" "$WORK/trace.txt"
  run policy show 'f16+block*.mlp=f32' --model transformer
  expect_rc 0
  expect_out "one training step of the transformer under it"
  sed -n '/^mpt trace: /,$p' "$OUT" >"$WORK/shown.txt"
  cmp -s "$WORK/trace.txt" "$WORK/shown.txt" || fail "policy show --model prints another trace than mpt trace"
  expect_out_regex "forward +block0\.mlp\.fc1 +linear +x f32 32x64, weight f32"
  expect_out_regex "forward +block0\.attn\.q +linear +x f16 32x64, weight f16"
  need_python
  run policy show O1 --model cnn --json
  expect_rc 0
  python3 - "$OUT" <<'PY' || fail "JSON check failed"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["policy"] == "O1" and j["trace"]["model"].startswith("digits CNN"), j.get("trace", {}).get("model")
convs = [e for e in j["trace"]["trace"]["entries"] if e["op"] == "conv2d" and e["phase"] == "forward"]
assert convs and all(e["compute"] == "f32" and e["outputs"][0]["dtype"] == "f16" for e in convs), convs
PY
  ;;

show_jmp_and_presets)
  need_python
  run policy show jmp:params=float32,compute=float16,output=float32 --json
  expect_rc 0
  cp "$OUT" "$WORK/jmp.json"
  run policy show O3 --json
  expect_rc 0
  python3 - "$WORK/jmp.json" "$OUT" <<'PY' || fail "JSON check failed"
import json, sys
jmp, o3 = (json.load(open(p)) for p in sys.argv[1:3])
assert jmp["policy"] == "jmp:p=f32,c=f16,o=f32", jmp["policy"]
assert (jmp["params"], jmp["compute"], jmp["output"]) == ("f32", "f16", "f32")
assert jmp["jmp_str"] == "p=full,c=f16,o=full"
assert jmp["needs"] == {"master_weights": True, "scaler": None}
assert o3["needs"] == {"master_weights": False, "scaler": "static:1"}
assert "params" not in o3 and all(o["list"] is None for o in o3["ops"])
PY
  ;;

train_applies_the_preset)
  # O3 names its scaler (loss_scale=1.0) and trains without master weights;
  # an explicit --scaler overrides it, as apex's loss_scale= does.
  need_python
  run train --model mlp --policy O3 --steps 2 --json
  expect_rc 0
  python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))["config"]; assert (c["policy"], c["scaler"]) == ("O3", "static:1"), c' "$OUT" ||
    fail "O3 did not bring its scaler"
  run train --model mlp --policy O3 --scaler dynamic --steps 2 --json
  expect_rc 0
  python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))["config"]; assert c["scaler"] == "dynamic", c' "$OUT" ||
    fail "--scaler did not override the preset's"
  # A region that is off casts nothing: fc1's bf16 output reaches fc2 as it
  # is, and fc2's f32 weight with it is a product PyTorch refuses. The
  # attention, whose input arrives in f32 (layer_norm passes it through on
  # the CPU), runs in f32 there without complaint.
  run train --model transformer --policy "autocast:cpu:bf16+block0.mlp.fc2=autocast-off" --scaler none --steps 1
  # The refusal comes when the op first runs; mpt train runs one step of a
  # throwaway run first, so it is bad input: exit 2, before anything is written.
  expect_usage_error "the first step is refused: linear at block0.mlp.fc2: its inputs arrive as bf16 and f32"
  run train --model transformer --policy "autocast:cpu:bf16+block0.attn=autocast-off" --scaler none --steps 1
  expect_rc 0
  ;;

trace_takes_the_policy_string)
  # mpt trace reads the grammar of mpt train: the Transformer under CUDA's
  # autocast lists keeps layer_norm and the loss in f32, runs the products
  # in f16 and reuses the weight casts in backward.
  need_python
  run trace --model transformer --batch 2 --policy autocast:cuda:f16 --json
  expect_rc 0
  python3 - "$OUT" <<'PY' || fail "JSON check failed"
import json, sys
j = json.load(open(sys.argv[1]))
e = j["trace"]["entries"]
fwd = lambda op: [x for x in e if x["op"] == op and x["phase"] == "forward"]
assert fwd("layer_norm") and all(x["outputs"][0]["dtype"] == "f32" for x in fwd("layer_norm"))
assert fwd("linear") and all(x["outputs"][0]["dtype"] == "f16" for x in fwd("linear"))
assert j["trace"]["cached_casts"] > 0
assert j["policy"] == "autocast cuda f16", j["policy"]
PY
  run trace --policy O1 --dtype f16
  expect_usage_error "--policy excludes --dtype" "f16+keep-f32-layers:fc3"
  run trace --model cnn --policy f16+bn=f32
  expect_usage_error "the layer pattern 'bn' selects no layer" "its paths: unflatten, conv1"
  ;;

trace_cost_on_a_gpu)
  # --gpu adds the cost model: the ops' times add up to the step's, f16
  # puts the products on the tensor cores and is estimated faster than f32.
  need_python
  run trace --model transformer --batch 2 --dtype f32 --gpu h100-sxm --json
  expect_rc 0
  cp "$OUT" "$WORK/f32.json"
  run trace --model transformer --batch 2 --dtype f16 --gpu h100-sxm --json
  expect_rc 0
  python3 - "$WORK/f32.json" "$OUT" <<'PY' || fail "JSON check failed"
import json, sys
full, half = (json.load(open(p))["cost"] for p in sys.argv[1:3])
for c in (full, half):
    assert c["gpu"] == "h100-sxm"
    assert abs(sum(o["seconds"] for o in c["ops"]) - c["seconds"]) <= 1e-9 * c["seconds"]
assert full["tensor_flops"] == 0 and half["tensor_flops"] > 0
assert abs(full["flops"] - half["flops"]) <= 1e-9 * full["flops"]  # the same work
assert half["bytes"] < full["bytes"] and half["seconds"] < full["seconds"]
PY
  run trace --model cnn --gpu h200-sxm
  expect_rc 0
  expect_out "cost model on NVIDIA H200"
  ;;

search_finds_a_reusable_policy)
  # The policy a search prints trains as it is; every verdict is the budget's.
  need_python
  run policy search --model mlp --budget 0 --steps 8 --seeds 2 --json
  expect_rc 0
  python3 - "$OUT" > "$WORK/policy" <<'PY' || fail "JSON check failed"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["found"]["mean_loss"] <= j["loss_limit"]
for l in j["layers"]:
    assert l["lowered"] == (l["loss_when_tried"] <= j["loss_limit"]), l
assert j["evaluations"] == 1 + 2 * len(j["layers"])
print(j["policy"])
PY
  run train --model mlp --policy "$(cat "$WORK/policy")" --scaler dynamic --steps 2
  expect_rc 0
  run policy search --model mlp --budget 0.5 --steps 4 --seeds 1
  expect_rc 0
  expect_out "found: "
  expect_out "reuse it with mpt train --policy"
  ;;

help_lists_policy)
  run policy --help
  expect_rc 0
  expect_out "show"
  expect_out "search"
  run policy show --help
  expect_rc 0
  expect_out "--inputs"
  ;;

*)
  echo "unknown case '$CASE'"
  exit 1
  ;;
esac
exit 0
