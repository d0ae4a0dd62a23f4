#!/usr/bin/env bash
# Push+pull through TLS against plaintext (issue 29, auth.tls): bench/psbench at 4 MiB,
# 40 MiB and 400 MiB, SHARDS shards and WORKERS workers, in alternating rounds (plaintext,
# then TLS, at each size), so both see the same machine. The certificates come from
# tests/lib/make_tls_certs.sh (P-256; the suite negotiated is TLS_AES_128_GCM_SHA256).
#
# Each run is psbench's median GB/s over its timed runs (RUNS of SECS seconds; the 400 MiB
# runs time ITERS_400 iterations instead); the table gives, per size and kind, the median
# (min-max) over ROUNDS rounds, and the TLS/plaintext ratio of the medians. Before every
# round the script waits (at most LOAD_WAIT_S, default 300) for the 1-minute load average to
# fall below LOAD_MAX (1.0).
#
# usage: bench/tls.sh [BUILD_DIR]   (default build)
#   env: ROUNDS (5), RUNS (3), SECS (1.0), ITERS_400 (3), SHARDS (1), WORKERS (1),
#        SIZES ("4MiB 40MiB 400MiB"), OUT (bench/results/tls-DATE.jsonl)
# Output: one JSON object per run appended to OUT (psbench's fields plus kind and round),
# then a Markdown table on stdout.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.." || exit 1
build=${1:-build}
rounds=${ROUNDS:-5}
runs=${RUNS:-3}
secs=${SECS:-1.0}
iters_400=${ITERS_400:-3}
shards=${SHARDS:-1}
workers=${WORKERS:-1}
read -ra sizes <<<"${SIZES:-4MiB 40MiB 400MiB}"
load_max=${LOAD_MAX:-1.0}
load_wait=${LOAD_WAIT_S:-300}
mkdir -p bench/results
out=${OUT:-bench/results/tls-$(date -u +%Y%m%dT%H%M%SZ).jsonl}
certs=$(mktemp -d /tmp/tessera-tls-bench-XXXXXX)
trap 'rm -rf "$certs"' EXIT
bash tests/lib/make_tls_certs.sh "$certs" || exit 1

wait_quiet() {
  local waited=0
  while awk -v m="$load_max" '{exit !($1 >= m)}' /proc/loadavg && [ "$waited" -lt "$load_wait" ]; do
    sleep 5
    waited=$((waited + 5))
  done
}

for round in $(seq 1 "$rounds"); do
  for size in "${sizes[@]}"; do
    for kind in plain tls; do
      wait_quiet
      args=(--size "$size" --shards "$shards" --workers "$workers" --runs "$runs" --no-iperf --output json)
      if [ "$size" = 400MiB ]; then args+=(--iters "$iters_400"); else args+=(--seconds "$secs"); fi
      [ "$kind" = tls ] && args+=(--tls "$certs")
      line=$("$build/bench/psbench" "${args[@]}" 2>/dev/null | tail -1)
      if [ -z "$line" ]; then
        echo "tls.sh: psbench failed: ${args[*]}" >&2
        exit 1
      fi
      python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["kind"]=sys.argv[2]; d["round"]=int(sys.argv[3]); print(json.dumps(d))' \
        "$line" "$kind" "$round" >>"$out"
      echo "round $round $size $kind: $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["gbps"])' "$line") GB/s" >&2
    done
  done
done

python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| size | plaintext GB/s | TLS GB/s | TLS / plaintext |")
print("|---|---|---|---|")
for size in sorted({r["size"] for r in rows}):
    cell, med = {}, {}
    for kind in ("plain", "tls"):
        v = [r["gbps"] for r in rows if r["size"] == size and r["kind"] == kind]
        med[kind] = statistics.median(v)
        cell[kind] = f"{med[kind]:.3f} ({min(v):.3f}-{max(v):.3f})"
    print(f"| {size >> 20} MiB | {cell['plain']} | {cell['tls']} | {med['tls'] / med['plain']:.2f} x |")
PY
