#!/usr/bin/env bash
# Step time against table size (issue 28): an embedding table of VOCAB ids at dim 16 served
# by 2 shards to 2 workers, two ways, in alternating rounds:
#
#   sparse  bench/sparsebench: a Tessera table (async, SGD, rows made on first touch); each
#           request is one step's TS_CLIENT_SPARSE_PUSH_PULL of a CTR batch (BATCH keys:
#           256 examples x 26 fields = 6656 by default) drawn Zipf(ZIPF) over VOCAB ids;
#           BATCHES precomputed batches a worker (4000: 26.6 M draws, about one pass over
#           them in the run), so the table grows as a job's does: rows are made on first
#           touch, and the rows it holds at the end are reported
#   dense   bench/psbench: the same table as one dense tensor of VOCAB x 16 float32 pushed
#           and pulled whole every step, which is what a parameter server without sparse
#           tables does with a stock embedding (and what tessera.keras would, 57 x the rows
#           touched, before tessera.keras.Embedding); up to DENSE_MAX ids (a copy of 10^8
#           rows is 6.4 GB, and the shards, the gradient and the pulled copy of each worker
#           hold one each: more than this 24 GiB machine)
#
# MODE=held measures the table at its size rather than the table growing: each sparse run
# first makes a row of every one of the VOCAB ids (sparsebench --prefill), caps each shard
# at VOCAB / 2 rows (--max-rows: the least recently used are evicted), draws each batch's
# Zipf ranks over HOT ids scattered over the table (--hot-ids: the same work per step at
# every size) and makes FRESH of each batch's keys ids never seen (--fresh-share: rows made,
# and as many evicted, every step), with each shard's server.max_table_bytes at
# TABLE_BYTES (8 GiB: 10^8 rows of dim 16 fit). MODE=grow (the default) is the sweep above.
# PREFILL picks how the held table is made: scattered (the default: the ids in order, so
# the hot rows end up anywhere in the table's memory, the worst case for the caches and the
# TLB) or stream (sparsebench --prefill-stream: the hot ids first and again after every pull
# of the prefill, as a long job's stream where they recur lays its table out).
#
# The step time is the median push+pull round trip of every request of every worker (p50_us
# of either tool). Before every round the script waits (LOAD_WAIT_S, default 600) for the
# 1-minute load average to fall below LOAD_MAX (1.0).
#
# usage: bench/table_size.sh [BUILD_DIR]   (default build)
#   env: SUMMARY_ONLY=1 (no runs: the summary and plot of OUT), ROUNDS (5), SECS (6: timed seconds of a sparse run), WARMUP (1), BATCHES (4000), SIZES ("100000
#        1000000 10000000 100000000"), DENSE_MAX (10000000), BATCH (6656), ZIPF (1.05),
#        ITERS (dense push+pulls timed per worker, 5), MODE (grow | held), HOT (100000),
#        FRESH (0.05), TABLE_BYTES (8589934592), PREFILL (scattered | stream), OUT (bench/results/table-size[-held]-DATE.jsonl)
# Output: one JSON object per run appended to OUT (the tool's fields plus kind, vocab, round,
# load_before), then a Markdown table on stdout: per table size the median (min-max) step
# time of each kind and the rows the sparse shards held.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.." || exit 1
build=${1:-build}
rounds=${ROUNDS:-5}
secs=${SECS:-6}
warmup=${WARMUP:-1}
read -ra sizes <<<"${SIZES:-100000 1000000 10000000 100000000}"
dense_max=${DENSE_MAX:-10000000}
batch=${BATCH:-6656}
batches=${BATCHES:-4000}
zipf=${ZIPF:-1.05}
iters=${ITERS:-5}
load_max=${LOAD_MAX:-1.0}
load_wait=${LOAD_WAIT_S:-600}
mode=${MODE:-grow}
hot=${HOT:-100000}
fresh=${FRESH:-0.05}
table_bytes=${TABLE_BYTES:-8589934592}
prefill=--prefill
case ${PREFILL:-scattered} in
  scattered) ;;
  stream) prefill=--prefill-stream ;;
  *) echo "table_size.sh: PREFILL is scattered or stream, not $PREFILL" >&2; exit 2 ;;
esac
case $mode in
  grow) sparse_args=(); out=${OUT:-bench/results/table-size-$(date -u +%F).jsonl} ;;
  held) out=${OUT:-bench/results/table-size-held-$(date -u +%F).jsonl} ;;
  *) echo "table_size.sh: MODE is grow or held, not $mode" >&2; exit 2 ;;
esac
dim=16

for b in bench/sparsebench bench/psbench server/ps-server; do
  [ -x "$build/$b" ] || { echo "table_size.sh: $build/$b is not built (meson compile -C $build)" >&2; exit 1; }
done
mkdir -p "$(dirname "$out")"

