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
[ "$fails" = 0 ] || exit 1
echo "$BIN"
