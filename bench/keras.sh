#!/usr/bin/env bash
# Examples/s of the Keras CNN (examples/python/keras_fashion_mnist.py), for bench/RESULTS.md:
#   (a) cluster: 2 ps-server shards + 2 Keras worker processes (deploy/local/keras.cfg,
#       sync and async, batch B per worker, 1 TensorFlow thread each), total examples of
#       both workers over the cluster's wall-clock window (first worker started to last
#       worker exited, TensorFlow start-up and the test-set evaluation included);
#   (b) local: one Keras process, no shards, Keras's own Adam, global batch 2B, 2 threads,
#       the same number of examples, over its own wall-clock window;
#   (c) pss: TensorFlow's ParameterServerStrategy on the same model and cluster shape
#       (bench/keras_pss.py: 2 ps tasks, 2 workers, 1 thread each, and the coordinator
#       process it needs; Keras 2 from PyPI's tf-keras, as Keras 3 has no parameter-server
#       training; asynchronous like Tessera's async mode), batch B per worker step, the
#       same number of examples, over the coordinator's wall-clock window.
# Also the training-only rate (fit's window, from the "done:" lines: summed over the
# workers), without TensorFlow's start-up, the tracing and the evaluation.
# The workers run bench/keras_steps.py (the example, printing the median time of each part
# of a step). Rounds alternate local, sync, async, (sync with one bucket,) pss; the summary
# gives median and min-max of each.
#
# usage: bench/keras.sh [BUILD_DIR]   env: RUNS (3), STEPS (300 global steps), BATCH (32),
#        VENV (default: python/venv.sh's), PSS=0 to skip (c), PSS_STEPS (worker steps of (c),
#        default 2 x STEPS: the same examples as (a); it is about ten times slower),
#        ONE_BUCKET=1 to add sync rounds with every variable in one bucket (no overlap)
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
export TF_CPP_MIN_LOG_LEVEL=2

# tf-keras of the venv's TensorFlow version, unpacked beside the venv (not into it).
pss=${PSS:-1}
if [ "$pss" = 1 ]; then
  tfv=$("$py" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)
  tfk="$(dirname "$venv")/tf-keras-$tfv"
  if [ ! -d "$tfk/tf_keras" ] &&
     ! "$py" -m pip install -q --no-deps --target "$tfk" "tf-keras==$tfv" >&2; then
    echo "keras.sh: could not install tf-keras==$tfv: the ParameterServerStrategy rounds skip" >&2
    pss=0
  fi
fi
bench_start keras

now() { date +%s.%N; }
field() { sed -n "s/.*$1=\\([0-9.]*\\).*/\\1/p" "${@:2}"; }
results=()
report() { # what, examples, seconds, fit rate, accuracy
  local eps
  eps=$(echo "$2 / $3" | bc -l)
  printf 'what=%s run=%d examples=%d wall_s=%.1f examples_per_sec=%.0f fit_examples_per_sec=%.0f test_accuracy=%s load=%s\n' \
    "$1" "$r" "$2" "$3" "$eps" "$4" "$5" "$(cut -d' ' -f1 /proc/loadavg)"
  results+=("$1 $eps" "fit-$1 $4")
}
for r in $(seq 1 "$runs"); do
  # (b) one process, global batch 2B.
  t0=$(now)
  "$py" $ex -c $cfg --local --threads 2 --set train.batch_size=$((2 * B)) \
    --set train.max_steps=$steps --set train.epochs=100 >"$dir/local.out" 2>"$dir/local.log" ||
    { echo "keras.sh: local run failed:"; tail -5 "$dir/local.log"; exit 1; }
  t1=$(now)
  report local "$(field examples "$dir/local.out")" "$(echo "$t1 - $t0" | bc -l)" \
    "$(field examples_per_sec "$dir/local.out")" "$(field test_accuracy "$dir/local.out")"

  # (a) the cluster, sync then async (and sync with one bucket: no overlap, ONE_BUCKET=1).
  modes="sync async"
  [ "${ONE_BUCKET:-0}" = 1 ] && modes="$modes sync-1bucket"
  for what in $modes; do
    mode=${what%%-*}
    free_port p0; free_port p1; free_port h0; free_port h1; free_port w0; free_port w1
    psp=("$p0" "$p1")
    sets=(--set "cluster.ps=$(list "$p0" "$p1")" --set "cluster.ps_http=$(list "$h0" "$h1")"
          --set "cluster.workers=$(list "$w0" "$w1")" --set "job.mode=\"$mode\""
          --set "train.batch_size=$B" --set "train.max_steps=$steps" --set "train.epochs=100")
    # The example, timing each step's parts (bench/keras_steps.py).
    worker_cmd=(env TESSERA_BUCKET_BYTES=$([ "$what" = sync-1bucket ] && echo $((1 << 40)))
                "$py" bench/keras_steps.py --threads 1)
    run_cluster 2 "${sets[@]}" ||
      { echo "keras.sh: a $what worker failed:"; tail -5 "$dir"/w*.log; exit 1; }
    total=$(cat "$dir"/w*.out | field examples | paste -sd+ | bc)
    report "$what" "$total" "$workers_s" "$(cat "$dir"/w*.out | field examples_per_sec | paste -sd+ | bc)" \
      "$(field test_accuracy "$dir/w0.out")"
    for t in 0 1; do
      sed -n "s/^steps=/#   $what worker $t median step: steps=/p" "$dir/w$t.log"
    done
  done

  # (c) TensorFlow's ParameterServerStrategy: by default as many worker steps as (a)'s two
  # workers make.
  if [ "$pss" = 1 ]; then
    free_port q0; free_port q1; free_port q2; free_port q3; free_port q4
    targs=(--ps "$q0,$q1" --workers "$q2,$q3" --chief "$q4" --batch "$B" --threads 1)
    for task in "ps 0" "ps 1" "worker 0" "worker 1"; do
      set -- $task
      PYTHONPATH="$tfk" timeout 900 "$py" bench/keras_pss.py --role "$1" --index "$2" "${targs[@]}" \
        >/dev/null 2>"$dir/pss-$1$2.log" </dev/null &
      pids+=($!)
    done
    t0=$(now)
    PYTHONPATH="$tfk" timeout 900 "$py" bench/keras_pss.py --role chief "${targs[@]}" \
      --steps "${PSS_STEPS:-$((2 * steps))}" >"$dir/pss.out" 2>"$dir/pss.log" </dev/null ||
      { echo "keras.sh: the ParameterServerStrategy run failed:"; tail -5 "$dir/pss.log"; exit 1; }
    t1=$(now)
    stop_all
    report pss "$(field examples "$dir/pss.out")" "$(echo "$t1 - $t0" | bc -l)" \
      "$(field examples_per_sec "$dir/pss.out")" "$(field test_accuracy "$dir/pss.out")"
  fi
done
echo "# summary (examples/s over the wall-clock window: median, min-max of $runs rounds)"
for w in local sync async sync-1bucket pss fit-local fit-sync fit-async fit-sync-1bucket fit-pss; do
  printf '%s\n' "${results[@]}" | awk -v w=$w '$1 == w {print $2}' | sort -g |
    awk -v w=$w 'NR > 0 {a[NR]=$1} END {if (!NR) exit; m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2;
                   printf "# %s: median %.0f, min %.0f, max %.0f\n", w, m, a[1], a[NR]}'
done
