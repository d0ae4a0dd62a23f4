#!/usr/bin/env bash
# GPU checks, for a machine with an NVIDIA GPU and its driver (issues "GPU workers" and
# "Convolutional models"). Installs what is missing (deploy/install-deps.sh), builds with the
# CUDA back end (sm_90 code plus PTX) and cuDNN (-Dcudnn=enabled: the build fails without it),
# then:
#   (a) every CUDA kernel against the CPU back end on fresh random inputs of several shapes,
#       outputs poisoned before each run, relative error < 1e-5 (tests/gpu/test_kernels_cuda);
#       with cuDNN, TF32 off: conv2d_fwd, conv2d_bwd_data and conv2d_bwd_filter (strides 1
#       and 2, same and valid, odd total padding, 1 to 32 channels, batches > 1) and
#       maxpool_bwd < 1e-4, maxpool_fwd (same and valid, overlapping 3x3/2) exact, mul < 1e-5,
#       and a convolution workspace smaller than conv2d_workspace asked refused (TS_EINVAL)
#   (b) Fashion-MNIST on /gpu:0 with a local 2-shard cluster, test accuracy >= 0.84
#   (c) two towers on one GPU equal one tower with twice the micro-batch
#   (d) device.memory_fraction honoured (without allow_growth: logged reservation = what the
#       GPU loses, never exceeded; with it: grown under the limit) and an over-large model
#       failing cleanly; /gpu:3 soft placement
#   (e) a table of examples/s on GPU vs CPU, and one of kernel times
#   (f) LeNet-5 split over /gpu:0 (convolutions, pooling) and /cpu:0 (dense) by device.rules:
#       one step's gradients vs the CPU back end, 25 cluster steps vs /cpu:0 (both 1e-4), one
#       epoch of Fashion-MNIST to test accuracy 0.82, each op logged on its device
# (b)-(f) are tests/gpu/test_training_gpu. Ends with `gpu: PASSED` or `gpu: FAILED (...)` and
# exits non-zero on any failure. Runs in about 5 minutes (under 8) on one H100/H200, before
# (f) was added; (f) is estimated at one to two minutes more, not yet measured.
#
# Environment: OUT (a folder for the logs: build.log, kernels.log, training.log, summary.txt;
# default build-gpu/logs), BUILD_DIR (default build-gpu), CUDA_VISIBLE_DEVICES as usual,
# PACK (a tarball of tests/gpu/pack.sh, for a machine without a network or build tools: no
# packages installed, nothing built; its programs and libraries are used instead).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
t0=$(date +%s)
build=${BUILD_DIR:-build-gpu}
out=${OUT:-$build/logs}
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
failed=()
say() { echo "$*" | tee -a "$summary"; }
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }

# PACK: put the packed build back at the path it was built at (the tests start the daemons
# by it), the source tree's path too (a link to this checkout) where it is missing, the data
# where the tests read it, and the packed libraries and the machine's CUDA ones (the CUDA
# toolkit's, or the nvidia-* Python wheels') on LD_LIBRARY_PATH.
unpack_pack() {
  local dir lib dirs="" name found missing
  dir=$(mktemp -d) && tar -C "$dir" -xzf "$PACK" || { say "gpu: FAILED (cannot unpack $PACK)"; return 1; }
  build=$(sed -n 's/^build=//p' "$dir/paths")
  local src; src=$(sed -n 's/^source=//p' "$dir/paths")
  mkdir -p "$build" && cp -a "$dir/build/." "$build/"
  if [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
  local data=/usr/share/datasets/fashion-mnist
  [ -f "$data/train-images-idx3-ubyte.gz" ] || { mkdir -p "$data" && cp "$dir"/data/* "$data/"; }
  for name in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
    found=$(find /usr/local/cuda*/ /usr/lib /usr/local/lib /opt \
              $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
              -name "$name" 2>/dev/null | head -1)
    [ -n "$found" ] && dirs="$dirs:$(dirname "$found")"
  done
  export LD_LIBRARY_PATH="$dir/lib$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  say "gpu: unpacked $PACK (commit $(sed -n 's/^commit=//p' "$dir/paths")) into $build"
  missing=$(for lib in "$build"/*/* "$build"/tests/gpu/*; do [ -x "$lib" ] && [ -f "$lib" ] && ldd "$lib"; done |
    grep "not found" | sort -u | tr -s ' \t' ' ')
  if [ -n "$missing" ]; then
    say "gpu: FAILED (libraries not found:$missing)"
    return 1
  fi
}

say "gpu: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,driver_version --format=csv,noheader \
    2>&1 | sed 's/^/gpu: nvidia-smi: /' | tee -a "$summary"
else
  say "gpu: nvidia-smi not found (is the NVIDIA driver installed?)"
fi

# A machine without a network: what tests/gpu/pack.sh built and packed elsewhere.
if [ -n "${PACK:-}" ]; then
  unpack_pack || exit 1
else
  # Dependencies: the Debian packages, and nvcc from a CUDA toolkit (/usr/local/cuda).
  if ! bash deploy/install-deps.sh >"$out/build.log" 2>&1; then
    say "gpu: FAILED (deploy/install-deps.sh; see build.log)"
    tail -20 "$out/build.log"
    exit 1
  fi
  export PATH="$PATH:/usr/local/cuda/bin"
  if ! command -v nvcc >/dev/null; then
    say "gpu: FAILED (no nvcc: install the CUDA toolkit, e.g. to /usr/local/cuda)"
    exit 1
  fi
  say "gpu: building in $build with -Dcuda=enabled -Dcudnn=enabled ($(nvcc --version | tail -1))"
  if ! tests/gpu/build.sh "$build" "$out/build.log"; then
    say "gpu: FAILED (build; see build.log; cuDNN is expected beside CUDA in /usr/local/cuda)"
    tail -30 "$out/build.log"
    exit 1
  fi
  grep -E "CUDA back end|NCCL  |cuDNN  " "$out/build.log" | tail -3 | sed 's/^/gpu: /' | tee -a "$summary"
  say "gpu: built ($(elapsed))"
fi

# (a) kernels, then their timings.
"$build/tests/gpu/test_kernels_cuda" --bench >"$out/kernels.log" 2>&1
rc=$?
if [ $rc -eq 77 ]; then
  say "gpu: SKIPPED: $(head -1 "$out/kernels.log")"
  exit 1
fi
grep -E "^(FAIL|PASSED|FAILED|seed|/gpu)" "$out/kernels.log" | tee -a "$summary"
sed -n '/^kernel times/,/^$/p' "$out/kernels.log" | tee -a "$summary"
[ $rc -eq 0 ] || failed+=("kernels")
say "gpu: (a) kernels done ($(elapsed))"

# (b)-(f) training end to end.
"$build/tests/gpu/test_training_gpu" >"$out/training.log" 2>&1
rc=$?
grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|accuracy|relative difference|memory_fraction|  \| |^\||examples/s" \
  "$out/training.log" | tee -a "$summary"
[ $rc -eq 0 ] || failed+=("training")
say "gpu: (b)-(f) training done ($(elapsed))"

if [ ${#failed[@]} -eq 0 ]; then
  say "gpu: PASSED in $(elapsed)"
  exit 0
fi
say "gpu: FAILED (${failed[*]}) in $(elapsed); logs in $out"
exit 1
