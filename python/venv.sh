#!/usr/bin/env bash
# Makes (or reuses) a virtual environment with the tessera package built from this checkout
# and what its tests, examples and the Keras layer need (pytest, numpy, tensorflow-cpu);
# prints its path on stdout, progress on stderr. Used by tests/python/run_pytest.sh and
# deploy/local/demo.sh --keras.
#
#   venv=$(python/venv.sh) && "$venv/bin/python" examples/python/keras_fashion_mnist.py ...
#
# Environment:
#   TESSERA_VENV  the virtual environment (default: one per set of requirements under
#                 ~/.cache/tessera/, reused while python/pyproject.toml, this script and the
#                 Python version are unchanged; others unused for a week are removed)
#   PYTHON        the interpreter to make it with (default python3; needs venv, pip and its
#                 headers: Debian's python3-venv, python3-pip, python3-dev)
# The package is rebuilt and reinstalled only when its sources changed (python/ and the C
# layers compiled into the extension); its build directory is build-python/ (ignored).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

py=${PYTHON:-python3}
# The build requirements of python/pyproject.toml, then the tests' and tessera.keras's.
reqs="meson-python>=0.15 meson>=0.63.3 ninja numpy pytest tensorflow-cpu>=2.16"
key=$( { cat python/pyproject.toml python/venv.sh; "$py" -c 'import sys; print(sys.version)'; echo "$reqs"; } |
  sha256sum | cut -c1-16)
venv=${TESSERA_VENV:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/tessera/venv-$key}

if [ ! -f "$venv/.tessera-ready" ]; then
  echo "== python: making $venv" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  if ! "$py" -m venv "$venv" >&2 ||
     ! "$venv/bin/python" -m pip install -q --upgrade pip >&2 ||
     ! "$venv/bin/python" -m pip install -q $reqs >&2; then
    echo "python: could not make the virtual environment $venv" >&2
    rm -rf "$venv"
    exit 1
  fi
fi
touch "$venv/.tessera-ready"
# Default venvs of other requirements unused for a week go.
if [ -z "${TESSERA_VENV:-}" ]; then
  find "$(dirname "$venv")" -mindepth 2 -maxdepth 2 -name .tessera-ready -mtime +7 2>/dev/null |
    while read -r old; do [ "$(dirname "$old")" != "$venv" ] && rm -rf "$(dirname "$old")"; done
fi

# Without build isolation: the build requirements are in the venv already, nothing fetched.
src_key=$( { find python client net proto base config include -type f \
               ! -path 'python/.mesonpy-*' ! -path '*/__pycache__/*' -print0 | sort -z |
             xargs -0 sha256sum; echo "$venv"; } | sha256sum | cut -c1-16)
stamp="$venv/.tessera-src"
if [ "$(cat "$stamp" 2>/dev/null)" != "$src_key" ]; then
  echo "== python: building and installing python/ into $venv" >&2
  rm -f "$stamp"
  if ! PATH="$venv/bin:$PATH" "$venv/bin/python" -m pip install -q --no-build-isolation --no-deps --force-reinstall \
       -Cbuild-dir="$root/build-python/$key" ./python >&2; then
    echo "python: pip install ./python failed" >&2
    exit 1
  fi
  echo "$src_key" >"$stamp"
fi
echo "$venv"
