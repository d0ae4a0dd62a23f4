#!/usr/bin/env bash
# The TensorFlow peer of bench/train.sh: makes bench/peers/.venv with tensorflow-cpu from
# PyPI (once), then runs tf_pss.py (2 ps + 2 workers + coordinator on 127.0.0.1, async, batch
# 64, Adam) for each model, RUNS times. env: RUNS (3), STEPS_SMALL (600), STEPS_LARGE (40)
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import tensorflow' 2>/dev/null; then
  python3 -m venv .venv
  timeout 900 .venv/bin/pip install -q tensorflow-cpu
fi
export TF_CPP_MIN_LOG_LEVEL=2
for run in $(seq 1 "${RUNS:-3}"); do
  timeout 600 .venv/bin/python tf_pss.py --layers 784,128,10 --steps "${STEPS_SMALL:-600}"
  timeout 600 .venv/bin/python tf_pss.py --layers 784,2048,2048,10 --steps "${STEPS_LARGE:-40}"
done
