#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (default 30 s each) from its committed corpus
# and prints each one's executions and exec rate. The total is bounded by the number of targets
# times (SECONDS + 120 s) plus one build. Same build flags as scripts/fuzz-campaign.sh (no
# sanitizer, debug assertions; see its header for why).
# cargo-fuzz needs nightly features; RUSTC_BOOTSTRAP=1 enables them on the stable toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"

command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1

targets=$(cd fuzz && cargo fuzz list)
[ -n "$targets" ] || { echo "no fuzz targets found" >&2; exit 1; }
cd fuzz
flags=(--release --sanitizer "${FUZZ_SANITIZER:-none}" --debug-assertions)
cargo fuzz build "${flags[@]}"
for t in $targets; do
  work="target/smoke-corpus/$t"
  rm -rf "$work" && mkdir -p "$work"
  # Copy the committed corpus so the run never writes into the repository.
  if [ -d "corpus/$t" ]; then cp -r "corpus/$t/." "$work/"; fi
  echo "fuzz $t for ${seconds}s ($(ls "$work" | wc -l) inputs)"
  log="target/smoke-corpus/$t.log"
  st=0
  timeout $((seconds + 120)) cargo fuzz run "${flags[@]}" "$t" "$work" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 >"$log" 2>&1 || st=$?
  if [ "$st" -ne 0 ]; then
    tail -n 40 "$log" >&2
    echo "fuzz target $t failed (status $st)" >&2
    exit 1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$')
  rss=$(grep -o 'stat::peak_rss_mb: *[0-9]*' "$log" | grep -o '[0-9]*$')
  echo "  $execs executions, $rate exec/s, peak RSS $rss MB"
done
echo "fuzz smoke: $(echo $targets | wc -w) targets ran ${seconds}s each without a crash"
