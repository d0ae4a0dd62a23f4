#!/usr/bin/env bash
# Installs the Debian 12 packages Tessera builds, tests and runs with, when any is missing.
# Used by tests/run.sh and deploy/local/demo.sh. Needs root (or sudo) only when something
# is missing. Extra package names may be given as arguments.
set -euo pipefail

pkgs=(meson ninja-build pkg-config gcc clang protobuf-c-compiler libprotobuf-c-dev libuv1-dev
      libopenblas-dev libconfig-dev libsodium-dev libssl-dev zlib1g-dev libcjson-dev libcmocka-dev
      libmicrohttpd-dev libsystemd-dev dataset-fashion-mnist openssl "$@")

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
