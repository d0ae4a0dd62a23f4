#!/usr/bin/env bash
# Before/after psbench rows, alternating the two builds (the order flips every pair), for the
# shard figures of bench/RESULTS.md section 12 ("Fewer passes and syscalls on the shard"):
# 4 KiB async and sync (latency, shard CPU s/GB), 40 and 400 MiB at 1+1 and 2+2 (shard CPU s/GB).
# CSV on stdout: the build ("before"/"after"), the time, then psbench's CSV row.
#
# usage: bench/shard_pairs.sh BEFORE_BUILD AFTER_BUILD [PAIRS]      (default 3 pairs)
set -uo pipefail
before=$1 after=$2 n=${3:-3}
run() { # build tag size workers shards mode runs seconds
  local line
  line=$(timeout 300 "$1/bench/psbench" --size "$3" --workers "$4" --shards "$5" --mode "$6" \
         --runs "$7" --seconds "$8" --no-iperf --output csv 2>/dev/null | tail -1)
  echo "$2,$(date -u +%H:%M:%S),$line"
}
# psbench's CSV columns; a build older than the column split (psbench.c) stops after
# client_cpu_s_per_gb, or after cpu_s_per_gb.
echo "build,time,size,workers,shards,mode,runs,iterations,gbps,gbps_min,gbps_max,iperf3_gbps,ratio,p50_us,p99_us,shard_rss_kib,loadavg,cpu_s_per_gb,client_cpu_s_per_gb,shard_user_s_per_gb,shard_sys_s_per_gb,client_user_s_per_gb,client_sys_s_per_gb"
for i in $(seq "$n"); do
  for cfg in "4KiB 1 1 async 3 1" "4KiB 1 1 sync 3 1" "40MiB 1 1 async 1 2" "40MiB 2 2 async 1 2" \
             "400MiB 1 1 async 1 3" "400MiB 2 2 async 1 3"; do
    if [ $((i % 2)) = 1 ]; then order="before after"; else order="after before"; fi
    for b in $order; do
      if [ "$b" = before ]; then B=$before; else B=$after; fi
      # shellcheck disable=SC2086
      run "$B" "$b" $cfg
    done
  done
done
