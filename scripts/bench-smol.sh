#!/usr/bin/env bash
# The smoltcp path's benchmark on a veth pair whose ends sit in two network namespaces, for
# each MTU in $MTUS (default: 1500, then 9000): `iwarp bench --transport smoltcp` opens each
# stack in the namespace of its end, and the kernel's own address on each end carries the
# kernel-TCP baseline over the same pair (the stacks use another subnet). Needs root; deletes
# the namespaces (and the pair with them) on exit.
#
# Usage: scripts/bench-smol.sh [bench flags, e.g. --ops write --sizes 64k,1m --duration 1]
# Environment: IWARP_BIN (default target/release/iwarp), MTUS, GRO (on: receive coalescing on
# both ends of the pair, as a NIC's GRO; it serves the kernel-TCP baseline and the stacks alike).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${IWARP_BIN:-target/release/iwarp}"
[ -x "$BIN" ] || { echo "bench-smol: $BIN is not built (cargo build --release -p iwarp-cli)" >&2; exit 1; }
tag="iwb$$"
ns1="$tag-a"
ns2="$tag-b"
cleanup() {
  ip netns del "$ns1" 2>/dev/null || true
  ip netns del "$ns2" 2>/dev/null || true
}
trap cleanup EXIT
for mtu in ${MTUS:-1500 9000}; do
  cleanup
  for ns in "$ns1" "$ns2"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
  done
  ip link add vsa netns "$ns1" type veth peer name vsb netns "$ns2"
  ip -n "$ns1" link set vsa mtu "$mtu" up
  ip -n "$ns2" link set vsb mtu "$mtu" up
  if [ "${GRO:-off}" = on ]; then
    ip netns exec "$ns1" ethtool -K vsa gro on
    ip netns exec "$ns2" ethtool -K vsb gro on
  fi
  ip -n "$ns1" addr add 10.231.0.1/24 dev vsa
  ip -n "$ns2" addr add 10.231.0.2/24 dev vsb
  echo "== MTU $mtu, GRO ${GRO:-off}"
  "$BIN" bench --transport smoltcp --netns "$ns1" --peer-netns "$ns2" --iface vsa --peer-iface vsb \
    --ip 10.231.1.1/24 --peer-ip 10.231.1.2/24 "$@"
done
