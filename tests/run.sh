#!/usr/bin/env bash
# Installs what is missing, builds, runs every test suite, then builds again under
# AddressSanitizer + UndefinedBehaviorSanitizer and runs the unit and integration suites
# there. Ends with `tests: N passed, N failed, N skipped`; exits non-zero on any failure.
#
# Environment: BUILD_DIR (default build-test), SAN_BUILD_DIR (default build-san),
# TS_SKIP_SANITIZE=1 to skip the sanitizer pass while iterating, TS_SKIP_DEPLOY=1 to skip
# the deploy suite (Docker end to end).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

bash deploy/install-deps.sh || { echo "tests: 0 passed, 1 failed"; exit 1; }

# Checking tools of the operations tests: PyYAML and docker-compose (deploy files) and zsh
# (psctl's zsh completion) from Debian; promtool (`promtool check metrics`) unpacked from
# Debian's prometheus package into .tools/ rather than installed, so no Prometheus server
# gets enabled on this machine.
# Tests whose tool is missing skip.
bash deploy/install-deps.sh python3-yaml docker-compose zsh || echo "tests: no PyYAML/docker-compose/zsh; those checks skip"
# The end-to-end deploy suite: Debian's Docker engine (the tests use a running one, or start
# dockerd themselves and stop it after) and debootstrap for their base image. Without them
# those tests skip, saying why.
bash deploy/install-deps.sh docker.io debootstrap || echo "tests: no docker.io/debootstrap; the deploy suite skips"
# The Python package (tests/python/run_pytest.sh) builds its extension in a venv: venv, pip and the
# interpreter's headers.
bash deploy/install-deps.sh python3-dev python3-venv python3-pip ||
  echo "tests: no python3-dev/python3-venv/python3-pip; the Python pass will fail"
if ! command -v promtool >/dev/null; then
  if [ ! -x .tools/usr/bin/promtool ]; then
    ( mkdir -p .tools && cd .tools && apt-get download prometheus >/dev/null 2>&1 &&
      dpkg-deb -x prometheus_*.deb . && rm -f prometheus_*.deb ) ||
      echo "tests: could not fetch promtool; the promtool checks skip"
  fi
  [ -x .tools/usr/bin/promtool ] && export PATH="$root/.tools/usr/bin:$PATH"
fi

build=${BUILD_DIR:-build-test}
san=${SAN_BUILD_DIR:-build-san}
jobs=$(nproc)
passed=0 failed=0 skipped=0

# meson test writes testlog.json (testlog-SETUP.json under --setup SETUP); count its
# results so the closing line sums every pass.
count() { # build-dir [log name]
  local log="$1/meson-logs/${2:-testlog}.json"
  [ -f "$log" ] || { failed=$((failed + 1)); return; }
  local p f s
  p=$(grep -c '"result": "OK"' "$log")
  s=$(grep -c '"result": "SKIP"' "$log")
  f=$(grep -c -E '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log")
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
}

setup() { # dir, meson args...
  local dir=$1; shift
  if [ -d "$dir" ]; then
    meson setup --reconfigure "$dir" "$@" >"$dir.setup.log" 2>&1 || meson setup --wipe "$dir" "$@" >"$dir.setup.log" 2>&1
  else
    meson setup "$dir" "$@" >"$dir.setup.log" 2>&1
  fi || { cat "$dir.setup.log"; return 1; }
}

run_pass() { # name, dir, suites, meson args...
  local name=$1 dir=$2 suites=$3; shift 3
  echo "== $name: configure and build ($dir)"
  if ! setup "$dir" "$@" || ! meson compile -C "$dir" -j "$jobs"; then
    echo "== $name: build FAILED"
    failed=$((failed + 1))
    return
  fi
  built=1
  echo "== $name: test (suites: $suites)"
  local args=()
  for s in $suites; do args+=(--suite "$s"); done
  rm -f "$dir/meson-logs/testlog.json"
  meson test -C "$dir" --print-errorlogs --num-processes "$jobs" "${args[@]}"
  count "$dir"
}

built=0
run_pass "main" "$build" "unit integration system fuzz" -Dwerror=true -Dbuildtype=debugoptimized

# The deploy suite: end to end on a Docker engine (tests/deploy/docker_env.sh), one test at a
# time, every line shown so a skip says why. Counted with the others; TS_SKIP_DEPLOY=1
# leaves it out.
if [ "${TS_SKIP_DEPLOY:-0}" != 1 ] && [ "$built" = 1 ]; then
  echo "== deploy: end to end (docker-compose, systemd in a container)"
  rm -f "$build/meson-logs/testlog-deploy.json"
  meson test -C "$build" --setup deploy --suite deploy --num-processes 1 --verbose
  count "$build" testlog-deploy
elif [ "$built" = 1 ]; then
  n=$(meson test -C "$build" --setup deploy --suite deploy --list 2>/dev/null | grep -c deploy_)
  echo "== deploy: $n test(s) skipped: TS_SKIP_DEPLOY=1"
  skipped=$((skipped + n))
fi

# The Python package against the main build's ps-server; its closing line
# `python: N passed, N failed, N skipped` adds to the count.
if [ "${TS_SKIP_PYTHON:-0}" != 1 ] && [ "$built" = 1 ]; then
  echo "== python: tests/python/run_pytest.sh"
  pylog=$(mktemp /tmp/tessera-python-XXXXXX.log)
  TESSERA_BUILD_DIR="$build" bash tests/python/run_pytest.sh 2>&1 | tee "$pylog"
  line=$(grep -E '^python: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$pylog" | tail -1)
  rm -f "$pylog"
  if [ -n "$line" ]; then
    read -r p f s <<<"$(echo "$line" | sed -E 's/^python: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped$/\1 \2 \3/')"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  else
    failed=$((failed + 1))
  fi
fi
if [ "${TS_SKIP_SANITIZE:-0}" != 1 ]; then
  # CUDA objects are not instrumented: the sanitizer pass builds the CPU back end only.
  run_pass "sanitize" "$san" "unit integration" -Dwerror=true -Dbuildtype=debug \
    -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled
fi

echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
