#!/usr/bin/env bash
# Embedding tables (issue 27): Tessera's sparse push+pull (bench/sparsebench) against ps-lite
# (bench/peers/pslite/pslite_sparse), stock and with jemalloc, in alternating rounds over a
# grid that moves one axis at a time from dim 64, batch 65536, Zipf 1.0, 1 server + 1 worker:
#
#   dim   16 64 128                (batch 65536, zipf 1.0, 1+1)
#   batch 4096 16384 65536 262144  (dim 64, zipf 1.0, 1+1)
#   zipf  0.8 1.0 1.2              (dim 64, batch 65536, 1+1)
#   2+2                            (dim 64, batch 65536, zipf 1.0)
#
#   tessera          sparsebench --output json: S ps-server shards (async, one SGD table of
#                    zero rows), W client threads, one TS_CLIENT_SPARSE_PUSH_PULL per request
#   pslite-stock     pslite_sparse: scheduler, S servers, W workers (processes), ZPushPull of
#                    the sorted unique keys; glibc malloc
#   pslite-jemalloc  the same with LD_PRELOAD=$JEMALLOC MALLOC_CONF=$JEMALLOC_CONF in every
#                    ps-lite process (compare.sh's tuning)
#
# Both draw the same batches (bench/sparse_common.h); rows/s counts the caller's keys
# (duplicates included), GB/s = 2 x rows/s x dim x 4. Each run: WARMUP s of requests, and
# at least WARMUP_REQUESTS (8: a pass over each worker's 8 batches, so every row the timed
# requests touch is made before them), then SECS s timed. Before every round the script
# waits (LOAD_WAIT_S in all, default 900) for the 1-minute load average to fall below
# LOAD_MAX (1.0) and records the load it saw; the order of the systems rotates with the
# round.
#
# usage: PSLITE_DIR=/path/to/ps-lite bench/sparse_compare.sh [BUILD_DIR]   (default build)
#   env: ROUNDS (5), SECS (1.5), WARMUP (0.5), WARMUP_REQUESTS (8),
#        GRID ("D:B:S:N ..." to replace the grid),
#        SYSTEMS ("tessera pslite-stock pslite-jemalloc"), JEMALLOC (libjemalloc.so.2),
#        JEMALLOC_CONF, PSLITE_BIN (a pslite_sparse built elsewhere, instead of building
#        it from PSLITE_DIR: a machine without build tools; bench/pack_sparse.sh packs
#        everything such a machine needs), PSLITE_ENV (more VAR=VALUE words for every
#        ps-lite process, e.g. DMLC_LOCAL=1 for ps-lite's same-host ipc:// transport;
#        kept in each run's JSON),
#        BUSY_POLL_US (Tessera's job.busy_poll_us, clients and shards; default the
#        configuration's, 50), LOAD_MAX, LOAD_WAIT_S, SETTLE (1 s after each run),
#        OUT (bench/results/sparse-compare-DATE.jsonl)
# Output: one JSON object per run appended to OUT (sparsebench's fields, the same for the
# ps-lite runs, plus system, round, load_before; client_cpu_s_per_mrows is sparsebench's
# process and the ps-lite workers' processes over the timed window), then a Markdown summary
# on stdout: per grid row and system the median (min-max) of rows/s and GB/s, the ratios,
# the shards' and the workers' CPU per row, the CPUs they kept busy, RSS per row.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.." || exit 1
# shellcheck source-path=SCRIPTDIR/..
. bench/lib.sh   # bench_start (sets $dir, $pids, the EXIT trap), stop_all, free_port, $taken
build=${1:-build}
rounds=${ROUNDS:-5}
secs=${SECS:-1.5}
warmup=${WARMUP:-0.5}
warmup_requests=${WARMUP_REQUESTS:-8}
grid=${GRID:-"64:65536:1.0:1 16:65536:1.0:1 128:65536:1.0:1 64:4096:1.0:1 64:16384:1.0:1 64:262144:1.0:1 64:65536:0.8:1 64:65536:1.2:1 64:65536:1.0:2"}
jemalloc=${JEMALLOC:-libjemalloc.so.2}
jemalloc_conf=${JEMALLOC_CONF:-oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1}
load_max=${LOAD_MAX:-1.0}
load_wait=${LOAD_WAIT_S:-900}
settle=${SETTLE:-1}
out=${OUT:-bench/results/sparse-compare-$(date -u +%F).jsonl}
read -ra systems <<<"${SYSTEMS:-tessera pslite-stock pslite-jemalloc}"
read -ra pslite_env <<<"${PSLITE_ENV:-}"
busy_poll=()
[ -n "${BUSY_POLL_US:-}" ] && busy_poll=(--busy-poll-us "$BUSY_POLL_US")

