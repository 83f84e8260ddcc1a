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
# BTL in the same run (figures reported, not asserted). Then rsockets: Debian's rstream with
# both ends on the drop-in (verified), netcat and iperf3 through librspreload.so, and rstream's
# latency and bandwidth on the drop-in against rstream over kernel TCP (-T s) in the same run.
#
# Prints one PASS/FAIL line per case and exits non-zero when one failed. Installs what it
# needs with apt (rdmacm-utils, perftest, ibverbs-utils, libibverbs-dev, librdmacm-dev,
# libfabric-bin, openmpi-bin, libopenmpi-dev, netcat-traditional, iperf3).
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
  mpirun:openmpi-bin mpicc:libopenmpi-dev nc.traditional:netcat-traditional iperf3:iperf3; do
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

# The processes under PID (children first), one per line.
descendants() {
  local c
  for c in $(ps -o pid= --ppid "$1" 2> /dev/null); do
    descendants "$c"
    echo "$c"
  done
}

# Where every process under PID and each of its threads waits: command line, wait channel
# and kernel stack, and the user-space stacks where gdb is installed.
describe_hang() {
  local p t
  for p in $(descendants "$1") "$1"; do
    echo "== process $p: $(tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null)"
    for t in /proc/"$p"/task/*; do
      echo "-- thread ${t##*/} $(cat "$t/comm" 2> /dev/null) wchan=$(cat "$t/wchan" 2> /dev/null)"
      cat "$t/stack" 2> /dev/null
    done
    if command -v gdb > /dev/null; then
      timeout 30 gdb -q -batch -p "$p" -ex 'thread apply all bt' 2>&1 | grep -E '^(Thread|#)'
    fi
  done
}

# run_bounded SECS OUT HANG CMD...: runs CMD with its output in OUT; if it is still running
# after SECS, writes where its processes wait into HANG, kills them (by PID) and returns 124.
run_bounded() {
  local secs="$1" out="$2" hang="$3" waited=0 p
  shift 3
  "$@" > "$out" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  while kill -0 "$pid" 2> /dev/null && [ "$waited" -lt "$secs" ]; do
    sleep 1
    waited=$((waited + 1))
  done
  if kill -0 "$pid" 2> /dev/null; then
    describe_hang "$pid" > "$hang" 2>&1
    for p in $(descendants "$pid") "$pid"; do kill -KILL "$p" 2> /dev/null; done
    wait "$pid" 2> /dev/null
    return 124
  fi
  wait "$pid"
}

LIBS="$(cd "$LIBS" && pwd)"
DROPIN=(env LD_LIBRARY_PATH="$LIBS")
ROUNDS_RS="${VERBS_ABI_PERF_ROUNDS:-3}"

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
  # A run that does not end: where its ranks wait goes to mpi-ofi-verbs-rxm.hang.
  mpi_ofi() {
    run_bounded 120 "$OUT/mpi-ofi-verbs-rxm.txt" "$OUT/mpi-ofi-verbs-rxm.hang" \
      "${MPIRUN[@]}" -x LD_LIBRARY_PATH="$LIBS" --mca pml cm --mca mtl ofi \
      --mca mtl_ofi_provider_include "verbs;ofi_rxm" --mca mtl_base_verbose 100 "$OUT/mpi-pingpong"
  }
  mpi_ofi
  orc=$?
  # A run whose ranks finished the ping-pong (all sizes checked) but did not get through
  # MPI_Finalize within the bound: seen once in CI, not in 80 runs since, cause not known.
  # Where its processes waited is kept (.hang.1) and shown; the run is repeated once, and a
  # second hang of any kind fails the case.
  if [ "$orc" = 124 ] && grep -q "^pingpong: OK" "$OUT/mpi-ofi-verbs-rxm.txt"; then
    mv "$OUT/mpi-ofi-verbs-rxm.hang" "$OUT/mpi-ofi-verbs-rxm.hang.1"
    cp "$OUT/mpi-ofi-verbs-rxm.txt" "$OUT/mpi-ofi-verbs-rxm.txt.1"
    echo "[verbs-abi-test] the MPI run over the drop-in finished its ping-pong but hung in its teardown; where it waited ($OUT/mpi-ofi-verbs-rxm.hang.1):" >&2
    sed 's/^/  /' "$OUT/mpi-ofi-verbs-rxm.hang.1" | head -200 >&2
    echo "[verbs-abi-test] running it once more" >&2
    mpi_ofi
    orc=$?
  fi
  timeout 120 "${MPIRUN[@]}" --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
    "$OUT/mpi-pingpong" > "$OUT/mpi-tcp-btl.txt" 2>&1
  trc=$?
  if [ "$orc" = 0 ] && grep -q "^pingpong: OK" "$OUT/mpi-ofi-verbs-rxm.txt" &&
    grep -q "mtl:ofi:provider: iwarp0" "$OUT/mpi-ofi-verbs-rxm.txt"; then
    note=""
    [ -s "$OUT/mpi-ofi-verbs-rxm.hang.1" ] && note=" (the first run hung in its teardown, see above)"
    result PASS "mpi-pingpong-ofi-mtl-verbs-ofi_rxm" "$(grep '^pingpong:' "$OUT/mpi-ofi-verbs-rxm.txt")$note"
  else
    result FAIL "mpi-pingpong-ofi-mtl-verbs-ofi_rxm" "exit $orc (see $OUT/mpi-ofi-verbs-rxm.txt)"
    [ -s "$OUT/mpi-ofi-verbs-rxm.hang" ] && sed 's/^/  /' "$OUT/mpi-ofi-verbs-rxm.hang" | head -200 >&2
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

