# shellcheck shell=bash
# Sourced by run-guest.sh and run-suite.sh: boot the interop guest with its NIC on a tap device
# in a network namespace this script creates, run things on both sides, clean up by PID.
#
# Network rule (docs/interop.md#network-rule): traffic only inside the namespace created here
# (10.99.0.0/24 on the tap, host side .1, guest .2) and qemu's link.
#
# Usage:
#   source lib.sh; iw_setup_ns              # namespace + tap, trap cleanup installed
#   iw_boot OUTDIR [--siw stock|param] [--siwopts a=1,b=0] [--cmd 'guest shell'] [--pcap F]
#           [--smp N] [--max SECS]
#   iw_wait_marker REGEX SECS              # wait for a line on the guest's serial console
#   iw_wait_exit SECS                      # wait for IWARP-GUEST-EXIT=N; sets IW_GUEST_RC
#   iw_ns CMD...                           # run a command inside the namespace
#   iw_dropin_libs OUTDIR                  # the verbs drop-in's libraries -> IW_DROPIN_LIBS
#   iw_guest_image                         # the guest image -> IW_IMG (exported)
#   iw_stop_guest                          # kill qemu (by PID) if still running
#   iw_cleanup                             # everything (also run by the EXIT trap)

IW_HOST_IP=10.99.0.1
IW_GUEST_IP=10.99.0.2
IW_TAP=iwtap0
IW_NS=""
IW_QEMU_PID=""
IW_SERIAL=""
IW_MONITOR=""
IW_GUEST_RC=""
IW_BG_PIDS=()

iw_log() { printf '[interop %s] %s\n' "$(date +%T)" "$*" >&2; }
iw_die() { printf '[interop] FAILED: %s\n' "$*" >&2; exit 1; }

iw_cleanup() {
  local p
  for p in "${IW_BG_PIDS[@]}"; do
    kill "$p" 2>/dev/null || true
  done
  iw_stop_guest
  if [ -n "$IW_NS" ]; then
    ip -n "$IW_NS" link del "$IW_TAP" 2>/dev/null || true
    ip netns del "$IW_NS" 2>/dev/null || true
    IW_NS=""
  fi
}

iw_stop_guest() {
  if [ -n "$IW_QEMU_PID" ]; then
    if kill -0 "$IW_QEMU_PID" 2>/dev/null; then
      kill "$IW_QEMU_PID" 2>/dev/null || true
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        kill -0 "$IW_QEMU_PID" 2>/dev/null || break
        sleep 0.2
      done
      kill -9 "$IW_QEMU_PID" 2>/dev/null || true
    fi
    wait "$IW_QEMU_PID" 2>/dev/null || true
    IW_QEMU_PID=""
  fi
}

# Creates the namespace and the tap; installs the cleanup trap.
iw_setup_ns() {
  [ "$(id -u)" = 0 ] || iw_die "must run as root (network namespace, tap device)"
  [ -c /dev/net/tun ] || iw_die "/dev/net/tun missing: cannot create a tap device"
  IW_NS="iwarp-interop-$$-$RANDOM"
  trap iw_cleanup EXIT
  trap 'exit 130' INT TERM
  ip netns add "$IW_NS" || iw_die "cannot create network namespace $IW_NS (ip netns add)"
  ip -n "$IW_NS" link set lo up
  ip netns exec "$IW_NS" ip tuntap add dev "$IW_TAP" mode tap \
    || iw_die "cannot create tap device $IW_TAP in namespace $IW_NS"
  ip -n "$IW_NS" addr add "$IW_HOST_IP/24" dev "$IW_TAP"
  ip -n "$IW_NS" link set "$IW_TAP" up
}

iw_ns() { ip netns exec "$IW_NS" "$@"; }

# The verbs drop-in's staged libraries: $IWARP_VERBS_ABI_DIR, or built now (scripts/verbs-abi.sh
# --release, its log in OUTDIR/build.log); sets IW_DROPIN_LIBS to an absolute path.
iw_dropin_libs() { # OUTDIR
  local libs="${IWARP_VERBS_ABI_DIR:-}" root
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  [ -n "$libs" ] || libs="$(cd "$root" && bash scripts/verbs-abi.sh --release 2> "$1/build.log" | tail -1)"
  IW_DROPIN_LIBS="$(cd "$libs" && pwd)" || iw_die "no drop-in libraries (see $1/build.log)"
}