for b in bench/sparsebench server/ps-server; do
  [ -x "$build/$b" ] || { echo "sparse_compare.sh: $build/$b is not built (meson compile -C $build)" >&2; exit 1; }
done
need_pslite=0
case " ${systems[*]} " in *" pslite-"*) need_pslite=1 ;; esac
if [ $need_pslite = 1 ]; then
  if ! ldconfig -p | grep "${jemalloc##*/}" >/dev/null; then
    [ -f "$jemalloc" ] || { echo "sparse_compare.sh: $jemalloc not found (apt-get install libjemalloc2)" >&2; exit 1; }
  fi
  if [ -n "${PSLITE_BIN:-}" ]; then
    pslite_bin=$PSLITE_BIN
  else
    bench/peers/pslite/build.sh "$build/bench/peers/pslite" >/dev/null || exit 1
    pslite_bin=$build/bench/peers/pslite/pslite_sparse
  fi
fi

bench_start sparse
load() { cut -d' ' -f1 /proc/loadavg; }
waited=0
wait_quiet() {   # sets load_seen: the load when the round starts
  while awk -v l="$(load)" -v m="$load_max" 'BEGIN { exit !(l >= m) }' && [ "$waited" -lt "$load_wait" ]; do
    sleep 10
    waited=$((waited + 10))
  done
  load_seen=$(load)
}
mkdir -p "$(dirname "$out")"
echo "# $(date -u +%FT%TZ) nproc=$(nproc) cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\" kernel=$(uname -r) gcc=$(gcc -dumpfullversion) rounds=$rounds secs=$secs warmup=$warmup warmup_requests=$warmup_requests out=$out" >&2

# The runners run in this shell (never in $(...)), so every process they start is in $pids,
# which the EXIT trap stops; each leaves one JSON object in $dir/run.json or returns 1.
tessera() {   # dim batch zipf n
  timeout 120 "$build/bench/sparsebench" --dim "$1" --batch "$2" --zipf "$3" --shards "$4" \
    --workers "$4" --seconds "$secs" --warmup-seconds "$warmup" \
    --warmup-requests "$warmup_requests" "${busy_poll[@]}" --output json \
    >"$dir/run.json" 2>"$dir/tessera.log" </dev/null &
  pids+=($!)
  wait $! || { tail -3 "$dir/tessera.log" >&2; stop_all; return 1; }
  stop_all
}

