#!/usr/bin/env bash
# deploy/systemd end to end: systemd booted in a container (tests/deploy/systemd.Dockerfile:
# Tessera put in place by `meson install`), the shipped units run as an operator would,
# with the example job file adapted to loopback, a token and a 1 s checkpoint interval:
#   - tessera-ps@0/1 start (Type=notify: READY) and report their STATUS= line;
#   - tessera-worker@0/1 (5 epochs through /etc/tessera/worker.env) report READY and their
#     progress, train to the end, print `done:`, leave their TensorBoard events in their
#     LogsDirectory (/var/log/tessera/worker-T/RUN/worker-T/train) and the unit inactive
#     with success;
#   - shard 0 SIGKILLed is restarted by systemd and restores its checkpoint at the last step;
#   - `systemctl stop` of shard 1 (its interval raised by a drop-in, so no periodic
#     checkpoint has the last step) writes a final checkpoint, which a restart restores;
#   - the journal has the daemons' priorities: `-p warning` selects the warning a bad
#     connection causes and none of the info lines; PRIORITY 5 for a restore, 6 for info.
# The container is removed at exit. Exits 77 (skip) with the reason where no Docker engine
# can run. Environment: SOURCE_ROOT (the repository).
set -uo pipefail
src=${SOURCE_ROOT:?SOURCE_ROOT must name the repository}
. "$src/tests/deploy/docker_env.sh"

ts_docker_init
ts_base_image
ts_can_run

image=tessera-systemd:e2e
# Fashion-MNIST's 60000 examples in batches of 64 for 2 workers: 468 steps an epoch. Five
# epochs leave time to see the workers' STATUS= lines while they train.
epochs=5
steps=$((468 * epochs))
ts_build -f "$src/tests/deploy/systemd.Dockerfile" -t "$image" "$src" >"$TS_TMP/build.log" 2>&1 ||
  { tail -40 "$TS_TMP/build.log"; ts_fail "docker build of $image failed"; }
ts_step "built $image (meson install in Debian 12 with systemd)"

# systemd needs the cgroup tree: v1 (and hybrid) hosts give it read-only with writable
# hierarchies below; on a cgroup v2 host it needs the host's namespace and write access.
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
  cgroup=(--cgroupns=host -v /sys/fs/cgroup:/sys/fs/cgroup:rw)
else
  cgroup=(-v /sys/fs/cgroup:/sys/fs/cgroup:ro)
fi
name=tessera-e2e-systemd
docker rm -f "$name" >/dev/null 2>&1
ts_on_exit 'docker rm -f "$name" >/dev/null 2>&1'
ts_on_exit '[ -f "$TS_TMP/failed" ] && docker exec "$name" journalctl --no-pager -o short-precise | tail -80'
fail() { touch "$TS_TMP/failed"; ts_fail "$@"; }
# --privileged is not needed (and refused on some hosts).
docker run -d --name "$name" --cap-add SYS_ADMIN --security-opt seccomp=unconfined \
  --tmpfs /run --tmpfs /run/lock "${cgroup[@]}" "$image" >"$TS_TMP/run.log" 2>&1 ||
  { cat "$TS_TMP/run.log"; fail "docker run of $image failed"; }

ct() { timeout 120 docker exec "$name" "$@"; }
booted() {
  local s
  s=$(ct systemctl is-system-running 2>/dev/null)
  [ "$s" = running ] || [ "$s" = degraded ]
}
ts_poll 90 booted || { docker logs "$name" 2>&1 | tail -30; fail "systemd did not boot in the container in 90 s"; }
ts_step "systemd booted in the container ($(ct systemctl is-system-running))"

# The example job file on loopback, with a token and a 1 s checkpoint interval.
timeout 120 docker exec -i "$name" bash -s "$epochs" >"$TS_TMP/setup.log" 2>&1 <<'EOF' || { cat "$TS_TMP/setup.log"; fail "setting up /etc/tessera failed"; }
set -e
sed -e 's/10\.0\.0\.1:7100/127.0.0.1:7100/; s/10\.0\.0\.2:7100/127.0.0.1:7101/' \
    -e 's/10\.0\.0\.1:9100/127.0.0.1:9100/; s/10\.0\.0\.2:9100/127.0.0.1:9101/' \
    -e 's/10\.0\.0\.3:9200/127.0.0.1:9200/; s/10\.0\.0\.4:9200/127.0.0.1:9201/' \
    -e 's/interval_s = 60;/interval_s = 1;/' /etc/tessera/job.cfg.example >/etc/tessera/job.cfg