# The guest image: $IW_IMG, or built (cached) by build-guest.sh; exported.
iw_guest_image() {
  IW_IMG="${IW_IMG:-$(bash "$(dirname "${BASH_SOURCE[0]}")/build-guest.sh" | tail -1)}"
  export IW_IMG
  [ -s "$IW_IMG/vmlinux" ] || iw_die "no guest image"
}

# tshark's options for every capture check.
# - rpcordma off: tshark 4.0's RPC-over-RDMA heuristic throws on Sends shorter than its header
#   (perftest's 4- and 2-byte control messages) and marks them malformed; none of this traffic
#   is RPC-over-RDMA.
# - heuristics first: MPA has no port of its own, so tshark finds it with its heuristic, which it
#   tries by default only after the dissector registered on either port of the connection. An
#   ephemeral port that tshark knows (48898 ADS/AMS, 34980 EtherCAT, 44818 EtherNet/IP, 57000
#   IRC, ...) gives the whole connection to that dissector, which marks its frames malformed:
#   one CI run failed so, a siw perftest client's control connection from port 48898 (10
#   malformed frames, none of its 32 FPDUs decoded; with this option all 32 and none malformed).
IW_TSHARK_OPTS=(--disable-protocol rpcordma -o tcp.try_heuristic_first:TRUE)

# Whether siw's perftest, whose output lines SERIAL carries prefixed "[TAG]", gave up on its
# cycle counter's calibration: it calibrates when it prints its report, after the data phase,
# and under TCG a noisy calibration ends it ("Correlation coefficient r^2: ... < 0.9", "Can't
# produce a report", exit 1). Such a run says nothing about either stack.
iw_siw_clock_failed() { # SERIAL TAG
  grep -aqF "[$2] Correlation coefficient" "$1"
}

# Where tshark lost the FPDU boundaries of PORT's connections in PCAP (tshark-sync.py: the frame
# and both views), or nothing. `iwarp dissect --json` of PCAP is written beside it once.
iw_tshark_lost() { # PCAP PORT
  local js="$1.dissect.jsonl"
  [ -s "$js" ] || "$IWARP_BIN" dissect --json "$1" > "$js" 2> /dev/null || true
  python3 "$(dirname "${BASH_SOURCE[0]}")/tshark-sync.py" "$1" "$2" "$js" "${IW_TSHARK_OPTS[@]}" 2> /dev/null || true
}

# Runs CMD in the namespace in the background (bounded by SECS), output to FILE; sets IW_BG_PID.
iw_ns_bg() { # SECS FILE CMD...
  local secs="$1" file="$2"; shift 2
  ip netns exec "$IW_NS" timeout -k 2 "$secs" "$@" > "$file" 2>&1 &
  IW_BG_PID=$!
  IW_BG_PIDS+=("$IW_BG_PID")
}

iw_boot() { # OUTDIR [options]
  local out="$1"; shift
  local siw=stock siwopts="" cmd="" pcap="" max=300 smp=1
  while [ $# -gt 0 ]; do
    case "$1" in
      --siw) siw="$2"; shift 2 ;;
      --siwopts) siwopts="$2"; shift 2 ;;
      --cmd) cmd="$2"; shift 2 ;;
      --pcap) pcap="$2"; shift 2 ;;
      --max) max="$2"; shift 2 ;;
      --smp) smp="$2"; shift 2 ;;
      *) iw_die "iw_boot: unknown option $1" ;;
    esac
  done
  [ -n "$IW_IMG" ] || iw_die "IW_IMG (image directory from build-guest.sh) not set"
  [ -n "$IW_NS" ] || iw_die "iw_setup_ns first"
  mkdir -p "$out"
  IW_SERIAL="$out/serial.log"
  : > "$IW_SERIAL"
  IW_GUEST_RC=""
  local append="console=ttyS0 quiet panic=-1 iw.ip=$IW_GUEST_IP iw.siw=$siw"
  [ -n "$siwopts" ] && append+=" iw.siwopts=$siwopts"
  [ -n "$cmd" ] && append+=" iw.cmd=$(printf '%s' "$cmd" | base64 -w0)"
  local filter=()
  [ -n "$pcap" ] && filter=(-object "filter-dump,id=d0,netdev=n0,file=$pcap")
  # qemu's monitor on a socket beside the log, for a look at a guest that stopped answering
  # (iw_guest_state); none where the path is too long for a socket's name.
  IW_MONITOR="$out/monitor.sock"
  local monitor=(-monitor "unix:$IW_MONITOR,server=on,wait=off")
  [ "${#IW_MONITOR}" -lt 100 ] || { IW_MONITOR=""; monitor=(-monitor none); }
  # qemu is exec'd by `ip netns exec` and `timeout`... keep qemu itself the PID we hold:
  # `ip netns exec` execs its command, so $! is qemu.
  ip netns exec "$IW_NS" qemu-system-x86_64 \
    -M pc -accel tcg -cpu max -m 512M -smp "$smp" \
    -nographic "${monitor[@]}" -serial "file:$IW_SERIAL" -no-reboot \
    -kernel "$IW_IMG/vmlinux" -initrd "$IW_IMG/initrd.img" -append "$append" \
    -netdev "tap,id=n0,ifname=$IW_TAP,script=no,downscript=no,vnet_hdr=off" \
    -device "virtio-net-pci,netdev=n0,mac=52:54:00:99:00:02" \
    "${filter[@]}" \
    < /dev/null > "$out/qemu.log" 2>&1 &
  IW_QEMU_PID=$!
  # hard bound on the guest's life, whatever the caller does
  # shellcheck disable=SC2016
  ( trap 'kill $sp 2>/dev/null; exit 0' TERM; sleep "$max" & sp=$!; wait $sp
    kill "$IW_QEMU_PID" 2>/dev/null ) > /dev/null 2>&1 &
  IW_BG_PIDS+=("$!")
}

