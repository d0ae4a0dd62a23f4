# Shared by the bench scripts that start local clusters (source it from the repo root):
#   bench_start NAME   a temporary directory $dir, the list $pids of processes to stop, and
#                      traps that stop them and remove $dir on exit (also on Ctrl-C)
#   stop_all           stop every process in $pids (TERM, then KILL after 5 s)
#   free_port VAR      set VAR to a free 127.0.0.1 port below the kernel's ephemeral range
#                      (32768+), so no outgoing connection takes it after the check; never
#                      twice (it sets VAR rather than printing: in a $(...) subshell the
#                      record of ports already handed out would be lost)
#   list PORT...       ["127.0.0.1:P1", ...] for a --set value
#   window_eps OUT...    the examples/s over the training window of the workers' "done:" lines
#   run_cluster N ARG...  2 ps-server shards (listening on the ports in $psp) and N worker
#                      processes of the job file $cfg with ARG... (--set ...), built in $build;
#                      the workers are ps-worker, or the command in the array $worker_cmd
#                      when set (called as `CMD -c $cfg ARG... --task T`); logs in
#                      $dir/psS.log and $dir/wT.log, worker stdout in $dir/wT.out; waits for
#                      the workers, stops everything, returns 1 if a worker failed; sets
#                      $workers_s to the seconds from starting the first worker to the last
#                      one's exit

# window_eps OUT...: the examples/s of a cluster from its workers' "done:" lines: all their
# examples over the earliest started_at to the latest finished_at (never a sum of each
# worker's own rate, which overstates it when the windows do not overlap). Prints nothing
# when a line lacks the window.
window_eps() {
  python3 - "$@" <<'PY'
import re, sys
f = [dict(re.findall(r'(\w+)=([0-9.]+)', open(p).read())) for p in sys.argv[1:]]
if f and all('finished_at' in d and 'started_at' in d and 'examples' in d for d in f):
    window = max(float(d['finished_at']) for d in f) - min(float(d['started_at']) for d in f)
    print(round(sum(int(d['examples']) for d in f) / window, 1) if window > 0 else "")
PY
}

stop_all() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  pids=()
}

bench_start() {
  dir=$(mktemp -d "/tmp/tessera-$1-XXXXXX")
  pids=()
  trap 'trap - EXIT INT TERM; stop_all; rm -rf "$dir"' EXIT
  trap 'exit 130' INT TERM
}

taken=" "
free_port() {
  local port
  while :; do
    port=$(( 20000 + RANDOM % 12000 ))
    case "$taken" in *" $port "*) continue ;; esac
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      taken="$taken$port "
      printf -v "$1" '%s' "$port"
      return
    fi
  done
}

list() { local o="" i; for i in "$@"; do o="$o${o:+, }\"127.0.0.1:$i\""; done; echo "[$o]"; }

run_cluster() {
  local n=$1 s t port w fail=0 t0
  shift
  for s in 0 1; do
    timeout 900 "$build/server/ps-server" -c "$cfg" "$@" --shard $s --log-level warn \
      2>"$dir/ps$s.log" </dev/null >/dev/null &
    pids+=($!)
  done
  for port in "${psp[@]}"; do
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  done
  local cmd=("$build/worker/ps-worker")
  [ -n "${worker_cmd+set}" ] && cmd=("${worker_cmd[@]}")
  local wpids=()
  t0=$(date +%s.%N)
  for t in $(seq 0 $((n - 1))); do
    timeout 600 "${cmd[@]}" -c "$cfg" "$@" --task "$t" \
      >"$dir/w$t.out" 2>"$dir/w$t.log" </dev/null &
    wpids+=($!) pids+=($!)
  done
  for w in "${wpids[@]}"; do wait "$w" || fail=1; done
  workers_s=$(echo "$(date +%s.%N) - $t0" | bc -l)
  stop_all
  return $fail
}
