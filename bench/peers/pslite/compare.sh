#!/usr/bin/env bash
# Tessera (bench/psbench) against ps-lite (bench/peers/pslite/pslite_bench), stock and tuned,
# and loopback iperf3, in alternating rounds on this machine: dense push+pull of one tensor
# of SIZE bytes, 1 server + 1 worker and 2 servers + 2 workers, everything on 127.0.0.1.
#
#   tessera       build/bench/psbench --mode async --runs 1 --no-iperf: SIZE split in
#                 partitions over the ps-server shards, one TS_CLIENT_PUSH_PULL per iteration
#   pslite-stock  glibc malloc; the server answers each pull from a fresh copy of its store
#                 (the style of ps-lite's KVServerDefaultHandle)
#   pslite-tuned  LD_PRELOAD=libjemalloc.so.2 with MALLOC_CONF=$JEMALLOC_CONF (every ps-lite
#                 process) and the pull reply sent from the store itself (no copy)
#   iperf3        one stream for 1+1; for 2+2 two client/server pairs at once, summed
#   bare-sgd      bench/bare_pushpull --apply sgd: the same push+pull over bare blocking
#                 sockets, a thread per connection, the shards' SGD loop and nothing else
#                 (no framing, check, event loop): what this machine allows a parameter server
#   bare          bench/bare_pushpull --apply none: only the bytes moved
#
# Every system is measured with the same byte accounting: workers x iterations x 2 x SIZE
# (pushed plus pulled) / wall time of the timed run, GB/s = 1e9 B/s; iperf3: bytes received /
# its own time. One timed run per system per round (SECS, LARGE_SECS at 400 MiB) after one
# warm-up iteration; the order of the systems rotates from round to round.
#
# usage: PSLITE_DIR=/path/to/ps-lite bench/peers/pslite/compare.sh [BUILD_DIR]
#   env: ROUNDS (5), SIZES ("4MiB 40MiB 400MiB"), CONFIGS ("1+1 2+2"), SECS (1),
#        LARGE_SECS (3), JEMALLOC (libjemalloc.so.2), PSLITE_OP (push-pull, or pushpull),
#        SYSTEMS ("tessera pslite-stock pslite-tuned iperf3 bare-sgd bare"), SETTLE (3: seconds
#        of pause after each run)
# Output: a "# ..." header, one line per measurement,
#   what=pslite-tuned size=40MiB config=1+1 run=3 gbps=1.234 load=1.52
# then "# summary" lines: per size and config, each system's median (min-max) over the rounds
# and the ratios of Tessera's median to the others'.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.." || exit 1
# shellcheck source-path=SCRIPTDIR/../../..
. bench/lib.sh   # bench_start (sets $dir, $pids, the EXIT trap), stop_all, free_port, $taken
build=${1:-build}
rounds=${ROUNDS:-5}
sizes=${SIZES:-4MiB 40MiB 400MiB}
configs=${CONFIGS:-1+1 2+2}
secs=${SECS:-1}
large_secs=${LARGE_SECS:-3}
jemalloc=${JEMALLOC:-libjemalloc.so.2}
jemalloc_conf=${JEMALLOC_CONF:-oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1}
op=${PSLITE_OP:-push-pull}
settle=${SETTLE:-3}

for b in bench/psbench server/ps-server bench/bare_pushpull; do
  [ -x "$build/$b" ] || { echo "compare.sh: $build/$b is not built (meson compile -C $build)" >&2; exit 1; }
done
command -v iperf3 >/dev/null || { echo "compare.sh: iperf3 is missing (apt-get install iperf3)" >&2; exit 1; }
# grep reads all of ldconfig's list (grep -q would stop early, and pipefail then sees SIGPIPE)
if ! ldconfig -p | grep "${jemalloc##*/}" >/dev/null; then
  [ -f "$jemalloc" ] || { echo "compare.sh: $jemalloc not found (apt-get install libjemalloc2)" >&2; exit 1; }
fi
pslite_bin=$(bench/peers/pslite/build.sh "$build/bench/peers/pslite") || exit 1

bench_start pslite
load() { cut -d' ' -f1 /proc/loadavg; }
# SIZE in MiB (4MiB, 400MiB; KiB sizes count as 0): runs of 200 MiB and more last LARGE_SECS.
mib_of() { case $1 in *MiB) echo "${1%MiB}" ;; *GiB) echo $(( ${1%GiB} * 1024 )) ;; *) echo 0 ;; esac; }
secs_of() { [ "$(mib_of "$1")" -ge 200 ] && echo "$large_secs" || echo "$secs"; }

