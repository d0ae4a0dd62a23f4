#!/usr/bin/env bash
# The functional BatchNormalization CNN of examples/python/keras_fashion_mnist.py
# (--model bn-cnn) on Tessera against plain Keras, for bench/RESULTS.md section 14:
#   tessera    2 shards + 2 Keras workers, sync, batch B each, Adam, E epochs of the whole
#              Fashion-MNIST training set: both workers' test accuracy ("done:" lines)
#   evaluator  a fresh process that builds the model and takes the shards' parameters and
#              BatchNorm statistics (--evaluate): its test accuracy
#   keras      plain Keras in one process (--local): global batch 2B, the same order and
#              Adam settings, the same initial values (--deterministic)
# usage: bench/keras_bn.sh [BUILD_DIR]   env: EPOCHS (2), BATCH (32), VENV
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
build=${1:-build}
E=${EPOCHS:-2} B=${BATCH:-32}
[ -x "$build/server/ps-server" ] || { echo "keras_bn.sh: $build/server/ps-server is not built" >&2; exit 1; }
venv=${VENV:-$(python/venv.sh)} || { echo "keras_bn.sh: python/venv.sh failed" >&2; exit 1; }
bench_start keras-bn
psp=() hp=() wp=()
for i in 0 1; do free_port p; psp+=("$p"); free_port p; hp+=("$p"); free_port p; wp+=("$p"); done
cfg=$dir/job.cfg
cat >"$cfg" <<CFG
cluster = { ps = $(list "${psp[@]}"); ps_http = $(list "${hp[@]}"); workers = $(list "${wp[@]}"); };
job = { mode = "sync"; partition_bytes = 131072; sync_timeout_s = 60.0; heartbeat_timeout_s = 60.0; };
optimizer = { name = "adam"; learning_rate = 0.001; epsilon = 1e-7; };
model = { seed = 42; };
train = { batch_size = $B; epochs = $E; };
CFG
export TF_CPP_MIN_LOG_LEVEL=2 OMP_NUM_THREADS=1
ex=(timeout 1800 "$venv/bin/python" examples/python/keras_fashion_mnist.py -c "$cfg" --threads 1
    --model bn-cnn)
for s in 0 1; do
  "$build/server/ps-server" -c "$cfg" --shard $s --log-level warn 2>"$dir/ps$s.log" </dev/null &
  pids+=($!)
done
for port in "${psp[@]}"; do
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
done
t0=$(date +%s)
wpids=()
for t in 0 1; do "${ex[@]}" --task $t --deterministic >"$dir/w$t.out" 2>"$dir/w$t.log" & wpids+=($!); done
fail=0
for w in "${wpids[@]}"; do wait "$w" || fail=1; done
t1=$(date +%s)
[ $fail = 0 ] || { cat "$dir"/w*.log >&2; echo "keras_bn.sh: a worker failed" >&2; exit 1; }
"${ex[@]}" --task 0 --evaluate >"$dir/eval.out" 2>"$dir/eval.log" || { cat "$dir/eval.log" >&2; exit 1; }
stop_all
"${ex[@]}" --local --deterministic --set "train.batch_size=$((2 * B))" >"$dir/local.out" \
  2>"$dir/local.log" || { cat "$dir/local.log" >&2; exit 1; }
t2=$(date +%s)
acc() { sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p' "$1" | head -1; }
echo "date=$(date -u +%FT%TZ) epochs=$E batch=$B tessera_s=$((t1 - t0)) keras_s=$((t2 - t1))"
echo "tessera task0=$(acc "$dir/w0.out") task1=$(acc "$dir/w1.out") evaluator=$(acc "$dir/eval.out") keras=$(acc "$dir/local.out")"
