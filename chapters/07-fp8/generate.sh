#!/usr/bin/env bash
# Chapter 07 — regenerates the outputs the chapter text shows (generated/*.txt,
# the loss curves generated/fp8-curves-*.svg and the picture of the
# delayed-scaling loop, generated/fp8_delayed_scaling.svg from
# docs/fp8_delayed_scaling.dot) and splices each text block into README.md
# between its markers.
# Depends on: a build of the project (BUILD_DIR/src/cli/mpt and
# BUILD_DIR/chapters/ch07_numbers; for --bench and the docs test's quick
# rerun also BUILD_DIR/tests/bench/bench_ch07_quantize), the digits file (the
# MLP's sweep; the build's fetch-data target), the licence texts of
# /usr/share/common-licenses (the Transformer's corpus: --bench, and the
# quick rerun of --check),
# ../generate_common.sh (the modes, the splicing and the check, shared by
# every chapter), bash, awk, grep, Graphviz's dot (the picture).
#
# usage: generate.sh BUILD_DIR           regenerate in place (then commit the result)
#        generate.sh --check BUILD_DIR   regenerate into a scratch copy and fail if
#                                        the committed files differ (the docs test)
#        generate.sh --bench BUILD_DIR   rerun the Transformer's sweep (a quarter of
#                                        an hour on one core) and the quantize
#                                        benchmark, and splice their records in
#        generate.sh --into DIR BUILD_DIR
#                                        write a fresh copy of the chapter into DIR
set -euo pipefail

chapter_id=07
chapter_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
required_programs=(src/cli/mpt chapters/ch07_numbers)
# The Transformer's sweep is a record: 35 runs of 200 steps, minutes of FP8
# emulation each (see run_benchmarks). Its picture is written by the same
# run, so it is a record too.
bench_records=(transformer.txt fp8-curves-transformer.svg bench-quantize.txt bench-fp8-step.txt)
# shellcheck source=../generate_common.sh
source "$chapter_dir/../generate_common.sh"

pitfall_ids=(fp8-no-scaling e4m3-for-gradients delayed-scaling-spike amax-history-too-long amax-history-too-short
             per-tensor-outlier saturation-hides-overflow e4m3-max-240-448-480 resume-drops-amax-history)

# The values of the quantize examples: a block whose largest value lands
# above 448 × 2^-8 × 2^floor(log2) (1.9: FLOOR saturates it, RCEIL does
# not) and whose smallest, 2^-17, RCEIL flushes and FLOOR keeps.
block_values="1.9 -1.8 1 0.3 0x1p-17"

generate_all() {
  local mpt="$build/src/cli/mpt" numbers="$build/chapters/ch07_numbers" dir="$1"
  fp8_formats() { "$mpt" formats | grep -E '^(format|e4m3|e5m2) '; }
  gen_run formats "mpt formats | grep -E '^(format|e4m3|e5m2) '" fp8_formats
  local r
  for r in current mx-floor mx-rceil; do
    gen_run_with_input "quantize-$r" "$block_values" "mpt fp8 quantize --format e4m3 --recipe $r" \
      "$mpt" fp8 quantize --format e4m3 --recipe "$r"
  done
  gen_run_with_input simulate-spike "1 1 1 100 1 1 1 1 1 1" \
    "mpt fp8 simulate --recipe delayed --format e4m3 --history 4" \
    "$mpt" fp8 simulate --recipe delayed --format e4m3 --history 4
  gen_run_with_input simulate-spike-margin "1 1 1 100 1 1 1 1 1 1" \
    "mpt fp8 simulate --recipe delayed --format e4m3 --history 4 --margin 7" \
    "$mpt" fp8 simulate --recipe delayed --format e4m3 --history 4 --margin 7
  gen_run_with_input simulate-shrink-long "64 32 16 8 4 2 1 0.5" \
    "mpt fp8 simulate --recipe delayed --format e4m3 --history 1024" \
    "$mpt" fp8 simulate --recipe delayed --format e4m3 --history 1024
  gen_run_with_input simulate-shrink-short "64 32 16 8 4 2 1 0.5" \
    "mpt fp8 simulate --recipe delayed --format e4m3 --history 2" \
    "$mpt" fp8 simulate --recipe delayed --format e4m3 --history 2
  gen_run_with_input simulate-periodic-short "1 1 100 1 1 100 1 1 100" \
    "mpt fp8 simulate --recipe delayed --format e4m3 --history 1" \
    "$mpt" fp8 simulate --recipe delayed --format e4m3 --history 1
  gen_run trace-mlp "mpt trace --model mlp --policy fp8:delayed" "$mpt" trace --model mlp --policy fp8:delayed
  policy_options() { "$mpt" policy show fp8:delayed:margin=1,history=16,algo=most_recent | head -n 2; }
  gen_run policy-options "mpt policy show fp8:delayed:margin=1,history=16,algo=most_recent | head -n 2" policy_options
  gen_run policy-option-refused "mpt train --model mlp --policy fp8:mx-floor:margin=1 --steps 10" \
    gen_refused "$mpt" train --model mlp --policy fp8:mx-floor:margin=1 --steps 10
  # The MLP's sweep writes generated/fp8-curves-mlp.svg and prints that path:
  # run it from the chapter folder (or the scratch copy) so the path is the
  # same wherever. 35 runs of 300 steps: seconds.
  mlp_sweep() { (cd "$dir" && "$numbers" train mlp generated); }
  gen_run mlp "ch07_numbers train mlp generated" mlp_sweep
  step_cost() {
    local p
    for p in bf16 fp8:delayed fp8:mx-floor; do
      printf '%-13s ' "$p"
      "$mpt" trace --model transformer --policy "$p" --gpu h100-sxm | grep '^step:'
    done
  }
  gen_run cost "for p in bf16 fp8:delayed fp8:mx-floor; do printf '%-13s ' \$p; mpt trace --model transformer --policy \$p --gpu h100-sxm | grep '^step:'; done" \
    step_cost
  gen_run pitfalls "mpt pitfalls --chapter 7" "$mpt" pitfalls --chapter 7
  gen_pitfalls_and_tour 7 "${pitfall_ids[@]}"
  # The claim reads the MLP's sweep just written and the Transformer's record
  # (committed, copied into the scratch copy by --check).
  claims_of() { (cd "$dir" && "$numbers" claims generated/mlp.txt generated/transformer.txt); }
  gen_run claims "ch07_numbers claims generated/mlp.txt generated/transformer.txt" claims_of
}

