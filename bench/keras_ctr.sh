#!/usr/bin/env bash
# The CTR model of ps-worker (deploy/local/ctr.cfg) four ways, for bench/RESULTS.md
# (issue 28), in alternating rounds on the same Criteo-shaped rows (bench/criteo_gen:
# ROWS training rows, 20000 test rows, 26 fields capped at CARD ids, Zipf 1.05, seed 3):
#
#   ps-worker   2 ps-server shards + 2 ps-worker processes, sync, batch B per worker,
#               Adam 0.002 (rows: lazy Adam), EPOCHS epochs
#   keras       the same model in Keras (bench/keras_ctr.py): tessera.keras.Embedding and
#               tessera.keras.Optimizer, 2 shards + 2 worker processes, one TensorFlow
#               thread each, the same job
#   local       the same model in one plain Keras process, Keras's Embedding and Adam
#               0.002, global batch 2B, 2 TensorFlow threads
#   pss         the same model on TensorFlow's ParameterServerStrategy (bench/keras_pss_ctr.py,
#               Keras 2 from tf-keras): 2 ps tasks (the embedding split over them), 2 worker
#               tasks and the coordinator, one TensorFlow thread each, batch B per worker
#               step, Adam 0.002, asynchronous (the strategy is)
#
# examples/s over the training window (fit's for Keras, the training loop's for ps-worker:
# the earliest start to the latest end of the workers, from their done: lines; start-up,
# reading the files and the test evaluation left out), each run's test AUC, and the bytes
# the run moved over the loopback interface (/proc/net/dev's lo, start-up included) per
# step of a worker: what a step costs on the wire.
#
# usage: bench/keras_ctr.sh [BUILD_DIR]   env: RUNS (5), ROWS (200000), CARD (100), B (256),
#        EPOCHS (2), VENV (default: python/venv.sh's), WAYS (the ways to run, in that order:
#        "ps-worker keras local pss")
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
build=${1:-build}
runs=${RUNS:-5} rows=${ROWS:-200000} card=${CARD:-100} B=${B:-256} epochs=${EPOCHS:-2}
for b in server/ps-server worker/ps-worker bench/criteo_gen; do
  [ -x "$build/$b" ] || { echo "keras_ctr.sh: $build/$b is not built" >&2; exit 1; }
done
venv=${VENV:-$(python/venv.sh)} || { echo "keras_ctr.sh: python/venv.sh failed" >&2; exit 1; }
py="$venv/bin/python"
# tf-keras of the venv's TensorFlow version, unpacked beside the venv (as bench/keras.sh).
tfv=$("$py" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)
tfk="$(dirname "$venv")/tf-keras-$tfv"
read -r -a ways <<<"${WAYS:-ps-worker keras local pss}"
if [[ " ${ways[*]} " == *" pss "* && ! -d "$tfk/tf_keras" ]] &&
   ! "$py" -m pip install -q --no-deps --target "$tfk" "tf-keras==$tfv" >&2; then
  echo "keras_ctr.sh: could not install tf-keras==$tfv: the ParameterServerStrategy rounds skip" >&2
  read -r -a ways <<<"${ways[*]/pss/}"
fi
export TF_CPP_MIN_LOG_LEVEL=2
cfg=deploy/local/ctr.cfg
bench_start keras-ctr

"$build/bench/criteo_gen" --rows "$rows" --seed 3 --max-cardinality "$card" -o "$dir/train.tsv" 2>/dev/null
best=$("$build/bench/criteo_gen" --rows 20000 --seed 3 --stream 1 --max-cardinality "$card" \
  -o "$dir/test.tsv" 2>&1 | sed -n 's/.*best_auc=\([0-9.]*\).*/\1/p')
echo "# data: $rows training rows, 20000 test rows (best AUC $best), fields capped at $card ids"

