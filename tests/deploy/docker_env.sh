# Sourced by the end-to-end deploy tests (suite "deploy"): a Docker engine, a client that
# builds with BuildKit, and the base image debian:bookworm-slim made without any registry.
# A test that cannot have these exits 77 (skip) with the reason.
#
#   ts_docker_init   the engine: the one DOCKER_HOST or the default socket reaches, else a
#                    dockerd (Debian's docker.io) started here on a private socket and data
#                    root, stopped at exit. Deploy tests hold a machine-wide lock meanwhile.
#   ts_base_image    debian:bookworm-slim: kept in the engine; else imported from the cached
#                    tarball; else `debootstrap --variant=minbase bookworm` from the Debian
#                    mirror apt uses, tarred into the cache (TESSERA_DEPLOY_CACHE, default
#                    ~/.cache/tessera/deploy) and imported.
#   ts_can_run       skips where the engine runs but containers cannot.
#   ts_build ARGS    docker build with BuildKit (Dockerfile.dockerignore needs it).
#   ts_on_exit CMD   cleanup, run at exit (also on failure, timeout or interrupt), last first.
#   ts_step MSG      prints MSG with the seconds since the previous step.
#
# Environment: SOURCE_ROOT (the repository); TESSERA_DOCKER_ROOT (the data root of a dockerd
# started here, default /var/lib/tessera-test-docker: it keeps the images between runs);
# TESSERA_DEPLOY_CACHE. Sets TS_TMP, a scratch directory removed at exit.

ts_skip() { echo "SKIP: $*"; exit 77; }
ts_fail() { echo "FAIL: $*"; exit 1; }

