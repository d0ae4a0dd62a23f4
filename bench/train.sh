#!/usr/bin/env bash
# Examples/s of training, for bench/RESULTS.md:
#   (a) the one-process compute ceiling: build/bench/train_local (ps-worker's model and CPU
#       kernels, the shard's Adam loop in place, same batch, no parameter server);
#   (b) the cluster: 2 ps-server shards + 2 ps-worker processes on 127.0.0.1, sync and
#       async, examples/s over the cluster's training window: both workers' examples over
#       the earliest started_at to the latest finished_at of their "done:" lines (a sum of
#       each worker's own rate overstates it when the workers' windows do not overlap);
# for the MLPs [784,128,10] and [784,2048,2048,10]. Peak RSS of every process from
# /usr/bin/time -v (installed with apt-get when missing). Every process is bounded by
# train.max_steps and by `timeout`; the temporary job directory is removed at the end.
#
# usage: bench/train.sh [BUILD_DIR]      env: STEPS_SMALL (300), STEPS_LARGE (20), RUNS (3),
#                                            MODELS ("small large"), MODES ("async sync")
# Runs go in rounds (a ceiling run, then the cluster runs), so each cluster figure can be
# compared with the ceiling measured just before it on this noisy machine.
# Output: one line per measurement,
#   what=... model=... mode=... run=N examples_per_sec=X rss_kib=[name:KiB ...] load=L
# then "# summary" lines: medians, and the median of the round-by-round ratios to the ceiling.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh   # free_port
build=${1:-build}
steps_small=${STEPS_SMALL:-300}
steps_large=${STEPS_LARGE:-20}
runs=${RUNS:-3}
models=${MODELS:-small large}
modes=${MODES:-async sync}
data=/usr/share/datasets/fashion-mnist

if [ ! -x /usr/bin/time ]; then
  DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q time >/dev/null 2>&1 ||
    { echo "train.sh: /usr/bin/time is missing and could not be installed" >&2; exit 1; }
fi
for b in server/ps-server worker/ps-worker bench/train_local; do
  [ -x "$build/$b" ] || { echo "train.sh: $build/$b is not built (meson compile -C $build)" >&2; exit 1; }
done

