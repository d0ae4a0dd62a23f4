#!/usr/bin/env bash
# The psbench figures of bench/RESULTS.md: tensor sizes 4 KiB .. 400 MiB, 1 worker + 1 shard
# and 2 workers + 2 shards, async and sync; 5 runs each, iperf3 in every invocation.
# Writes JSON lines (one object per invocation, with the load average) to OUT
# (default bench/results/psbench.jsonl) and echoes them.
#
# usage: bench/sweep.sh [BUILD_DIR]    env: SIZES, SHAPES ("1x1 2x2"), MODES, RUNS, OUT
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
sizes=${SIZES:-4KiB 64KiB 4MiB 40MiB 400MiB}
shapes=${SHAPES:-1x1 2x2}
modes=${MODES:-async sync}
runs=${RUNS:-5}
out=${OUT:-bench/results/psbench.jsonl}
mkdir -p "$(dirname "$out")"
for mode in $modes; do
  for shape in $shapes; do
    w=${shape%x*} s=${shape#*x}
    for size in $sizes; do
      secs=1
      [ "$size" = 400MiB ] && secs=3
      line=$(timeout 600 "$build/bench/psbench" --size "$size" --workers "$w" --shards "$s" \
             --mode "$mode" --runs "$runs" --seconds "$secs" --output json) || line="{\"size\": \"$size\", \"workers\": $w, \"shards\": $s, \"mode\": \"$mode\", \"error\": true}"
      echo "$line" | tee -a "$out"
    done
  done
done
