#!/usr/bin/env bash
# LeNet-5 on the CPU (deploy/local/lenet5.cfg), examples/s, for bench/RESULTS.md:
#   tf       TensorFlow/Keras training the same model in one process (bench/keras_lenet.py),
#            batch B, T intra-op threads, one inter-op thread; fit's own window
#   ceiling  build/bench/train_local --config lenet5.cfg: ps-worker's model and CPU kernels
#            with the shard's Adam in place, one process, batch B, T OpenBLAS threads
#   worker   one ps-worker (batch B, device.intra_op_parallelism_threads = T) with its 2
#            shards: the worker's own examples_per_sec ("done:" line)
#   cluster  2 shards + 2 ps-workers, sync, batch B each, T threads each: both workers'
#            examples over the cluster's training window (bench/lib.sh window_eps)
# In rounds (tf, ceiling, worker, cluster), so each ratio compares runs minutes apart on
# this machine whose speed moves by +-30%; the summary gives medians, min-max, and the
# medians of the round-by-round ratios worker/tf and cluster/ceiling.
#
# usage: bench/lenet.sh [BUILD_DIR]   env: RUNS (3), STEPS (400 steps of each worker), BATCH
#        (32), THREADS (1), VENV (default: python/venv.sh's)
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
build=${1:-build}
runs=${RUNS:-3} steps=${STEPS:-400} B=${BATCH:-32} T=${THREADS:-1}
for b in server/ps-server worker/ps-worker bench/train_local; do
  [ -x "$build/$b" ] || { echo "lenet.sh: $build/$b is not built" >&2; exit 1; }
done
venv=${VENV:-$(python/venv.sh)} || { echo "lenet.sh: python/venv.sh failed" >&2; exit 1; }
bench_start lenet
cfg=deploy/local/lenet5.cfg
load() { cut -d' ' -f1 /proc/loadavg; }
eps_of() { sed -n 's/.*examples_per_sec=\([0-9.]*\).*/\1/p' "$1" | head -1; }
line() { echo "what=$1 run=$run examples_per_sec=${2:-FAILED} load=$(load)" | tee -a "$dir/lines.txt"; }

echo "# $(date -u +%FT%TZ) nproc=$(nproc) cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\" batch=$B threads=$T steps=$steps"
cluster() {   # cluster N: N workers of batch B for $steps steps each; sets $got
  local n=$1 p0 p1 w0 w1
  free_port p0; free_port p1; free_port w0; free_port w1
  psp=("$p0" "$p1")
  local workers=("$w0" "$w1")
  local sets=(--set "cluster.ps=$(list "$p0" "$p1")" --set "cluster.ps_http=[]"
    --set "cluster.workers=$(list "${workers[@]:0:n}")"
    --set "train.batch_size=$B" --set "train.max_steps=$((steps * n))"
    --set "device.intra_op_parallelism_threads=$T")
  got=""
  run_cluster "$n" "${sets[@]}" || { tail -3 "$dir"/w*.log >&2; return; }
  got=$(window_eps $(for t in $(seq 0 $((n - 1))); do echo "$dir/w$t.out"; done))
}
for run in $(seq 1 "$runs"); do
  "$venv/bin/python" bench/keras_lenet.py --batch "$B" --steps "$steps" --threads "$T" \
    >"$dir/tf.out" 2>"$dir/tf.err"
  line tf "$(eps_of "$dir/tf.out")"
  OPENBLAS_NUM_THREADS=$T timeout 600 "$build/bench/train_local" --config "$cfg" --batch "$B" \
    --steps "$steps" >"$dir/local.out" 2>&1
  line ceiling "$(eps_of "$dir/local.out")"
  cluster 1
  line worker "$got"
  cluster 2
  line cluster "$got"
done

python3 - "$dir/lines.txt" <<'PY'
import re, statistics, sys
rows = [dict(re.findall(r'(\w+)=(\S+)', l)) for l in open(sys.argv[1])]
by = {}
for r in rows:
    if r['examples_per_sec'] != 'FAILED':
        by.setdefault(r['what'], {})[r['run']] = float(r['examples_per_sec'])
for what, runs in by.items():
    v = list(runs.values())
    print(f"# summary {what}: examples_per_sec median={statistics.median(v):.0f} "
          f"min={min(v):.0f} max={max(v):.0f} runs={len(v)}")
for num, den in (('worker', 'tf'), ('cluster', 'ceiling')):
    r = [by[num][k] / by[den][k] for k in by.get(num, {}) if k in by.get(den, {})]
    if r:
        print(f"# summary {num}/{den}: ratio median={statistics.median(r):.2f} "
              f"min={min(r):.2f} max={max(r):.2f} rounds={len(r)}")
PY
