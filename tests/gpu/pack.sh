#!/usr/bin/env bash
# Packs the GPU checks for a machine with a GPU but no network (no apt-get, no build tools):
# builds BUILD_DIR here as tests/gpu/run.sh would (CUDA back end, cuDNN; needs nvcc), then
# writes one tarball with
#   build/   the programs tests/gpu/run.sh runs and the daemons they start (ps-server,
#            ps-worker, psctl, tests/gpu/test_kernels_cuda, tests/gpu/test_training_gpu)
#   lib/     every shared library they load that a CUDA machine may lack (the Debian ones:
#            libuv, protobuf-c, OpenBLAS, ...), not glibc's, libstdc++/libgcc_s, nor CUDA's
#            and NVIDIA's (libcudart, cuBLAS, cuDNN, NCCL, the driver): the GPU machine's own
#            match its driver
#   data/    Fashion-MNIST (dataset-fashion-mnist's files)
#   paths    the build directory's and the source tree's absolute paths here: the tests
#            start the daemons by those paths (TS_PS_SERVER ...), so run.sh puts them back
#            there
# On the GPU machine, from a checkout of the same commit: PACK=FILE tests/gpu/run.sh.
#
# usage: tests/gpu/pack.sh [FILE]   (default build-gpu/tessera-gpu-pack.tar.gz)
#   env: BUILD_DIR (default build-gpu)
set -euo pipefail
cd "$(dirname "$0")/../.." || exit 1
root=$(pwd)
build=${BUILD_DIR:-build-gpu}
file=${1:-$build/tessera-gpu-pack.tar.gz}
data=/usr/share/datasets/fashion-mnist
[ -f "$data/train-images-idx3-ubyte.gz" ] || { echo "pack.sh: no $data (apt-get install dataset-fashion-mnist)" >&2; exit 1; }

rc=0
tests/gpu/build.sh "$build" /dev/null || rc=$?
[ $rc -ne 2 ] || { echo "pack.sh: no nvcc (install the CUDA toolkit in /usr/local/cuda)" >&2; exit 1; }
[ $rc -eq 0 ] || { echo "pack.sh: the build of $build failed (meson compile -C $build)" >&2; exit 1; }
progs=(server/ps-server worker/ps-worker psctl/psctl tests/gpu/test_kernels_cuda
       tests/gpu/test_training_gpu)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build" "$stage/lib" "$stage/data"
for p in "${progs[@]}"; do
  mkdir -p "$stage/build/$(dirname "$p")"
  cp "$build/$p" "$stage/build/$p"
done
tests/lib/copy_libs.sh "$stage/lib" "${progs[@]/#/$build/}"
cp "$data"/*-ubyte.gz "$stage/data/"
printf 'build=%s\nsource=%s\ncommit=%s\n' "$(cd "$build" && pwd)" "$root" \
  "$(git describe --always --dirty 2>/dev/null || echo unknown)" >"$stage/paths"
mkdir -p "$(dirname "$file")"
tar -C "$stage" -czf "$file" .
echo "$file: $(du -h "$file" | cut -f1), $(ls "$stage/lib" | wc -l) libraries"
