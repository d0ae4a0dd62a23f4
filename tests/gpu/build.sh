#!/usr/bin/env bash
# Builds BUILD_DIR with the CUDA back end and cuDNN, the one configuration of the GPU checks
# (tests/gpu/run.sh builds it on the GPU machine, tests/gpu/pack.sh here to pack it); meson's
# output is appended to LOG. Exit 2: no nvcc (in PATH or /usr/local/cuda/bin); 1: the build
# failed.
#
# usage: tests/gpu/build.sh BUILD_DIR LOG
set -uo pipefail
build=$1
log=$2
export PATH="$PATH:/usr/local/cuda/bin"
command -v nvcc >/dev/null || exit 2
setup=(meson setup "$build" -Dcuda=enabled -Dcudnn=enabled -Dbuildtype=debugoptimized)
[ -f "$build/build.ninja" ] && setup+=(--reconfigure)
"${setup[@]}" >>"$log" 2>&1 && meson compile -C "$build" >>"$log" 2>&1 || exit 1
