#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (default 30 s each) from its seed corpus.
# cargo-fuzz needs nightly features; RUSTC_BOOTSTRAP=1 enables them on the stable toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"

command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1

targets=$(cd fuzz && cargo fuzz list)
[ -n "$targets" ] || { echo "no fuzz targets found" >&2; exit 1; }
cd fuzz
cargo fuzz build --release
for t in $targets; do
  work="target/smoke-corpus/$t"
  rm -rf "$work" && mkdir -p "$work"
  # Copy the committed seeds so the run never writes into the repository.
  if [ -d "corpus/$t" ]; then cp -r "corpus/$t/." "$work/"; fi
  echo "fuzz $t for ${seconds}s ($(ls "$work" | wc -l) seeds)"
  timeout $((seconds + 120)) cargo fuzz run --release "$t" "$work" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 2>&1 | tail -n 4
  st=${PIPESTATUS[0]}
  if [ "$st" -ne 0 ]; then echo "fuzz target $t failed (status $st)" >&2; exit 1; fi
done
echo "fuzz smoke: $(echo $targets | wc -w) targets ran ${seconds}s each without a crash"
