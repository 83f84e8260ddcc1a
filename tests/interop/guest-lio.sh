#!/bin/sh
# In the interop guest (installed as /usr/bin/iw-lio by build-guest.sh): loads LIO and its iSER
# transport (/etc/iw-modules-lio) and configures one target through configfs, the way targetcli
# would but with nothing but mkdir/echo/ln:
#
#   iw-lio IP IQN MIB
#
#   - a ramdisk backstore (rd_mcp) of MIB MiB as LUN 0 of IQN's portal group 1;
#   - demo mode: any initiator logs in without an ACL or CHAP, and may write;
#   - ImmediateData=No, InitialR2T=Yes: the target fetches all write data itself (over iSER
#     with RDMA Reads). Debian bookworm's libiscsi (1.19.0) declares immediate data in an iSER
#     command but sends only the headers (fixed upstream in 1.20.0), so LIO would drop the
#     connection at the first write with immediate data;
#   - portal IP:3261, iSCSI over TCP;
#   - portal IP:3260 with iSER enabled (ib_isert listens through rdma_cm, on siw0).
#
# LIO creates every portal with a TCP listener first and adds iSER as a second listener on the
# same address and port. On an iWARP device that second listener is a kernel TCP socket too
# (siw listens on the port itself), so the bind fails with EADDRINUSE. The portal's TCP socket
# is created in the network namespace of the process that makes the directory, and ib_isert's
# rdma_cm id always lives in the initial one: making the iSER portal's directory from a private
# namespace (where binding the guest's address is allowed by ip_nonlocal_bind) leaves the port
# free for siw's listener in the real one.
set -e
IP="$1" IQN="$2" MIB="$3"
if [ -z "$IP" ] || [ -z "$IQN" ] || [ -z "$MIB" ]; then echo "usage: iw-lio IP IQN MIB" >&2; exit 2; fi
while read -r m; do
	insmod "$m" 2> /tmp/insmod.err || grep -q "File exists" /tmp/insmod.err \
		|| { echo "insmod $m: $(cat /tmp/insmod.err)" >&2; exit 1; }
done < /etc/iw-modules-lio
grep -q configfs /proc/mounts || mount -t configfs configfs /sys/kernel/config
T=/sys/kernel/config/target
RD="$T/core/rd_mcp_0/rd0"
mkdir -p "$RD"
echo "rd_pages=$((MIB * 256))" > "$RD/control"
echo 1 > "$RD/enable"
G="$T/iscsi/$IQN/tpgt_1"
mkdir -p "$G/lun/lun_0"
ln -s "$RD" "$G/lun/lun_0/rd0"
echo 0 > "$G/attrib/authentication"
echo 1 > "$G/attrib/generate_node_acls"
echo 1 > "$G/attrib/cache_dynamic_acls"
echo 0 > "$G/attrib/demo_mode_write_protect"
echo No > "$G/param/ImmediateData"
echo Yes > "$G/param/InitialR2T"
mkdir "$G/np/$IP:3261"
unshare -n sh -c "sysctl -qw net.ipv4.ip_nonlocal_bind=1 && mkdir '$G/np/$IP:3260'"
echo 1 > "$G/np/$IP:3260/iser"
echo 1 > "$G/enable"
echo "iw-lio: $IQN lun 0 = rd_mcp $MIB MiB; iSER on $IP:3260, TCP on $IP:3261"