# The Transformer's sweep: every precision of the chapter, seeds 1 to 5,
# 200 steps each — 35 runs, a quarter of an hour on one core (an FP8 step
# emulates its quantization and GEMMs in software). --check reruns it with
# 2 seeds of 2 steps and compares what does not depend on the training: the
# rows of its tables (bench_deterministic). That cannot see a change of the
# training code that moves the losses: after one, rerun --bench. It writes
# its picture, generated/fp8-curves-transformer.svg, beside the record (so it
# runs from DIR, the chapter folder or the check's scratch folder).
#
# The quantize benchmark: per-tensor and MX quantize against memcpy of the
# same bytes (a minute); --check reruns it on 2^20 elements, minimally, and
# compares its variants and targets.
#
# The step benchmark: one training step of the MLP and the tiny Transformer
# under f32, bf16 and the four FP8 recipes, each against bf16's (about a
# minute); --check reruns it minimally and compares its rows' names.
run_benchmarks() {
  pushd "$1" >/dev/null
  gen_bench transformer.txt chapters/ch07_numbers '^the tiny Transformer' train transformer generated \
    -- train transformer generated --seeds 2 --steps 2
  popd >/dev/null
  # The same run drew the picture (gen_bench runs each record's program once).
  gen_bench_ran+=(fp8-curves-transformer.svg)
  gen_bench bench-quantize.txt tests/bench/bench_ch07_quantize '^FP8 E4M3 quantize' --benchmark_min_time=0.5 \
    -- --n=1048576 --benchmark_min_time=0.001 --repetitions=1
  gen_bench bench-fp8-step.txt tests/bench/bench_ch07_fp8_step '^FP8 training step' --benchmark_min_time=0.5 \
    -- --benchmark_min_time=0.001 --repetitions=1
}

# What of a record does not depend on timing or training: the Transformer's
# rows (the first 18 characters of every table row: the precisions, in
# order); the quantize benchmark's variants and their targets.
bench_deterministic() {
  case "$1" in
    transformer.txt)
      awk '
        /^(precision|policy|run) / { table = 1; print substr($0, 1, 18); next }
        table && NF == 0 { table = 0; next }
        table && /^shown at/ { table = 0; next }
        table { print substr($0, 1, 18) }
      ' ;;
    fp8-curves-transformer.svg) cat >/dev/null ;;
    bench-fp8-step.txt)
      awk '/^FP8 training step/ || /^(MLP|tiny Transformer) / || /^model / { print; next } $1 == "mlp" || $1 == "lm" { print $1, $2 }' ;;
    bench-quantize.txt)
      awk '/^variant / { t = 1; print; next } t && NF >= 5 { print $1, $5 }' ;;
    *) cat ;;
  esac
}

generate_main "$@"
