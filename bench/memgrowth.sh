#!/usr/bin/env bash
# Memory growth of a shard over a long run (bench/RESULTS.md, "Memory over 10 minutes"):
# 1 ps-server shard + 2 async ps-worker processes on free 127.0.0.1 ports, the demo job
# deploy/local/cluster.cfg ([784,128,10], Adam) with train.epochs large enough to keep
# training for SECONDS; the shard's VmRSS (/proc/PID/status) is sampled every INTERVAL s.
#
# usage: bench/memgrowth.sh [BUILD_DIR]   env: SECONDS_RUN (600), INTERVAL (10),
#                                             OUT (bench/results/memgrowth.txt)
# Writes OUT: "seconds vmrss_kib worker0_step" per sample, then first/last/max.
# Every process started here is stopped on exit (also on Ctrl-C).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
secs=${SECONDS_RUN:-600}
interval=${INTERVAL:-10}
out=${OUT:-bench/results/memgrowth.txt}
cfg=deploy/local/cluster.cfg

. bench/lib.sh
bench_start mem

free_port p0; free_port h0; free_port w0; free_port w1
sets=(--set "cluster.ps=$(list "$p0")" --set "cluster.ps_http=$(list "$h0")"
      --set "cluster.workers=$(list "$w0" "$w1")" --set 'job.mode="async"'
      --set train.epochs=100000 --set train.max_steps=0 --set train.log_interval_s=5.0)
"$build/server/ps-server" -c "$cfg" "${sets[@]}" --shard 0 --log-level warn 2>"$dir/ps0.log" </dev/null >/dev/null &
shard=$!
pids+=($shard)
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$p0") 2>/dev/null && break; sleep 0.1; done
for t in 0 1; do
  "$build/worker/ps-worker" -c "$cfg" "${sets[@]}" --task $t >"$dir/w$t.out" 2>"$dir/w$t.log" </dev/null &
  pids+=($!)
done
mkdir -p "$(dirname "$out")"
{
  echo "# bench/memgrowth.sh $(date -u +%FT%TZ) 1 shard + 2 async workers, deploy/local/cluster.cfg, ${secs} s, VmRSS every ${interval} s, nproc=$(nproc), load at start $(cut -d' ' -f1 /proc/loadavg)"
  echo "# seconds vmrss_kib worker0_last_logged_step"
} >"$out"
start=$(date +%s)
while :; do
  now=$(( $(date +%s) - start ))
  kill -0 "$shard" 2>/dev/null || { echo "# the shard exited at ${now} s" >>"$out"; break; }
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$shard/status")
  step=$(grep -o 'step [0-9]*' "$dir/w0.log" | tail -1 | cut -d' ' -f2)
  echo "$now $rss ${step:-0}" >>"$out"
  [ "$now" -ge "$secs" ] && break
  sleep "$interval"
done
for t in 0 1; do
  kill -0 "${pids[$((t + 1))]}" 2>/dev/null || echo "# worker $t had exited before the end: $(tail -1 "$dir/w$t.log")" >>"$out"
done
awk '!/^#/ && NF==3 {n++; if (n==1) f=$2; l=$2; if ($2>m) m=$2} END {printf "# first %d KiB, last %d KiB, max %d KiB, last-first %d KiB over %d samples\n", f, l, m, l-f, n}' "$out" >>"$out"
echo "# load at end $(cut -d' ' -f1 /proc/loadavg)" >>"$out"
tail -3 "$out"
