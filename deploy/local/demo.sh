#!/usr/bin/env bash
# Tessera demo: installs what is missing, builds, then trains an MLP on Fashion-MNIST with a
# local cluster (2 parameter-server shards + 2 workers on free loopback ports), shows the
# progress, each worker's test accuracy and a final `psctl status`, and stops everything it
# started, also on Ctrl-C.
#
# Each worker's progress lines (at each tenth of an epoch and every half second) are shown
# as they come; the last worker to finish evaluates the job's final parameters, shown with
# the results.
#
#   deploy/local/demo.sh [--mode sync|async|ssp] [--workers N] [--shards N] [--epochs N]
#                        (--epochs: 3 unless given)
#                        [--keep]   (keep the logs directory)
#                        [--keras]  (Keras workers: a CNN, examples/python/keras_fashion_mnist.py,
#                                    job deploy/local/keras.cfg;
#                                    makes or reuses python/venv.sh's venv with TensorFlow)
#                        [--ctr]    (a CTR model, embeddings + MLP, job deploy/local/ctr.cfg, on
#                                    Criteo-shaped rows bench/criteo_gen writes: 300k training
#                                    and 30k test rows, 26 fields of up to 1000 ids; prints each
#                                    worker's test AUC and the best the data allows; --epochs:
#                                    1 unless given)
set -euo pipefail

mode=sync workers=2 shards=2 epochs= keep=0 keras=0 ctr=0
while [ $# -gt 0 ]; do
  case "$1" in
    --mode) mode=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --keras) keras=1; shift ;;
    --ctr) ctr=1; shift ;;
    -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "demo: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$epochs" ]; then epochs=3; [ "$ctr" = 0 ] || epochs=1; fi
[ "$keras$ctr" != 11 ] || { echo "demo: --keras and --ctr are two demos: pick one" >&2; exit 2; }
case "$mode" in sync|async|ssp) ;; *) echo "demo: --mode is sync, async or ssp" >&2; exit 2 ;; esac
for n in "$workers" "$shards" "$epochs"; do
  [[ "$n" =~ ^[1-9][0-9]?$ ]] || { echo "demo: counts are whole numbers from 1 to 99" >&2; exit 2; }
done

cd "$(dirname "$0")/../.."
root=$(pwd)
bash deploy/install-deps.sh

build=${BUILD_DIR:-build}
if [ ! -f "$build/build.ninja" ]; then
  echo "demo: configuring $build"
  meson setup "$build" >/dev/null
fi
echo "demo: building"
meson compile -C "$build" >/dev/null
if [ "$keras" = 1 ]; then
  echo "demo: making or reusing the Python venv (tessera + TensorFlow; minutes the first time)"
  venv=$(python/venv.sh) || { echo "demo: python/venv.sh failed" >&2; exit 1; }
fi

run=$(mktemp -d /tmp/tessera-demo-XXXXXX)
pids=()
cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  if [ "$keep" = 1 ]; then echo "demo: logs kept in $run"; else rm -rf "$run"; fi
}
trap cleanup EXIT
trap 'echo; echo "demo: interrupted, stopping the cluster"; exit 130' INT TERM

# Free loopback ports: nothing may answer on them now.
taken=" "
free_port() {
  local port
  while :; do
    port=$(( 20000 + RANDOM % 12000 ))  # below the kernel's ephemeral range (32768+)
    case "$taken" in *" $port "*) continue ;; esac
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      taken="$taken$port "  # kept: free_port sets $1 instead of printing, so no subshell loses it
      printf -v "$1" '%s' "$port"
      return
    fi
  done
}
list() { local out="" i; for i in "$@"; do out="$out${out:+, }\"127.0.0.1:$i\""; done; echo "[$out]"; }
ps_ports=() http_ports=() worker_ports=()
for _ in $(seq "$shards"); do free_port p; ps_ports+=("$p"); free_port p; http_ports+=("$p"); done
for _ in $(seq "$workers"); do free_port p; worker_ports+=("$p"); done
sets=(--set "cluster.ps=$(list "${ps_ports[@]}")"
      --set "cluster.ps_http=$(list "${http_ports[@]}")"
      --set "cluster.workers=$(list "${worker_ports[@]}")"
      --set "job.mode=\"$mode\"" --set "train.epochs=$epochs" --set "train.log_interval_s=0.5")
