#!/usr/bin/env bash
# Same-machine comparison: the host-built `iwarp` binary runs inside the siw guest, so this
# stack's `iwarp bench` (kernel TCP on the guest's loopback, client and server on separate
# devices) and perftest over siw (`ib_{write,read,send}_bw -R`, server and client in the guest,
# siw0 on eth0, to the guest's own address, which TCP carries over the loopback) run on the same
# emulated machine, with the same CRC setting (siw's default: off). TCG distorts absolute
# numbers, not the comparison. Prints both results and their ratio per operation, vCPU count
# and poll mode; a measurement, not a test (exit status 0 when every run produced its numbers).
#
#   compare.sh [SIZE] [SECONDS] [VCPUS] [POLL_MODES]
#   defaults:   65536   3         "1 2"   "inline adaptive"
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"
SIZE="${1:-65536}" SECS="${2:-3}" VCPUS="${3:-1 2}" POLLS="${4:-inline adaptive}"
BIN="${IWARP_BIN:-$ROOT/target/release/iwarp}"
[ -x "$BIN" ] || iw_die "$BIN is not built (cargo build --release --bin iwarp)"
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

# The guest: for each operation perftest's server then client over siw (its default CRC
# setting: off), then this stack's bench in each poll mode with CRC off too.
cmd="[ -x /opt/iwarp ] || { echo 'IWARP-COMPARE: /opt/iwarp missing'; exit 3; }; "
# perftest's client gives up when it cannot calibrate its cycle counter under TCG ("Can't
# produce a report"): up to three tries.
for op in write read send; do
  cmd+="for try in 1 2 3; do "
  cmd+="timeout 120 ib_${op}_bw -R -d siw0 -s $SIZE -D $SECS > /tmp/srv 2>&1 & sleep 3; "
  cmd+="timeout 120 ib_${op}_bw -R -d siw0 -s $SIZE -D $SECS $IW_GUEST_IP > /tmp/cli 2>&1; wait; "
  cmd+="grep -qE '^ +$SIZE ' /tmp/cli && break; done; sed 's/^/[siw-$op] /' /tmp/cli; "
done
for poll in $POLLS; do
  cmd+="timeout 400 /opt/iwarp bench --ops write,read,send --sizes $SIZE --duration $SECS --crc off "
  cmd+="--poll $poll --quiet 2>&1 | sed 's/^/[iwarp-$poll] /'; "
done

failed=0
results=""
for n in $VCPUS; do
  out="$work/smp$n"
  iw_boot "$out" --smp "$n" --max 900 --cmd "$cmd"
  iw_wait_exit 900 || true
  iw_stop_guest
  if grep -q 'IWARP-COMPARE:' "$IW_SERIAL"; then
    cat "$IW_SERIAL"
    iw_die "the guest could not run the binary (log $IW_SERIAL)"
  fi
  for op in write read send; do
    # perftest: "#bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]"
    # A run without its result line leaves the value empty (reported below), not the script.
    siw="$(grep -aE "^\[siw-$op\] +$SIZE " "$IW_SERIAL" | awk '{print $5}' | head -1 || true)"
    for poll in $POLLS; do
      # bench: per operation a section whose first row is "  64K |  GB/s ..."
      iw="$(grep -aE "^\[iwarp-$poll\] +[0-9]+[KMG]? \|" "$IW_SERIAL" |
        awk -F'|' -v k="$op" 'BEGIN { n = (k == "write") ? 1 : (k == "read") ? 2 : 3 } NR == n { split($2, a, " "); print a[1] }' || true)"
      if [ -z "$siw" ] || [ -z "$iw" ]; then
        failed=1
        iw_mb="$(awk -v i="$iw" 'BEGIN { if (i != "") printf "%.2f", i * 1000; else print "?" }')"
        results+="$(printf '%s vCPU  %-5s %-8s siw %8s MB/s  iwarp %8s MB/s  ratio ?' "$n" "$op" "$poll" "${siw:-?}" "$iw_mb")"$'\n'
        continue
      fi
      results+="$(awk -v n="$n" -v o="$op" -v p="$poll" -v s="$siw" -v i="$iw" 'BEGIN {
        printf "%s vCPU  %-5s %-8s siw %8.2f MB/s  iwarp %8.2f MB/s  ratio %.2f", n, o, p, s, i * 1000, (s > 0) ? i * 1000 / s : 0 }')"$'\n'
    done
  done
done
echo "same emulated machine (TCG), $SIZE B, CRC off on both, iwarp client and server on separate devices:"
printf '%s' "$results"
[ "$failed" = 0 ] || { grep -aE '^\[(siw|iwarp)' "$work"/smp*/serial.log | tail -40; iw_die "some runs gave no result"; }
# The guests' logs stay only when a run gave no result.
rm -rf "$work"
