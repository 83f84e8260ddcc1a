# shellcheck shell=bash
# Sourced by scripts/fuzz-peer-loopback.sh and tests/interop/run-fuzz.sh: the PASS/FAIL line of
# one `iwarp fuzz-peer --json` run and, when it failed, the saved cases (the failure text with
# its reproducing command, and `iwarp dissect` of each pcap).
#
#   fuzz_report NAME RC DIR ROLE SEED BIN
#     NAME: the line's label; RC: fuzz-peer's exit status; DIR/ROLE.json, DIR/ROLE.log and
#     DIR/ROLE/ (--save-failures) are its output. Returns RC.
fuzz_report() {
  local name="$1" rc="$2" dir="$3" role="$4" seed="$5" bin="$6" rate p
  rate="$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%d cases, %.1f cases/s" % (d["cases"], d["cases_per_s"]))' "$dir/$role.json" 2>/dev/null || echo "no summary")"
  if [ "$rc" = 0 ]; then
    printf 'PASS  %-24s %s (seed %s)\n' "$name" "$rate" "$seed" >&2
    return 0
  fi
  printf 'FAIL  %-24s exit %s, %s (seed %s; log %s)\n' "$name" "$rc" "$rate" "$seed" "$dir/$role.log" >&2
  grep -A 8 'FAILURE\|health probe before' "$dir/$role.log" >&2 || tail -20 "$dir/$role.log" >&2
  for p in "$dir/$role"/*.pcap; do
    [ -e "$p" ] || continue
    echo "--- iwarp dissect $p" >&2
    "$bin" dissect "$p" 2>&1 | head -40 >&2 || true
  done
  return "$rc"
}