pslite() {   # variant dim batch zipf n
  local variant=$1 n=$5 sport i env=("${pslite_env[@]}") wp=() fail=0
  [ "$variant" = jemalloc ] && env+=(LD_PRELOAD="$jemalloc" MALLOC_CONF="$jemalloc_conf")
  # shellcheck disable=SC2034 # read by free_port: every port is free again after a run
  taken=" "
  free_port sport
  local common=(env "${env[@]}" DMLC_NUM_SERVER="$n" DMLC_NUM_WORKER="$n" DMLC_PS_ROOT_URI=127.0.0.1
                DMLC_PS_ROOT_PORT="$sport" DMLC_NODE_HOST=127.0.0.1)
  local args=(--dim "$2" --batch "$3" --zipf "$4" --seconds "$secs" --warmup-seconds "$warmup"
    --warmup-requests "$warmup_requests")
  rm -f "$dir"/pl-*
  "${common[@]}" DMLC_ROLE=scheduler timeout 120 "$pslite_bin" "${args[@]}" >/dev/null 2>"$dir/pl-sched.log" </dev/null &
  pids+=($!)
  for i in $(seq "$n"); do
    "${common[@]}" DMLC_ROLE=server timeout 120 "$pslite_bin" "${args[@]}" >"$dir/pl-s$i.out" 2>"$dir/pl-s$i.log" </dev/null &
    pids+=($!)
  done
  for i in $(seq "$n"); do
    "${common[@]}" DMLC_ROLE=worker timeout 120 "$pslite_bin" "${args[@]}" >"$dir/pl-w$i.out" 2>"$dir/pl-w$i.log" </dev/null &
    pids+=($!) wp+=($!)
  done
  for i in "${wp[@]}"; do wait "$i" || fail=1; done
  # the servers print after ps::Finalize, which every process passes together
  for _ in $(seq 50); do [ "$(cat "$dir"/pl-s*.out | wc -l)" -ge "$n" ] && break; sleep 0.1; done
  stop_all
  python3 - "$n" "$2" "$3" "$4" "$dir"/pl-s*.out "$dir"/pl-w*.out >"$dir/run.json" <<'PY' || fail=1
import json, os, sys
n, dim, batch, zipf = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
objs = [json.loads(l) for p in sys.argv[5:] for l in open(p) if l.startswith('{')]
srv = [o for o in objs if o['role'] == 'server']
wrk = [o for o in objs if o['role'] == 'worker']
assert len(srv) == n and len(wrk) == n and all(w['check'] == 'ok' for w in wrk), objs
wall = max(w['t1'] for w in wrk) - min(w['t0'] for w in wrk)
reqs = sum(w['requests'] for w in wrk)
rows = reqs * batch
mrows = rows / 1e6
held = sum(s['rows'] for s in srv)
r = {"shards": n, "workers": n, "dim": dim, "batch": batch, "zipf": zipf, "vocab": 1000000,
     "seconds": round(wall, 3), "requests": reqs, "rows_per_s": round(rows / wall),
     "gbps": round(2 * rows / wall * dim * 4 / 1e9, 4),
     # the mean of the workers' own p50 / p99 (sparsebench: over all requests of all workers)
     "p50_us": round(sum(w['p50_us'] for w in wrk) / n, 1),
     "p99_us": round(sum(w['p99_us'] for w in wrk) / n, 1),
     "shard_cpu_s_per_mrows": round(sum(s['cpu_user_s'] + s['cpu_sys_s'] for s in srv) / mrows, 4),
     "shard_user_s_per_mrows": round(sum(s['cpu_user_s'] for s in srv) / mrows, 4),
     "shard_sys_s_per_mrows": round(sum(s['cpu_sys_s'] for s in srv) / mrows, 4),
     "client_cpu_s_per_mrows": round(sum(w['cpu_user_s'] + w['cpu_sys_s'] for w in wrk) / mrows, 4),
     "rows_held": held, "shard_rss_kib": max(s['rss_kib'] for s in srv),
     "rss_bytes_per_row": round(sum(s['rss_kib'] - s['rss0_kib'] for s in srv) * 1024 / held, 1),
     "raw_bytes_per_row": dim * 4,
     "unique_per_request": round(sum(w['unique_per_request'] for w in wrk) / n, 1),
     "memcpy_gbps": next((w['memcpy_gbps'] for w in wrk if 'memcpy_gbps' in w), None),
     "loadavg": float(open('/proc/loadavg').read().split()[0]),
     "pslite_env": os.environ.get('PSLITE_ENV', '')}
print(json.dumps(r))
PY
  if [ $fail = 1 ]; then tail -n 3 "$dir"/pl-*.log "$dir"/pl-*.out >&2; return 1; fi
}

nsys=${#systems[@]}
for run in $(seq "$rounds"); do
  wait_quiet
  echo "# round $run: load before $load_seen (waited ${waited}s in all)" >&2
  for point in $grid; do
    IFS=: read -r d b s n <<<"$point"
    for k in $(seq 0 $((nsys - 1))); do   # the order rotates with the round
      what=${systems[$(( (k + run - 1) % nsys ))]}
      case $what in
        tessera) tessera "$d" "$b" "$s" "$n" ;;
        pslite-stock) pslite stock "$d" "$b" "$s" "$n" ;;
        pslite-jemalloc) pslite jemalloc "$d" "$b" "$s" "$n" ;;
        *) echo "sparse_compare.sh: unknown system $what" >&2; exit 2 ;;
      esac
      rc=$?
      python3 - "$dir/run.json" "$what" "$run" "$load_seen" "$rc" "$d" "$b" "$s" "$n" >>"$out" <<'PY'
import json, sys
f, what, rnd, load, rc = sys.argv[1:6]
try:
    o = json.loads(open(f).read()) if rc == '0' else None
except ValueError:
    o = None
if o is None:
    d, b, s, n = sys.argv[6:10]
    o = {"dim": int(d), "batch": int(b), "zipf": float(s), "shards": int(n), "workers": int(n),
         "failed": True}
o.update(system=what, round=int(rnd), load_before=float(load))
print(json.dumps(o))
PY
      tail -1 "$out" | cut -c1-200 >&2
      rm -f "$dir/run.json"
      sleep "$settle"
    done
  done
done

python3 bench/sparse_summary.py "$out"
