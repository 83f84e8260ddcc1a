#!/usr/bin/env bash
# The Terminate checks against Linux siw in the qemu guest (`iwarp fuzz-peer --terminates siw`,
# docs/interop.md#terminate-checks): one guest boot with stock siw, every check once. With
# --target the guest runs siw's `rping -s -P`: each check provokes one Terminate siw can send
# as a responder (or sends it one of this stack's) and checks what came back, how siw closed,
# and what siw logged of our Terminates; with --listen the guest runs loops of `rping -c -C 1`
# towards the host and the checks bend the MPA Reply. After every check siw must still complete
# a connection and a ping (health probe) and the guest console must show no Oops, BUG or WARN.
# The one Terminate stock siw cannot send (no matching RTR: its initiator never offers
# peer-to-peer) takes a second, short boot of the module-parameter build with peer_to_peer=1
# (role listen-p2p). Prints one PASS/FAIL line per check; a failed check's pcap is saved and
# decoded with `iwarp dissect`. Exits non-zero on any failure.
#
# Environment: IWARP_BIN (default target/release/iwarp), IW_IMG (guest image; built if
# unset), IWARP_TERM_ROLES (default "target listen listen-p2p"), IWARP_TERM_ONLY
# (comma-separated check names, default all), IWARP_TERM_OUT (logs and failures; default: a new
# directory under /tmp).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"
BIN="${IWARP_BIN:-$ROOT/target/release/iwarp}"
[ -x "$BIN" ] || iw_die "$BIN is not built (cargo build --release --bin iwarp, or set IWARP_BIN)"
ROLES="${IWARP_TERM_ROLES:-target listen listen-p2p}"
OUT="${IWARP_TERM_OUT:-$(mktemp -d /tmp/iwarp-terminates.XXXXXX)}"
mkdir -p "$OUT"
LISTEN_PORT=7301
export IW_IMG="${IW_IMG:-$(bash "$HERE/build-guest.sh" | tail -1)}"
[ -s "$IW_IMG/vmlinux" ] || iw_die "no guest image"

# Each role: up to about 60 checks, each the case, the peer's close and a health probe (about
# 0.1 s each against the target, a second against siw's client loops; a failed health probe,
# 10 s, ends the role), bounded by PER_ROLE; a guest lives as long as its roles and the boot,
# and no longer. A passing run takes 30 to 50 s, both boots included.
PER_ROLE=45
# printk level 5: siw's pr_warn lines (how it read our Terminates) and any WARN reach the console.
guest_cmd() { # SECS
  echo "echo 5 > /proc/sys/kernel/printk
rping -s -a $IW_GUEST_IP -P > /tmp/rping-s.log 2>&1 &
for l in 1 2; do ( while :; do timeout 6 rping -c -a $IW_HOST_IP -p $LISTEN_PORT -C 1 -S 64 > /dev/null 2>&1; sleep 0.3; done ) & done
sleep 2; echo IWARP-READY; sleep $1"
}

FAILS=0
CRASHED=0
# Runs the roles in one guest boot: BOOT-NAME SIW-BUILD SIWOPTS ROLE...
run_boot() {
  local name="$1" siw="$2" opts="$3"; shift 3
  local life=$((40 + PER_ROLE * $#)) role rc only=()
  [ -n "${IWARP_TERM_ONLY:-}" ] && only=(--only "$IWARP_TERM_ONLY")
  local siwopts=()
  [ -n "$opts" ] && siwopts=(--siwopts "$opts")
  iw_boot "$OUT/$name" --siw "$siw" "${siwopts[@]}" --max "$life" --cmd "$(guest_cmd "$life")"
  iw_wait_marker IWARP-READY 90 || { cat "$IW_SERIAL"; iw_die "the guest did not come up"; }
  for role in "$@"; do
    local peer=()
    case "$role" in
      target) peer=(--target "$IW_GUEST_IP:7174") ;;
      listen) peer=(--listen "$IW_HOST_IP:$LISTEN_PORT") ;;
      listen-p2p) peer=(--listen "$IW_HOST_IP:$LISTEN_PORT" --p2p) ;;
      *) iw_die "unknown role $role (target, listen or listen-p2p)" ;;
    esac
    rc=0
    iw_ns timeout -k 5 "$PER_ROLE" "$BIN" fuzz-peer "${peer[@]}" --terminates siw "${only[@]}" \
      --console "$IW_SERIAL" --save-failures "$OUT/$role" > "$OUT/$role.txt" 2> "$OUT/$role.log" || rc=$?
    # A role none of the --only checks is for: nothing to run.
    if [ "$rc" = 2 ] && grep -q "none of the Terminate checks named is one for" "$OUT/$role.log"; then
      continue
    fi
    grep -E '^(PASS|FAIL) ' "$OUT/$role.txt" | sed "s/^/[terminates\/$role] /" || true
    if [ "$rc" != 0 ]; then
      FAILS=$((FAILS + 1))
      echo "--- terminates/$role: exit status $rc; the run's last lines:" >&2
      tail -n 20 "$OUT/$role.log" >&2
      for p in "$OUT/$role"/*.pcap; do
        [ -e "$p" ] || continue
        echo "--- $p (iwarp dissect):" >&2
        "$BIN" dissect "$p" >&2 || true
      done
    fi
    if iw_guest_crashed; then
      echo "--- the guest's kernel crashed:" >&2
      grep -aE -A 12 'invalid opcode:|kernel BUG at|BUG: |Oops:|general protection fault' "$IW_SERIAL" | head -40 >&2
      CRASHED=1
      break
    fi
  done
  iw_stop_guest
}

iw_setup_ns
iw_log "Terminate checks against siw ($ROLES); output in $OUT"
started=$SECONDS
stock=()
p2p=()
for role in $ROLES; do
  case "$role" in
    target | listen) stock+=("$role") ;;
    listen-p2p) p2p+=("$role") ;;
    *) iw_die "unknown role $role (target, listen or listen-p2p)" ;;
  esac
done
[ ${#stock[@]} = 0 ] || run_boot guest stock "" "${stock[@]}"
[ ${#p2p[@]} = 0 ] || [ "$CRASHED" = 1 ] || run_boot guest-p2p param peer_to_peer=1 "${p2p[@]}"
echo "[interop-terminates] $((SECONDS - started)) s, guest boots included" >&2
[ "$FAILS" = 0 ] && [ "$CRASHED" = 0 ] || { echo "[interop-terminates] FAILED: $FAILS role(s); output in $OUT" >&2; exit 1; }
echo "[interop-terminates] every Terminate check passed against siw" >&2
# Kept only when it says why something failed, or when the caller chose where it goes.
[ -n "${IWARP_TERM_OUT:-}" ] || rm -rf "$OUT"
