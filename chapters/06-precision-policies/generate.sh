#!/usr/bin/env bash
# Chapter 06 — regenerates the outputs the chapter text shows (generated/*.txt,
# and the picture generated/presets.svg) and splices each text block into
# README.md between its markers.
# Depends on: a build of the project (BUILD_DIR/src/cli/mpt and
# BUILD_DIR/chapters/ch06_numbers), the digits file (the CNN's search; the
# build's fetch-data target), ../generate_common.sh (the modes, the splicing
# and the check, shared by every chapter), bash, grep, sed, Graphviz's dot
# (the picture).
#
# usage: generate.sh BUILD_DIR           regenerate in place (then commit the result)
#        generate.sh --check BUILD_DIR   regenerate into a scratch copy and fail if
#                                        the committed files differ (the docs test)
#        generate.sh --into DIR BUILD_DIR
#                                        write a fresh copy of the chapter into DIR
set -euo pipefail

chapter_id=06
chapter_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
required_programs=(src/cli/mpt chapters/ch06_numbers)
bench_records=(search-transformer.txt)
# shellcheck source=../generate_common.sh
source "$chapter_dir/../generate_common.sh"

pitfall_ids=(name-substring-policy bce-on-fp16-probabilities sum-outside-autocast half-under-autocast cpu-autocast-list
             ffn-fp32-rule-of-thumb o3-everything-fp16)

# The precision picture of each preset (presets.dot of the text).
draw_diagrams() {
  "$build/chapters/ch06_numbers" presets "$1" >/dev/null
}

generate_all() {
  local mpt="$build/src/cli/mpt" numbers="$build/chapters/ch06_numbers"
  gen_run trace-mlp-autocast "mpt trace --model mlp --policy autocast:cuda:f16" \
    "$mpt" trace --model mlp --policy autocast:cuda:f16
  gen_run autocast "ch06_numbers autocast" "$numbers" autocast
  gen_run show-o1 "mpt policy show O1" "$mpt" policy show O1
  gen_run lists "ch06_numbers lists" "$numbers" lists
  pic_dir="$gen_tmp/presets"
  mkdir -p "$pic_dir"
  gen_run presets "ch06_numbers presets DIR" "$numbers" presets "$pic_dir"
  presets_needs() {
    local p
    for p in O0 O1 O2 O3 mixed_float16 mixed_bfloat16 jmp:half; do "$mpt" policy show "$p" | head -n 3; done
  }
  gen_run needs "for p in O0 O1 O2 O3 mixed_float16 mixed_bfloat16 jmp:half; do mpt policy show \$p | head -n 3; done" \
    presets_needs
  rule_lines() {
    "$mpt" trace --model transformer --policy 'f16+block*.mlp=f32' --forward-only |
      grep -E '^(mpt trace|#|[0-9]+ +forward +block0\.(ln2|mlp|residual2))'
  }
  gen_run rules "mpt trace --model transformer --policy 'f16+block*.mlp=f32' --forward-only | grep -E '^(mpt trace|#|[0-9]+ +forward +block0\\.(ln2|mlp|residual2))'" \
    rule_lines
  gen_run rule-refused "mpt train --model transformer --policy 'f16+*.ffn=f32' --scaler dynamic --steps 10" \
    gen_refused "$mpt" train --model transformer --policy 'f16+*.ffn=f32' --scaler dynamic --steps 10
  cost_lines() { "$mpt" trace --model mlp --policy O1 --gpu h100-sxm | sed -n '/^cost model/,$p'; }
  gen_run cost "mpt trace --model mlp --policy O1 --gpu h100-sxm | sed -n '/^cost model/,\$p'" cost_lines
  gen_run search-cnn "mpt policy search --model cnn --budget 0.02 --steps 20 --seeds 2 --compare" \
    "$mpt" policy search --model cnn --budget 0.02 --steps 20 --seeds 2 --compare
  o3_train() {
    local m p
    for m in mlp cnn; do
      for p in O0 O3; do
        printf '%-4s %-3s ' "$m" "$p"
        "$mpt" train --model "$m" --policy "$p" --steps 200 2>/dev/null | grep '^final loss'
      done
    done
  }
  gen_run o3-train "for m in mlp cnn; do for p in O0 O3; do printf '%-4s %-3s ' \$m \$p; mpt train --model \$m --policy \$p --steps 200 | grep '^final loss'; done; done" \
    o3_train
  gen_run pitfalls "mpt pitfalls --chapter 6" "$mpt" pitfalls --chapter 6
  gen_pitfalls_and_tour 6 "${pitfall_ids[@]}"
  gen_run claims "ch06_numbers claims" "$numbers" claims
}

# The Transformer's search trains 21 candidates x 3 seeds x 60 steps (a few
# minutes on one core): a record, rerun by --bench. The docs test reruns it
# with 2 steps and 1 seed and compares what does not depend on the training:
# the layers and their ops, and each compared policy's bytes and estimated
# step time (bench_deterministic).
run_benchmarks() {
  gen_bench search-transformer.txt src/cli/mpt '^policy search on' \
    policy search --model transformer --budget 0.01 --steps 60 --seeds 3 --depth 1 --compare \
    -- policy search --model transformer --budget 0.01 --steps 2 --seeds 1 --depth 1 --compare
}

# What of the search's record does not depend on the training: the layers
# with their ops (sorted: their order is the sensitivity's), and per compared
# policy (the found one left out) its bytes and the cost model's step time.
bench_deterministic() {
  case "$1" in
    search-transformer.txt)
      awk '
        /^layer / { layers = 1; next }
        /^found:/ { layers = 0; next }
        layers && NF >= 6 { print "layer", $1; next }
        /^policy +final loss/ { cmp = 1; row = 0; next }
        /^\(step time/ { cmp = 0; next }
        cmp && NF >= 8 { row++; if (row != 2) print "policy", $1, $(NF-4), $(NF-3), $(NF-2); next }
      ' | sort ;;
    *) cat ;;
  esac
}

generate_main "$@"
