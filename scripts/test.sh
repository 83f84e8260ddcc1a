#!/usr/bin/env bash
# The project's test command: formatting, lints, docs, the dependency-direction check, the
# check that every cited path exists, the check that source files import no circle, every
# test, a short fuzz smoke run of every fuzz target, the registered-memory code under
# AddressSanitizer, short `iwarp fuzz-peer` runs against this stack's rping and against siw,
# the verbs drop-in (Debian's rping and perftest) against this stack's tools and against
# siw, libiscsi's iSER initiator on the drop-in against the Linux LIO target on siw, the
# conformance suite on every backend (engine, drop-in, siw, rxe), and the siw interop suite
# (qemu guest; needs root, see docs/interop.md). Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
# Tests that need root (namespaces, veth, TAP, raw sockets) fail instead of skipping.
export IWARP_REQUIRE_ALL=1

FUZZ_SECONDS="${FUZZ_SECONDS:-15}"
# Each step says when it started (minutes:seconds since the command began).
step() { printf '\n==> %s [%d:%02d]\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)); }

step "toolchain"
cargo --version
command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest

step "packages the verbs drop-in's tests use (rdma-core headers and programs, binutils, libfabric, Open MPI, netcat)"
pkgs=()
for p in rping:rdmacm-utils ib_write_bw:perftest ibv_devinfo:ibverbs-utils objdump:binutils cc:gcc \
  fi_pingpong:libfabric-bin mpirun:openmpi-bin mpicc:libopenmpi-dev nc.traditional:netcat-traditional; do
  command -v "${p%%:*}" >/dev/null || pkgs+=("${p#*:}")
done
[ -f /usr/include/infiniband/verbs.h ] || pkgs+=(libibverbs-dev)
[ -f /usr/include/rdma/rdma_cma.h ] || pkgs+=(librdmacm-dev)
# The `verbs` feature (sideway's rdma-mummy-sys builds its loader stubs with cmake and clang).
command -v cmake >/dev/null || pkgs+=(cmake)
[ -n "$(ls /usr/lib/llvm-*/lib/libclang.so* 2>/dev/null)" ] || pkgs+=(libclang-dev)
if [ "${#pkgs[@]}" -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" \
    || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}"; }
fi

step "cargo fmt --check"
cargo fmt --all --check

step "dependency directions (docs/architecture.md#dependency-rules)"
python3 scripts/check-deps.py

step "cited paths exist (comments, scripts, docs/)"
python3 scripts/check-doc-refs.py

step "no source file imports one that imports it back (scripts/check-imports.py)"
python3 scripts/check-imports.py

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
# The verbs backend (src/verbs.rs) and what uses it are compiled only with the feature.
cargo clippy -p iwarp -p iwarp-tests -p iwarp-cli --all-targets --features verbs --locked -- -D warnings

step "cargo doc -D warnings"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

step "tests"
cargo nextest run --workspace --locked --no-fail-fast
cargo test --workspace --doc --locked

step "random fault schedules, and schedules that must finish without a teardown, through real devices (10^4 each, optimized build)"
cargo test --release --locked -p iwarp-tests --test faults -- --nocapture

step "fuzz-peer against this stack's own rping on loopback, both roles (scripts/fuzz-peer-loopback.sh)"
IWARP_FUZZ_SECONDS="${IWARP_FUZZ_SECONDS:-15}" bash scripts/fuzz-peer-loopback.sh

step "fuzz smoke (${FUZZ_SECONDS}s per target)"
bash scripts/fuzz-smoke.sh "$FUZZ_SECONDS"

step "AddressSanitizer: DMA module, memory tests, deregistration race, the verbs drop-in, placement fuzz targets"
bash scripts/asan.sh "${ASAN_FUZZ_SECONDS:-10}"

step "verbs drop-in: Debian's rping and perftest against iwarp rping/perftest, its bandwidth, libfabric's fi_pingpong and the MPI ping-pong (ofi MTL vs tcp BTL) on it (scripts/verbs-abi-test.sh)"
bash scripts/verbs-abi-test.sh

step "conformance suite: the engine and the verbs backend over the drop-in on the host, siw and rxe in the guest, engine <-> siw traffic (scripts/conformance.sh, tests/interop/run-conformance.sh)"
CONFORMANCE_BIN="$(bash scripts/conformance.sh | tail -1)"
CONFORMANCE_BIN="$CONFORMANCE_BIN" bash tests/interop/run-conformance.sh

step "siw interop (qemu guest on a tap in a private netns: tests/interop/run-suite.sh)"
# Fails with a message when qemu cannot be installed or a namespace/tap cannot be created.
bash tests/interop/run-suite.sh

step "siw interop over this stack's own TCP/IP (smoltcp on a veth bridged to the guest's tap)"
bash tests/interop/run-smol.sh

step "verbs drop-in against siw in the guest: Debian's rping and ib_*_bw -R, both directions (tests/interop/run-verbs-abi.sh)"
# Status 3: only siw's perftest failed, calibrating its clock or answering a connection in time
# under TCG; up to two more boots decide. (Its clock calibration, after the data phase, failed
# in two boots in a row once: one retry was not enough.)
verbs_rc=0
bash tests/interop/run-verbs-abi.sh || verbs_rc=$?
for again in 1 2; do
  [ "$verbs_rc" = 3 ] || break
  echo "siw's perftest was too slow under TCG (clock calibration or accept): the drop-in against siw once more ($again of 2)"
  verbs_rc=0
  IWARP_INTEROP_OUT="$PWD/target/interop-verbs-abi-again$again" bash tests/interop/run-verbs-abi.sh || verbs_rc=$?
done
[ "$verbs_rc" = 0 ] || exit "$verbs_rc"

step "iSER: libiscsi on the drop-in against LIO's ib_isert on siw in the guest: inquiry, capacity, 8 MiB written and read back, against iSCSI/TCP (tests/interop/run-iser.sh)"
bash tests/interop/run-iser.sh

step "fuzz-peer against siw in the guest, both roles (tests/interop/run-fuzz.sh)"
bash tests/interop/run-fuzz.sh

step "Terminate checks against siw in the guest (tests/interop/run-terminates.sh, docs/interop.md#terminate-checks)"
bash tests/interop/run-terminates.sh

step "all checks passed"
