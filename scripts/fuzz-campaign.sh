#!/usr/bin/env bash
# A bounded fuzz campaign of one cargo-fuzz target.
#
#   scripts/fuzz-campaign.sh TARGET SECONDS
#
# Fuzzes TARGET (one of `cd fuzz && cargo fuzz list`) for SECONDS from its committed corpus
# (the TARGET directory under fuzz/corpus), then merges the inputs that add coverage back into
# that corpus (libFuzzer -merge=1: only inputs with new features are copied; commit them, and
# run `cargo fuzz cmin` now and then), and prints the executions, the exec rate and the peak
# RSS. A crash leaves its input in the fuzz workspace's artifacts directory (artifacts/TARGET)
# and makes the script exit 1; reproduce it with `cargo fuzz run TARGET artifacts/TARGET/...`
# in the fuzz workspace, with the same build flags as below.
#
# Bounded and clean: libFuzzer stops itself after SECONDS (-max_total_time), `timeout` stops it
# SECONDS + 300 s later whatever happens, and on exit (also Ctrl-C or a TERM) the script kills
# the fuzzer's process group and removes its scratch corpus (under target/campaign in the fuzz
# workspace, next to the run's log).
#
# Build flags: no sanitizer (`-s none`) and debug assertions (`-a`). The only unsafe code of
# the protocol crates is the DMA module (ddp/src/dma.rs), which scripts/asan.sh checks under
# AddressSanitizer (its tests and short ASan runs of ddp_placement and qp_receive); everything
# else is safe Rust, where ASan finds nothing that Rust's own checks miss while it costs about
# 5x in exec rate and 400-500 MB of RSS (its quarantine and shadow memory). Debug assertions
# add integer-overflow checks, which do find arithmetic bugs on hostile input.
# FUZZ_SANITIZER=address runs a campaign under ASan. Extra libFuzzer flags can follow in
# FUZZ_ARGS (e.g. FUZZ_ARGS="-max_len=1024").
#
# On a shared machine run it at low priority: nice -n 19 scripts/fuzz-campaign.sh TARGET 600
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -ne 2 ] || ! [[ "$2" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 TARGET SECONDS" >&2
  exit 2
fi
target="$1"
seconds="$2"

command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
# cargo-fuzz needs nightly features; RUSTC_BOOTSTRAP=1 enables them on the stable toolchain.
export RUSTC_BOOTSTRAP=1
cd fuzz
targets=$(cargo fuzz list)
if ! grep -qx -- "$target" <<<"$targets"; then
  echo "no fuzz target '$target'; targets: $(tr '\n' ' ' <<<"$targets")" >&2
  exit 2
fi
flags=(--release --sanitizer "${FUZZ_SANITIZER:-none}" --debug-assertions)
cargo fuzz build "${flags[@]}" "$target"

corpus="corpus/$target"
work="target/campaign/$target"
log="target/campaign/$target.log"
mkdir -p "$corpus" "artifacts/$target"
rm -rf "$work" && mkdir -p "$work"
fuzzer_pid=""
cleanup() {
  if [ -n "$fuzzer_pid" ] && kill -0 "$fuzzer_pid" 2>/dev/null; then
    kill -- "-$fuzzer_pid" 2>/dev/null || kill "$fuzzer_pid" 2>/dev/null || true
    wait "$fuzzer_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "fuzz $target for ${seconds}s from $(ls "$corpus" | wc -l) corpus inputs"
# New inputs go to the scratch corpus (the first directory); the committed one is only read.
# setsid gives the fuzzer its own process group, which cleanup can kill as a whole.
# shellcheck disable=SC2086
setsid timeout --kill-after=10 $((seconds + 300)) \
  cargo fuzz run "${flags[@]}" "$target" "$work" "$corpus" -- \
  -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 \
  ${FUZZ_ARGS:-} >"$log" 2>&1 &
fuzzer_pid=$!
status=0
wait "$fuzzer_pid" || status=$?
fuzzer_pid=""

stat() { grep -o "stat::$1: *[0-9]*" "$log" | grep -o '[0-9]*$' | tail -n 1; }
execs=$(stat number_of_executed_units)
rate=$(stat average_exec_per_sec)
rss=$(stat peak_rss_mb)
if [ "$status" -ne 0 ]; then
  tail -n 40 "$log" >&2
  echo "fuzz $target: FAILED (status $status) after ${execs:-?} executions; input in $PWD/artifacts/$target" >&2
  exit 1
fi

# Merge what the run found back into the committed corpus: only inputs that add coverage.
before=$(ls "$corpus" | wc -l)
cargo fuzz run "${flags[@]}" "$target" "$corpus" "$work" -- -merge=1 >>"$log" 2>&1
after=$(ls "$corpus" | wc -l)
echo "fuzz $target: ${execs} executions in ${seconds}s (${rate} exec/s), peak RSS ${rss} MB, no crash"
echo "fuzz $target: corpus $before -> $after inputs ($(du -sh "$corpus" | cut -f1)); log in fuzz/$log"
