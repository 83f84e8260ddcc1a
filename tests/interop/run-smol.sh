#!/usr/bin/env bash
# This stack on its own TCP/IP (smoltcp, raw Ethernet) against Linux siw in the qemu guest:
# `iwarp rping --transport smoltcp` both ways. In the test's namespace the guest's tap and one
# end of a veth pair are bridged (the kernel keeps 10.99.0.1 on the bridge); smoltcp owns the
# other veth end as 10.99.0.3, so its frames reach the guest (10.99.0.2) on the same link.
# Each case boots the guest once; prints PASS/FAIL lines and exits non-zero on any failure.
#
# Environment: IWARP_BIN (default target/release/iwarp), IW_IMG (guest image; built if
# unset), IWARP_INTEROP_FPDU_DELAY (ms before our first FPDU to siw, default 200).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${IWARP_BIN:-$ROOT/target/release/iwarp}"
[ -x "$BIN" ] || { echo "[interop-smol] FAILED: $BIN is not built" >&2; exit 1; }
export IW_IMG="${IW_IMG:-$(bash "$HERE/build-guest.sh" | tail -1)}"
DELAY="${IWARP_INTEROP_FPDU_DELAY:-200}"
SMOL="--transport smoltcp --iface vsB --ip 10.99.0.3/24"
BRIDGE="ip link add vsA type veth peer name vsB && ip link add br0 type bridge \
 && ip link set iwtap0 master br0 && ip link set vsA master br0 && ip addr flush dev iwtap0 \
 && ip addr add 10.99.0.1/24 dev br0 && ip link set br0 up && ip link set vsA up && ip link set vsB up"
FAILS=0
result() { printf '%-5s smoltcp/%-10s %s\n' "$1" "$2" "$3" >&2; [ "$1" = PASS ] || FAILS=$((FAILS + 1)); }

# a: our smoltcp client against siw's rping server.
out="$(mktemp -d /tmp/iwarp-smol-a.XXXXXX)"
log="$out/run.log"
if timeout 240 bash "$HERE/run-guest.sh" --timeout 120 --out "$out" \
    --host "$BRIDGE && sleep 3 && $BIN rping $SMOL -c -a 10.99.0.2 -C 10 -V -S 64 --first-fpdu-delay $DELAY --timeout 60" \
    'rping -s -a 10.99.0.2 -C 10 -v' > "$log" 2>&1; then
  n="$(grep -c '^server ping data: rdma-ping-' "$log" || true)"
  if [ "$n" = 10 ]; then result PASS a-rping "10 pings, siw server"; else result FAIL a-rping "$n pings (log $log)"; fi
else
  result FAIL a-rping "exit status $? (log $log)"
fi

# b: siw's rping client against our smoltcp server.
out="$(mktemp -d /tmp/iwarp-smol-b.XXXXXX)"
log="$out/run.log"
if timeout 240 bash "$HERE/run-guest.sh" --timeout 120 --out "$out" \
    --host "$BRIDGE && $BIN rping $SMOL -s -a 10.99.0.3 --accept-timeout 60 --timeout 60" \
    'sleep 4; rping -c -a 10.99.0.3 -C 10 -v -V -S 64' > "$log" 2>&1; then
  n="$(grep -c '^ping data: rdma-ping-' "$log" || true)"
  if [ "$n" = 10 ]; then result PASS b-rping "10 pings, siw client"; else result FAIL b-rping "$n pings (log $log)"; fi
else
  result FAIL b-rping "exit status $? (log $log)"
fi

# c: a perftest bandwidth run: our smoltcp `iwarp perftest write` client against siw's
# `ib_write_bw -R` server.
out="$(mktemp -d /tmp/iwarp-smol-c.XXXXXX)"
log="$out/run.log"
if timeout 240 bash "$HERE/run-guest.sh" --timeout 120 --out "$out" \
    --host "$BRIDGE && sleep 3 && $BIN perftest write 10.99.0.2 $SMOL -s 65536 -n 100 --first-fpdu-delay $DELAY --timeout 60 > $out/host.log 2>&1; rc=\$?; cat $out/host.log; exit \$rc" \
    'timeout 90 ib_write_bw -R -d siw0 -s 65536 -n 100' > "$log" 2>&1; then
  line="$(grep -E '^ *65536 +100 ' "$out/host.log" | head -1 || true)"
  avg="$(awk '{print $4}' <<<"$line")"
  if [ -n "$line" ] && awk -v a="$avg" 'BEGIN { exit !(a > 0) }'; then
    result PASS c-write-bw "average ${avg} MB/s (TCG guest: not a throughput figure)"
  else
    result FAIL c-write-bw "no positive result line (log $log)"
  fi
else
  result FAIL c-write-bw "exit status $? (log $log)"
fi

[ "$FAILS" = 0 ] || { echo "[interop-smol] FAILED: $FAILS case(s)" >&2; exit 1; }
echo "[interop-smol] smoltcp against siw: all cases passed" >&2
