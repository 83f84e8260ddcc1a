#!/usr/bin/env bash
# A stress run, not a CI step: N rsockets connections in a row from the host's rstream on the
# verbs drop-in to siw's rstream server in one guest boot (run-verbs-abi.sh's rstream-a case,
# repeated), each moving 100 x 4 KiB each way with every byte verified (-T v). Races between a
# quick initiator and siw's connection setup show up here at rates far below one in a hundred
# connections (docs/siw-quirks.md#the-first-fpdu-after-the-mpa-reply-goes-unread: this loop is
# how the rsockets case there was found and checked).
#
#   bash tests/interop/repeat-rstream.sh [N]      # N connections, default 300 (about 2 minutes)
#
# Prints one line per failed connection and a tally; exits 1 if any failed. Logs in
# $IWARP_INTEROP_OUT (default target/interop-rstream-repeat): each client's output (engine debug
# log included) as cK.log, the guest's console, the capture of the guest NIC.
# Environment: IWARP_VERBS_ABI_DIR (default: scripts/verbs-abi.sh --release), IW_IMG.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"
N="${1:-300}"
[[ "$N" =~ ^[1-9][0-9]*$ ]] || iw_die "N must be a positive number of connections, not '$N'"
OUT="${IWARP_INTEROP_OUT:-$ROOT/target/interop-rstream-repeat}"
rm -rf "$OUT"; mkdir -p "$OUT"
[ "$(id -u)" = 0 ] || iw_die "needs root (network namespace, tap)"
command -v rstream > /dev/null || iw_die "rstream is not installed (rdmacm-utils)"
iw_dropin_libs "$OUT"; LIBS="$IW_DROPIN_LIBS"
iw_guest_image

iw_setup_ns
G="$IW_GUEST_IP"
# The guest: one server at a time on port 7541 (each bounded), "RSREADY K" once it listens,
# "RSS K rc=R" when it ended.
# shellcheck disable=SC2016
gcmd='W(){ j=0; while ! netstat -ltn | grep -q ":$1 "; do j=$((j+1)); [ $j -gt 200 ] && break; sleep 0.1; done; }; '
gcmd+="for k in \$(seq 1 $N); do (timeout 40 rstream -T v -S 4096 -C 100 -p 7541 > /tmp/s 2>&1; "
gcmd+="echo RSS \$k rc=\$? >> /tmp/s) & W 7541; echo RSREADY \$k; wait; sed \"s/^/[s\$k] /\" /tmp/s; done"
iw_boot "$OUT" --siw stock --max $((120 + N * 45)) --pcap "$OUT/guest-nic.pcap" --cmd "$gcmd"
fails=0
for i in $(seq 1 "$N"); do
  iw_wait_marker "RSREADY $i([^0-9]|$)" 120 || iw_die "the guest's server $i did not come up"
  rc=0
  iw_ns timeout -k 2 40 env LD_LIBRARY_PATH="$LIBS" IWARP_LOG=debug \
    rstream -T v -S 4096 -C 100 -s "$G" -p 7541 > "$OUT/c$i.log" 2>&1 || rc=$?
  iw_wait_marker "RSS $i rc=[0-9]" 60 || true
  src="$(grep -aoE "RSS $i rc=[0-9]+" "$IW_SERIAL" | head -1 | sed 's/.*rc=//')"
  if [ "$rc" != 0 ] || [ "$src" != 0 ]; then
    fails=$((fails + 1))
    echo "FAIL  connection $i: host client exit $rc, siw server exit ${src:-none} (see $OUT/c$i.log)"
  fi
done
iw_wait_exit 60 || true
echo "[rstream-repeat] $((N - fails)) of $N connections verified both ways; logs in $OUT"
[ "$fails" = 0 ]
