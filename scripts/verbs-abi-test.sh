#!/usr/bin/env bash
# Debian's unmodified rping (rdmacm-utils 44) and perftest 4.5 (ib_write_bw, ib_read_bw,
# ib_send_bw with -R) on the drop-in verbs libraries (verbs-abi/), against this stack's own
# `iwarp rping` and `iwarp perftest`, both directions, over 127.0.0.1; then the drop-in's
# bandwidth: `ib_write_bw -R -s 65536` with both ends on the drop-in, as a ratio to
# `iwarp bench` Write at 64 KiB measured in the same run (reported, not asserted: tests never
# assert on time). Then the upper layers (docs/upper-layers.md): libfabric 1.17's
# `fi_pingpong` over `verbs;ofi_rxm` and `verbs` with both ends on the drop-in (data
# checked), and Open MPI 4.1 running tests/mpi/pingpong.c on two ranks with the ofi MTL
# forced onto `verbs;ofi_rxm` on the drop-in, next to the same program over Open MPI's tcp
# BTL in the same run (figures reported, not asserted).
#
# Prints one PASS/FAIL line per case and exits non-zero when one failed. Installs what it
# needs with apt (rdmacm-utils, perftest, ibverbs-utils, libibverbs-dev, librdmacm-dev,
# libfabric-bin, openmpi-bin, libopenmpi-dev).
# Every process is bounded by `timeout` and killed by its PID on the way out.
#
# Environment: IWARP_BIN (default: cargo build --release), IWARP_VERBS_ABI_DIR (default:
# scripts/verbs-abi.sh --release), VERBS_ABI_PERF_ROUNDS (default 3; 0 skips the figure).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="$ROOT/target/verbs-abi-test"
rm -rf "$OUT"; mkdir -p "$OUT"
FAILS=0
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] && kill "$p" 2> /dev/null
  done
  return 0
}
trap cleanup EXIT
log() { printf '[verbs-abi] %s\n' "$*" >&2; }
result() { # PASS|FAIL name detail
  printf '%-4s %-44s %s\n' "$1" "$2" "$3" | tee -a "$OUT/summary.txt" >&2
  [ "$1" = PASS ] || FAILS=$((FAILS + 1))
}

need=()
for p in rping:rdmacm-utils ib_write_bw:perftest ibv_devinfo:ibverbs-utils fi_pingpong:libfabric-bin \
  mpirun:openmpi-bin mpicc:libopenmpi-dev; do
  command -v "${p%%:*}" > /dev/null || need+=("${p#*:}")
done
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
[ -f /usr/include/rdma/rdma_cma.h ] || need+=(librdmacm-dev)
if [ "${#need[@]}" -gt 0 ]; then
  log "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends "${need[@]}" \
    > "$OUT/apt.log" 2>&1 || { apt-get update -q > /dev/null 2>&1 &&
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends "${need[@]}" \
      >> "$OUT/apt.log" 2>&1; } || { log "apt-get install failed (see $OUT/apt.log)"; exit 1; }
fi

LIBS="${IWARP_VERBS_ABI_DIR:-}"
if [ -z "$LIBS" ]; then
  log "building the drop-in libraries (release)"
  LIBS="$(timeout 1800 bash scripts/verbs-abi.sh --release 2> "$OUT/build.log" | tail -1)" ||
    { log "build failed (see $OUT/build.log)"; exit 1; }
fi
if [ -z "${IWARP_BIN:-}" ]; then
  timeout 1800 cargo build --release --locked --quiet --bin iwarp 2>> "$OUT/build.log" ||
    { log "cargo build of iwarp failed"; exit 1; }
  IWARP_BIN="$ROOT/target/release/iwarp"
fi
log "libraries: $LIBS"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# run_pair NAME SERVER_CMD... -- CLIENT_CMD...: the server in the background, then the client;
# both must exit 0 within 90 s. Output in $OUT/NAME.{server,client}.
run_pair() {
  local name="$1"; shift
  local server=() client=()
  while [ "$1" != "--" ]; do server+=("$1"); shift; done
  shift
  client=("$@")
  timeout 90 "${server[@]}" > "$OUT/$name.server" 2>&1 &
  local spid=$!
  PIDS+=("$spid")
  sleep 0.7
  timeout 90 "${client[@]}" > "$OUT/$name.client" 2>&1
  local crc=$?
  wait "$spid"
  local src=$?
  if [ "$crc" = 0 ] && [ "$src" = 0 ]; then
    result PASS "$name" "$(grep -h -A1 '#bytes' "$OUT/$name.client" | tail -1 | awk '{print $4 " MiB/s"}')"
  else
    result FAIL "$name" "client $crc, server $src (see $OUT/$name.*)"
  fi
}

