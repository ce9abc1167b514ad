#!/usr/bin/env bash
# Chapter 05 — regenerates the outputs the chapter text shows (generated/*.txt,
# and the picture generated/ddp-step.svg) and splices each text block into
# README.md between its markers.
# Depends on: a build of the project with the MPI backend (BUILD_DIR/src/cli/mpt
# and BUILD_DIR/chapters/ch05_numbers), OpenMPI's mpiexec (Debian:
# openmpi-bin), ../generate_common.sh (the modes, the splicing and the check,
# shared by every chapter), bash, awk, diff, Graphviz's dot (the sequence
# picture).
#
# usage: generate.sh BUILD_DIR           regenerate in place (then commit the result)
#        generate.sh --check BUILD_DIR   regenerate into a scratch copy and fail if
#                                        the committed files differ (the docs test)
#        generate.sh --bench BUILD_DIR   rerun the benchmarks under mpiexec (a
#                                        minute, on an otherwise idle machine) and
#                                        splice their records in
#        generate.sh --into DIR BUILD_DIR
#                                        write a fresh copy of the chapter into DIR
#
# The runs under mpiexec pass --allow-run-as-root (CI runs as root),
# --oversubscribe (4 ranks on 2 cores) and --bind-to none; set MPIEXEC to use
# another launcher. Their outputs are those of rank 0, which alone prints.
set -euo pipefail

chapter_id=05
chapter_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
required_programs=(src/cli/mpt chapters/ch05_numbers)
bench_records=(bench-allreduce.txt)
# shellcheck source=../generate_common.sh
source "$chapter_dir/../generate_common.sh"

pitfall_ids=(fp16-allreduce-overflow sharded-found-inf-unsynced scaler-state-one-rank loss-summed-across-ranks
             ddp-accumulation-sync bn-buffers-per-rank ranks-disagree-on-skip)

read -r -a mpiexec <<<"${MPIEXEC:-mpiexec --allow-run-as-root --oversubscribe --bind-to none}"
command -v "${mpiexec[0]}" >/dev/null ||
  { echo "generate.sh: ${mpiexec[0]} not found (Debian: apt-get install openmpi-bin)" >&2; exit 1; }

# The recorded step of the sequence picture (ddp-step.dot of the text).
draw_diagrams() {
  "$build/chapters/ch05_numbers" sequence "$1" >/dev/null
}

# `mpt train`'s summary: without the progress lines and the wall time, which
# carry timings that differ run to run.
train_summary() { "$@" 2>/dev/null | grep -v -e 'steps/s' -e '^wall time'; }

generate_all() {
  local mpt="$build/src/cli/mpt" numbers="$build/chapters/ch05_numbers" dir="$1"
  local train=(train --model mlp --policy f16 --scaler dynamic --steps 40)
  gen_run verdicts "ch05_numbers verdicts" "$numbers" verdicts
  gen_run equivalence "ch05_numbers equivalence" "$numbers" equivalence
  gen_run order "ch05_numbers order" "$numbers" order
  seq_dir="$gen_tmp/sequence"
  mkdir -p "$seq_dir"
  sequence_events() { "$numbers" sequence "$seq_dir" | sed "s|$seq_dir/|DIR/|"; }
  gen_run sequence "ch05_numbers sequence DIR" sequence_events
  gen_run train-one "mpt ${train[*]} | grep -v -e 'steps/s' -e '^wall time'" train_summary "$mpt" "${train[@]}"
  gen_run train-dp2 "mpiexec -n 2 mpt ${train[*]} --data-parallel | grep -v -e 'steps/s' -e '^wall time'" \
    train_summary "${mpiexec[@]}" -n 2 "$mpt" "${train[@]}" --data-parallel
  gen_run train-dp4-zero "mpiexec -n 4 mpt ${train[*]} --data-parallel --shard-optimizer --comm-dtype f16 | grep -v -e 'steps/s' -e '^wall time'" \
    train_summary "${mpiexec[@]}" -n 4 "$mpt" "${train[@]}" --data-parallel --shard-optimizer --comm-dtype f16
  if [[ ${#pitfall_ids[@]} -gt 0 ]]; then
    gen_run pitfalls "mpt pitfalls --chapter 5" "$mpt" pitfalls --chapter 5
    gen_pitfalls_and_tour 5 "${pitfall_ids[@]}"
  fi
  gen_run claims "ch05_numbers claims" "$numbers" claims
}

# The benchmark record (an MPI program under mpiexec, run by its driver
# script); --check reruns its quick form (a smaller MLP, 3 repeats) and
# compares what bench_deterministic keeps.
run_benchmarks() {
  gen_bench bench-allreduce.txt tests/bench/bench_ch05_allreduce_all '^all-reduce' -- --quick
}

# What of the record depends neither on timing nor on the quick form's
# sizes: the column headings, the runs' names, and the world sizes.
bench_deterministic() {
  case "$1" in
    bench-allreduce.txt)
      awk '
        /^run / { print; next }
        /^ddp cap / { print $1, $2, $3, $4, $5; next }
        /^(raw|ddp) / { print $1, $2; next }
        /^world [0-9]+:/ { print $1, $2 }
      ' ;;
    *) cat ;;
  esac
}

generate_main "$@"