# Waits until the serial log has a line matching REGEX (grep -E); fails on guest exit/timeout.
iw_wait_marker() { # REGEX SECS
  local re="$1" secs="$2" end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    grep -qE "$re" "$IW_SERIAL" 2>/dev/null && return 0
    if ! kill -0 "$IW_QEMU_PID" 2>/dev/null; then
      grep -qE "$re" "$IW_SERIAL" 2>/dev/null && return 0
      iw_log "guest exited before '$re'"; return 1
    fi
    sleep 0.1
  done
  iw_log "timeout ($secs s) waiting for '$re' on the guest console"
  return 1
}

# Appends what qemu's monitor says of the guest's CPU to FILE: whether it runs, and its
# registers five times, 0.2 s apart (an instruction pointer that stays in one place with
# interrupts off, IF (0x200) clear in RFL, is a guest kernel spinning; one that moves, a guest
# that runs but does not answer; no answer at all, qemu itself stuck). For a guest that stopped
# answering the network mid-run. Returns 0 whatever happens.
iw_guest_state() { # FILE
  local file="$1"
  [ -n "${IW_MONITOR:-}" ] && [ -S "$IW_MONITOR" ] || { echo "(no qemu monitor)" >> "$file"; return 0; }
  timeout 15 python3 - "$IW_MONITOR" >> "$file" 2>&1 << 'PY' || echo "(the monitor did not answer in 15 s)" >> "$file"
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.settimeout(3)
s.connect(sys.argv[1])
def cmd(c):
    s.sendall((c + "\n").encode())
    time.sleep(0.2)
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
            if out.rstrip().endswith(b"(qemu)"):
                break
    except socket.timeout:
        pass
    print(out.decode(errors="replace"))
cmd("info status")
for _ in range(5):
    cmd("info registers")
PY
  return 0
}

# Whether the guest's kernel crashed (an oops or BUG on its console).
iw_guest_crashed() {
  grep -aqE 'invalid opcode:|kernel BUG at|BUG: |Oops:|general protection fault' "$IW_SERIAL" 2>/dev/null
}

# Waits for the guest's exit marker; sets IW_GUEST_RC (empty on timeout, or when the guest's
# kernel crashed) and stops qemu.
iw_wait_exit() { # SECS
  local secs="$1" end=$((SECONDS + $1)) line
  local alive=1
  while [ $SECONDS -lt $end ]; do
    line="$(grep -aoE 'IWARP-GUEST-EXIT=[0-9]+' "$IW_SERIAL" 2>/dev/null | head -1)"
    if [ -n "$line" ]; then
      IW_GUEST_RC="${line#IWARP-GUEST-EXIT=}"
      break
    fi
    [ $alive = 0 ] && break
    iw_guest_crashed && { iw_log "the guest's kernel crashed (see $IW_SERIAL)"; break; }
    kill -0 "$IW_QEMU_PID" 2>/dev/null || alive=0
    sleep 0.1
  done
  # let qemu finish on its own (the guest reboots = qemu exits), then make sure
  for _ in $(seq 1 20); do
    kill -0 "$IW_QEMU_PID" 2>/dev/null || break
    sleep 0.1
  done
  iw_stop_guest
  [ -n "$IW_GUEST_RC" ]
}