LIBS="$(cd "$LIBS" && pwd)"
DROPIN=(env LD_LIBRARY_PATH="$LIBS")

# rping: the drop-in against `iwarp rping`, both ways.
for size in 1024 65535; do
  port="$(free_port)"
  run_pair "rping-dropin-server-iwarp-client-$size" "${DROPIN[@]}" rping -s -a 127.0.0.1 -p "$port" -S "$size" -- \
    "$IWARP_BIN" rping -c -a 127.0.0.1 -p "$port" -C 100 -V -S "$size"
  port="$(free_port)"
  run_pair "rping-iwarp-server-dropin-client-$size" "$IWARP_BIN" rping -s -a 127.0.0.1 -p "$port" -S "$size" -- \
    "${DROPIN[@]}" rping -c -a 127.0.0.1 -p "$port" -C 100 -V -S "$size"
done
# The pings really were validated: the drop-in client printed none of rping's errors.
if grep -l "data mismatch\|error" "$OUT"/rping-iwarp-server-dropin-client-*.client > /dev/null 2>&1; then
  result FAIL "rping-output" "errors in the drop-in client's output"
fi

# perftest: the drop-in against `iwarp perftest`, both ways.
for t in write read send; do
  port="$(free_port)"
  run_pair "ib_${t}_bw-dropin-server-iwarp-client" "${DROPIN[@]}" "ib_${t}_bw" -R -F -p "$port" -s 65536 -n 500 -- \
    "$IWARP_BIN" perftest "$t" 127.0.0.1 -p "$port" -s 65536 -n 500
  port="$(free_port)"
  run_pair "ib_${t}_bw-iwarp-server-dropin-client" "$IWARP_BIN" perftest "$t" -p "$port" -s 65536 -n 500 -- \
    "${DROPIN[@]}" "ib_${t}_bw" -R -F -p "$port" -s 65536 -n 500 127.0.0.1
done

# libfabric's verbs provider on the drop-in: fi_pingpong, every default size (64 B .. 1 MiB:
# rxm's eager, segmented and rendezvous protocols), each message checked (-c).
for case in "verbs;ofi_rxm:rdm" "verbs:msg"; do
  prov="${case%%:*}"; ep="${case#*:}"
  port="$(free_port)"
  name="fi_pingpong-${prov/;/-}-$ep"
  timeout 90 "${DROPIN[@]}" fi_pingpong -p "$prov" -e "$ep" -I 500 -c -B "$port" > "$OUT/$name.server" 2>&1 &
  spid=$!; PIDS+=("$spid"); sleep 0.7
  timeout 90 "${DROPIN[@]}" fi_pingpong -p "$prov" -e "$ep" -I 500 -c -P "$port" 127.0.0.1 > "$OUT/$name.client" 2>&1
  crc=$?
  wait "$spid"; src=$?
  rows="$(grep -cE '^(64|256|1k|4k|64k|1m) +500 +=500 ' "$OUT/$name.client")"
  if [ "$crc" = 0 ] && [ "$src" = 0 ] && [ "$rows" = 6 ] && ! grep -q "Error at" "$OUT/$name".*; then
    result PASS "$name" "$(awk '$1 == "64" {l=$7} $1 == "1m" {b=$6} END {print "64 B " l " us/xfer, 1 MiB " b " MB/s"}' "$OUT/$name.client")"
  else
    result FAIL "$name" "client $crc, server $src, $rows of 6 sizes (see $OUT/$name.*)"
  fi
done