pslite_version="unknown commit"
if git -C "$PSLITE_DIR" rev-parse HEAD >/dev/null 2>&1; then pslite_version=$(git -C "$PSLITE_DIR" rev-parse --short HEAD); fi
echo "# $(date -u +%FT%TZ) nproc=$(nproc) cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\" kernel=$(uname -r)"
echo "# ps-lite $PSLITE_DIR ($pslite_version), op=$op; libzmq $(pkg-config --modversion libzmq), protobuf $(pkg-config --modversion protobuf), jemalloc $(dpkg-query -W -f='${Version}' libjemalloc2 2>/dev/null || echo '?') MALLOC_CONF=$jemalloc_conf; iperf3 $(iperf3 --version | head -1 | cut -d' ' -f2)"
echo "# rounds=$rounds sizes=\"$sizes\" configs=\"$configs\" secs=$secs large_secs=$large_secs"

# The measuring functions run in this shell (never in $(...)), so every process they start is
# in $pids, which the EXIT trap of bench_start stops (TERM to each timeout(1), which passes it
# on); they set g to the GB/s, or FAILED.

tessera() {   # size n
  timeout 300 "$build/bench/psbench" --size "$1" --workers "$2" --shards "$2" --mode async \
    --runs 1 --seconds "$(secs_of "$1")" --no-iperf --output json >"$dir/tessera.json" \
    2>"$dir/tessera.log" </dev/null &
  pids+=($!)
  wait $!
  stop_all
  g=$(python3 -c 'import json, sys; print("%.3f" % json.load(open(sys.argv[1]))["gbps"])' "$dir/tessera.json" 2>/dev/null)
  [ -n "$g" ] || { tail -3 "$dir/tessera.log" >&2; g=FAILED; }
}

pslite() {   # variant size n
  local variant=$1 size=$2 n=$3 sport i reply=copy env=()
  local s; s=$(secs_of "$size")
  if [ "$variant" = tuned ]; then reply=zerocopy env=(LD_PRELOAD="$jemalloc" MALLOC_CONF="$jemalloc_conf"); fi
  # shellcheck disable=SC2034 # read by free_port: every port is free again after a run
  taken=" "
  free_port sport
  local common=(env "${env[@]}" DMLC_NUM_SERVER="$n" DMLC_NUM_WORKER="$n" DMLC_PS_ROOT_URI=127.0.0.1
                DMLC_PS_ROOT_PORT="$sport" DMLC_NODE_HOST=127.0.0.1)
  local args=(--size "$size" --seconds "$s" --warmup 1 --reply "$reply" --op "$op")
  local limit=$((s * 3 + 60)) wp=()
  rm -f "$dir"/pl-*
  "${common[@]}" DMLC_ROLE=scheduler timeout "$limit" "$pslite_bin" "${args[@]}" >/dev/null 2>"$dir/pl-sched.log" </dev/null &
  pids+=($!)
  for i in $(seq "$n"); do
    "${common[@]}" DMLC_ROLE=server timeout "$limit" "$pslite_bin" "${args[@]}" >/dev/null 2>"$dir/pl-s$i.log" </dev/null &
    pids+=($!)
  done
  for i in $(seq "$n"); do
    "${common[@]}" DMLC_ROLE=worker timeout "$limit" "$pslite_bin" "${args[@]}" >"$dir/pl-w$i.out" 2>"$dir/pl-w$i.log" </dev/null &
    pids+=($!) wp+=($!)
  done
  local fail=0
  for i in "${wp[@]}"; do wait "$i" || fail=1; done
  stop_all
  g=$(cat "$dir"/pl-w*.out | awk -v n="$n" '
      /^pslite_run/ { for (f = 2; f <= NF; f++) { split($f, kv, "="); v[kv[1]] = kv[2] }
                      if (v["check"] != "ok") bad = 1
                      it += v["iterations"]; size = v["size"]; k++
                      if (k == 1 || v["t0"] < t0) t0 = v["t0"]; if (k == 1 || v["t1"] > t1) t1 = v["t1"] }
      END { if (k == n && !bad && t1 > t0) printf "%.3f\n", it * 2 * size / (t1 - t0) / 1e9 }')
  if [ $fail = 1 ] || [ -z "$g" ]; then
    tail -n 3 "$dir"/pl-*.log "$dir"/pl-w*.out >&2
    g=FAILED
  fi
}

iperf() {   # n: the summed GB/s of n single-stream pairs at once
  local n=$1 i ports=() cl=() p   # not "port": free_port's own local would hide it
  # shellcheck disable=SC2034 # read by free_port: every port is free again after a run
  taken=" "
  for i in $(seq "$n"); do
    free_port p
    ports+=("$p")
    timeout 60 iperf3 -s -1 -B 127.0.0.1 -p "$p" >/dev/null 2>&1 </dev/null &
    pids+=($!)
  done
  sleep 0.5   # iperf3 listens within milliseconds; a connection to test it would be its one client
  rm -f "$dir"/iperf*.json
  i=0
  for p in "${ports[@]}"; do
    i=$((i + 1))
    timeout 60 iperf3 -J -c 127.0.0.1 -p "$p" -t 2 >"$dir/iperf$i.json" 2>/dev/null </dev/null &
    pids+=($!) cl+=($!)
  done
  for i in "${cl[@]}"; do wait "$i"; done
  stop_all
  g=$(python3 - "$dir"/iperf*.json <<'PY' 2>/dev/null
import json, sys
print(f"{sum(json.load(open(p))['end']['sum_received']['bits_per_second'] for p in sys.argv[1:]) / 8e9:.3f}")
PY
  )
  [ -n "$g" ] || g=FAILED
}

bare() {   # apply size n
  timeout 300 "$build/bench/bare_pushpull" --apply "$1" --size "$2" --workers "$3" --shards "$3" \
    --seconds "$(secs_of "$2")" >"$dir/bare.out" 2>"$dir/bare.log" </dev/null &
  pids+=($!)
  wait $!
  stop_all
  g=$(sed -n 's/^bare_run .* gbps=\([0-9.]*\)$/\1/p' "$dir/bare.out")
  [ -n "$g" ] || { tail -3 "$dir/bare.log" >&2; g=FAILED; }
}

read -ra systems <<<"${SYSTEMS:-tessera pslite-stock pslite-tuned iperf3 bare-sgd bare}"
nsys=${#systems[@]}
for run in $(seq "$rounds"); do
  for config in $configs; do
    n=${config%+*}
    for size in $sizes; do
      for k in $(seq 0 $((nsys - 1))); do   # the order rotates with the round
        what=${systems[$(( (k + run - 1) % nsys ))]}
        case $what in
          tessera) tessera "$size" "$n" ;;
          pslite-stock) pslite stock "$size" "$n" ;;
          pslite-tuned) pslite tuned "$size" "$n" ;;
          iperf3) iperf "$n" ;;
          bare-sgd) bare sgd "$size" "$n" ;;
          bare) bare none "$size" "$n" ;;
          *) echo "compare.sh: unknown system $what" >&2; exit 2 ;;
        esac
        echo "what=$what size=$size config=$config run=$run gbps=$g load=$(load)" | tee -a "$dir/lines.txt"
        # Let the machine settle: the run before freed up to GBs of memory (bare_pushpull's
        # huge pages, jemalloc's arenas), and on this VM the next run was 6 % slower for it.
        sleep "$settle"
      done
    done
  done
