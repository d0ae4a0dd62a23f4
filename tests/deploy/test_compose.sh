#!/usr/bin/env bash
# deploy/docker end to end: builds tessera:dev from deploy/docker/Dockerfile on a base image
# made without any registry (docker_env.sh), brings up docker-compose.yml with its .env
# (the CPU profile: two shards, two workers), and checks that both workers print their
# `done:` line and exit 0, that `psctl status` inside the compose network sees both shards
# and both workers done, that the shards' admin ports answer on the host's loopback, and
# that stopping a shard writes its final checkpoint. The compose project is removed at exit.
# Exits 77 (skip) with the reason where no Docker engine can run.
# Environment: SOURCE_ROOT (the repository).
set -uo pipefail
src=${SOURCE_ROOT:?SOURCE_ROOT must name the repository}
. "$src/tests/deploy/docker_env.sh"

if command -v docker-compose >/dev/null; then
  compose_cmd=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  compose_cmd=(docker compose)
else
  ts_skip "neither docker-compose nor docker compose (apt-get install docker-compose)"
fi
ts_docker_init
ts_base_image
ts_can_run

ts_build -f "$src/deploy/docker/Dockerfile" --target runtime -t tessera:dev "$src" \
  >"$TS_TMP/build.log" 2>&1 || { tail -40 "$TS_TMP/build.log"; ts_fail "docker build of tessera:dev failed"; }
ts_step "built tessera:dev (deploy/docker/Dockerfile, target runtime)"

project=tessera-e2e
files=(-f "$src/deploy/docker/docker-compose.yml")
# The shipped file publishes the admin ports on 127.0.0.1:9100-9101 and 9200-9201. Where
# another program holds one, a copy without published ports is used instead (compose
# cannot remove list entries with an override file), and the loopback check is left out.
busy=$(ss -Hltn 2>/dev/null | awk '{ print $4 }' | grep -E ':(9100|9101|9200|9201)$' | tr '\n' ' ')
if [ -n "$busy" ]; then
  echo "deploy: ports in use on this host: $busy-> composing a copy without published ports"
  sed '/^ *ports: \[/d' "$src/deploy/docker/docker-compose.yml" >"$TS_TMP/noports.yml" ||
    ts_fail "cannot write the port-less copy"
  files=(-f "$TS_TMP/noports.yml")
fi
# COMPOSE_PROFILES comes from deploy/docker/.env, as for a user (not from this environment).
compose() { env -u COMPOSE_PROFILES -u COMPOSE_FILE "${compose_cmd[@]}" -p "$project" \
  --project-directory "$src/deploy/docker" "${files[@]}" "$@"; }
compose down -v --remove-orphans >/dev/null 2>&1 # a project left by a killed run
ts_on_exit 'compose logs --no-color >"$TS_TMP/compose.log" 2>&1; [ -f "$TS_TMP/failed" ] && tail -60 "$TS_TMP/compose.log"; compose down -v --remove-orphans >/dev/null 2>&1'
fail() { touch "$TS_TMP/failed"; ts_fail "$@"; }

compose up -d >"$TS_TMP/up.log" 2>&1 || { cat "$TS_TMP/up.log"; fail "docker-compose up failed"; }
ts_step "docker-compose up -d: $(docker ps -a --filter "label=com.docker.compose.project=$project" \
  --format '{{.Label "com.docker.compose.service"}}' | sort | tr '\n' ' ')"

for w in worker0 worker1; do
  id=$(compose ps -q "$w")
  [ -n "$id" ] || fail "$w was not created (is COMPOSE_PROFILES=cpu in deploy/docker/.env?)"
  rc=$(timeout 300 docker wait "$id") || fail "$w did not finish in 300 s"
  [ "$rc" = 0 ] || fail "$w exited $rc"
  compose logs --no-color "$w" >"$TS_TMP/$w.log" 2>&1
  task=${w#worker}
  grep -qE "done: task=$task steps=468 .*test_accuracy=0\.[5-9]" "$TS_TMP/$w.log" ||
    { tail -20 "$TS_TMP/$w.log"; fail "$w printed no done: line with 468 steps and test accuracy >= 0.5"; }
  echo "deploy: $w: $(grep -oE 'done: .*' "$TS_TMP/$w.log")"
done
ts_step "both workers trained and exited 0"

compose exec -T ps0 psctl -c /etc/tessera/job.cfg status >"$TS_TMP/status" 2>&1 ||
  { cat "$TS_TMP/status"; fail "psctl status inside the compose network exited non-zero"; }
cat "$TS_TMP/status"
grep -q "step 468, 2 of 2 shard(s) up, 2 worker(s)" "$TS_TMP/status" || fail "psctl status: not both shards at step 468"
[ "$(grep -cE '^[01] +468 .* stopped +/cpu:0$' "$TS_TMP/status")" = 2 ] || fail "psctl status: not both workers done at step 468"
grep -qE "^final test accuracy: 0\.[5-9][0-9]* \(worker [01] evaluated the final parameters\)" "$TS_TMP/status" ||
  fail "psctl status: no final test accuracy of the job"
ts_step "psctl status (in ps0's container) sees both shards and both workers done"

if [ -z "$busy" ]; then
  for port in 9100 9101; do
    curl -sf "http://127.0.0.1:$port/metrics" | has '^tessera_build_info{.*role="ps"' ||
      fail "shard /metrics on 127.0.0.1:$port (published port) does not answer"
  done
  ts_step "the shards' /metrics answer on 127.0.0.1:9100 and 9101"
fi

# SIGTERM through init: true; the parameters changed since the last 60 s checkpoint.
compose stop ps0 ps1 >"$TS_TMP/stop.log" 2>&1 || { cat "$TS_TMP/stop.log"; fail "docker-compose stop failed"; }
for s in ps0 ps1; do
  id=$(compose ps -q "$s")
  rc=$(docker inspect -f '{{.State.ExitCode}}' "$id")
  [ "$rc" = 0 ] || fail "$s exited $rc on docker-compose stop"
  compose logs --no-color "$s" >"$TS_TMP/$s.log" 2>&1
  grep -q "writing a final checkpoint before stopping" "$TS_TMP/$s.log" &&
    grep -qE "checkpoint written: .*\(step 468," "$TS_TMP/$s.log" ||
    { tail -10 "$TS_TMP/$s.log"; fail "$s wrote no final checkpoint at step 468 on stop"; }
done
ts_step "docker-compose stop: both shards wrote a final checkpoint at step 468 and exited 0"
echo "deploy: compose end to end passed in $(ts_elapsed) s"
