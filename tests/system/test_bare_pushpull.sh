#!/usr/bin/env bash
# Functional smoke test of bench/bare_pushpull (no speed assertion): 1+1 and 2+2, with and
# without the SGD pass, a small tensor, a short run; the result line carries its fields, and
# bad options are refused with exit status 2.
set -euo pipefail
bare=$1
for cfg in "1 sgd" "2 sgd" "2 none"; do
  # shellcheck disable=SC2086 # two words: workers and apply
  set -- $cfg
  out=$(timeout 60 "$bare" --size 256KiB --workers "$1" --shards "$1" --apply "$2" \
        --seconds 0.2 --piece-bytes 64KiB)
  echo "$out"
  python3 - "$out" "$1" "$2" <<'PY'
import re, sys
line, n, apply = sys.argv[1], sys.argv[2], sys.argv[3]
assert line.startswith("bare_run "), line
f = dict(re.findall(r"(\w+)=(\S+)", line))
assert f["workers"] == n and f["shards"] == n and f["apply"] == apply, f
assert f["size"] == "262144" and f["piece"] == "65536", f
assert int(f["iterations"]) > 0 and float(f["seconds"]) >= 0.2 and float(f["gbps"]) > 0, f
PY
done
for bad in "--workers 9" "--apply adam" "--size 0" "--bogus 1" "--seconds"; do
  rc=0
  # shellcheck disable=SC2086
  "$bare" $bad >/dev/null 2>&1 || rc=$?
  [ "$rc" = 2 ] || { echo "bare_pushpull $bad: exit $rc, want 2"; exit 1; }
done
echo "bare_pushpull smoke: ok"
