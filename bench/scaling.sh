#!/usr/bin/env bash
# Step time against the number of worker processes (bench/RESULTS.md, "Step time vs
# workers"): 2 ps-server shards + N ps-worker processes on 127.0.0.1, sync mode, the demo job
# (deploy/local/cluster.cfg) with a small model, for N in 1 2 4 8 16 32; RUNS runs each.
#
# Step time of one worker in one run = the slope of its progress lines
# ("step S/T ..." with their timestamps, train.log_interval_s=0.1): (t_last - t_first) /
# (S_last - S_first), so data loading and the wait for the last worker to join are left out.
# When a worker printed fewer than two lines the figure falls back to its "done:" line:
# batch_size / examples_per_sec. A run's figure is the median over its workers; the table
# gives the median over runs with min and max.
#
# usage: bench/scaling.sh [BUILD_DIR]   env: COUNTS ("1 2 4 8 16 32"), RUNS (5), STEPS (300),
#                                           OUT (bench/results/scaling.txt)
# Writes OUT (one line per run, then the summary table) and bench/scaling.png.
# Every process started here is stopped on exit (also on Ctrl-C); ports are free 127.0.0.1 ports.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
counts=${COUNTS:-1 2 4 8 16 32}
runs=${RUNS:-5}
steps=${STEPS:-300}
out=${OUT:-bench/results/scaling.txt}
batch=32
cfg=deploy/local/cluster.cfg
for b in server/ps-server worker/ps-worker; do
  [ -x "$build/$b" ] || { echo "scaling.sh: $build/$b is not built (meson compile -C $build)" >&2; exit 1; }
done
command -v gnuplot >/dev/null || { echo "scaling.sh: gnuplot is missing (apt-get install -y gnuplot-nox)" >&2; exit 1; }

. bench/lib.sh
bench_start scaling
load() { cut -d' ' -f1 /proc/loadavg; }

mkdir -p "$(dirname "$out")"
{
  echo "# bench/scaling.sh $(date -u +%FT%TZ) nproc=$(nproc) cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\""
  echo "# sync, 2 shards, model [784,32,10], batch $batch per worker, max_steps $steps, runs $runs"
  echo "# per run: workers run median_step_ms (over workers, from progress-line slopes) min max done_line_step_ms load"
} >"$out"

for n in $counts; do
  for run in $(seq 1 "$runs"); do
    taken=" "
    psp=() hp=() wp=()
    for _ in 0 1; do free_port p; psp+=("$p"); free_port p; hp+=("$p"); done
    for _ in $(seq "$n"); do free_port p; wp+=("$p"); done
    sets=(--set "cluster.ps=$(list "${psp[@]}")" --set "cluster.ps_http=$(list "${hp[@]}")"
          --set "cluster.workers=$(list "${wp[@]}")" --set 'job.mode="sync"'
          --set job.sync_timeout_s=60.0 --set job.heartbeat_timeout_s=30.0
          --set 'model.layers=[784, 32, 10]' --set train.batch_size=$batch
          --set train.epochs=100 --set train.max_steps=$steps --set train.log_interval_s=0.1)
    rm -f "$dir"/*
    fail=0
    run_cluster "$n" "${sets[@]}" || fail=1
    if [ $fail = 1 ]; then
      echo "$n $run FAILED" >>"$out"
      for t in $(seq 0 $((n - 1))); do tail -3 "$dir/w$t.log" | sed "s/^/  w$t: /" >&2; done
      continue
    fi
    python3 - "$dir" "$n" "$run" "$batch" "$(load)" >>"$out" <<'PY'
import re, sys, statistics, datetime
d, n, run, batch, load = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
line = re.compile(r'^(\S+Z) .* step (\d+)/\d+ ')
slope, done = [], []
for t in range(n):
    pts = []
    for l in open("%s/w%d.log" % (d, t)):
        m = line.match(l)
        if m:
            ts = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
            pts.append((ts, int(m.group(2))))
    eps = float(re.search(r'examples_per_sec=([0-9.]+)', open("%s/w%d.out" % (d, t)).read()).group(1))
    done.append(1000.0 * batch / eps)
    if len(pts) >= 2 and pts[-1][1] > pts[0][1]:
        slope.append(1000.0 * (pts[-1][0] - pts[0][0]) / (pts[-1][1] - pts[0][1]))
    else:
        slope.append(done[-1])
print("%d %s %.3f %.3f %.3f %.3f %s" % (n, run, statistics.median(slope), min(slope), max(slope),
                                        statistics.median(done), load))
PY
    tail -1 "$out"
  done
done

# Summary over runs and the plot.
python3 - "$out" "$dir/scaling.dat" <<'PY' | tee -a "$out"
import sys, statistics
rows = {}
for l in open(sys.argv[1]):
    f = l.split()
    if not f or l.startswith("#") or "FAILED" in l:
        continue
    rows.setdefault(int(f[0]), []).append((float(f[2]), float(f[5]), float(f[6])))
print("# summary: workers runs step_ms_median min max done_line_step_ms_median load_min-max examples_per_sec_cluster")
with open(sys.argv[2], "w") as dat:
    for n in sorted(rows):
        r = rows[n]
        s = [x[0] for x in r]
        med = statistics.median(s)
        print("# %d %d %.3f %.3f %.3f %.3f %.2f-%.2f %.0f" % (n, len(r), med, min(s), max(s),
              statistics.median([x[1] for x in r]), min(x[2] for x in r), max(x[2] for x in r),
              n * 32 / med * 1000.0))
        dat.write("%d %f %f %f\n" % (n, med, min(s), max(s)))
PY
gnuplot <<GP
set terminal png size 900,560
set output "bench/scaling.png"
set logscale x 2
set xtics (1, 2, 4, 8, 16, 32)
set xlabel "worker processes (sync, 2 shards, [784,32,10], batch 32 each, $(nproc) cores)"
set ylabel "step time, ms (median over runs; bars: min-max)"
set key top left
set grid
plot "$dir/scaling.dat" using 1:2:3:4 with yerrorlines lw 2 title "sync step time"
GP
echo "wrote $out and bench/scaling.png"
