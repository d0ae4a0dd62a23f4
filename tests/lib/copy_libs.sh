#!/usr/bin/env bash
# Copies into DEST every shared library that PROG... load (as ldd resolves them here) and
# another machine of the same architecture may lack: all but the C runtime (glibc's,
# libgcc_s, libstdc++) and CUDA's and NVIDIA's, which must be that machine's own (they
# match its driver). Used by tests/gpu/pack.sh and bench/pack_sparse.sh.
#
# usage: tests/lib/copy_libs.sh DEST PROG...
set -euo pipefail
dest=$1
shift
mkdir -p "$dest"
skip='/(ld-linux[^/]*|lib(c|m|dl|pthread|rt|util|resolv|gcc_s|stdc\+\+)\.so[^/]*|libcud[^/]*|libcublas[^/]*|libnccl[^/]*|libnv[^/]*)$'
for p in "$@"; do ldd "$p"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -v -E "$skip" | while read -r lib; do cp -L "$lib" "$dest/"; done
