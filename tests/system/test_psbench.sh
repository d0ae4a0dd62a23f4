#!/usr/bin/env bash
# Functional smoke test of bench/psbench (no speed assertion: speed is checked by running
# the benchmarks, never by timed tests): a tiny tensor, one short run per mode, no iperf3;
# the JSON object must carry every documented field.
set -euo pipefail
psbench=$1
for mode in async sync; do
  out=$(timeout 120 "$psbench" --size 4KiB --workers 2 --shards 2 --mode "$mode" --runs 1 \
        --iters 3 --no-iperf --output json)
  echo "$out"
  python3 - "$out" "$mode" <<'PY'
import json, sys
o = json.loads(sys.argv[1])
for k in ("size", "workers", "shards", "mode", "runs", "gbps", "gbps_min", "gbps_max",
          "iperf3_gbps", "ratio", "p50_us", "p99_us", "cpu_s_per_gb", "client_cpu_s_per_gb",
          "shard_user_s_per_gb", "shard_sys_s_per_gb", "client_user_s_per_gb",
          "client_sys_s_per_gb"):
    assert k in o, "missing field " + k
# the shards' CPU seconds per GB moved: a number (0 when the runs took under a clock tick)
assert isinstance(o["cpu_s_per_gb"], (int, float)) and o["cpu_s_per_gb"] >= 0, o["cpu_s_per_gb"]
# the clients' (psbench's own) CPU seconds per GB moved, likewise
assert isinstance(o["client_cpu_s_per_gb"], (int, float)) and o["client_cpu_s_per_gb"] >= 0
assert o["mode"] == sys.argv[2] and o["size"] == 4096 and o["workers"] == 2
assert o["iterations"] == 6, o["iterations"]
assert o["iperf3_gbps"] is None and o["ratio"] is None
assert o["gbps"] > 0 and o["gbps_min"] <= o["gbps"] <= o["gbps_max"]
PY
done
# A run that keeps the shard busy for a tenth of a second or more shows its CPU time.
out=$(timeout 120 "$psbench" --size 4MiB --runs 1 --iters 50 --no-iperf --output json)
echo "$out"
python3 -c 'import json, sys; o = json.loads(sys.argv[1]); assert o["cpu_s_per_gb"] > 0 and o["client_cpu_s_per_gb"] > 0, o' "$out"
"$psbench" --output table --size 8KiB --runs 1 --iters 2 --no-iperf | grep -q 'GB/s'
"$psbench" --output csv --size 8KiB --runs 1 --iters 2 --no-iperf | head -1 | grep -q '^size,workers'
if "$psbench" --size 3 --no-iperf 2>/dev/null; then echo "bad size accepted"; exit 1; fi
echo "psbench smoke: ok"
