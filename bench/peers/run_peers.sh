#!/usr/bin/env bash
# Tessera against TensorFlow's own parameter-server training on the job of bench/train.sh
# (2 ps + 2 workers on 127.0.0.1, the MLP, batch 64 per worker, Adam 0.002), in alternating
# rounds so each ratio compares runs minutes apart on this machine whose speed moves:
#   tessera  bench/train.sh, one run: the cluster in async and in sync (examples over the
#            workers' common training window)
#   tf_pss   tf_pss.py: TF2's ParameterServerStrategy (asynchronous only) + its coordinator
#   tf_sync  tf_sync.py: TF1's SyncReplicasOptimizer (the book chapter's synchronous
#            training), window-based like Tessera's
# TensorFlow comes from python/venv.sh's virtual environment (tensorflow-cpu from PyPI).
#
# usage: bench/peers/run_peers.sh [BUILD_DIR]
#   env: RUNS (5), MODELS ("small large"), TF_STEPS_SMALL (600), TF_STEPS_LARGE (40),
#        STEPS_SMALL (900: within train.sh's one epoch), STEPS_LARGE (60) for Tessera, VENV (default: python/venv.sh's)
# Output: train.sh's and the peers' lines (run=R), then "# summary" lines: medians with
# min-max, and the medians of the round-by-round ratios Tessera / TensorFlow per mode.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
runs=${RUNS:-5}
models=${MODELS:-small large}
venv=${VENV:-$(python/venv.sh)} || { echo "run_peers.sh: python/venv.sh failed" >&2; exit 1; }
export TF_CPP_MIN_LOG_LEVEL=2
lines=$(mktemp /tmp/tessera-peers-XXXXXX)
trap 'rm -f "$lines"' EXIT

echo "# $(date -u +%FT%TZ) nproc=$(nproc) cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\""
for model in $models; do
  if [ "$model" = small ]; then layers=784,128,10 tf_steps=${TF_STEPS_SMALL:-600}
  else layers=784,2048,2048,10 tf_steps=${TF_STEPS_LARGE:-40}; fi
  for run in $(seq 1 "$runs"); do
    RUNS=1 MODELS=$model MODES="async sync" STEPS_SMALL=${STEPS_SMALL:-900} \
      STEPS_LARGE=${STEPS_LARGE:-60} bench/train.sh "$build" 2>&1 |
      grep '^what=cluster' | sed "s/ run=1 / run=$run /" | tee -a "$lines"
    for peer in tf_pss tf_sync; do
      timeout 900 "$venv/bin/python" "bench/peers/$peer.py" --layers "$layers" --steps "$tf_steps" |
        sed "s/^what=$peer model=\([^ ]*\) mode=\([a-z]*\) /what=$peer model=\1 mode=\2 run=$run /" |
        tee -a "$lines"
    done
  done
done

python3 - "$lines" <<'PY'
import re, statistics, sys
rows = [dict(re.findall(r'(\w+)=(\S+)', l)) for l in open(sys.argv[1]) if l.startswith('what=')]
ok = [r for r in rows if re.match(r'^[0-9.]+$', r.get('examples_per_sec', ''))]
groups = {}
for r in ok:
    groups.setdefault((r['model'], r['what'], r['mode']), []).append(r)
for (model, what, mode), rs in sorted(groups.items()):
    eps = [float(r['examples_per_sec']) for r in rs]
    print(f"# summary model={model} what={what} mode={mode} runs={len(eps)} "
          f"examples_per_sec_median={statistics.median(eps):.0f} min={min(eps):.0f} max={max(eps):.0f}")
peer = {'async': 'tf_pss', 'sync': 'tf_sync'}
for (model, what, mode), rs in sorted(groups.items()):
    if what != 'cluster':
        continue
    tf = {r['run']: float(r['examples_per_sec']) for r in groups.get((model, peer[mode], mode), [])}
    ratios = [float(r['examples_per_sec']) / tf[r['run']] for r in rs if r['run'] in tf]
    if ratios:
        print(f"# summary model={model} tessera_{mode}/{peer[mode]} ratio_median="
              f"{statistics.median(ratios):.1f} min={min(ratios):.1f} max={max(ratios):.1f} "
              f"ratios=[{' '.join(f'{x:.1f}' for x in ratios)}]")
PY
