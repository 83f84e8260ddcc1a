#!/usr/bin/env bash
# Same-machine comparison: the host-built `iwarp` binary runs inside the siw guest, so this
# stack's `iwarp bench` (kernel TCP on the guest's loopback) and perftest over siw (server and
# client in the guest, siw0 on eth0, to the guest's own address, which TCP carries over the
# loopback) run on the same emulated machine.
# TCG distorts absolute numbers, not the comparison. Prints both results and their ratio; a
# measurement, not a test (exit status 0 when both ran).
#
#   compare.sh [SIZE] [SECONDS]      defaults: 65536 bytes, 3 s per measurement
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"
SIZE="${1:-65536}" SECS="${2:-3}"
BIN="${IWARP_BIN:-$ROOT/target/release/iwarp}"
[ -x "$BIN" ] || iw_die "$BIN is not built (cargo build --release --bin iwarp)"
base="$(bash "$HERE/build-guest.sh" | tail -1)"
work="$(mktemp -d /tmp/iwarp-compare.XXXXXX)"
# A second cpio archive appended to the image's initramfs brings the binary in (the kernel
# unpacks concatenated archives in order).
mkdir -p "$work/root/opt"
strip -o "$work/root/opt/iwarp" "$BIN"
(cd "$work/root" && find . | cpio -o -H newc --quiet) > "$work/extra.cpio"
mkdir -p "$work/img"
ln -s "$base/vmlinux" "$work/img/vmlinux"
cat "$base/initrd.img" "$work/extra.cpio" > "$work/img/initrd.img"
export IW_IMG="$work/img"
cmd="timeout 120 ib_write_bw -R -d siw0 -s $SIZE -D $SECS > /tmp/srv 2>&1 & sleep 3; "
cmd+="timeout 120 ib_write_bw -R -d siw0 -s $SIZE -D $SECS $IW_GUEST_IP 2>&1 | sed 's/^/[siw] /'; wait; "
cmd+="timeout 300 /opt/iwarp bench --ops write --sizes $SIZE --duration $SECS --poll adaptive --quiet 2>&1 | sed 's/^/[iwarp] /'"
iw_setup_ns
iw_boot "$work" --max 600 --cmd "$cmd"
iw_wait_exit 600 || true
grep -E '^\[(siw|iwarp)\]' "$IW_SERIAL" || { cat "$IW_SERIAL"; iw_die "no results (log $IW_SERIAL)"; }
siw="$(grep -E "^\[siw\] +$SIZE " "$IW_SERIAL" | awk '{print $5}' | head -1)"
iw="$(grep -E "^\[iwarp\] +[0-9]+K? \|" "$IW_SERIAL" | head -1 | awk -F'|' '{print $2}' | awk '{print $1}')"
echo "guest (TCG, 1 vCPU): siw ib_write_bw ${siw:-?} MB/s; iwarp bench write ${iw:-?} GB/s"
if [ -n "$siw" ] && [ -n "$iw" ]; then
  awk -v s="$siw" -v i="$iw" 'BEGIN { if (s > 0) printf "ratio iwarp/siw (same emulated machine): %.2f\n", (i * 1000) / s }'
fi
