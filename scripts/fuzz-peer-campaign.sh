#!/usr/bin/env bash
# A long `iwarp fuzz-peer` campaign against Linux siw in the qemu guest (needs what
# docs/interop.md lists: root, qemu, network namespaces). Round after round until the time
# budget is spent, each round boots a fresh guest with one siw configuration and a new seed and
# runs tests/interop/run-fuzz.sh: fuzz-peer --target (siw responds) then --listen (siw
# initiates), each for IWARP_CAMPAIGN_ROUND seconds, with the console oracle. A round that
# fails keeps its whole output (failure pcaps and their reproducing commands, fuzz-peer's logs
# and JSON summaries, the guest's console); a clean round keeps only its summaries.
# campaign.txt lists every round; docs/fuzz-peer.md describes the findings so far.
#
#   scripts/fuzz-peer-campaign.sh [HOURS]      (default 1; fractions allowed, e.g. 0.25)
#
# Environment:
#   IWARP_CAMPAIGN_OUT      where rounds go (default target/fuzz-campaign/<date-time>)
#   IWARP_CAMPAIGN_ROUND    seconds per role per round (default 300)
#   IWARP_CAMPAIGN_CONFIGS  siw configurations, in turn (default "stock crc p2p"): stock:
#                           siw's defaults; crc: mpa_crc_required=1; p2p: peer_to_peer=1 (every
#                           Request and probe offers peer-to-peer). (mpa_version=1 is left out:
#                           its rping server cannot post the RDMA Read the health probe needs,
#                           docs/siw-quirks.md#mpa-revision-1-leaves-siw-without-reads.)
#   IWARP_CAMPAIGN_KNOWN=1  keep the cases of known findings (by default --skip-known leaves
#                           them out, so that a round is not spent crashing the guest again)
#   IWARP_BIN               the iwarp binary (default: cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
HOURS="${1:-1}"
budget="$(python3 -c 'import sys; print(int(float(sys.argv[1]) * 3600))' "$HOURS")" \
  || { echo "usage: $0 [HOURS]" >&2; exit 2; }
[ "$budget" -gt 0 ] || { echo "usage: $0 [HOURS] (more than 0)" >&2; exit 2; }
ROUND="${IWARP_CAMPAIGN_ROUND:-300}"
CONFIGS="${IWARP_CAMPAIGN_CONFIGS:-stock crc p2p}"
OUT="${IWARP_CAMPAIGN_OUT:-$PWD/target/fuzz-campaign/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
if [ -z "${IWARP_BIN:-}" ]; then
  timeout 900 cargo build --release --locked --quiet --bin iwarp
  IWARP_BIN="$PWD/target/release/iwarp"
fi
export IWARP_BIN
known="--skip-known"
[ "${IWARP_CAMPAIGN_KNOWN:-0}" = 1 ] && known=""
LIST="$OUT/campaign.txt"
echo "campaign of $HOURS h from $(date -Is), $ROUND s per role per round, configurations: $CONFIGS" > "$LIST"
end=$((SECONDS + budget))
round=0 failed=0
# A round runs two roles of $ROUND seconds, a boot, and at most a minute of minimising each.
while [ $((SECONDS + 2 * ROUND + 240)) -le "$end" ]; do
  for cfg in $CONFIGS; do
    [ $((SECONDS + 2 * ROUND + 240)) -le "$end" ] || break
    round=$((round + 1))
    seed="$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')"
    siw=param opts="" extra="$known"
    case "$cfg" in
      stock) siw=stock ;;
      crc) opts="mpa_crc_required=1" ;;
      p2p) opts="peer_to_peer=1"; extra="$extra --p2p" ;;
      *) echo "unknown configuration $cfg" >&2; exit 2 ;;
    esac
    dir="$OUT/round-$round-$cfg-$seed"
    rc=0
    IWARP_FUZZ_SEED="$seed" IWARP_FUZZ_SECONDS="$ROUND" IWARP_FUZZ_SIW="$siw" IWARP_FUZZ_SIWOPTS="$opts" \
      IWARP_FUZZ_ARGS="$extra" IWARP_FUZZ_OUT="$dir" \
      bash tests/interop/run-fuzz.sh > "$dir.log" 2>&1 || rc=$?
    verdict="$(grep -E '^(PASS|FAIL) ' "$dir.log" | tr '\n' ';' || true)"
    if [ "$rc" = 0 ]; then
      # Keep the summaries of a clean round, not its guest console.
      mkdir -p "$dir.summaries"
      cp "$dir"/*.json "$dir.summaries/" 2>/dev/null || true
      rm -rf "$dir"
      echo "round $round $cfg seed $seed: clean: $verdict" >> "$LIST"
    else
      failed=$((failed + 1))
      echo "round $round $cfg seed $seed: FAILED (exit $rc; kept in $dir): $verdict" >> "$LIST"
    fi
    tail -1 "$LIST" >&2
  done
done
echo "campaign done: $round rounds, $failed with findings; see $LIST" | tee -a "$LIST" >&2
[ "$round" -gt 0 ] || { echo "the budget is too small for one round ($((2 * ROUND + 240)) s)" >&2; exit 2; }
