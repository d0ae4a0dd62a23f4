#!/usr/bin/env bash
# Packs bench/sparse_compare.sh's programs for a machine without a network or build tools (as
# tests/gpu/pack.sh packs the GPU checks): BUILD_DIR's sparsebench and ps-server, the ps-lite
# peer (built from PSLITE_DIR when BUILD_DIR has none), and every shared library they load
# but glibc's and libstdc++'s, libjemalloc included. The tarball's run.sh, started from a
# checkout of the same commit, puts the two programs back at the path they were built at
# (sparsebench starts ps-server by it) and runs bench/sparse_compare.sh with the packed
# peer and libraries; the environment (GRID, ROUNDS, OUT, ...) goes through.
#
# usage: [PSLITE_DIR=...] bench/pack_sparse.sh [BUILD_DIR] [FILE]
#        (defaults build-rel, BUILD_DIR/tessera-sparse-pack.tar.gz)
# there: d=$(mktemp -d); tar -C $d -xzf FILE; LOAD_MAX=99 GRID=... $d/run.sh
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${1:-build-rel}
file=${2:-$build/tessera-sparse-pack.tar.gz}
for b in bench/sparsebench server/ps-server; do
  [ -x "$build/$b" ] || { echo "pack_sparse.sh: $build/$b is not built" >&2; exit 1; }
done
peer=$build/bench/peers/pslite/pslite_sparse
[ -x "$peer" ] || bench/peers/pslite/build.sh "$build/bench/peers/pslite" >/dev/null
jemalloc=$(ldconfig -p | awk '/libjemalloc.so.2 / {print $NF; exit}')
[ -n "$jemalloc" ] || { echo "pack_sparse.sh: no libjemalloc.so.2 (apt-get install libjemalloc2)" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/bench" "$stage/build/server" "$stage/lib"
cp "$build/bench/sparsebench" "$stage/build/bench/"
cp "$build/server/ps-server" "$stage/build/server/"
cp "$peer" "$stage/pslite_sparse"
tests/lib/copy_libs.sh "$stage/lib" "$stage/build/bench/sparsebench" \
  "$stage/build/server/ps-server" "$stage/pslite_sparse"
cp -L "$jemalloc" "$stage/lib/"
printf 'build=%s\ncommit=%s\n' "$(cd "$build" && pwd)" \
  "$(git describe --always --dirty 2>/dev/null || echo unknown)" >"$stage/paths"
cat >"$stage/run.sh" <<'EOF'
#!/usr/bin/env bash
# Run from the checkout: puts the packed programs back and runs bench/sparse_compare.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(sed -n 's/^build=//p' "$here/paths")
mkdir -p "$build" && cp -a "$here/build/." "$build/"
echo "# packed at $(sed -n 's/^commit=//p' "$here/paths"); programs in $build" >&2
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PSLITE_BIN=$here/pslite_sparse JEMALLOC=$here/lib/libjemalloc.so.2 \
  exec bash bench/sparse_compare.sh "$build"
EOF
chmod +x "$stage/run.sh"
mkdir -p "$(dirname "$file")"
tar -C "$stage" -czf "$file" .
echo "$file: $(du -h "$file" | cut -f1), $(ls "$stage/lib" | wc -l) libraries"