dir=$(mktemp -d /tmp/tessera-train-XXXXXX)
pids=()
# Stop the shards: SIGTERM to each timeout(1) under our time(1) (it passes it on).
stop_shards() {
  for p in "${pids[@]}"; do
    for c in $(pgrep -P "$p"); do kill -TERM "$c" 2>/dev/null; done
  done
}
cleanup() {
  stop_shards
  wait 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT

load() { cut -d' ' -f1 /proc/loadavg; }
peak() { awk -F': ' '/Maximum resident set size/ {print $2}' "$1"; }

layers_of() { [ "$1" = small ] && echo "784, 128, 10" || echo "784, 2048, 2048, 10"; }
steps_of() { [ "$1" = small ] && echo "$steps_small" || echo "$steps_large"; }

echo "# $(date -u +%FT%TZ) nproc=$(nproc) cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\" OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-unset}"

ceiling_run() {
  /usr/bin/time -v -o "$dir/local.time" timeout 600 "$build/bench/train_local" \
    --layers "${layers// /}" --batch 64 --steps "$steps" --data "$data" >"$dir/local.out" 2>&1
  eps=$(sed -n 's/.*examples_per_sec=\([0-9.]*\).*/\1/p' "$dir/local.out")
  echo "what=ceiling model=$model mode=local run=$run steps=$steps examples_per_sec=${eps:-FAILED} rss_kib=[train_local:$(peak "$dir/local.time")] load=$(load)" | tee -a "$dir/lines.txt"
}

cluster_run() {
  free_port p0; free_port p1; free_port h0; free_port h1; free_port w0; free_port w1
  cat >"$dir/job.cfg" <<EOF
cluster = { ps = ["127.0.0.1:$p0", "127.0.0.1:$p1"]; ps_http = ["127.0.0.1:$h0", "127.0.0.1:$h1"];
        workers = ["127.0.0.1:$w0", "127.0.0.1:$w1"]; };
job = { mode = "$mode"; sync_timeout_s = 30.0; heartbeat_timeout_s = 10.0; partition_bytes = 131072; };
optimizer = { name = "adam"; learning_rate = 0.002; };
model = { layers = [$layers]; activation = "relu"; seed = 42; };
data = { format = "idx"; train_images = "$data/train-images-idx3-ubyte.gz";
     train_labels = "$data/train-labels-idx1-ubyte.gz";
     test_images = "$data/t10k-images-idx3-ubyte.gz"; test_labels = "$data/t10k-labels-idx1-ubyte.gz"; };
train = { batch_size = 64; epochs = 1; max_steps = $steps; };
EOF
  pids=()
  for s in 0 1; do
    # time(1) waits for timeout(1), which forwards our SIGTERM to ps-server; the peak RSS
    # time reports is the largest of the processes it waited for: ps-server's.
    /usr/bin/time -v -o "$dir/ps$s.time" timeout 900 "$build/server/ps-server" -c "$dir/job.cfg" \
      --shard $s --log-level warn 2>"$dir/ps$s.log" </dev/null >/dev/null &
    pids+=($!)
  done
  for s in 0 1; do   # wait until each shard listens (10 s at most)
    port=$([ $s = 0 ] && echo "$p0" || echo "$p1")
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  done
  wpids=()
  for t in 0 1; do
    /usr/bin/time -v -o "$dir/w$t.time" timeout 600 "$build/worker/ps-worker" -c "$dir/job.cfg" \
      --task $t --log-level warn >"$dir/w$t.out" 2>"$dir/w$t.log" </dev/null &
    wpids+=($!)
  done
  wait "${wpids[@]}"
  stop_shards
  wait "${pids[@]}" 2>/dev/null
  pids=()
  total=$(window_eps "$dir/w0.out" "$dir/w1.out") ok=1
  [ -n "$total" ] || { ok=0; tail -5 "$dir"/w*.log >&2; }
  [ $ok = 1 ] || total=FAILED
  echo "what=cluster model=$model mode=$mode run=$run steps=$steps examples_per_sec=$total rss_kib=[ps0:$(peak "$dir/ps0.time") ps1:$(peak "$dir/ps1.time") w0:$(peak "$dir/w0.time") w1:$(peak "$dir/w1.time")] load=$(load)" | tee -a "$dir/lines.txt"
}

# Rounds: each run of the ceiling is followed by the cluster runs of the same round, so the
# two see the same state of this shared machine (its speed moves by +-30% over minutes);
# compare them round by round (bench/RESULTS.md section 2 reports the median ratio).
for model in $models; do
  layers=$(layers_of "$model")
  steps=$(steps_of "$model")
  for run in $(seq 1 "$runs"); do
    ceiling_run
    for mode in $modes; do cluster_run; done
  done
done

# Summary: per model and mode, the median of the examples/s and of the round-by-round ratio
# cluster / ceiling.
python3 - "$dir/lines.txt" <<'PY'
import re, statistics, sys
rows = [dict(re.findall(r'(\w+)=(\S+)', l)) for l in open(sys.argv[1])]
ceil = {(r['model'], r['run']): float(r['examples_per_sec']) for r in rows
        if r['what'] == 'ceiling' and r['examples_per_sec'] != 'FAILED'}
groups = {}
for r in rows:
    if r['examples_per_sec'] == 'FAILED':
        continue
    groups.setdefault((r['model'], r['mode']), []).append(r)
for (model, mode), rs in groups.items():
    eps = [float(r['examples_per_sec']) for r in rs]
    line = (f"# summary model={model} mode={mode} runs={len(eps)} examples_per_sec_median="
            f"{statistics.median(eps):.0f} min={min(eps):.0f} max={max(eps):.0f}")
    if mode != 'local':
        ratios = [float(r['examples_per_sec']) / ceil[(model, r['run'])] for r in rs
                  if (model, r['run']) in ceil]
        if ratios:
            line += (f" ratio_to_same_round_ceiling_median={statistics.median(ratios):.2f}"
                     f" ratios=[{' '.join(f'{x:.2f}' for x in ratios)}]")
    print(line)
PY