[ "$(grep -c 127.0.0.1 /etc/tessera/job.cfg)" = 3 ] && grep -q 'interval_s = 1;' /etc/tessera/job.cfg
grep -q 'token_file = "/etc/tessera/token"' /etc/tessera/job.cfg
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >/etc/tessera/token
chmod 0644 /etc/tessera/token
echo "TESSERA_WORKER_OPTS=\"--set train.epochs=$1\"" >/etc/tessera/worker.env
mkdir -p /etc/systemd/system/tessera-ps@1.service.d
printf '[Service]\nEnvironment=TESSERA_PS_OPTS="--set checkpoint.interval_s=3600"\n' \
  >/etc/systemd/system/tessera-ps@1.service.d/e2e.conf
systemctl daemon-reload
EOF

prop() { ct systemctl show -P "$2" "$1"; } # unit, property
journal() { ct journalctl --no-pager -o cat "_SYSTEMD_UNIT=$1.service" "${@:2}"; }

ct systemctl start tessera-ps@0 tessera-ps@1 || fail "systemctl start tessera-ps@0 tessera-ps@1 failed"
for i in 0 1; do
  u=tessera-ps@$i
  [ "$(prop "$u" ActiveState)" = active ] || fail "$u is $(prop "$u" ActiveState) after start"
  st=$(prop "$u" StatusText)
  echo "deploy: $u: active, StatusText=$st"
  [[ $st =~ ^(serving\ shard\ $i\ of\ 2|shard\ $i/2\ serving:\ ) ]] || fail "$u: unexpected StatusText: $st"
done
ts_step "tessera-ps@0/1 ready (Type=notify) with their STATUS= lines"

ct systemctl start --no-block tessera-worker@0 tessera-worker@1 || fail "systemctl start of the workers failed"
seen=()
worker_ready() { # task: READY came (active) and STATUS= says it trains
  local u=tessera-worker@$1 st
  [ "$(prop "$u" ActiveState)" = active ] || return 1
  st=$(prop "$u" StatusText)
  [[ $st =~ ^worker\ $1(\ training|:\ step\ ) ]] || return 1
  seen+=("$u: active, StatusText=$st")
}
for t in 0 1; do
  ts_poll 120 worker_ready "$t" ||
    fail "tessera-worker@$t: never active with a training STATUS= (now $(prop tessera-worker@$t ActiveState): $(prop tessera-worker@$t StatusText))"
done
printf 'deploy: %s\n' "${seen[@]}"
ts_step "tessera-worker@0/1 ready (Type=notify), STATUS= shows training"

worker_gone() { local s; s=$(prop "tessera-worker@$1" ActiveState); [ "$s" = inactive ] || [ "$s" = failed ]; }
for t in 0 1; do
  u=tessera-worker@$t
  ts_poll 300 worker_gone "$t" || fail "$u still $(prop "$u" ActiveState) after 300 s"
  [ "$(prop "$u" Result)" = success ] && [ "$(prop "$u" ExecMainStatus)" = 0 ] ||
    fail "$u: Result=$(prop "$u" Result) ExecMainStatus=$(prop "$u" ExecMainStatus)"
  done_line=$(journal "$u" | grep -E "^done: task=$t steps=$steps .*test_accuracy=0\.[5-9]") ||
    { journal "$u" | tail -10; fail "$u: no done: line with $steps steps and test accuracy >= 0.5 in the journal"; }
  echo "deploy: $u: $done_line"
  # TensorBoard events in the unit's LogsDirectory, as docs/operations.md says.
  events=$(ct sh -c "ls /var/log/tessera/worker-$t/*/worker-$t/train/events.out.tfevents.*") ||
    fail "$u: no TensorBoard event file in /var/log/tessera/worker-$t/RUN/worker-$t/train: $(ct find /var/log/tessera)"
  echo "deploy: $u: TensorBoard events $events"
done
ts_step "both workers trained $epochs epochs, exited 0, units inactive (Result=success)"

ct psctl -c /etc/tessera/job.cfg status >"$TS_TMP/status" 2>&1 ||
  { cat "$TS_TMP/status"; fail "psctl status exited non-zero"; }
cat "$TS_TMP/status"
grep -q "step $steps, 2 of 2 shard(s) up, 2 worker(s)" "$TS_TMP/status" || fail "psctl status: not both shards at step $steps"
[ "$(grep -cE "^[01] +$steps .* stopped +/cpu:0\$" "$TS_TMP/status")" = 2 ] || fail "psctl status: not both workers done"
grep -qE "^final test accuracy: 0\.[5-9][0-9]* \(worker [01] evaluated the final parameters\)" "$TS_TMP/status" ||
  fail "psctl status: no final test accuracy of the job"
