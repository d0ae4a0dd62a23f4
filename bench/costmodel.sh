#!/usr/bin/env bash
# The measured parameters of the step-time cost model (bench/costmodel.py, bench/RESULTS.md
# section 13), taken on this machine. One JSON object per line to OUT, each with the 1-minute
# load average at its end ("load"):
#
#   {"kind": "share", ...}       the CPU this benchmark gets on the shared machine: nproc
#                                processes spin for SHARE_S seconds at this script's nice
#                                level; cores = their CPU seconds / SHARE_S (2.0 on an idle
#                                2-vCPU machine, less under other engineers' load)
#   {"kind": "psbench", ...}     build/bench/psbench --output json (its own fields): async
#                                1+1 and 2+2 at SIZES (push+pull time per iteration, the
#                                shards' and the clients' CPU seconds per GB moved, also split
#                                into user and system time: shard_user_s_per_gb, the check and
#                                the optimizer, against shard_sys_s_per_gb, the kernel's copies;
#                                loopback iperf3 in the same invocation), and sync 1+1 and 2+2
#                                at SYNC_SIZES
#   {"kind": "train_local", ...} the scaling job's model alone, no parameter server
#                                (model [784,32,10], batch 32, one OpenBLAS thread as each of
#                                several ps-workers sharing a host; SGD, since Adam's step in
#                                train_local slows ~10x between step 300 and 5000, below):
#                                compute per step; and with Adam (deploy/local/cluster.cfg's
#                                optimizer, which bench/scaling.sh runs) over STEPS_SHORT
#                                steps, as long as scaling.sh's runs: what Adam adds per step
#   {"kind": "run", ...}         2 ps-server shards + N ps-worker (N in RUN_WORKERS), the job
#                                of bench/scaling.sh, at STEPS_SHORT and STEPS_LONG steps: the
#                                CPU seconds of the workers (/usr/bin/time) and of every
#                                process of the run (this shell's children times), so the
#                                per-step CPU of the workers and of the shards is the
#                                difference over the extra steps (loading and start-up cancel);
#                                train_s, the median over the workers of their "done:" lines'
#                                finished_at - started_at, gives the training's start-up
#                                (train_s at STEPS_SHORT minus STEPS_SHORT steps), which
#                                scaling.sh's done-line figures (short runs) include.
#                                optimizer.name = "sgd" here: with the job's Adam the shards'
#                                step grows over thousands of steps (as train_local's does),
#                                while bench/scaling.sh runs 300 steps, where Adam costs
#                                about 0.01 ms per step (train_local: adam against sgd)
#
# usage: bench/costmodel.sh [BUILD_DIR]   env: OUT (bench/results/costmodel-DATE.jsonl,
#        appended to), SIZES ("4KiB 100KB 4MiB 40MiB 400MiB"), SYNC_SIZES ("4KiB 100KB"),
#        RUNS (3), REPEATS (2: train_local runs and run pairs), STEPS_SHORT (300),
#        STEPS_LONG (5000), RUN_WORKERS ("1 4"), SHARE_S (3),
#        PARTS ("share psbench train_local run share"; PARTS=share alone brackets another
#        benchmark with the probe)
# About 4 minutes on 2 vCPUs. Every process started here is stopped on exit.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${OUT:-bench/results/costmodel-$(date -u +%F).jsonl}
sizes=${SIZES:-4KiB 100KB 4MiB 40MiB 400MiB}
sync_sizes=${SYNC_SIZES:-4KiB 100KB}
runs=${RUNS:-3}
repeats=${REPEATS:-2}
short=${STEPS_SHORT:-300}
long=${STEPS_LONG:-5000}
run_workers=${RUN_WORKERS:-1 4}
share_s=${SHARE_S:-3}
parts=${PARTS:-share psbench train_local run share}
data=/usr/share/datasets/fashion-mnist
cfg=deploy/local/cluster.cfg
for b in server/ps-server worker/ps-worker bench/psbench bench/train_local; do
  [ -x "$build/$b" ] || { echo "costmodel.sh: $build/$b is not built (meson compile -C $build)" >&2; exit 1; }
done
[ -x /usr/bin/time ] || { echo "costmodel.sh: /usr/bin/time is missing (apt-get install -y time)" >&2; exit 1; }

. bench/lib.sh
bench_start costmodel
load() { cut -d' ' -f1 /proc/loadavg; }
# children_cpu VAR: set VAR to the user + system seconds of every process this shell has
# waited for so far (`times` runs in this shell: a $(...) subshell would count its own).
children_cpu() {
  times >"$dir/times"
  printf -v "$1" '%s' "$(python3 -c 'import re, sys
print(sum(int(m) * 60 + float(s) for m, s in re.findall(r"(\d+)m([0-9.]+)s", open(sys.argv[1]).readlines()[-1])))' "$dir/times")"
}
mkdir -p "$(dirname "$out")"
echo "# bench/costmodel.sh $(date -u +%FT%TZ) nproc=$(nproc) cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\" nice=$(nice) load=$(load) parts=\"$parts\"" | tee -a "$out"

