#!/usr/bin/env bash
# The Python package's tests: builds python/ (the tessera package and its C extension) into
# a virtual environment and runs tests/python with pytest against the C build's ps-server.
# Ends with `python: N passed, N failed, N skipped` (tests/run.sh adds it to its own count);
# exits non-zero on any failure, or when nothing ran.
#
# Environment:
#   TESSERA_BUILD_DIR  the C build with server/ps-server (default: build-test, as tests/run.sh)
#   TESSERA_VENV       the virtual environment (default: one per set of requirements under
#                      ~/.cache/tessera/, reused while python/pyproject.toml, this script and
#                      the Python version are unchanged)
#   PYTHON             the interpreter to make it with (default python3; needs venv, pip
#                      and its headers: Debian's python3-venv, python3-pip, python3-dev)
#   PYTEST_ARGS        extra pytest arguments (-k sync, -x ...)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

done_line() { echo "python: $1 passed, $2 failed, $3 skipped"; }

build=${TESSERA_BUILD_DIR:-build-test}
case $build in /*) ;; *) build="$root/$build" ;; esac
if [ ! -x "$build/server/ps-server" ]; then
  echo "python: $build/server/ps-server missing: build the C tree first"
  done_line 0 1 0
  exit 1
fi

py=${PYTHON:-python3}
# The packages the tests need besides the build requirements of python/pyproject.toml;
# tensorflow-cpu for tessera.keras (tests/python/test_keras*.py skip without it).
reqs="meson-python>=0.15 meson>=0.63.3 ninja numpy pytest tensorflow-cpu>=2.16"
key=$( { cat python/pyproject.toml tests/python/run.sh; "$py" -c 'import sys; print(sys.version)'; echo "$reqs"; } |
  sha256sum | cut -c1-16)
venv=${TESSERA_VENV:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/tessera/venv-$key}

t0=$(date +%s)
if [ ! -f "$venv/.tessera-ready" ]; then
  echo "== python: making $venv"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  if ! "$py" -m venv "$venv" ||
     ! "$venv/bin/python" -m pip install -q --upgrade pip ||
     ! "$venv/bin/python" -m pip install -q $reqs; then
    echo "python: could not make the virtual environment $venv"
    rm -rf "$venv"
    done_line 0 1 0
    exit 1
  fi
  touch "$venv/.tessera-ready"
fi
touch "$venv/.tessera-ready"
# Default venvs of other requirements unused for a week go.
if [ -z "${TESSERA_VENV:-}" ]; then
  find "$(dirname "$venv")" -mindepth 2 -maxdepth 2 -name .tessera-ready -mtime +7 2>/dev/null |
    while read -r old; do [ "$(dirname "$old")" != "$venv" ] && rm -rf "$(dirname "$old")"; done
fi

# Rebuild and reinstall the package only when its sources changed: python/ and the C layers
# compiled into the extension. The build directory (build-python/, ignored by git) stays,
# so a rebuild recompiles only what changed. Without build isolation: the build
# requirements are in the venv already, and nothing is fetched.
src_key=$( { find python client net proto base config include -type f \
               ! -path 'python/.mesonpy-*' ! -path '*/__pycache__/*' -print0 | sort -z |
             xargs -0 sha256sum; echo "$venv"; } | sha256sum | cut -c1-16)
stamp="$venv/.tessera-src"
if [ "$(cat "$stamp" 2>/dev/null)" != "$src_key" ]; then
  echo "== python: building and installing python/ into $venv"
  rm -f "$stamp"
  if ! PATH="$venv/bin:$PATH" "$venv/bin/python" -m pip install -q --no-build-isolation --no-deps --force-reinstall \
       -Cbuild-dir="$root/build-python/$key" ./python; then
    echo "python: pip install ./python failed"
    done_line 0 1 0
    exit 1
  fi
  echo "$src_key" >"$stamp"
fi
t1=$(date +%s)
echo "== python: environment ready in $((t1 - t0)) s; pytest tests/python"

xml=$(mktemp /tmp/tessera-pytest-XXXXXX.xml)
# From tests/python, so the checkout's python/src is not on sys.path: the tests import the
# installed package. No cache directory is written into the checkout.
( cd tests/python &&
  TESSERA_BUILD_DIR="$build" "$venv/bin/python" -m pytest -p no:cacheprovider -q -rs \
    --junitxml="$xml" ${PYTEST_ARGS:-} . )
rc=$?

# The counts from the JUnit XML: tests, failures, errors and skipped of every suite.
counts=$("$venv/bin/python" - "$xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET
try:
    r = ET.parse(sys.argv[1]).getroot()
except Exception:
    print("0 0 0")
    raise SystemExit
suites = [r] if r.tag == "testsuite" else r.findall("testsuite")
t = f = s = 0
for x in suites:
    t += int(x.get("tests", 0))
    f += int(x.get("failures", 0)) + int(x.get("errors", 0))
    s += int(x.get("skipped", 0))
print(t - f - s, f, s)
EOF
)
rm -f "$xml"
read -r passed failed skipped <<<"$counts"
# pytest failing without a failed test (a collection error, exit 5 for no tests) fails too.
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "== python: $(( $(date +%s) - t0 )) s in all"
done_line "$passed" "$failed" "$skipped"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