# Open MPI 4.1: tests/mpi/pingpong.c on two ranks, the ofi MTL forced onto verbs;ofi_rxm on
# the drop-in, and the same program over the tcp BTL (kernel TCP on loopback) as the baseline.
if mpicc -O2 -o "$OUT/mpi-pingpong" tests/mpi/pingpong.c 2> "$OUT/mpi-build.log"; then
  MPIRUN=(mpirun --allow-run-as-root -np 2 --host localhost:2 --bind-to none)
  timeout 120 "${MPIRUN[@]}" -x LD_LIBRARY_PATH="$LIBS" --mca pml cm --mca mtl ofi \
    --mca mtl_ofi_provider_include "verbs;ofi_rxm" --mca mtl_base_verbose 100 \
    "$OUT/mpi-pingpong" > "$OUT/mpi-ofi-verbs-rxm.txt" 2>&1
  orc=$?
  timeout 120 "${MPIRUN[@]}" --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
    "$OUT/mpi-pingpong" > "$OUT/mpi-tcp-btl.txt" 2>&1
  trc=$?
  if [ "$orc" = 0 ] && grep -q "^pingpong: OK" "$OUT/mpi-ofi-verbs-rxm.txt" &&
    grep -q "mtl:ofi:provider: iwarp0" "$OUT/mpi-ofi-verbs-rxm.txt"; then
    result PASS "mpi-pingpong-ofi-mtl-verbs-ofi_rxm" "$(grep '^pingpong:' "$OUT/mpi-ofi-verbs-rxm.txt")"
  else
    result FAIL "mpi-pingpong-ofi-mtl-verbs-ofi_rxm" "exit $orc (see $OUT/mpi-ofi-verbs-rxm.txt)"
  fi
  if [ "$trc" = 0 ] && grep -q "^pingpong: OK" "$OUT/mpi-tcp-btl.txt"; then
    result PASS "mpi-pingpong-tcp-btl" "$(grep '^pingpong:' "$OUT/mpi-tcp-btl.txt")"
  else
    result FAIL "mpi-pingpong-tcp-btl" "exit $trc (see $OUT/mpi-tcp-btl.txt)"
  fi
  python3 - "$OUT/mpi-ofi-verbs-rxm.txt" "$OUT/mpi-tcp-btl.txt" <<'PY' | tee -a "$OUT/summary.txt" >&2
import sys
def rows(path):
    out = {}
    for line in open(path):
        f = line.split()
        if len(f) == 4 and f[0].isdigit():
            out[int(f[0])] = (float(f[2]), float(f[3]))
    return out
ofi, tcp = rows(sys.argv[1]), rows(sys.argv[2])
print("PERF MPI ping-pong (Open MPI 4.1, 2 ranks, one host): ofi MTL on verbs;ofi_rxm (drop-in) vs tcp BTL")
print(f"PERF {'bytes':>9} {'ofi lat us':>11} {'tcp lat us':>11} {'ofi MB/s':>10} {'tcp MB/s':>10}")
for size in sorted(set(ofi) & set(tcp)):
    (ol, ob), (tl, tb) = ofi[size], tcp[size]
    print(f"PERF {size:>9} {ol:>11.2f} {tl:>11.2f} {ob:>10.2f} {tb:>10.2f}")
PY
else
  result FAIL "mpi-pingpong-build" "mpicc failed (see $OUT/mpi-build.log)"
fi

# The figure: ib_write_bw -R -s 65536 over the drop-in, against iwarp bench Write 64 KiB,
# alternating, in one run. CRC off on both (the drop-in's default).
ROUNDS="${VERBS_ABI_PERF_ROUNDS:-3}"
if [ "$ROUNDS" -gt 0 ]; then
  : > "$OUT/perf.txt"
  for i in $(seq "$ROUNDS"); do
    bench="$(timeout 120 "$IWARP_BIN" bench --ops write --sizes 64k --duration 3 --crc off 2> /dev/null |
      awk '$1 == "64K" {print $3}')"
    port="$(free_port)"
    timeout 90 env LD_LIBRARY_PATH="$LIBS" ib_write_bw -R -F -p "$port" -s 65536 -D 4 > "$OUT/perf-server.$i" 2>&1 &
    spid=$!; PIDS+=("$spid"); sleep 0.7
    pt="$(timeout 90 env LD_LIBRARY_PATH="$LIBS" ib_write_bw -R -F -p "$port" -s 65536 -D 4 127.0.0.1 2>&1 |
      grep -A1 '#bytes' | tail -1 | awk '{print $4}')"
    wait "$spid"
    echo "$i bench_write_64k_GBps=${bench:-?} ib_write_bw_MiBps=${pt:-?}" | tee -a "$OUT/perf.txt" >&2
  done
  python3 - "$OUT/perf.txt" <<'PY' | tee -a "$OUT/summary.txt" >&2
import statistics, sys
ratios = []
for line in open(sys.argv[1]):
    f = dict(kv.split("=") for kv in line.split()[1:])
    try:
        b, p = float(f["bench_write_64k_GBps"]), float(f["ib_write_bw_MiBps"]) * 1048576 / 1e9
    except ValueError:
        continue
    ratios.append(p / b)
    print(f"PERF round: ib_write_bw {p:.3f} GB/s, iwarp bench write {b:.3f} GB/s, ratio {p / b:.2f}")
if ratios:
    print(f"PERF ib_write_bw -R -s 65536 on the drop-in / iwarp bench write 64K: median ratio "
          f"{statistics.median(ratios):.2f} over {len(ratios)} rounds (goal >= 0.9)")
PY
fi

cleanup
if [ "$FAILS" -gt 0 ]; then
  log "FAILED: $FAILS case(s); logs in $OUT"
  exit 1
fi
log "all cases passed"
