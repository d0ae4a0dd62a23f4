#!/usr/bin/env bash
# Examples/s of the Keras CNN (examples/python/keras_fashion_mnist.py), for bench/RESULTS.md:
#   (a) cluster: 2 ps-server shards + 2 Keras worker processes (deploy/local/keras.cfg,
#       sync and async, batch B per worker, 1 TensorFlow thread each), total examples of
#       both workers over the cluster's wall-clock window (first worker started to last
#       worker exited, TensorFlow start-up and the test-set evaluation included);
#   (b) local: one Keras process, no shards, Keras's own Adam, global batch 2B, 2 threads,
#       the same number of examples, over its own wall-clock window.
# Also the training-only rate (fit's window, from the "done:" lines: summed over the
# workers), without TensorFlow's start-up, the tracing and the evaluation.
# Rounds alternate local, sync, async; the summary gives median and min-max of each.
#
# usage: bench/keras.sh [BUILD_DIR]   env: RUNS (3), STEPS (300 global steps), BATCH (32),
#                                         VENV (default: python/venv.sh's)
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
build=${1:-build}
runs=${RUNS:-3} steps=${STEPS:-300} B=${BATCH:-32}
[ -x "$build/server/ps-server" ] || { echo "keras.sh: $build/server/ps-server is not built" >&2; exit 1; }
venv=${VENV:-$(python/venv.sh)} || { echo "keras.sh: python/venv.sh failed" >&2; exit 1; }
py="$venv/bin/python"
ex=examples/python/keras_fashion_mnist.py
cfg=deploy/local/keras.cfg
bench_start keras
export TF_CPP_MIN_LOG_LEVEL=2

now() { date +%s.%N; }
results=()
for r in $(seq 1 "$runs"); do
  # (b) one process, global batch 2B.
  t0=$(now)
  "$py" $ex -c $cfg --local --threads 2 --set train.batch_size=$((2 * B)) \
    --set train.max_steps=$steps --set train.epochs=100 >"$dir/local.out" 2>"$dir/local.log" ||
    { echo "keras.sh: local run failed:"; tail -5 "$dir/local.log"; exit 1; }
  t1=$(now)
  ex_local=$(sed -n 's/^done: .* examples=\([0-9]*\) .*/\1/p' "$dir/local.out")
  eps=$(echo "$ex_local / ($t1 - $t0)" | bc -l)
  acc=$(sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p' "$dir/local.out")
  fit=$(sed -n 's/.*examples_per_sec=\([0-9.]*\).*/\1/p' "$dir/local.out")
  printf 'what=local run=%d examples=%d wall_s=%.1f examples_per_sec=%.0f fit_examples_per_sec=%.0f test_accuracy=%s load=%s\n' \
    "$r" "$ex_local" "$(echo "$t1 - $t0" | bc -l)" "$eps" "$fit" "$acc" "$(cut -d' ' -f1 /proc/loadavg)"
  results+=("local $eps" "fit-local $fit")
  for mode in sync async; do
    free_port p0; free_port p1; free_port h0; free_port h1; free_port w0; free_port w1
    psp=("$p0" "$p1")
    sets=(--set "cluster.ps=$(list "$p0" "$p1")" --set "cluster.ps_http=$(list "$h0" "$h1")"
          --set "cluster.workers=$(list "$w0" "$w1")" --set "job.mode=\"$mode\""
          --set "train.batch_size=$B" --set "train.max_steps=$steps" --set "train.epochs=100")
    for s in 0 1; do
      timeout 900 "$build/server/ps-server" -c "$cfg" "${sets[@]}" --shard $s --log-level warn \
        2>"$dir/ps$s.log" </dev/null >/dev/null &
      pids+=($!)
    done
    for port in "${psp[@]}"; do
      for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
    done
    t0=$(now)
    wpids=()
    for t in 0 1; do
      timeout 600 "$py" $ex -c "$cfg" "${sets[@]}" --task $t --threads 1 \
        >"$dir/w$t.out" 2>"$dir/w$t.log" </dev/null &
      wpids+=($!) pids+=($!)
    done
    fail=0
    for w in "${wpids[@]}"; do wait "$w" || fail=1; done
    t1=$(now)
    stop_all
    [ $fail = 0 ] || { echo "keras.sh: a $mode worker failed:"; tail -5 "$dir"/w*.log; exit 1; }
    total=$(cat "$dir"/w*.out | sed -n 's/^done: .* examples=\([0-9]*\) .*/\1/p' | paste -sd+ | bc)
    eps=$(echo "$total / ($t1 - $t0)" | bc -l)
    acc=$(sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p' "$dir/w0.out")
    fit=$(cat "$dir"/w*.out | sed -n 's/.*examples_per_sec=\([0-9.]*\).*/\1/p' | paste -sd+ | bc)
    printf 'what=cluster mode=%s run=%d examples=%d wall_s=%.1f examples_per_sec=%.0f fit_examples_per_sec=%.0f test_accuracy=%s load=%s\n' \
      "$mode" "$r" "$total" "$(echo "$t1 - $t0" | bc -l)" "$eps" "$fit" "$acc" "$(cut -d' ' -f1 /proc/loadavg)"
    results+=("$mode $eps" "fit-$mode $fit")
  done
done
echo "# summary (examples/s over the wall-clock window: median, min-max of $runs rounds)"
for w in local sync async fit-local fit-sync fit-async; do
  printf '%s\n' "${results[@]}" | awk -v w=$w '$1 == w {print $2}' | sort -g |
    awk -v w=$w '{a[NR]=$1} END {m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2;
                   printf "# %s: median %.0f, min %.0f, max %.0f\n", w, m, a[1], a[NR]}'
done
