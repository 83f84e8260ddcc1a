#!/usr/bin/env bash
# `iwarp fuzz-peer` against this stack's own rping on loopback (127.0.0.1 only): first its
# server (`iwarp rping -s -P`) with --target, then a loop of its clients (`iwarp rping -c -C 1`)
# with --listen. Both must survive every case: any failure (a malformed answer, a failed health
# probe, the server gone) fails the script, which then prints the saved case. See
# docs/fuzz-peer.md.
#
# Environment: IWARP_BIN (default: cargo build --release), IWARP_FUZZ_SECONDS (per role,
# default 25), IWARP_FUZZ_SEED (default 1, so that the test command runs the same cases every
# time). Everything it starts is stopped by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${IWARP_BIN:-}" ]; then
  timeout 900 cargo build --release --locked --quiet --bin iwarp
  IWARP_BIN="$PWD/target/release/iwarp"
fi
BIN="$IWARP_BIN"
SECS="${IWARP_FUZZ_SECONDS:-25}"
SEED="${IWARP_FUZZ_SEED:-1}"
OUT="$(mktemp -d /tmp/iwarp-fuzz-loopback.XXXXXX)"
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
log() { printf '[fuzz-loopback] %s\n' "$*" >&2; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
FAILS=0

# shellcheck source=fuzz-peer-report.sh
source scripts/fuzz-peer-report.sh
report() { fuzz_report "fuzz-peer/loopback-$1" "$2" "$OUT" "$1" "$SEED" "$BIN" || FAILS=$((FAILS + 1)); }

# The server.
port="$(free_port)"
"$BIN" rping -s -P -a 127.0.0.1 -p "$port" --timeout 5 > "$OUT/server.log" 2>&1 &
server=$!
PIDS+=("$server")
for _ in $(seq 1 100); do
  (exec 3<> "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done
rc=0
timeout -k 5 $((SECS + 150)) "$BIN" fuzz-peer --target "127.0.0.1:$port" --seed "$SEED" --duration "$SECS" \
  --answer-wait 50 --seed-pcap tests/data/siw/siw-rping.pcap --save-failures "$OUT/target" --json \
  > "$OUT/target.json" 2> "$OUT/target.log" || rc=$?
if ! kill -0 "$server" 2>/dev/null; then
  log "the rping server exited during the run:"
  tail -5 "$OUT/server.log" >&2
  [ "$rc" != 0 ] || rc=99
fi
report target "$rc"

# The clients: a bounded loop, one rping client at a time.
port="$(free_port)"
( end=$((SECONDS + SECS + 150))
  while [ $SECONDS -lt $end ]; do
    timeout 10 "$BIN" rping -c -a 127.0.0.1 -p "$port" -C 1 --timeout 3 > /dev/null 2>&1 || true
    sleep 0.02
  done ) &
PIDS+=("$!")
rc=0
timeout -k 5 $((SECS + 150)) "$BIN" fuzz-peer --listen "127.0.0.1:$port" --seed "$SEED" --duration "$SECS" \
  --answer-wait 50 --seed-pcap tests/data/siw/siw-rping.pcap --save-failures "$OUT/listen" --json \
  > "$OUT/listen.json" 2> "$OUT/listen.log" || rc=$?
report listen "$rc"

[ "$FAILS" = 0 ] || { log "FAILED: $FAILS role(s)"; exit 1; }
rm -rf "$OUT"
log "this stack's rping survived every case in both roles"
