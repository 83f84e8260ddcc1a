#!/usr/bin/env bash
# Boots the interop guest on a tap in a fresh network namespace, runs a command in the guest
# and optionally one on the host side (inside the namespace), prints the guest's console and
# exits with the guest command's status. Always cleans up (qemu by PID, tap, namespace).
#
#   run-guest.sh [--siw stock|param] [--siwopts k=v,...] [--pcap FILE] [--timeout SECS]
#                [--out DIR] [--host 'command run in the namespace once the guest is up']
#                [--] 'guest shell command'
# Host address 10.99.0.1, guest 10.99.0.2 (private to the namespace).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"
siw=stock siwopts="" pcap="" timeout=120 out="" host=""
while [ $# -gt 0 ]; do
  case "$1" in
    --siw) siw="$2"; shift 2 ;;
    --siwopts) siwopts="$2"; shift 2 ;;
    --pcap) pcap="$(realpath -m "$2")"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --host) host="$2"; shift 2 ;;
    --) shift; break ;;
    -*) iw_die "unknown option $1" ;;
    *) break ;;
  esac
done
cmd="${*:-}"
IW_IMG="${IW_IMG:-$(bash "$HERE/build-guest.sh" | tail -1)}"
[ -n "$out" ] || out="$(mktemp -d /tmp/iwarp-guest.XXXXXX)"
iw_setup_ns
opts=(--siw "$siw" --max "$timeout")
[ -n "$siwopts" ] && opts+=(--siwopts "$siwopts")
[ -n "$pcap" ] && opts+=(--pcap "$pcap")
iw_boot "$out" "${opts[@]}" --cmd "$cmd"
host_rc=0
if [ -n "$host" ]; then
  iw_wait_marker IWARP-GUEST-UP 60 || { cat "$IW_SERIAL"; iw_die "guest did not come up"; }
  iw_ns timeout "$timeout" bash -c "$host" || host_rc=$?
  echo "host command exit status: $host_rc" >&2
fi
iw_wait_exit "$timeout" || true
cat "$IW_SERIAL"
[ -n "$IW_GUEST_RC" ] || iw_die "no exit marker from the guest (timeout $timeout s; log in $out)"
[ "$host_rc" = 0 ] || exit "$host_rc"
exit "$IW_GUEST_RC"
