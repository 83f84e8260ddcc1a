#!/usr/bin/env bash
# `iwarp fuzz-peer` against Linux siw in the qemu guest: one guest boot, a short bounded run in
# each role. The guest runs siw's `rping -s -P` (the target: siw responds) and loops of
# `rping -c -C 1` towards the host, two at a time (siw initiates; fuzz-peer --listen answers,
# every other connection being the health probe). Oracles: the peer's answers are well-formed,
# siw still completes a connection and a ping after each case, and the guest's console shows
# no Oops, BUG, WARN or KASAN line (its printk level is raised so that WARN lines reach it). A
# failure prints the saved case: its description, the command that reproduces it and
# `iwarp dissect` of its pcap. Prints PASS/FAIL per role and exits non-zero on any failure.
#
# Environment: IWARP_BIN (default target/release/iwarp), IW_IMG (guest image; built if unset),
# IWARP_FUZZ_SECONDS (per role, default 20), IWARP_FUZZ_SEED (default 1, so that the test
# command runs the same cases every time), IWARP_FUZZ_ROLES (default "target listen"),
# IWARP_FUZZ_SIW (stock|param, default stock), IWARP_FUZZ_SIWOPTS (module parameters of the
# param build, e.g. peer_to_peer=1), IWARP_FUZZ_ARGS (more fuzz-peer flags; default
# --skip-known, which leaves out cases that would trigger a known siw finding again; e.g.
# "--p2p" or "--recipe reset-after-reply"),
# IWARP_FUZZ_OUT (logs, summaries and failures; default: a new directory under /tmp).
# scripts/fuzz-peer-campaign.sh runs it for long campaigns.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"
# shellcheck source=../../scripts/fuzz-peer-report.sh
source "$ROOT/scripts/fuzz-peer-report.sh"
BIN="${IWARP_BIN:-$ROOT/target/release/iwarp}"
[ -x "$BIN" ] || iw_die "$BIN is not built (cargo build --release --bin iwarp, or set IWARP_BIN)"
SECS="${IWARP_FUZZ_SECONDS:-20}"
SEED="${IWARP_FUZZ_SEED:-1}"
ROLES="${IWARP_FUZZ_ROLES:-target listen}"
SIW="${IWARP_FUZZ_SIW:-stock}"
SIWOPTS="${IWARP_FUZZ_SIWOPTS:-}"
read -r -a EXTRA <<< "${IWARP_FUZZ_ARGS---skip-known}"
OUT="${IWARP_FUZZ_OUT:-$(mktemp -d /tmp/iwarp-fuzz.XXXXXX)}"
mkdir -p "$OUT"
LISTEN_PORT=7300
export IW_IMG="${IW_IMG:-$(bash "$HERE/build-guest.sh" | tail -1)}"
[ -s "$IW_IMG/vmlinux" ] || iw_die "no guest image"

# Every role's run is bounded by --duration; a failing case adds at most a minute of
# minimising. The guest lives as long as all of that and the boot, and no longer.
per_role=$((SECS + 90))
guest_life=$((40 + per_role * $(wc -w <<< "$ROLES")))
GUEST_CMD="echo 5 > /proc/sys/kernel/printk
rping -s -a $IW_GUEST_IP -P > /tmp/rping-s.log 2>&1 &
for l in 1 2; do ( while :; do timeout 6 rping -c -a $IW_HOST_IP -p $LISTEN_PORT -C 1 -S 64 > /dev/null 2>&1; sleep 0.3; done ) & done
sleep 2; echo IWARP-READY; sleep $guest_life"

iw_setup_ns
opts=(--siw "$SIW" --max "$guest_life" --cmd "$GUEST_CMD")
[ -n "$SIWOPTS" ] && opts+=(--siwopts "$SIWOPTS")
iw_log "fuzz-peer against siw ($SIW${SIWOPTS:+ $SIWOPTS}), seed $SEED, $SECS s per role; output in $OUT"
iw_boot "$OUT/guest" "${opts[@]}"
iw_wait_marker IWARP-READY 90 || { cat "$IW_SERIAL"; iw_die "the guest did not come up"; }

FAILS=0
for role in $ROLES; do
  case "$role" in
    target) peer=(--target "$IW_GUEST_IP:7174") ;;
    listen) peer=(--listen "$IW_HOST_IP:$LISTEN_PORT") ;;
    *) iw_die "unknown role $role (target or listen)" ;;
  esac
  rc=0
  iw_ns timeout -k 5 "$per_role" "$BIN" fuzz-peer "${peer[@]}" --seed "$SEED" --duration "$SECS" \
    --console "$IW_SERIAL" --save-failures "$OUT/$role" --seed-pcap "$ROOT/tests/data/siw/siw-rping.pcap" \
    --json "${EXTRA[@]}" > "$OUT/$role.json" 2> "$OUT/$role.log" || rc=$?
  fuzz_report "fuzz-peer/$role" "$rc" "$OUT" "$role" "$SEED" "$BIN" || FAILS=$((FAILS + 1))
  if iw_guest_crashed; then
    echo "--- the guest's kernel crashed:" >&2
    grep -aE -A 12 'invalid opcode:|kernel BUG at|BUG: |Oops:|general protection fault' "$IW_SERIAL" | head -40 >&2
    break
  fi
done
iw_stop_guest
[ "$FAILS" = 0 ] || { echo "[interop-fuzz] FAILED: $FAILS role(s); output in $OUT" >&2; exit 1; }
echo "[interop-fuzz] fuzz-peer against siw: no failure" >&2
# Kept only when it says why something failed, or when the caller chose where it goes.
[ -n "${IWARP_FUZZ_OUT:-}" ] || rm -rf "$OUT"