# rsockets (librdmacm's socket API, docs/upper-layers.md#rsockets): Debian's rstream with both
# ends on the drop-in, every transfer verified by rstream (-T v), several sizes, one run through
# rpoll (-T a) and one non-blocking (-T n).
for case in "64:500:" "4096:500:" "65536:200:a" "1048576:20:n"; do
  IFS=: read -r size count opt <<< "$case"
  extra=(); [ -n "$opt" ] && extra=(-T "$opt")
  port="$(free_port)"
  name="rstream-verified-$size${opt:+-$opt}"
  timeout 90 "${DROPIN[@]}" rstream -p "$port" -T v -S "$size" -C "$count" "${extra[@]}" > "$OUT/$name.server" 2>&1 &
  spid=$!; PIDS+=("$spid"); sleep 0.7
  timeout 90 "${DROPIN[@]}" rstream -s 127.0.0.1 -p "$port" -T v -S "$size" -C "$count" "${extra[@]}" \
    > "$OUT/$name.client" 2>&1
  crc=$?
  wait "$spid"; src=$?
  if [ "$crc" = 0 ] && [ "$src" = 0 ] && grep -q '^custom' "$OUT/$name.client" && grep -q '^custom' "$OUT/$name.server"; then
    result PASS "$name" "$(awk '$1 == "custom" {print $7 " Gb/s, " $8 " us/xfer"}' "$OUT/$name.client")"
  else
    result FAIL "$name" "client $crc, server $src (see $OUT/$name.*)"
  fi
done