done

python3 - "$dir/lines.txt" <<'PY'
import re, statistics, sys
rows = [dict(re.findall(r'(\w+)=(\S+)', l)) for l in open(sys.argv[1])]
groups = {}
for r in rows:
    groups.setdefault((r['size'], r['config']), {}).setdefault(r['what'], []).append(r)
def med(rs):
    g = [float(r['gbps']) for r in rs if r['gbps'] != 'FAILED']
    return (statistics.median(g), min(g), max(g), len(g)) if g else None
for (size, config), whats in groups.items():
    parts, m = [], {}
    loads = [float(r['load']) for rs in whats.values() for r in rs]
    for what in ('tessera', 'pslite-stock', 'pslite-tuned', 'iperf3', 'bare-sgd', 'bare'):
        s = med(whats.get(what, []))
        if s:
            m[what] = s[0]
            parts.append(f"{what}={s[0]:.3f}({s[1]:.3f}-{s[2]:.3f},n={s[3]})")
    ratios = []
    for one, other, name in (('tessera', 'pslite-tuned', 'tessera/tuned'),
                             ('tessera', 'pslite-stock', 'tessera/stock'),
                             ('tessera', 'iperf3', 'tessera/iperf3'),
                             ('tessera', 'bare-sgd', 'tessera/bare-sgd'),
                             ('bare-sgd', 'pslite-tuned', 'bare-sgd/tuned'),
                             ('bare-sgd', 'pslite-stock', 'bare-sgd/stock'),
                             ('bare-sgd', 'iperf3', 'bare-sgd/iperf3'),
                             ('bare', 'iperf3', 'bare/iperf3')):
        if one in m and other in m and m[other] > 0:
            ratios.append(f"{name}={m[one] / m[other]:.2f}")
    print(f"# summary size={size} config={config} " + " ".join(parts + ratios) +
          f" load={statistics.median(loads):.2f}({min(loads):.2f}-{max(loads):.2f})")
PY