_ts_exit_cmds=()
ts_on_exit() { _ts_exit_cmds+=("$1"); }
_ts_at_exit() {
  local i
  for ((i = ${#_ts_exit_cmds[@]} - 1; i >= 0; i--)); do eval "${_ts_exit_cmds[i]}" || true; done
}
trap _ts_at_exit EXIT
trap 'echo "deploy: interrupted"; exit 1' INT TERM

TS_TMP=$(mktemp -d /tmp/tessera-deploy-XXXXXX)
ts_on_exit 'rm -rf "$TS_TMP"'

_ts_t0=$(date +%s) _ts_tstep=$_ts_t0
ts_step() {
  local now
  now=$(date +%s)
  echo "deploy: [$((now - _ts_tstep)) s] $*"
  _ts_tstep=$now
}
ts_elapsed() { echo $(($(date +%s) - _ts_t0)); }

# has GREP-ARGS: grep's exit status, reading all its input. Under pipefail, `cmd | grep -q`
# fails when grep exits at the first match and cmd dies writing into the closed pipe.
has() { grep "$@" >/dev/null; }

# poll SECONDS CMD...: runs CMD every 0.5 s until it succeeds; fails after SECONDS.
ts_poll() {
  local until=$(($(date +%s) + $1))
  shift
  while ! "$@"; do
    [ "$(date +%s)" -lt "$until" ] || return 1
    sleep 0.5
  done
}

_ts_private_sock=/run/tessera-test-docker.sock
_ts_dockerd_pidfile=/run/tessera-test-dockerd.pid

_ts_stop_dockerd() {
  local pid
  pid=$(cat "$_ts_dockerd_pidfile" 2>/dev/null) || return 0
  # A pid file left by a dockerd that died may name another process by now.
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] || { rm -f "$_ts_dockerd_pidfile"; return 0; }
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  echo "deploy: dockerd $pid did not stop in 30 s: killing it"
  kill -9 "$pid" 2>/dev/null
}

ts_docker_init() {
  command -v docker >/dev/null || ts_skip "no docker client (apt-get install docker.io)"
  # One deploy test at a time on a machine: they share the engine, names and ports.
  local lock=/tmp/tessera-deploy.lock
  [ -e "$lock" ] || (umask 0; : >"$lock") 2>/dev/null
  if command -v flock >/dev/null && [ -r "$lock" ]; then
    exec 9<"$lock"
    flock -w 900 9 || ts_skip "another deploy test held $lock for 15 min"
  fi
  if [ -z "${DOCKER_HOST:-}" ] && ! docker info >/dev/null 2>&1; then
    [ "$(id -u)" -eq 0 ] || ts_skip "no Docker engine runs here, and starting dockerd needs root"
    command -v dockerd >/dev/null ||
      ts_skip "no Docker engine runs here and there is no dockerd (apt-get install docker.io)"
    _ts_stop_dockerd # one left by a run that was killed
    export DOCKER_HOST=unix://$_ts_private_sock
    ts_on_exit _ts_stop_dockerd
    dockerd --host "$DOCKER_HOST" --pidfile "$_ts_dockerd_pidfile" \
      --data-root "${TESSERA_DOCKER_ROOT:-/var/lib/tessera-test-docker}" \
      --exec-root /run/tessera-test-docker >"$TS_TMP/dockerd.log" 2>&1 &
    local pid=$!
    local i
    for i in $(seq 1 60); do
      docker info >/dev/null 2>&1 && break
      if ! kill -0 "$pid" 2>/dev/null; then
        ts_skip "dockerd cannot start here: $(grep -E 'level=(fatal|error)|failed' "$TS_TMP/dockerd.log" | tail -3)"
      fi
      sleep 0.5
    done
    docker info >/dev/null 2>&1 || ts_skip "dockerd did not answer in 30 s: $(tail -3 "$TS_TMP/dockerd.log")"
    # Its data root is this suite's cache: keep the tagged images, drop what rebuilds of
    # them leave behind (runs after each test's own cleanup, before dockerd stops).
    ts_on_exit 'docker image prune -f >/dev/null 2>&1; docker builder prune -f --keep-storage 4GB >/dev/null 2>&1'
    ts_step "started dockerd $(docker info -f '{{.ServerVersion}}') (pid $pid, $DOCKER_HOST)"
  else
    docker info >/dev/null 2>&1 || ts_skip "the Docker engine at $DOCKER_HOST does not answer"
    ts_step "using the running Docker engine $(docker info -f '{{.ServerVersion}}')"
  fi

  # BuildKit: a client with buildx, or one of Docker 20.10-22 (docker.io's /usr/bin/docker)
  # that has it built in. Newer clients without buildx only have the legacy builder.
  TS_DOCKER_BUILD=
  local c v
  for c in docker /usr/bin/docker; do
    command -v "$c" >/dev/null || continue
    if "$c" buildx version >/dev/null 2>&1; then TS_DOCKER_BUILD=$c; break; fi
    v=$("$c" version -f '{{.Client.Version}}' 2>/dev/null)
    if [ -n "$v" ] && [ "${v%%.*}" -lt 23 ] 2>/dev/null; then TS_DOCKER_BUILD=$c; break; fi
  done
  [ -n "$TS_DOCKER_BUILD" ] ||
    ts_skip "no docker client that builds with BuildKit (install docker-buildx, or docker.io's client)"
}

ts_build() { DOCKER_BUILDKIT=1 "$TS_DOCKER_BUILD" build --progress=plain "$@"; }

# The URI of the Debian archive apt uses for bookworm (or stable).
ts_apt_mirror() {
  apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null |
    awk '$2 == "bookworm" || $2 == "stable" { print $1; exit }'
}

TS_BASE_IMAGE=debian:bookworm-slim

ts_base_image() {
  if docker image inspect "$TS_BASE_IMAGE" >/dev/null 2>&1; then
    ts_step "base image $TS_BASE_IMAGE: in the engine"
    return
  fi
  local cache=${TESSERA_DEPLOY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/deploy}
  local tarball=$cache/debian-bookworm-minbase.tar
  if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null || ts_skip "no $TS_BASE_IMAGE image and no debootstrap (apt-get install debootstrap)"
    [ "$(id -u)" -eq 0 ] || ts_skip "no $TS_BASE_IMAGE image, and debootstrap needs root"
    local mirror
    mirror=$(ts_apt_mirror)
    [ -n "$mirror" ] || ts_skip "apt's sources (/etc/apt/sources.list*) name no bookworm archive for debootstrap"
    echo "deploy: debootstrap --variant=minbase bookworm from $mirror (once; cached in $tarball)"
    if ! debootstrap --variant=minbase bookworm "$TS_TMP/rootfs" "$mirror" >"$TS_TMP/debootstrap.log" 2>&1; then
      if grep -qE "Failed getting release file|Couldn't download|Failure trying to run" "$TS_TMP/debootstrap.log"; then
        ts_skip "debootstrap could not fetch from $mirror: $(grep -E '^E:' "$TS_TMP/debootstrap.log" | tail -2)"
      fi
      tail -20 "$TS_TMP/debootstrap.log"
      ts_fail "debootstrap failed"
    fi
    mkdir -p "$cache" || ts_fail "cannot create $cache"
    # Not compressed: gzip would add half a minute to the first run and to every import.
    tar -C "$TS_TMP/rootfs" -cf "$tarball.part" . && mv "$tarball.part" "$tarball" ||
      ts_fail "cannot write $tarball"
    rm -rf "$TS_TMP/rootfs"
    ts_step "debootstrapped and cached $tarball ($(du -h "$tarball" | cut -f1))"
  fi
  docker import --change 'CMD ["bash"]' "$tarball" "$TS_BASE_IMAGE" >/dev/null ||
    ts_fail "docker import $tarball failed"
  ts_step "base image $TS_BASE_IMAGE imported from $tarball"
}

# Containers run at all (an engine may start where the kernel lets no container run).
ts_can_run() {
  docker run --rm "$TS_BASE_IMAGE" true >"$TS_TMP/run-check.log" 2>&1 ||
    ts_skip "the Docker engine runs but no container can: $(tail -2 "$TS_TMP/run-check.log")"
}
