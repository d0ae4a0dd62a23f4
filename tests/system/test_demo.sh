#!/usr/bin/env bash
# deploy/local/demo.sh as a user runs it: it must finish with every worker's test accuracy
# >= 0.84 and leave no process behind, also when interrupted with Ctrl-C (SIGINT to its
# process group). BUILD_DIR is the build under test.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:?BUILD_DIR must name the build directory}
fail() { echo "FAIL: $*"; exit 1; }
leftovers() { pgrep -f "$build/(server/ps-server|worker/ps-worker)" || true; }

[ -z "$(leftovers)" ] || fail "processes of this build already run before the demo: $(leftovers)"

out=$(BUILD_DIR="$build" timeout 300 "$root/deploy/local/demo.sh" 2>&1)
rc=$?
echo "$out" | tail -n 20
[ $rc -eq 0 ] || fail "demo.sh exited $rc"
accs=$(echo "$out" | sed -n 's/^  worker [0-9]*: test accuracy \([0-9.]*\).*/\1/p')
[ "$(echo "$accs" | wc -w)" -eq 2 ] || fail "expected two workers' accuracy, got '$accs'"
for a in $accs; do
  awk -v a="$a" 'BEGIN { exit !(a >= 0.84) }' || fail "test accuracy $a < 0.84"
done
echo "$out" | grep -q "2 of 2 shard(s) up" || fail "no final psctl status"
sleep 0.5
[ -z "$(leftovers)" ] || fail "processes left behind: $(leftovers)"

# Ctrl-C in the middle of training: the terminal sends SIGINT to the whole process group.
# A background job of a script starts with SIGINT ignored; perl restores the default
# before exec, as a terminal's foreground job has it.
setsid perl -e '$SIG{INT} = "DEFAULT"; exec @ARGV' env BUILD_DIR="$build" \
  "$root/deploy/local/demo.sh" --epochs 20 >/tmp/tessera-demo-int.$$ 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q "step " /tmp/tessera-demo-int.$$ && break; sleep 0.1; done
grep -q "step " /tmp/tessera-demo-int.$$ || { cat /tmp/tessera-demo-int.$$; fail "the demo did not start training"; }
kill -INT -- "-$pid"
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "demo.sh still runs 10 s after Ctrl-C"
sleep 0.5
left=$(leftovers)
rm -f /tmp/tessera-demo-int.$$
[ -z "$left" ] || fail "processes left behind after Ctrl-C: $left"
echo "demo: accuracy $accs, nothing left behind (also after Ctrl-C)"
