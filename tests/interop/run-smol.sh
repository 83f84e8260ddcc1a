#!/usr/bin/env bash
# This stack on its own TCP/IP (smoltcp, raw Ethernet) against Linux siw in the qemu guest:
# `iwarp rping --transport smoltcp` both ways. In the test's namespace the guest's tap and one
# end of a veth pair are bridged (the kernel keeps 10.99.0.1 on the bridge); smoltcp owns the
# other veth end as 10.99.0.3, so its frames reach the guest (10.99.0.2) on the same link.
# Each case boots the guest once; prints PASS/FAIL lines and exits non-zero on any failure.
#
# Every case runs with the stack's offloads on (--offload auto: segmentation and checksums
# through the veth's virtio-net header) and off.
#
# Environment: IWARP_BIN (default target/release/iwarp), IW_IMG (guest image; built if
# unset), IWARP_SMOL_OFFLOADS (default "auto off"). Our clients run with their defaults (no
# first-FPDU delay).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${IWARP_BIN:-$ROOT/target/release/iwarp}"
[ -x "$BIN" ] || { echo "[interop-smol] FAILED: $BIN is not built" >&2; exit 1; }
export IW_IMG="${IW_IMG:-$(bash "$HERE/build-guest.sh" | tail -1)}"
SMOL_BASE="--transport smoltcp --iface vsB --ip 10.99.0.3/24"
BRIDGE="ip link add vsA type veth peer name vsB && ip link add br0 type bridge \
 && ip link set iwtap0 master br0 && ip link set vsA master br0 && ip addr flush dev iwtap0 \
 && ip addr add 10.99.0.1/24 dev br0 && ip link set br0 up && ip link set vsA up && ip link set vsB up"
FAILS=0
# A passing case's work directory (the guest's serial log, about 2.5 MB) is removed; a failing
# one's is kept and named in its FAIL line.
result() {
  printf '%-5s smoltcp/%-15s %s\n' "$1" "$2" "$3" >&2
  if [ "$1" = PASS ]; then rm -rf "$out"; else FAILS=$((FAILS + 1)); fi
}

# boot NAME HOSTCMD GUESTCMD: one guest boot; sets $log (both sides' output) and $out.
boot() {
  out="$(mktemp -d "/tmp/iwarp-smol-$1.XXXXXX")"
  log="$out/run.log"
  timeout 240 bash "$HERE/run-guest.sh" --timeout 120 --out "$out" --host "$BRIDGE && $2" "$3" > "$log" 2>&1
}
# pings NAME PATTERN HOSTCMD GUESTCMD: passes when the log shows all 10 pings.
pings() {
  local rc=0 n
  boot "$1" "$3" "$4" || rc=$?
  n="$(grep -c "$2" "$log" || true)"
  if [ "$rc" = 0 ] && [ "$n" = 10 ]; then result PASS "$1" "10 pings"; else result FAIL "$1" "exit $rc, $n pings (log $log)"; fi
}

for offload in ${IWARP_SMOL_OFFLOADS:-auto off}; do
  SMOL="$SMOL_BASE --offload $offload"
  # a: our smoltcp client against siw's rping server; b: siw's client against our server.
  pings "a-rping-$offload" '^server ping data: rdma-ping-' \
    "sleep 3 && $BIN rping $SMOL -c -a 10.99.0.2 -C 10 -V -S 64 --timeout 60" \
    'rping -s -a 10.99.0.2 -C 10 -v'
  pings "b-rping-$offload" '^ping data: rdma-ping-' \
    "$BIN rping $SMOL -s -a 10.99.0.3 --accept-timeout 60 --timeout 60" \
    'sleep 4; rping -c -a 10.99.0.3 -C 10 -v -V -S 64'

  # c: a perftest bandwidth run: our smoltcp `iwarp perftest write` client against siw's
  # `ib_write_bw -R` server.
  rc=0
  boot "c-write-bw-$offload" \
    "sleep 3 && $BIN perftest write 10.99.0.2 $SMOL -s 65536 -n 100 --timeout 60" \
    'timeout 90 ib_write_bw -R -d siw0 -s 65536 -n 100' || rc=$?
  avg="$(grep -E '^ *65536 +100 ' "$log" | head -1 | awk '{print $4}')"
  if [ "$rc" = 0 ] && [ -n "$avg" ] && awk -v a="$avg" 'BEGIN { exit !(a > 0) }'; then
    result PASS "c-write-bw-$offload" "average $avg MB/s (TCG guest: not a throughput figure)"
  else
    result FAIL "c-write-bw-$offload" "exit $rc, average '${avg:-none}' (log $log)"
  fi

done

[ "$FAILS" = 0 ] || { echo "[interop-smol] FAILED: $FAILS case(s)" >&2; exit 1; }
echo "[interop-smol] smoltcp against siw: all cases passed" >&2