# Unmodified TCP programs through rdma-core's librspreload.so on the drop-in: netcat (the
# traditional one: the preload interposes accept, not accept4) sends 4 MB of random bytes that
# must arrive unchanged, and iperf3 moves 64 MiB; the rdma_cm log shows the drop-in carried them.
PRELOAD=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
if [ -f "$PRELOAD" ]; then
  RSP=(env LD_LIBRARY_PATH="$LIBS" LD_PRELOAD="$PRELOAD" IWARP_LOG=iwarp_verbs_abi::cm=debug)
  head -c 4000000 /dev/urandom > "$OUT/nc.in"
  port="$(free_port)"
  timeout 60 "${RSP[@]}" nc.traditional -l -p "$port" > "$OUT/nc.out" 2> "$OUT/nc.server" &
  spid=$!; PIDS+=("$spid"); sleep 0.7
  timeout 60 "${RSP[@]}" nc.traditional -q 0 127.0.0.1 "$port" < "$OUT/nc.in" > /dev/null 2> "$OUT/nc.client"
  crc=$?
  wait "$spid"; src=$?
  if [ "$crc" = 0 ] && [ "$src" = 0 ] && cmp -s "$OUT/nc.in" "$OUT/nc.out" && grep -q CONNECT_REQUEST "$OUT/nc.server"; then
    result PASS "netcat-librspreload" "4000000 bytes unchanged"
  else
    result FAIL "netcat-librspreload" "client $crc, server $src, $(stat -c %s "$OUT/nc.out") bytes (see $OUT/nc.*)"
  fi
  port="$(free_port)"
  timeout 60 "${RSP[@]}" iperf3 -s -1 -p "$port" > "$OUT/iperf3.server" 2>&1 &
  spid=$!; PIDS+=("$spid"); sleep 0.7
  timeout 60 "${RSP[@]}" iperf3 -c 127.0.0.1 -p "$port" -n 64M > "$OUT/iperf3.client" 2>&1
  crc=$?
  wait "$spid"; src=$?
  if [ "$crc" = 0 ] && [ "$src" = 0 ] && grep -q ' receiver$' "$OUT/iperf3.client" && grep -q CONNECT_REQUEST "$OUT/iperf3.server"; then
    result PASS "iperf3-librspreload" "$(grep ' receiver$' "$OUT/iperf3.client" | awk '{print $7 " " $8}')"
  else
    result FAIL "iperf3-librspreload" "client $crc, server $src (see $OUT/iperf3.*)"
  fi
else
  result FAIL "librspreload" "$PRELOAD missing (librdmacm1)"
fi

# The rsockets figures: rstream latency (64 B ping-pong) and bandwidth (64 KiB transfers) on
# the drop-in against the same rstream over kernel TCP sockets (-T s), alternating in one run.
if [ "$ROUNDS_RS" -gt 0 ]; then
  : > "$OUT/rstream-perf.txt"
  rs_pair() { # LABEL ARGS...: one rstream run, both ends; prints "LABEL Gb/s us/xfer"
    local label="$1"; shift
    local port; port="$(free_port)"
    timeout 90 env LD_LIBRARY_PATH="$LIBS" rstream -p "$port" "$@" > /dev/null 2>&1 &
    local spid=$!; PIDS+=("$spid"); sleep 0.7
    timeout 90 env LD_LIBRARY_PATH="$LIBS" rstream -s 127.0.0.1 -p "$port" "$@" 2>&1 |
      awk -v l="$label" '$1 == "custom" {print l, $7, $8}'
    wait "$spid"
  }
  for i in $(seq "$ROUNDS_RS"); do
    for mode in rs tcp; do
      t=(); [ "$mode" = tcp ] && t=(-T s)
      rs_pair "$i $mode lat" "${t[@]}" -S 64 -C 1 -I 5000
      rs_pair "$i $mode bw" "${t[@]}" -S 65536 -C 2000 -I 1
    done | tee -a "$OUT/rstream-perf.txt" >&2
  done
  python3 - "$OUT/rstream-perf.txt" <<'PY' | tee -a "$OUT/summary.txt" >&2
import statistics, sys
v = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 5:
        v.setdefault((f[1], f[2]), []).append((float(f[3]), float(f[4])))
def med(mode, kind, i):
    xs = [x[i] for x in v.get((mode, kind), [])]
    return statistics.median(xs) if xs else None
lat_rs, lat_tcp = med("rs", "lat", 1), med("tcp", "lat", 1)
bw_rs, bw_tcp = med("rs", "bw", 0), med("tcp", "bw", 0)
if None not in (lat_rs, lat_tcp, bw_rs, bw_tcp):
    print(f"PERF rstream 64 B latency: drop-in rsockets {lat_rs:.2f} us/xfer, kernel TCP {lat_tcp:.2f} us/xfer, "
          f"ratio {lat_rs / lat_tcp:.2f} (lower is better)")
    print(f"PERF rstream 64 KiB bandwidth: drop-in rsockets {bw_rs:.2f} Gb/s, kernel TCP {bw_tcp:.2f} Gb/s, "
          f"ratio {bw_rs / bw_tcp:.2f}")
else:
    print("PERF rstream: no figures (see rstream-perf.txt)")
PY
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
