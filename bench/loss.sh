#!/usr/bin/env bash
# Training loss against time, sync and async (bench/RESULTS.md, "Loss vs time"): the demo job
# deploy/local/cluster.cfg (2 ps-server shards + 2 ps-worker processes on free 127.0.0.1
# ports, [784,128,10], batch 64 per worker, Adam 0.002, 1 epoch of Fashion-MNIST) with
# train.log_interval_s=0.2. Every worker progress line
#   <timestamp> ps-worker[T] info: step S/T  epoch E P%  loss L  X examples/s
# becomes a row "worker seconds_since_first_line step loss examples_per_sec" of
# bench/results/loss_MODE.txt (time 0 = the first progress line of either worker of that run;
# the loss is the mean of the worker's own mini-batch losses over its steps since its previous
# line, as ps-worker logs it). Plot: bench/loss.png.
#
# usage: bench/loss.sh [BUILD_DIR]      env: MODES ("sync async")
# Every process started here is stopped on exit (also on Ctrl-C).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
modes=${MODES:-sync async}
cfg=deploy/local/cluster.cfg
for b in server/ps-server worker/ps-worker; do
  [ -x "$build/$b" ] || { echo "loss.sh: $build/$b is not built (meson compile -C $build)" >&2; exit 1; }
done
command -v gnuplot >/dev/null || { echo "loss.sh: gnuplot is missing (apt-get install -y gnuplot-nox)" >&2; exit 1; }

. bench/lib.sh
bench_start loss

mkdir -p bench/results
for mode in $modes; do
  taken=" "
  psp=() hp=() wp=()
  for _ in 0 1; do free_port p; psp+=("$p"); free_port p; hp+=("$p"); free_port p; wp+=("$p"); done
  sets=(--set "cluster.ps=$(list "${psp[@]}")" --set "cluster.ps_http=$(list "${hp[@]}")"
        --set "cluster.workers=$(list "${wp[@]}")" --set "job.mode=\"$mode\""
        --set train.epochs=1 --set train.log_interval_s=0.2)
  rm -f "$dir"/*
  fail=0
  run_cluster 2 "${sets[@]}" || fail=1
  [ $fail = 0 ] || { echo "loss.sh: a $mode worker failed:" >&2; tail -5 "$dir"/w*.log >&2; exit 1; }
  python3 - "$dir" "$mode" "$(nproc)" "$(cut -d' ' -f1 /proc/loadavg)" >"bench/results/loss_$mode.txt" <<'PY'
import re, sys, datetime
d, mode, nproc, load = sys.argv[1:5]
pat = re.compile(r'^(\S+Z) ps-worker\[(\d+)\] info: step (\d+)/(\d+)\s+epoch (\d+)\s+(\d+)%\s+loss ([0-9.eE+-]+|nan|inf)\s+(\d+) examples/s')
rows = []
for t in (0, 1):
    for l in open("%s/w%d.log" % (d, t)):
        m = pat.match(l)
        if m:
            ts = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
            rows.append((ts, int(m.group(2)), int(m.group(3)), float(m.group(7)), int(m.group(8))))
t0 = min(r[0] for r in rows)
done = [open("%s/w%d.out" % (d, t)).read().strip() for t in (0, 1)]
print("# bench/loss.sh %s mode=%s 2 shards + 2 workers, deploy/local/cluster.cfg, 1 epoch, log_interval_s=0.2, nproc=%s, load at end %s"
      % (datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), mode, nproc, load))
for x in done:
    print("# " + x)
print("# worker seconds step loss examples_per_sec")
for t in (0, 1):
    for r in sorted(x for x in rows if x[1] == t):
        print("%d %.3f %d %.4f %d" % (t, r[0] - t0, r[2], r[3], r[4]))
    print()
    print()
PY
  echo "loss.sh: $mode: $(grep -c '^[01] ' "bench/results/loss_$mode.txt") points; $(grep '^# done' "bench/results/loss_$mode.txt" | tr '\n' ' ')"
done

gnuplot <<'GP'
set terminal png size 900,560
set output "bench/loss.png"
set xlabel "seconds since the first progress line"
set ylabel "training loss (worker's mean mini-batch loss per 0.2 s log interval)"
set title "deploy/local/cluster.cfg: 2 shards + 2 workers, [784,128,10], Adam 0.002, 1 epoch"
set key top right
set grid
plot "bench/results/loss_sync.txt" index 0 using 2:4 with linespoints pt 7 ps 0.5 lc rgb "#1f77b4" title "sync, worker 0", \
     "bench/results/loss_sync.txt" index 1 using 2:4 with linespoints pt 6 ps 0.5 lc rgb "#6baed6" title "sync, worker 1", \
     "bench/results/loss_async.txt" index 0 using 2:4 with linespoints pt 7 ps 0.5 lc rgb "#d62728" title "async, worker 0", \
     "bench/results/loss_async.txt" index 1 using 2:4 with linespoints pt 6 ps 0.5 lc rgb "#fc9272" title "async, worker 1"
GP
echo "wrote bench/results/loss_sync.txt, bench/results/loss_async.txt and bench/loss.png"
