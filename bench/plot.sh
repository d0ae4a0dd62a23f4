#!/usr/bin/env bash
# Plots of bench/RESULTS.md from bench/results/psbench.jsonl (bench/sweep.sh):
# bench/throughput.png, push+pull GB/s against tensor size with iperf3's single stream.
set -euo pipefail
cd "$(dirname "$0")"
in=${1:-results/psbench.jsonl}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$in" "$tmp" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if not r.get("error")]   # failed invocations stay in the file only
series = {}
for r in rows:
    if r.get("error"):
        continue
    key = "%s_%dw%ds" % (r["mode"], r["workers"], r["shards"])
    series.setdefault(key, []).append(r)
with open(sys.argv[2] + "/series.txt", "w") as f:
    f.write(" ".join(sorted(series)) + "\n")
with open(sys.argv[2] + "/iperf.dat", "w") as f:
    for r in sorted(rows, key=lambda r: r.get("size", 0)):
        if not r.get("error") and r.get("iperf3_gbps") is not None:
            f.write("%d %f\n" % (r["size"], r["iperf3_gbps"]))
for k, rs in series.items():
    with open("%s/%s.dat" % (sys.argv[2], k), "w") as f:
        for r in sorted(rs, key=lambda r: r["size"]):
            f.write("%d %f %f %f\n" % (r["size"], r["gbps"], r["gbps_min"], r["gbps_max"]))
PY
plots=""
for s in $(cat "$tmp/series.txt"); do
  plots="$plots \"$tmp/$s.dat\" using 1:2:3:4 with yerrorlines title \"${s//_/ }\","
done
gnuplot <<GP
set terminal png size 900,560
set output "throughput.png"
set logscale x 2
set format x "%.0b%BB"
set xlabel "tensor size"
set ylabel "GB/s (gradient pushed + parameters pulled)"
set key top left
set grid
plot $plots "$tmp/iperf.dat" using 1:2 with points pt 6 title "iperf3, one stream (each run)"
GP
echo "wrote bench/throughput.png"
