#!/usr/bin/env bash
# Functional smoke test of bench/sparsebench (no speed assertion: speed is measured by
# bench/sparse_compare.sh, never by timed tests): tiny sizes, 2 shards + 2 workers, a tenth of
# a second timed; the JSON object must carry the documented fields and positive rows/s.
set -euo pipefail
sparsebench=$1
out=$(timeout 30 "$sparsebench" --shards 2 --workers 2 --dim 8 --batch 256 --vocab 1000 \
      --batches 2 --seconds 0.1 --warmup-seconds 0.05 --memcpy-mib 4 --output json)
echo "$out"
python3 - "$out" <<'PY'
import json, sys
o = json.loads(sys.argv[1])
for k in ("system", "shards", "workers", "dim", "batch", "zipf", "requests", "rows_per_s", "gbps",
          "p50_us", "p99_us", "shard_cpu_s_per_mrows", "client_cpu_s_per_mrows", "rows_held",
          "shard_rss_kib", "rss_bytes_per_row", "table_bytes_per_row", "raw_bytes_per_row",
          "memcpy_gbps", "loadavg", "busy_poll_us"):
    assert k in o, "missing field " + k
assert o["system"] == "tessera" and o["shards"] == 2 and o["workers"] == 2 and o["dim"] == 8
assert o["requests"] > 0 and o["rows_per_s"] > 0 and o["gbps"] > 0, o
assert abs(o["gbps"] - 2 * o["rows_per_s"] * 8 * 4 / 1e9) < 1e-3, o
assert 0 < o["rows_held"] <= 1000 and o["raw_bytes_per_row"] == 32 and o["memcpy_gbps"] > 0, o
assert o["busy_poll_us"] == 50, o                     # job.busy_poll_us's default
PY
# A table held at its size: every id made first, the ranks over 100 ids scattered over the
# 10000, a quarter of each request's keys new, each shard capped at 3000 rows (evicting).
out=$(timeout 30 "$sparsebench" --shards 2 --workers 2 --dim 8 --batch 256 --vocab 10000 \
      --batches 2 --seconds 0.1 --warmup-seconds 0.05 --memcpy-mib 0 --prefill --hot-ids 100 \
      --fresh-share 0.25 --max-rows 3000 --busy-poll-us 0 --output json)
echo "$out"
python3 - "$out" <<'PY'
import json, sys
o = json.loads(sys.argv[1])
assert o["prefill"] is True and o["hot_ids"] == 100 and o["max_rows"] == 3000, o
assert o["busy_poll_us"] == 0, o
assert o["rows_held"] == 6000, o                      # both shards at their cap
assert o["rows_created"] >= 10000 + o["requests"] * 64, o   # the prefill, then 64 new a request
assert o["rows_evicted"] == o["rows_created"] - o["rows_held"], o
PY
if "$sparsebench" --fresh-share 2 2>/dev/null; then echo "bad share accepted"; exit 1; fi
"$sparsebench" --batch 64 --vocab 100 --seconds 0.05 --warmup-seconds 0 --memcpy-mib 0 \
  --output table | grep -q 'rows/s'
if "$sparsebench" --dim 0 2>/dev/null; then echo "bad dim accepted"; exit 1; fi
if "$sparsebench" --busy-poll-us 2000000 2>/dev/null; then echo "bad busy-poll accepted"; exit 1; fi
echo "sparsebench smoke: ok"
