#!/usr/bin/env bash
# The Python package's tests: builds python/ (the tessera package and its C extension) into
# a virtual environment and runs tests/python with pytest against the C build's ps-server.
# Ends with `python: N passed, N failed, N skipped` (tests/run.sh adds it to its own count);
# exits non-zero on any failure, or when nothing ran.
#
# Environment:
#   TESSERA_BUILD_DIR  the C build with server/ps-server (default: build-test, as tests/run.sh)
#   TESSERA_VENV       the virtual environment (default: python/venv.sh's, one per set of
#                      requirements under ~/.cache/tessera/, with tensorflow-cpu)
#   PYTHON             the interpreter to make it with (default python3; see python/venv.sh)
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

t0=$(date +%s)
# The venv (made or reused) with the package installed: python/venv.sh.
if ! venv=$(python/venv.sh); then
  done_line 0 1 0
  exit 1
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
