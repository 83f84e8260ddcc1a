#!/usr/bin/env bash
# Same-machine comparison: the host-built `iwarp` binary runs inside the siw guest, so this
# stack's `iwarp bench` (kernel TCP on the guest's loopback, client and server on separate
# devices) and perftest over siw (`ib_{write,read,send}_bw -R`, server and client in the guest,
# siw0 on eth0, to the guest's own address, which TCP carries over the loopback) run on the same
# emulated machine, with the same CRC setting (siw's default: off). TCG distorts absolute
# numbers, not the comparison. Prints both results and their ratio per operation, vCPU count
# and poll mode; a measurement, not a test (exit status 0 when every run produced its numbers).
#
# Both sides run at perftest's depth: `ib_*_bw`'s defaults are a transmit depth of 128, CQ
# moderation 100 and, for reads, as many outstanding as the device allows (siw: 128), so the
# bench runs with `--window 128 --cq-mod 100` (its Reads then go 128 deep too); set
# IWARP_BENCH_FLAGS to run it otherwise (empty: the bench's own defaults).
#
#   compare.sh [SIZE] [SECONDS] [VCPUS] [POLL_MODES]
#   defaults:   65536   3         "1 2"   "inline adaptive"
#   environment: IWARP_BIN, IWARP_BENCH_FLAGS (above), IWARP_COMPARE_ROUNDS (3),
#   IWARP_COMPARE_BOOTS (1; below)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"
SIZE="${1:-65536}" SECS="${2:-3}" VCPUS="${3:-1 2}" POLLS="${4:-inline adaptive}"
BIN="${IWARP_BIN:-$ROOT/target/release/iwarp}"
FLAGS="${IWARP_BENCH_FLAGS---window 128 --cq-mod 100}"
[ -x "$BIN" ] || iw_die "$BIN is not built (cargo build --release --bin iwarp)"
# Checked before the guest image is built or a namespace made (see the boots below).
BOOTS="${IWARP_COMPARE_BOOTS:-1}"
case "$BOOTS" in ''|*[!0-9]*|0) iw_die "IWARP_COMPARE_BOOTS must be a positive number, not '$BOOTS'" ;; esac
base="$(bash "$HERE/build-guest.sh" | tail -1)"
work="$(mktemp -d /tmp/iwarp-compare.XXXXXX)"
# A second archive appended to the image's initramfs brings the binary in (the kernel unpacks
# concatenated archives in order). It is compressed like the first: the kernel takes an
# uncompressed archive after a compressed one only at a 4-byte aligned offset, which the
# first archive's length does not guarantee.
mkdir -p "$work/root/opt"
strip -o "$work/root/opt/iwarp" "$BIN"
(cd "$work/root" && find opt | cpio -o -H newc --quiet | gzip -1) > "$work/extra.cpio.gz"
mkdir -p "$work/img"
ln -s "$base/vmlinux" "$work/img/vmlinux"
cat "$base/initrd.img" "$work/extra.cpio.gz" > "$work/img/initrd.img"
export IW_IMG="$work/img"
iw_setup_ns

# The guest: ROUNDS rounds of, for each operation, perftest's server then client over siw (its
# default CRC setting: off), then this stack's bench in each poll mode with CRC off too. siw's
# figures move by a third from one run to the next (Write 103 then 140 MB/s in two boots of
# one image, 81-132 MB/s over several), so one run of each says little: the ratios are of the
# medians over the rounds, which alternate the two stacks, and over the boots: with
# IWARP_COMPARE_BOOTS=N (default 1) each vCPU count boots N guests one after the other and the
# medians take every round of every boot, so that one boot's luck weighs 1/N.
ROUNDS="${IWARP_COMPARE_ROUNDS:-3}"
cmd="[ -x /opt/iwarp ] || { echo 'IWARP-COMPARE: /opt/iwarp missing'; exit 3; }; "
# The rounds loop in the guest's shell: the command goes to the guest on the kernel command
# line, which holds 2 KiB.
cmd+="for r in $(seq -s ' ' "$ROUNDS"); do "
# perftest's client gives up when it cannot calibrate its cycle counter under TCG ("Can't
# produce a report"): up to three tries.
for op in write read send; do
  cmd+="for try in 1 2 3; do "
  cmd+="timeout 120 ib_${op}_bw -R -d siw0 -s $SIZE -D $SECS > /tmp/srv 2>&1 & sleep 3; "
  cmd+="timeout 120 ib_${op}_bw -R -d siw0 -s $SIZE -D $SECS $IW_GUEST_IP > /tmp/cli 2>&1; wait; "
  cmd+="grep -qE '^ +$SIZE ' /tmp/cli && break; done; sed \"s/^/[siw-$op-r\$r] /\" /tmp/cli; "
