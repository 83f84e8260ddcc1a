#!/bin/sh
# /init of the interop guest (dash). Kernel command-line parameters it reads:
#   iw.ip=A.B.C.D        eth0's address (/24)
#   iw.siw=stock|param   which siw.ko to load (param: the build with module parameters)
#   iw.siwopts=a=1,b=2   module parameters for siw (param build)
#   iw.cmd=BASE64        the command to run (sh -c), base64 of its text
# Prints IWARP-GUEST-UP when siw0 is up, the command's output, then IWARP-GUEST-EXIT=<status>,
# and reboots (qemu runs with -no-reboot, so it exits).
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /dev/shm
echo 1 > /proc/sys/kernel/printk 2>/dev/null

fail() {
	echo "IWARP-GUEST-ERROR: $*"
	echo "IWARP-GUEST-EXIT=99"
	sync
	reboot -f
	sleep 60
}

IP=""; SIW=stock; SIWOPTS=""; CMD=""
for w in $(cat /proc/cmdline); do
	case "$w" in
	iw.ip=*) IP="${w#iw.ip=}" ;;
	iw.siw=*) SIW="${w#iw.siw=}" ;;
	iw.siwopts=*) SIWOPTS="$(echo "${w#iw.siwopts=}" | tr ',' ' ')" ;;
	iw.cmd=*) CMD="$(echo "${w#iw.cmd=}" | base64 -d)" ;;
	esac
done

while read -r m; do
	insmod "$m" 2>/tmp/insmod.err || { grep -q "File exists" /tmp/insmod.err || fail "insmod $m: $(cat /tmp/insmod.err)"; }
done < /etc/iw-modules
# shellcheck disable=SC2086
insmod "/lib/modules/$(uname -r)/extra/siw-$SIW/siw.ko" $SIWOPTS || fail "insmod siw ($SIW $SIWOPTS)"

ip link set lo up
i=0
while ! ip link show eth0 >/dev/null 2>&1; do
	i=$((i + 1)); [ $i -gt 50 ] && fail "no eth0"
	sleep 0.1
done
[ -n "$IP" ] && ip addr add "$IP/24" dev eth0
ip link set eth0 up
rdma link add siw0 type siw netdev eth0 || fail "rdma link add siw0"
i=0
while ! ibv_devices 2>/dev/null | grep -q siw0; do
	i=$((i + 1)); [ $i -gt 50 ] && fail "siw0 not visible to libibverbs"
	sleep 0.1
done
echo "IWARP-GUEST-UP ip=$IP siw=$SIW opts=$SIWOPTS"
if [ -n "$CMD" ]; then
	cd /tmp || true
	sh -c "$CMD"
	rc=$?
else
	rc=0
fi
echo "IWARP-GUEST-EXIT=$rc"
sync
reboot -f
sleep 60
