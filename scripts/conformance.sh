#!/usr/bin/env bash
# The conformance suite (tests/tests/conformance.rs, docs/conformance.md) on the host: once on
# the userspace engine through the backend seam, once on the verbs backend (the `verbs`
# feature, src/verbs.rs) over the verbs drop-in (verbs-abi/, staged by scripts/verbs-abi.sh):
# rdma-core's API over this engine, end to end with no kernel RDMA. Each leg's result and SKIP
# lines (a test the device's capabilities rule out) go to stderr.
#
#   bash scripts/conformance.sh            (prints the test binary's path on stdout)
#
# Environment: IWARP_VERBS_ABI_DIR (the staged drop-in; default: scripts/verbs-abi.sh
# --release). Every run is bounded by `timeout`.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="$ROOT/target/conformance"
rm -rf "$OUT"; mkdir -p "$OUT"
log() { printf '[conformance] %s\n' "$*" >&2; }

# The suite's binary, built with the verbs backend (cmake and a C compiler: rdma-mummy-sys).
BIN="$(timeout 1800 cargo test -p iwarp-tests --features verbs --test conformance --locked --no-run \
  --message-format=json 2> "$OUT/build.log" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "conformance" and m.get("executable"):
        print(m["executable"])
')" || { cat "$OUT/build.log" >&2; log "build failed"; exit 1; }
[ -x "$BIN" ] || { log "no test binary (see $OUT/build.log)"; exit 1; }

LIBS="${IWARP_VERBS_ABI_DIR:-}"
[ -n "$LIBS" ] || LIBS="$(timeout 1800 bash scripts/verbs-abi.sh --release 2>> "$OUT/build.log" | tail -1)"
LIBS="$(cd "$LIBS" && pwd)"

fails=0
leg() { # NAME ENV...
  local name="$1"; shift
  log "$name"
  if env "$@" timeout 300 "$BIN" --test-threads=2 --nocapture > "$OUT/$name.log" 2>&1; then
    grep -aE '^test result:' "$OUT/$name.log" | sed "s/^/[$name] /" >&2
  else
    cat "$OUT/$name.log" >&2
    log "$name: FAILED"
    fails=$((fails + 1))
  fi
  grep -aE '^(SKIP|DEVIATION) ' "$OUT/$name.log" | sed "s/^/[$name] /" >&2 || true
}
leg engine IWARP_CONFORMANCE_DEVICE=iwarp
leg dropin IWARP_CONFORMANCE_DEVICE=iwarp0 LD_LIBRARY_PATH="$LIBS"
# `iwarp rping --device iwarp0`: this stack's rping on the verbs backend over the drop-in. Its
# client against Debian's rping server on the drop-in and against `iwarp rping -s` on the
# engine, and its server against Debian's rping client on the drop-in: ten pings of 1000
# bytes each, data checked (-V) by the client.
IWARP="$(timeout 1800 cargo build -p iwarp-cli --features verbs --locked --message-format=json \
  2>> "$OUT/build.log" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "iwarp" and m.get("executable"):
        print(m["executable"])
')" || { cat "$OUT/build.log" >&2; log "iwarp (verbs) build failed"; exit 1; }
# tests/interop/run-conformance.sh takes this `iwarp` into the guest (rping --device siw0).
echo "$IWARP" > "$OUT/iwarp-verbs.path"
export IWARP LIBS
pair_leg() { # NAME CHECK SERVER CLIENT (shell commands; the server listens on 127.0.0.1:$PORT)
  # CHECK: a function that reads the client's log and prints what passed, or fails.
  local name="$1" check="$2" server="$3" client="$4" pid passed
  PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  export PORT
  log "$name"
  timeout 60 bash -c "$server" > "$OUT/$name.server.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    ss -Hltn "sport = :$PORT" | grep -q . && break
    sleep 0.1
  done
  if timeout 60 bash -c "$client" > "$OUT/$name.log" 2>&1 && wait "$pid" \
      && passed="$("$check" "$OUT/$name.log")"; then
    log "$name: $passed"
  else
    kill "$pid" 2> /dev/null || true
    cat "$OUT/$name.log" "$OUT/$name.server.log" >&2
    log "$name: FAILED"
    fails=$((fails + 1))
  fi
}
pings_checked() { # LOG: ten pings, data checked by the client (-V)
  [ "$(grep -c '^ping data: rdma-ping-' "$1")" = 10 ] && echo "10 pings, data checked"
}
rping_leg() { # NAME SERVER CLIENT
  pair_leg "$1" pings_checked "$2" "$3"
}
# shellcheck disable=SC2016 # the variables expand in the commands' shells
{
  ours_client='LD_LIBRARY_PATH="$LIBS" "$IWARP" rping -c -a 127.0.0.1 -p "$PORT" --device iwarp0 -C 10 -S 1000 -V -v'
  rping_leg rping-device-client-debian-server \
    'LD_LIBRARY_PATH="$LIBS" exec rping -s -a 127.0.0.1 -p "$PORT" -S 1000 -v' "$ours_client"
  rping_leg rping-device-client-engine-server \
    'exec "$IWARP" rping -s -a 127.0.0.1 -p "$PORT" -v --accept-timeout 50' "$ours_client"
  rping_leg rping-device-server-debian-client \
    'LD_LIBRARY_PATH="$LIBS" exec "$IWARP" rping -s -a 127.0.0.1 -p "$PORT" --device iwarp0 -v --accept-timeout 50' \
    'LD_LIBRARY_PATH="$LIBS" rping -c -a 127.0.0.1 -p "$PORT" -C 10 -S 1000 -V -v'
}
# `iwarp perftest --device iwarp0`: this stack's perftest on the verbs backend over the
# drop-in, against Debian's ib_write_bw, ib_read_bw and ib_send_bw -R on the drop-in, as client
# and as server: 500 messages of 64 KiB, the client's result line checked.
perftest_result() { # LOG: the client's result line counts 500 messages of 65536 bytes
  local row
  row="$(grep -a -A1 '^ #bytes' "$1" | tail -1)"
  # shellcheck disable=SC2086 # the row's fields
  set -- $row
  [ "${1:-}" = 65536 ] && [ "${2:-}" = 500 ] && echo "500 x 64 KiB, ${4:-?} MB/s average"
}
# shellcheck disable=SC2016 # the variables expand in the commands' shells
for t in write read send; do
  export T="$t"
  pair_leg "perftest-$t-device-client-debian-server" perftest_result \
    'LD_LIBRARY_PATH="$LIBS" exec ib_${T}_bw -R -F -d iwarp0 -p "$PORT" -s 65536 -n 500' \
    'LD_LIBRARY_PATH="$LIBS" "$IWARP" perftest "$T" 127.0.0.1 -p "$PORT" --device iwarp0 -s 65536 -n 500'
  pair_leg "perftest-$t-device-server-debian-client" perftest_result \
    'LD_LIBRARY_PATH="$LIBS" exec "$IWARP" perftest "$T" -p "$PORT" --device iwarp0 -s 65536 -n 500 --accept-timeout 50' \
    'LD_LIBRARY_PATH="$LIBS" ib_${T}_bw -R -F -d iwarp0 -p "$PORT" -s 65536 -n 500 127.0.0.1'
done
[ "$fails" = 0 ] || exit 1
echo "$BIN"