part_share() {
  local cores
  cores=$(python3 -c 'import os, sys, time
n, secs = int(sys.argv[1]), float(sys.argv[2])
kids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        end = time.monotonic() + secs
        while time.monotonic() < end:
            pass
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
t = os.times()
print("%.3f" % ((t.children_user + t.children_system) / secs))' "$(nproc)" "$share_s")
  echo "{\"kind\": \"share\", \"processes\": $(nproc), \"seconds\": $share_s, \"cores\": $cores, \"load\": $(load)}" | tee -a "$out"
}

psb() {   # psb MODE SHAPE SIZE PSBENCH_ARGS...
  local mode=$1 shape=$2 size=$3 w s line secs=1
  shift 3
  w=${shape%x*} s=${shape#*x}
  [ "$size" = 400MiB ] && secs=3
  line=$(timeout 600 "$build/bench/psbench" --size "$size" --workers "$w" --shards "$s" \
         --mode "$mode" --runs "$runs" --seconds "$secs" --output json "$@") ||
    line="{\"size\": \"$size\", \"workers\": $w, \"shards\": $s, \"mode\": \"$mode\", \"error\": true}"
  echo "{\"kind\": \"psbench\", ${line#\{}" | tee -a "$out"
}
part_psbench() {
  local size shape
  for size in $sizes; do
    for shape in 1x1 2x2; do psb async "$shape" "$size" --iperf-runs 2 --iperf-seconds 1; done
  done
  for size in $sync_sizes; do
    for shape in 1x1 2x2; do psb sync "$shape" "$size" --no-iperf; done
  done
}

part_train_local() {
  local line eps steps optimizer steps_optimizer
  # SGD over STEPS_LONG steps: the compute; Adam over STEPS_SHORT: what Adam adds
  for steps_optimizer in "$long sgd" "$short adam"; do
    read -r steps optimizer <<<"$steps_optimizer"
    for _ in $(seq "$repeats"); do
      line=$(OPENBLAS_NUM_THREADS=1 "$build/bench/train_local" --layers 784,32,10 --batch 32 \
             --steps "$steps" --optimizer "$optimizer" --data "$data" | grep '^done:')
      eps=$(echo "$line" | sed -n 's/.*examples_per_sec=\([0-9.]*\).*/\1/p')
      echo "{\"kind\": \"train_local\", \"layers\": [784, 32, 10], \"batch\": 32, \"steps\": $steps, \"optimizer\": \"$optimizer\", \"openblas_threads\": 1, \"examples_per_sec\": ${eps:-null}, \"load\": $(load)}" | tee -a "$out"
    done
  done
}

part_run() {
  local n steps wcpu c0 c1 p t train
  worker_cmd=(/usr/bin/time -f "costmodel_cpu %U %S" "$build/worker/ps-worker")
  for n in $run_workers; do
    for _ in $(seq "$repeats"); do
      for steps in "$short" "$long"; do
        taken=" "
        psp=() hp=() wp=()
        for _ in 0 1; do free_port p; psp+=("$p"); free_port p; hp+=("$p"); done
        for _ in $(seq "$n"); do free_port p; wp+=("$p"); done
        rm -f "$dir"/*
        children_cpu c0
        if ! run_cluster "$n" --set "cluster.ps=$(list "${psp[@]}")" \
            --set "cluster.ps_http=$(list "${hp[@]}")" --set "cluster.workers=$(list "${wp[@]}")" \
            --set 'job.mode="sync"' --set job.sync_timeout_s=60.0 \
            --set job.heartbeat_timeout_s=30.0 --set 'model.layers=[784, 32, 10]' \
            --set train.batch_size=32 --set train.epochs=100 --set train.max_steps="$steps" \
            --set train.log_interval_s=1.0 --set 'optimizer.name="sgd"' \
            --set optimizer.learning_rate=0.05; then
          echo "{\"kind\": \"run\", \"workers\": $n, \"steps\": $steps, \"error\": true}" | tee -a "$out"
          for t in $(seq 0 $((n - 1))); do tail -3 "$dir/w$t.log" >&2; done
          continue
        fi
        children_cpu c1
        wcpu=$(cat "$dir"/w*.log | awk '/^costmodel_cpu/ {s += $2 + $3} END {print s}')
        train=$(python3 -c 'import re, statistics, sys
v = [float(d["finished_at"]) - float(d["started_at"])
     for d in (dict(re.findall(r"(\w+)=([0-9.]+)", open(f).read())) for f in sys.argv[1:])
     if "finished_at" in d and "started_at" in d]
print("%.4f" % statistics.median(v) if v else "null")' "$dir"/w*.out)
        echo "{\"kind\": \"run\", \"workers\": $n, \"shards\": 2, \"optimizer\": \"sgd\", \"steps\": $steps, \"worker_cpu_s\": ${wcpu:-null}, \"total_cpu_s\": $(printf '%.3f' "$(echo "$c1 - $c0" | bc -l)"), \"wall_s\": $(printf '%.3f' "$workers_s"), \"load\": $(load), \"train_s\": $train}" | tee -a "$out"
      done
    done
  done
  unset worker_cmd
}

for part in $parts; do
  case "$part" in
    share | psbench | train_local | run) "part_$part" ;;
    *) echo "costmodel.sh: unknown part $part (share, psbench, train_local, run)" >&2; exit 2 ;;
  esac
done
echo "wrote $out"
