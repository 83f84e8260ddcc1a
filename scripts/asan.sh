#!/usr/bin/env bash
# AddressSanitizer over the code that touches registered memory through raw pointers:
#  - the DMA module's own tests and the placement model (iwarp-ddp: ddp/src/dma.rs is the only
#    module of the protocol crates with unsafe code; ddp/src/placement.rs drives it),
#  - the whole-stack memory tests and the deregistration race (tests/tests/memory.rs,
#    tests/tests/dereg_race.rs): a placement or Read Response after the buffer was given back
#    and freed would be a heap-use-after-free,
#  - the verbs drop-in (verbs-abi/, the C ABI crate): its tests run Debian's rping, perftest
#    and the C programs of verbs-abi/tests/c/ on the instrumented library, with LLVM's shared
#    ASan runtime preloaded into those uninstrumented programs (IWARP_VERBS_ABI_PRELOAD; from
#    libclang-rt-14-dev); a canary checks that a bad access inside the library is reported,
#  - the verbs backend (src/verbs.rs, the `iwarp` package's only module with unsafe code: raw
#    rdma_cm, completion polling and notification, shared receive queues, registered memory):
#    the conformance suite built with `--features verbs` and instrumented, run on the verbs
#    drop-in (IWARP_CONFORMANCE_DEVICE=iwarp0, LD_LIBRARY_PATH at the libraries
#    scripts/verbs-abi.sh stages). The drop-in library itself is not instrumented in this step
#    (the step before covers it); its allocations still go through ASan's allocator. The
#    drop-in has no memory windows, so the backend's window code is not run here,
#  - netdev's frame-I/O module (netdev/src/frame_io.rs, its only module with unsafe code: the
#    packet socket's receive ring, the TAP ioctls) and the devices over it, in private network
#    namespaces (those tests skip without root),
#  - short runs of the ddp_placement and qp_receive fuzz targets (cargo fuzz builds with ASan).
# ASan needs nightly flags; RUSTC_BOOTSTRAP=1 enables them on the stable toolchain. The
# sanitized builds go to target/asan, apart from the normal ones. Leak checking stays on: an
# owned buffer the stack forgot to give back or free is reported too.
#
# Usage: scripts/asan.sh [fuzz seconds per target, default 20]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"
target=x86_64-unknown-linux-gnu
export RUSTC_BOOTSTRAP=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
step() { printf '\n==> asan: %s\n' "$*"; }

asan_test() {
  RUSTFLAGS="-Zsanitizer=address" cargo test --locked --target "$target" --target-dir target/asan "$@"
}

step "DMA module and placement (iwarp-ddp unit tests)"
asan_test -p iwarp-ddp --lib -- dma:: placement::

step "memory over real connections, and the deregistration race"
IWARP_RACE_ROUNDS="${IWARP_RACE_ROUNDS:-100}" asan_test -p iwarp-tests --test memory --test dereg_race

step "the verbs drop-in's tests on the instrumented library (rping, perftest, C programs)"
runtime="$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.asan-x86_64.so 2>/dev/null | tail -1 || true)"
if [ -z "$runtime" ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends libclang-rt-14-dev >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends libclang-rt-14-dev >/dev/null; }
  runtime="$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.asan-x86_64.so | tail -1)"
fi
IWARP_VERBS_ABI_PRELOAD="$runtime" asan_test -p iwarp-verbs-abi

step "the verbs backend (src/verbs.rs): the conformance suite on the verbs drop-in"
# The drop-in's libraries, built normally (cmake and a C compiler: rdma-mummy-sys).
dropin="$(timeout 1800 bash scripts/verbs-abi.sh | tail -1)"
asan_test -p iwarp-tests --features verbs --test conformance --no-run
# Built above: only the run sees the drop-in's libraries, and the run is bounded.
IWARP_CONFORMANCE_DEVICE=iwarp0 LD_LIBRARY_PATH="$dropin" \
  timeout 600 env RUSTFLAGS="-Zsanitizer=address" cargo test --locked --target "$target" \
  --target-dir target/asan -p iwarp-tests --features verbs --test conformance -- --test-threads=2

step "frame I/O: packet sockets, the receive ring, TAP devices (iwarp-netdev unit tests)"
asan_test -p iwarp-netdev --lib -- frame_io:: smol_device::

step "fuzz targets ddp_placement and qp_receive (${seconds}s each)"
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
cd fuzz
for t in ddp_placement qp_receive; do
  work="target/asan-corpus/$t"
  rm -rf "$work" && mkdir -p "$work"
  # Copy the committed seeds so the run never writes into the repository.
  if [ -d "corpus/$t" ]; then cp -r "corpus/$t/." "$work/"; fi
  cargo fuzz run --release --sanitizer address "$t" "$work" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 2>&1 | tail -n 4
  st=${PIPESTATUS[0]}
  if [ "$st" -ne 0 ]; then echo "fuzz target $t failed under ASan (status $st)" >&2; exit 1; fi
done
echo "asan: DMA tests, memory tests, deregistration race, the verbs drop-in, the verbs backend, frame I/O and fuzz targets ran clean"