field() { sed -n "s/.*$1=\\([0-9.]*\\).*/\\1/p" "${@:2}"; }
results=()
lo_bytes() { awk '$1 == "lo:" {print $2}' /proc/net/dev; }
report() { # what eps auc steps
  local moved=$(( $(lo_bytes) - lo0 )) per=0
  [ "${4:-0}" -gt 0 ] && per=$(( moved / $4 ))
  printf 'what=%s run=%d examples_per_sec=%.0f auc=%s bytes_per_step=%d load=%s\n' "$1" "$r" \
    "$2" "$3" "$per" "$(cut -d' ' -f1 /proc/loadavg)"
  results+=("$1 $2")
  bytes+=("$1 $per")
}
bytes=()
cluster_sets() {
  free_port p0; free_port p1; free_port h0; free_port h1; free_port w0; free_port w1
  psp=("$p0" "$p1")
  sets=(--set "cluster.ps=$(list "$p0" "$p1")" --set "cluster.ps_http=$(list "$h0" "$h1")"
        --set "cluster.workers=$(list "$w0" "$w1")" --set "optimizer.learning_rate=0.002"
        --set "train.batch_size=$B" --set "train.epochs=$epochs"
        --set "data.train_path=\"$dir/train.tsv\"" --set "data.test_path=\"$dir/test.tsv\"")
}
for r in $(seq 1 "$runs"); do
  nw=${#ways[@]}
  for k in $(seq 0 $((nw - 1))); do
    what=${ways[$(((k + r) % nw))]}
    lo0=$(lo_bytes)
    case $what in
      pss)
        free_port q0; free_port q1; free_port q2; free_port q3; free_port q4
        pargs=(--ps "$q0,$q1" --workers "$q2,$q3" --chief "$q4" --records "$dir/records.bin")
        for t in "ps 0" "ps 1" "worker 0" "worker 1"; do
          read -r role idx <<<"$t"
          PYTHONPATH="$tfk" timeout 900 "$py" bench/keras_pss_ctr.py --role "$role" --index "$idx" \
            "${pargs[@]}" >/dev/null 2>"$dir/pss-$role$idx.log" </dev/null &
          pids+=($!)
        done
        PYTHONPATH="$tfk" timeout 900 "$py" bench/keras_pss_ctr.py --role chief "${pargs[@]}" \
          --train "$dir/train.tsv" --test "$dir/test.tsv" --batch "$B" --epochs "$epochs" \
          >"$dir/pss.out" 2>"$dir/pss.log" ||
          { echo "keras_ctr.sh: the ParameterServerStrategy run failed:"; tail -5 "$dir/pss.log"; exit 1; }
        stop_all
        report pss "$(field examples_per_sec "$dir/pss.out")" "$(field auc "$dir/pss.out")" \
          "$(field steps "$dir/pss.out")" ;;
      local)
        "$py" bench/keras_ctr.py --local --train "$dir/train.tsv" --test "$dir/test.tsv" \
          --batch $((2 * B)) --epochs "$epochs" --threads 2 >"$dir/local.out" 2>"$dir/local.log" ||
          { echo "keras_ctr.sh: the local run failed:"; tail -5 "$dir/local.log"; exit 1; }
        report local "$(field examples_per_sec "$dir/local.out")" "$(field auc "$dir/local.out")" 1
        [ "$r" = 1 ] && echo "# the model's vocabulary: $(field vocab "$dir/local.out") ids" ;;
      *)
        cluster_sets
        if [ "$what" = keras ]; then
          worker_cmd=("$py" bench/keras_ctr.py --train "$dir/train.tsv" --test "$dir/test.tsv" --threads 1)
        else
          unset worker_cmd
        fi
        run_cluster 2 "${sets[@]}" ||
          { echo "keras_ctr.sh: a $what worker failed:"; tail -5 "$dir"/w*.log; exit 1; }
        report "$what" "$(window_eps "$dir/w0.out" "$dir/w1.out")" "$(field auc "$dir/w0.out")" \
          $(( $(field steps "$dir/w0.out") + $(field steps "$dir/w1.out") )) ;;
    esac
  done
done
echo "# summary (examples/s over the training window: median, min-max of $runs rounds)"
for w in "${ways[@]}"; do
  printf '%s\n' "${results[@]}" | awk -v w=$w '$1 == w {print $2}' | sort -g |
    awk -v w=$w '{a[NR]=$1} END {if (!NR) exit; m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2;
                   printf "# %s: median %.0f, min %.0f, max %.0f\n", w, m, a[1], a[NR]}'
  printf '%s\n' "${bytes[@]}" | awk -v w=$w '$1 == w {print $2}' | sort -g |
    awk -v w=$w '{a[NR]=$1} END {if (!NR) exit; m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2;
                   printf "# %s: bytes per worker step median %.0f, min %.0f, max %.0f\n", w, m, a[1], a[NR]}'
done