load1() { cut -d' ' -f1 /proc/loadavg; }
wait_quiet() {
  local t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$load_wait" ] &&
    python3 -c "import sys; sys.exit(0 if float('$(load1)') >= $load_max else 1)"; do
    sleep 5
  done
}

# One run: the tool's JSON line with kind, vocab, round and the load before it added.
record() { # kind vocab round load json
  python3 -c 'import json, sys
d = json.loads(sys.argv[5]); d.update(kind=sys.argv[1], vocab=int(sys.argv[2]),
round=int(sys.argv[3]), load_before=float(sys.argv[4])); print(json.dumps(d))' "$@" >>"$out"
}

[ "${SUMMARY_ONLY:-0}" = 1 ] && rounds=0
echo "table_size.sh: ${rounds} round(s), $mode, sizes ${sizes[*]}, batch $batch, zipf $zipf -> $out" >&2
for ((r = 1; r <= rounds; r++)); do
  wait_quiet
  # the order of the sizes rotates with the round
  n=${#sizes[@]}
  for ((i = 0; i < n; i++)); do
    v=${sizes[$(((i + r) % n))]}
    [ "$mode" = held ] && sparse_args=("$prefill" --hot-ids "$((hot < v ? hot : v))"
      --fresh-share "$fresh" --max-rows "$(((v + 1) / 2))" --max-table-bytes "$table_bytes")
    load=$(load1)
    j=$("$build/bench/sparsebench" --shards 2 --workers 2 --dim "$dim" --batch "$batch" \
      --zipf "$zipf" --vocab "$v" --batches "$batches" --seconds "$secs" --warmup-seconds "$warmup" \
      --memcpy-mib 0 "${sparse_args[@]}" --output json 2>/dev/null | tail -1)
    if [ -n "$j" ]; then record sparse "$v" "$r" "$load" "$j"; else echo "sparse $v: failed" >&2; fi
    if [ "$v" -le "$dense_max" ]; then
      load=$(load1)
      j=$("$build/bench/psbench" --size $((v * dim * 4)) --shards 2 --workers 2 --runs 1 \
        --iters "$iters" --no-iperf --output json 2>/dev/null | tail -1)
      if [ -n "$j" ]; then record dense "$v" "$r" "$load" "$j"; else echo "dense $v: failed" >&2; fi
    fi
    echo "round $r: vocab $v done" >&2
  done
done

python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for d in rows:
    by.setdefault((d["kind"], d["vocab"]), []).append(d)
def cell(ds, key, scale=1e-3, fmt="%.2f"):
    if not ds:
        return "-"
    v = [d[key] * scale for d in ds]
    return f"{fmt % statistics.median(v)} ({fmt % min(v)}-{fmt % max(v)})"
held = any(d.get("prefill") for d in rows)
print("| ids (vocab) | sparse step, ms | rows held (sparse) | "
      + ("rows made after the prefill / evicted | " if held else "") + "dense step, ms | runs |")
print("|---|---|---|---|---|" + ("---|" if held else ""))
for v in sorted({k[1] for k in by}):
    s, d = by.get(("sparse", v), []), by.get(("dense", v), [])
    churn = ""
    if held:
        made = [x["rows_created"] - v for x in s]
        ev = [x["rows_evicted"] for x in s]
        churn = (f"{statistics.median(made):,.0f} / {statistics.median(ev):,.0f} | "
                 if s else "- | ")
    print(f"| {v:,} | {cell(s, 'p50_us')} | {cell(s, 'rows_held', 1, '%.0f')} | {churn}"
          f"{cell(d, 'p50_us') if d else 'not run (memory)'} | {len(s)} / {len(d)} |")
PY

png=table_size.png
[ "$mode" = held ] && png=table_size_held.png
# bench/$png: step time against ids, log-log, median with min-max (gnuplot).
if command -v gnuplot >/dev/null; then
  tmp=$(mktemp -d)
  python3 - "$out" "$tmp" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for kind in ("sparse", "dense"):
    with open(f"{sys.argv[2]}/{kind}.dat", "w") as f:
        for v in sorted({d["vocab"] for d in rows if d["kind"] == kind}):
            ms = [d["p50_us"] / 1e3 for d in rows if d["kind"] == kind and d["vocab"] == v]
            f.write(f"{v} {statistics.median(ms)} {min(ms)} {max(ms)}\n")
PY
  gnuplot <<GP
set terminal png size 900,560
set output "bench/$png"
set logscale xy
set xlabel "ids in the table (dim 16)"
set ylabel "step time, ms (push+pull of a 256 x 26 batch)"
set key top left
set grid
plot "$tmp/dense.dat" using 1:2:3:4 with yerrorlines title "the table as one dense tensor, pushed and pulled whole", \
     "$tmp/sparse.dat" using 1:2:3:4 with yerrorlines title "Tessera's sparse table (rows the batch touches)"
GP
  rm -rf "$tmp"
  echo "wrote bench/$png" >&2
fi
