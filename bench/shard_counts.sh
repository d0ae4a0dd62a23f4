#!/usr/bin/env bash
# Load-robust counts of one psbench configuration (bench/RESULTS.md section 12, "Fewer passes
# and syscalls on the shard"): while psbench runs, `perf stat` of shard 0 and of psbench (the
# client) over 2 s, then `strace -c -f` of shard 0 over 2 s. Per round trip: CPU µs and
# context switches (round trips from the shard's tessera_ps_push_requests_total), and the
# syscalls by name (round trips = the shard's writev calls: one pull reply each). Needs perf,
# strace, curl and ss; run as root or with perf_event_paranoid <= 1.
#
# usage: bench/shard_counts.sh BUILD SIZE WORKERS SHARDS MODE [ITERS]  (default 300000)
set -uo pipefail
B=$1 SZ=$2 W=$3 S=$4 M=$5 ITERS=${6:-300000}
out=$(mktemp -d)
"$B/bench/psbench" --size "$SZ" --workers "$W" --shards "$S" --mode "$M" --runs 1 \
  --iters "$ITERS" --no-iperf --output csv > "$out/csv" 2>"$out/err" &
PB=$!
SP=
for _ in $(seq 100); do SP=$(pgrep -P $PB -x ps-server | head -1); [ -n "$SP" ] && break; sleep 0.1; done
[ -n "$SP" ] || { echo "no shard started" >&2; exit 1; }
sleep 1.2
ADMIN=
for p in $(ss -ltnpH | grep "pid=$SP," | awk '{print $4}' | sed 's/.*://'); do
  curl -sf -m1 "http://127.0.0.1:$p/metrics" >/dev/null && ADMIN=$p
done
pushes() {
  curl -s -m2 "http://127.0.0.1:$ADMIN/metrics" |
    awk '/^tessera_ps_push_requests_total\{result="ok"\}/{print $2}'
}
sleep 1.5
p0=$(pushes)
perf stat -x, -e task-clock,context-switches -p $PB -o "$out/cstat" -- sleep 2 >/dev/null 2>&1 &
CS=$!
perf stat -x, -e task-clock,context-switches -p "$SP" -o "$out/pstat" -- sleep 2 >/dev/null 2>&1
wait $CS
p1=$(pushes)
strace -c -f -p "$SP" -o "$out/strace" -- sleep 2 >/dev/null 2>&1 &
STP=$!
sleep 2
kill -INT $STP 2>/dev/null
wait $STP 2>/dev/null
wait $PB
python3 - "$out" "$p0" "$p1" <<'PY'
import sys
out, p0, p1 = sys.argv[1], float(sys.argv[2] or 0), float(sys.argv[3] or 0)
rt = max(p1 - p0, 1)
def stat(name):
    d = {}
    for l in open(out + "/" + name):
        f = l.strip().split(",")
        if len(f) > 3 and f[0] and f[0][0].isdigit():
            d[f[2]] = float(f[0])
    return d
s, c = stat("pstat"), stat("cstat")
per = {}
for l in open(out + "/strace"):
    f = l.split()
    if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
        per[f[-1]] = int(f[3])
n = max(per.get("writev", 1), 1)
top = sorted(per.items(), key=lambda x: -x[1])[:7]
print("shard: %.2f CPU us/rt, %.2f csw/rt | client: %.2f CPU us/rt, %.2f csw/rt | "
      "shard syscalls/rt %.2f: %s" % (
          1000 * s.get("task-clock", 0) / rt, s.get("context-switches", 0) / rt,
          1000 * c.get("task-clock", 0) / rt, c.get("context-switches", 0) / rt,
          sum(per.values()) / n, " ".join("%s=%.2f" % (k, v / n) for k, v in top)))
PY
rm -rf "$out"