cfg="$root/deploy/local/cluster.cfg"
[ "$keras" = 1 ] && cfg="$root/deploy/local/keras.cfg"
best=
if [ "$ctr" = 1 ]; then
  cfg="$root/deploy/local/ctr.cfg"
  echo "demo: generating Criteo-shaped rows (bench/criteo_gen) into $run"
  gen() { "$build/bench/criteo_gen" --seed 7 --max-cardinality 1000 "$@" 2>&1 >/dev/null; }
  gen --rows 300000 -o "$run/train.tsv" >/dev/null
  best=$(gen --rows 30000 --stream 1 -o "$run/test.tsv" | sed -n 's/.*best_auc=\([0-9.]*\).*/\1/p')
  sets+=(--set "data.train_path=\"$run/train.tsv\"" --set "data.test_path=\"$run/test.tsv\"")
fi
psctl() { "$build/psctl/psctl" -c "$cfg" "${sets[@]}" "$@"; }

what=MLP data=Fashion-MNIST
[ "$keras" = 1 ] && what="Keras CNN"
[ "$ctr" = 1 ] && what="CTR (embeddings + MLP)" data="Criteo-shaped rows"
echo "demo: $shards shard(s) + $workers $what worker(s), $mode mode, $epochs epoch(s) of $data; logs in $run"
for i in $(seq 0 $((shards - 1))); do
  "$build/server/ps-server" -c "$cfg" "${sets[@]}" --shard "$i" 2>"$run/ps-$i.log" &
  pids+=($!)
done
for _ in $(seq 100); do psctl health >/dev/null 2>&1 && break; sleep 0.1; done
psctl health >/dev/null || { echo "demo: the shards did not come up:"; cat "$run"/ps-*.log; exit 1; }

# Keras workers: one TensorFlow thread each when they share the cores.
threads=$(( $(nproc) / workers )); [ "$threads" -ge 1 ] || threads=1
for t in $(seq 0 $((workers - 1))); do
  # Made here, not by the child's redirection: the progress loop below reads them at once.
  : >"$run/worker-$t.out"
  if [ "$keras" = 1 ]; then
    TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" -u examples/python/keras_fashion_mnist.py \
      -c "$cfg" "${sets[@]}" --task "$t" --threads "$threads" --verbose 2 \
      >"$run/worker-$t.out" 2>&1 &
    ln -sf "worker-$t.out" "$run/worker-$t.log"   # Keras prints its progress on stdout
  else
    : >"$run/worker-$t.log"
    "$build/worker/ps-worker" -c "$cfg" "${sets[@]}" --task "$t" >"$run/worker-$t.out" 2>"$run/worker-$t.log" &
  fi
  pids+=($!)
done
worker_pids=("${pids[@]:$shards}")

# Show progress until every worker has exited.
shown=()
for t in $(seq 0 $((workers - 1))); do shown+=(0); done
while :; do
  running=0
  for p in "${worker_pids[@]}"; do kill -0 "$p" 2>/dev/null && running=1; done
  for t in $(seq 0 $((workers - 1))); do
    n=$(wc -l <"$run/worker-$t.log")
    if [ "$n" -gt "${shown[$t]}" ]; then
      tail -n +"$((shown[t] + 1))" "$run/worker-$t.log" | head -n "$((n - shown[t]))" |
        grep -E ' (step|error|warning|finished)|Error|ms/step' | grep -v oneDNN |
        sed -E 's/^[0-9T:.-]+Z //; s/^/  /' | sed "$([ "$keras" = 1 ] && echo "s/^/  worker $t:/")" || true
      shown[$t]=$n
    fi
  done
  [ "$running" = 1 ] || break
  sleep 0.5
done

status=0 final=
echo
echo "demo: results"
for t in $(seq 0 $((workers - 1))); do
  if wait "${worker_pids[$t]}"; then
    line=$(grep '^done:' "$run/worker-$t.out" || true)
    acc=$(sed -n 's/.* test_accuracy=\([0-9.]*\).*/\1/p' <<<"$line")
    if [ "$ctr" = 1 ]; then
      auc=$(sed -n 's/.* auc=\([0-9.]*\).*/\1/p' <<<"$line")
      ll=$(sed -n 's/.* logloss=\([0-9.]*\).*/\1/p' <<<"$line")
      echo "  worker $t: test AUC ${auc:-?}, log loss ${ll:-?}   ($line)"
    else
      echo "  worker $t: test accuracy ${acc:-?}   ($line)"
    fi
    fin=$(sed -n 's/.*final_test_accuracy=\([0-9.]*\).*/\1/p' <<<"$line")
    [ -z "$fin" ] || final="  the job's final parameters (evaluated by worker $t once all had finished): test accuracy $fin"
  else
    echo "  worker $t FAILED; the end of its log:"
    tail -n 5 "$run/worker-$t.log" | sed 's/^/    /'
    status=1
  fi
done
[ -z "$final" ] || echo "$final"
[ -z "$best" ] || echo "  the best AUC any model can reach on the test rows (the generator's hidden model): $best"
echo
psctl status || status=1
exit $status
