#!/usr/bin/env bash
# The systemd units as `meson install` installs them: `systemd-analyze verify` accepts both
# (any warning fails the test), their hardening scores as safe, and the install puts
# binaries, units and the example job file in place. Skips (77), saying why, without
# systemd-analyze, or after the other checks when `systemd-analyze security --offline`
# cannot score the units here (CONTRIBUTING.md: a check that needs something optional).
# BUILD_DIR is the build under test.
set -uo pipefail
build=${BUILD_DIR:?BUILD_DIR must name the build directory}
fail() { echo "FAIL: $*"; exit 1; }
command -v systemd-analyze >/dev/null || { echo "SKIP: no systemd-analyze (apt-get install systemd)"; exit 77; }

tmp=$(mktemp -d /tmp/tessera-systemd-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
meson install -C "$build" --no-rebuild --destdir "$tmp/root" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "meson install failed"; }
units=$(find "$tmp/root" -name 'tessera-*@.service')
[ "$(echo "$units" | wc -l)" -eq 2 ] || fail "expected two units, found: $units"
for b in ps-server ps-worker psctl; do
  [ -x "$(find "$tmp/root" -path "*/bin/$b" | head -n1)" ] || fail "$b is not installed"
done
[ -n "$(find "$tmp/root" -path '*/tessera/job.cfg.example')" ] || fail "no example job file installed"
[ -n "$(find "$tmp/root" -path '*/doc/tessera/operations.md')" ] || fail "no operator's guide installed"

# Verify with ExecStart pointing at this build's binaries (verify checks they exist).
mkdir -p "$tmp/units"
for u in $units; do
  sed -e "s|^ExecStart=[^ ]*/ps-server|ExecStart=$build/server/ps-server|" \
      -e "s|^ExecStart=[^ ]*/ps-worker|ExecStart=$build/worker/ps-worker|" "$u" >"$tmp/units/$(basename "$u")"
done
grep -q '^Type=notify$' "$tmp/units/tessera-ps@.service" || fail "ps unit is not Type=notify"
grep -q '^WatchdogSec=' "$tmp/units/tessera-ps@.service" || fail "ps unit has no watchdog"
out=$(systemd-analyze verify --man=no "$tmp/units/tessera-ps@0.service" "$tmp/units/tessera-worker@1.service" 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "systemd-analyze verify exited $rc: $out"
[ -z "$out" ] || fail "systemd-analyze verify warns: $out"

# A deliberately broken copy must be caught, or the check above proves nothing.
sed 's/^Type=notify$/Type=notifyy/' "$tmp/units/tessera-ps@.service" >"$tmp/units/broken@.service"
out=$(systemd-analyze verify --man=no "$tmp/units/broken@0.service" 2>&1)
[ -n "$out" ] || fail "systemd-analyze verify does not report a bad Type="

# Exposure score (0 safest .. 10): the shard is locked down, the GPU worker nearly so.
if systemd-analyze security --offline=yes "$tmp/units/tessera-ps@0.service" >"$tmp/sec" 2>&1; then
  score=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$tmp/sec")
  echo "exposure of tessera-ps@0: $score"
  awk -v s="$score" 'BEGIN { exit !(s != "" && s <= 2.5) }' || fail "exposure $score > 2.5"
  systemd-analyze security --offline=yes "$tmp/units/tessera-worker@0.service" >"$tmp/sec" 2>&1
  score=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$tmp/sec")
  echo "exposure of tessera-worker@0: $score"
  awk -v s="$score" 'BEGIN { exit !(s != "" && s <= 4.0) }' || fail "exposure $score > 4.0"
else
  echo "systemd units: verified, but not scored:"
  echo "SKIP: systemd-analyze security --offline=yes cannot score a unit here (systemd < 252?): $(head -n1 "$tmp/sec")"
  exit 77
fi
echo "systemd units: verified"