# STATUS= follows the shard's state about once a second.
at_end() { st=$(prop tessera-ps@0 StatusText); [[ $st == "shard 0/2 serving: step $steps, "* ]]; }
ts_poll 10 at_end || fail "tessera-ps@0: StatusText after training: $st"
ts_step "psctl status with the token: both shards at step $steps, both workers done; ps@0 StatusText=$st"

# SIGKILL shard 0 once its periodic checkpoint has the last step: systemd restarts it
# (Restart=on-failure, RestartSec=2s) and it restores that checkpoint.
ckpt_at_end() { journal tessera-ps@0 | has -E "checkpoint written: .*\(step $steps,"; }
ts_poll 30 ckpt_at_end || fail "tessera-ps@0 wrote no periodic checkpoint at step $steps"
pid=$(prop tessera-ps@0 MainPID)
ct systemctl kill -s SIGKILL --kill-whom=main tessera-ps@0 || fail "systemctl kill failed"
restarted() { [ "$(prop tessera-ps@0 NRestarts)" = 1 ] && [ "$(prop tessera-ps@0 ActiveState)" = active ]; }
ts_poll 60 restarted ||
  fail "tessera-ps@0 not restarted: NRestarts=$(prop tessera-ps@0 NRestarts) $(prop tessera-ps@0 ActiveState)"
ct journalctl --no-pager -o cat -u tessera-ps@0 | has "Main process exited, code=killed, status=9/KILL" ||
  fail "the journal does not show tessera-ps@0 killed by SIGKILL"
restore=$(journal tessera-ps@0 | grep -E "restored checkpoint .* at step $steps ") ||
  fail "tessera-ps@0 restarted without restoring its checkpoint at step $steps"
echo "deploy: tessera-ps@0 (pid $pid killed, now $(prop tessera-ps@0 MainPID)): $restore"
ct psctl -c /etc/tessera/job.cfg status >"$TS_TMP/status" 2>&1
grep -qE "^0 +127\.0\.0\.1:7100 +yes +[0-9]+ .* $steps " "$TS_TMP/status" ||
  { cat "$TS_TMP/status"; fail "psctl status: shard 0 is not back at version $steps"; }
ts_step "SIGKILLed tessera-ps@0 restarted by systemd, checkpoint at step $steps restored"

ct systemctl stop tessera-ps@1 || fail "systemctl stop tessera-ps@1 failed"
[ "$(prop tessera-ps@1 Result)" = success ] || fail "tessera-ps@1 stopped with Result=$(prop tessera-ps@1 Result)"
journal tessera-ps@1 | has "writing a final checkpoint before stopping" &&
  journal tessera-ps@1 | has -E "checkpoint written: .*\(step $steps," ||
  { journal tessera-ps@1 | tail -10; fail "systemctl stop: tessera-ps@1 wrote no final checkpoint at step $steps"; }
ct systemctl start tessera-ps@1 || fail "systemctl start tessera-ps@1 (again) failed"
journal tessera-ps@1 | has -E "restored checkpoint .* at step $steps " ||
  fail "tessera-ps@1 did not restore its final checkpoint"
ts_step "systemctl stop tessera-ps@1 wrote a final checkpoint at step $steps; the restart restored it"

# Priorities: a connection that is not Tessera's is refused with a warning.
ct bash -c 'printf "GARBAGEGARBAGEGARBAGEGARBAGE" >/dev/tcp/127.0.0.1/7100' ||
  fail "cannot connect to 127.0.0.1:7100 in the container"
warned() { journal tessera-ps@0 -p warning | has "bad magic"; }
ts_poll 10 warned || fail "journalctl -p warning shows no warning for the bad connection"
warnings=$(journal tessera-ps@0 -p warning)
echo "deploy: journalctl -p warning _SYSTEMD_UNIT=tessera-ps@0.service:"
echo "$warnings" | sed 's/^/  /'
! echo "$warnings" | has -E " info: | notice: " || fail "journalctl -p warning selects info or notice lines"
ct journalctl --no-pager -o json _SYSTEMD_UNIT=tessera-ps@0.service >"$TS_TMP/journal.json"
grep 'restored checkpoint' "$TS_TMP/journal.json" | has '"PRIORITY":"5"' ||
  fail "the restore notice is not PRIORITY 5 in the journal"
grep 'checkpoint written' "$TS_TMP/journal.json" | has '"PRIORITY":"6"' &&
  ! grep 'checkpoint written' "$TS_TMP/journal.json" | has -v '"PRIORITY":"6"' ||
  fail "checkpoint info lines are not PRIORITY 6 in the journal"
grep 'bad magic' "$TS_TMP/journal.json" | has '"PRIORITY":"4"' || fail "the warning is not PRIORITY 4"
ts_step "journal priorities: -p warning selects the warning only; PRIORITY 4/5/6 as logged"
echo "deploy: systemd end to end passed in $(ts_elapsed) s"