done
for poll in $POLLS; do
  cmd+="timeout 400 /opt/iwarp bench --ops write,read,send --sizes $SIZE --duration $SECS --crc off $FLAGS "
  cmd+="--poll $poll --quiet 2>&1 | sed \"s/^/[iwarp-$poll-r\$r] /\"; "
done
cmd+="done"
max=$((300 + 420 * ROUNDS))

# The median of the numbers on stdin, one per line (empty when there are none), and their
# range.
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%s %s %s", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[1], v[NR] }'; }

failed=0
results=""
for n in $VCPUS; do
  logs=()
  for b in $(seq "$BOOTS"); do
    out="$work/smp$n-boot$b"
    iw_boot "$out" --smp "$n" --max "$max" --cmd "$cmd"
    iw_wait_exit "$max" || true
    iw_stop_guest
    if grep -q 'IWARP-COMPARE:' "$IW_SERIAL"; then
      cat "$IW_SERIAL"
      iw_die "the guest could not run the binary (log $IW_SERIAL)"
    fi
    logs+=("$IW_SERIAL")
  done
  for op in write read send; do
    # perftest: "#bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]"
    # A round without its result line leaves the value out (and none at all is reported
    # below), not the script.
    read -r siw siw_lo siw_hi < <(grep -ahE "^\[siw-$op-r[0-9]+\] +$SIZE " "${logs[@]}" | awk '{ print $5 }' | median) || true
    for poll in $POLLS; do
      # bench: per operation a section whose first row is "  64K |  GB/s ..."; MB/s. A
      # round that gave no table (its bench failed) is left out of the median and counted
      # as a failure, and the rounds after it still count (grep finding nothing fails the
      # pipeline, under errexit and pipefail).
      rows="$(for log in "${logs[@]}"; do for r in $(seq "$ROUNDS"); do
        grep -aE "^\[iwarp-$poll-r$r\] +[0-9]+[KMG]? \|" "$log" |
          awk -F'|' -v k="$op" 'BEGIN { n = (k == "write") ? 1 : (k == "read") ? 2 : 3 } NR == n { split($2, a, " "); print a[1] * 1000, a[2] * 1000 }' ||
          true
      done; done)"
      vals="$(printf '%s\n' "$rows" | awk 'NF { print $1 }')"
      # The bench's own raw-TCP stream over the guest's loopback, in the same rounds: how
      # fast the guest is in this run (it is a length-prefixed stream with its own reader's
      # cost, not a ceiling: this stack's figures have come out above it).
      raw="$(printf '%s\n' "$rows" | awk 'NF { print $2 }' | median | awk '{ print $1 }')"
      got="$(printf '%s' "$vals" | grep -c . || true)"
      short=""
      if [ "$got" -lt $((ROUNDS * BOOTS)) ]; then
        failed=1
        short="  ($got of $((ROUNDS * BOOTS)) rounds)"
      fi
      iw=""
      read -r iw iw_lo iw_hi < <(printf '%s\n' "$vals" | grep . | median) || true
      if [ -z "${siw:-}" ] || [ -z "${iw:-}" ]; then
        failed=1
        results+="$(printf '%s vCPU  %-5s %-8s siw %8s MB/s  iwarp %8s MB/s  ratio ?' "$n" "$op" "$poll" "${siw:-?}" "${iw:-?}")"$'\n'
        continue
      fi
      results+="$(awk -v n="$n" -v o="$op" -v p="$poll" -v s="$siw" -v i="$iw" -v r="$siw_lo-$siw_hi / $iw_lo-$iw_hi" -v t="${raw:-0}" 'BEGIN {
        printf "%s vCPU  %-5s %-8s siw %8.2f MB/s  iwarp %8.2f MB/s  ratio %.2f  (ranges %s; raw TCP %.0f MB/s)", n, o, p, s, i, (s > 0) ? i / s : 0, r, t }')$short"$'\n'
    done
  done
done
echo "same emulated machine (TCG), $SIZE B, CRC off on both, iwarp client and server on separate devices, iwarp bench ${FLAGS:-(default flags)}; medians of $ROUNDS rounds in each of $BOOTS boot(s):"
printf '%s' "$results"
[ "$failed" = 0 ] || { grep -aE '^\[(siw|iwarp)' "$work"/smp*-boot*/serial.log | tail -40; iw_die "some runs gave no result"; }
# The guests' logs stay only when a run gave no result.
rm -rf "$work"
