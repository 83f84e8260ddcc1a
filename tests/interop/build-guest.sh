#!/usr/bin/env bash
# Builds the interop guest: Debian bookworm's 6.1 kernel (uncompressed vmlinux for PVH boot) and
# an initramfs with siw.ko (built out of tree from the matching linux-source-6.1, twice: stock,
# and with the compile-time settings CRC required/strict, peer-to-peer and MPA revision turned
# into module parameters by siw-modparams.patch), rdma_rxe (with crc32_generic: rxe asks the
# crypto API for "crc32", which nothing autoloads in the initramfs), rdma-core's rping/ucmatose/
# ibverbs tools, perftest, iproute2 (ip, rdma), busybox and dash as /bin/sh. The LIO iSCSI target
# with its iSER transport (target_core_mod, iscsi_target_mod, ib_isert and what they need) is in
# the image too but not loaded by the init: /etc/iw-modules-lio lists it in load order for the
# commands that want it (tests/interop/run-iser.sh).
#
# Everything is cached under $IWARP_INTEROP_CACHE (default ~/.cache/iwarp-interop), keyed by the
# package versions and the hash of this script, its patch and its init. Prints the image
# directory (holding vmlinux, initrd.img, versions.txt) as the last line of stdout.
#
# Needs root (apt-get). See docs/interop.md#the-guest-image for why each piece is the way it is.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${IWARP_INTEROP_CACHE:-$HOME/.cache/iwarp-interop}"
export DEBIAN_FRONTEND=noninteractive
log() { printf '[build-guest %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf '[build-guest] FAILED: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (apt-get, module build)"
command -v apt-get >/dev/null || die "apt-get not found: the harness needs a Debian bookworm host"

# --- host tools --------------------------------------------------------------------------
HOST_PKGS=(qemu-system-x86 gcc-12 make cpio kmod xz-utils binutils libc6-dev libelf-dev
           iproute2 gzip)
need_install=()
for p in "${HOST_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_install+=("$p")
done
if [ "${#need_install[@]}" -gt 0 ]; then
  log "apt-get install ${need_install[*]}"
  timeout 120 apt-get update -q >&2 || die "apt-get update failed"
  timeout 600 apt-get install -y -q --no-install-recommends "${need_install[@]}" >&2 \
    || die "apt-get install ${need_install[*]} failed (qemu cannot be installed?)"
fi
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing after install"

# --- versions -> cache key -----------------------------------------------------------------
declare -A CAND=()
load_candidates() { # fills CAND[pkg]=version with one apt-cache call
  local p v
  while read -r p v; do CAND[$p]="$v"; done < <(apt-cache policy "$@" 2>/dev/null |
    awk '/^[^ ].*:$/ { sub(":$", "", $1); p = $1 } /Candidate:/ { print p, $2 }')
}
candidate() { echo "${CAND[$1]:-}"; }
kabi="$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-6\.1\.0-.*-amd64$/ {print $2}' | head -1)"
if [ -z "$kabi" ]; then
  timeout 120 apt-get update -q >&2 || true
  kabi="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-6\.1\.0-.*-amd64$/ {print $2}' | head -1)"
fi
[ -n "$kabi" ] || die "cannot resolve linux-image-amd64 to a linux-image-6.1.0-*-amd64 package"
KREL="${kabi#linux-image-}"            # 6.1.0-57-amd64
KABI="${KREL%-amd64}"                   # 6.1.0-57

GUEST_PKGS=(
  "linux-image-$KREL" "linux-headers-$KREL" "linux-headers-$KABI-common" linux-kbuild-6.1
  linux-source-6.1 busybox-static dash
  rdma-core rdmacm-utils ibverbs-providers ibverbs-utils libibverbs1 librdmacm1 perftest iproute2
  libnl-3-200 libnl-route-3-200 libibumad3 libpci3 libudev1 libgcc-s1 libmnl0 libelf1 libbpf1
  libcap2 libbsd0 libmd0 libtirpc3 libdb5.3 libselinux1 libpcre2-8-0 zlib1g libxtables12
)
load_candidates "${GUEST_PKGS[@]}"
versions=""
for p in "${GUEST_PKGS[@]}"; do
  v="$(candidate "$p")"
  [ -n "$v" ] && [ "$v" != "(none)" ] || die "package $p has no candidate version (apt-get update?)"
  versions+="$p=$v"$'\n'
done
script_hash="$(cat "$0" "$HERE/siw-modparams.patch" "$HERE/guest-init.sh" "$HERE/guest-lio.sh" |
  sha256sum | cut -c1-12)"
key="$(printf '%s%s' "$versions" "$script_hash" | sha256sum | cut -c1-16)"
IMG="$CACHE/img-$KREL-$key"
if [ -s "$IMG/vmlinux" ] && [ -s "$IMG/initrd.img" ]; then
  log "cached: $IMG"
  echo "$IMG"
  exit 0
fi

mkdir -p "$CACHE/debs"
WORK="$(mktemp -d "$CACHE/build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# --- download ------------------------------------------------------------------------------
log "apt-get download (kernel $KREL)"
(
  cd "$CACHE/debs"
  missing=()
  for p in "${GUEST_PKGS[@]}"; do
    v="$(candidate "$p")"
    vf="${v//:/%3a}"
    ls "${p}_${vf}_"*.deb >/dev/null 2>&1 || missing+=("$p=$v")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    timeout 600 apt-get download -q "${missing[@]}" >&2 2> >(grep -v 'unsandboxed' >&2) \
      || die "apt-get download failed"
  fi
)
deb() { # path of the cached .deb of package $1
  local v; v="$(candidate "$1")"; v="${v//:/%3a}"
  ls "$CACHE/debs/${1}_${v}_"*.deb
}

# --- kernel ---------------------------------------------------------------------------------
log "extract kernel, headers, source"
K="$WORK/kernel"; mkdir -p "$K"
dpkg-deb -x "$(deb "linux-image-$KREL")" "$K"
H="$WORK/hdr"; mkdir -p "$H"
for p in "linux-headers-$KREL" "linux-headers-$KABI-common" linux-kbuild-6.1; do
  dpkg-deb -x "$(deb "$p")" "$H"
done
S="$WORK/src"; mkdir -p "$S"
dpkg-deb --fsys-tarfile "$(deb linux-source-6.1)" | tar -x -C "$S" ./usr/src/linux-source-6.1.tar.xz
tar -xJf "$S/usr/src/linux-source-6.1.tar.xz" -C "$S" \
  linux-source-6.1/drivers/infiniband/sw/siw linux-source-6.1/scripts/extract-vmlinux
rm -f "$S/usr/src/linux-source-6.1.tar.xz"

log "extract vmlinux"
mkdir -p "$WORK/out"
sh "$S/linux-source-6.1/scripts/extract-vmlinux" "$K/boot/vmlinuz-$KREL" > "$WORK/out/vmlinux" \
  || die "extract-vmlinux failed"
readelf -n "$WORK/out/vmlinux" | grep -q "Xen" || log "warning: no Xen/PVH ELF note in vmlinux"

log "build siw.ko (stock and module-parameter builds)"
KDIR="$H/usr/src/linux-headers-$KREL"
# the flavour's Makefile includes the common one by absolute path; point it into $H
sed -i "s|/usr/src/|$H/usr/src/|g" "$KDIR/Makefile"
build_siw() { # $1 = dir name, $2 = patch or empty
  local d="$WORK/$1"
  cp -r "$S/linux-source-6.1/drivers/infiniband/sw/siw" "$d"
  if [ -n "$2" ]; then (cd "$d" && patch -s -p2 < "$2") || die "patch $2 does not apply"; fi
  timeout 300 make -s -C "$KDIR" M="$d" CC=gcc-12 HOSTCC=gcc-12 CONFIG_RDMA_SIW=m modules \
    > "$WORK/$1.log" 2>&1 || { cat "$WORK/$1.log" >&2; die "siw build ($1) failed"; }
  [ -f "$d/siw.ko" ] || die "no siw.ko from build $1"
}
build_siw siw-stock ""
build_siw siw-param "$HERE/siw-modparams.patch"

# --- guest userland --------------------------------------------------------------------------
log "assemble initramfs"
U="$WORK/pkgs"; mkdir -p "$U"
for p in "${GUEST_PKGS[@]}"; do
  case "$p" in linux-*) continue ;; esac
  dpkg-deb -x "$(deb "$p")" "$U"
done
R="$WORK/root"
mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,lib64,etc,proc,sys,dev,tmp,run,root,mnt,var/tmp}
mkdir -p "$R/usr/lib/x86_64-linux-gnu" "$R/lib/x86_64-linux-gnu"
cp "$U/bin/dash" "$R/bin/dash"; ln -s dash "$R/bin/sh"
cp "$U/bin/busybox" "$R/bin/busybox"
bins=(usr/bin/rping usr/bin/ucmatose usr/bin/udaddy usr/bin/rstream usr/bin/riostream
      usr/bin/ibv_devinfo usr/bin/ibv_devices usr/bin/ibv_rc_pingpong
      usr/bin/ib_write_bw usr/bin/ib_read_bw usr/bin/ib_send_bw usr/bin/ib_write_lat
      usr/bin/ib_read_lat usr/bin/ib_send_lat bin/ip sbin/rdma sbin/bridge sbin/ss)
for b in "${bins[@]}"; do
  src="$U/$b"; [ -e "$src" ] || src="$U/usr/$b"
  [ -e "$src" ] || src="$(find "$U" -name "$(basename "$b")" -type f | head -1)"
  [ -n "$src" ] && [ -e "$src" ] || die "binary $b not found in the packages"
  cp -L "$src" "$R/usr/bin/$(basename "$b")"
done
# providers and their config
cp -rL "$U/usr/lib/x86_64-linux-gnu/libibverbs" "$R/usr/lib/x86_64-linux-gnu/"
cp -r "$U/etc/libibverbs.d" "$R/etc/"
[ -d "$U/etc/rdma" ] && cp -r "$U/etc/rdma" "$R/etc/"
# shared libraries: resolve with ldd against the extracted packages first, then the host
LIBPATH="$U/usr/lib/x86_64-linux-gnu:$U/lib/x86_64-linux-gnu:$U/usr/lib/x86_64-linux-gnu/libibverbs"
declare -A seen=()
copy_deps() {
  local f="$1" line lib
  while read -r line; do
    case "$line" in *"not found"*) die "ldd: $f needs $line" ;; esac
    lib="$(awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) { print $i; exit } }' <<<"$line")"
    [ -n "$lib" ] || continue
    [ -n "${seen[$lib]:-}" ] && continue
    seen[$lib]=1
    case "$lib" in
      "$U"/*) dst="$R/${lib#"$U"/}" ;;
      /lib64/*) dst="$R$lib" ;;
      /lib/*|/usr/lib/*) dst="$R/usr/lib/x86_64-linux-gnu/$(basename "$lib")" ;;
      *) dst="$R/usr/lib/x86_64-linux-gnu/$(basename "$lib")" ;;
    esac
    case "$dst" in "$R/lib/"*) dst="$R/usr/${dst#"$R"/}" ;; esac
    mkdir -p "$(dirname "$dst")"
    cp -L "$lib" "$dst"
  done < <(LD_LIBRARY_PATH="$LIBPATH" ldd "$f" 2>/dev/null || true)
}
for f in "$R"/usr/bin/* "$R"/usr/lib/x86_64-linux-gnu/libibverbs/*.so; do
  file -b "$f" 2>/dev/null | grep -q "dynamically linked\|shared object" || \
    { readelf -d "$f" >/dev/null 2>&1 || continue; }
  copy_deps "$f"
done
# glibc dlopens libgcc_s for pthread_exit/cancellation (ldd does not show it): rping -P aborts
# without it ("libgcc_s.so.1 must be installed for pthread_exit to work")
cp -L "$U/lib/x86_64-linux-gnu/libgcc_s.so.1" "$R/usr/lib/x86_64-linux-gnu/" 2>/dev/null \
  || cp -L "$U/usr/lib/x86_64-linux-gnu/libgcc_s.so.1" "$R/usr/lib/x86_64-linux-gnu/" \
  || die "libgcc_s.so.1 not found in libgcc-s1"
# the loader finds libraries under /usr/lib/x86_64-linux-gnu (merged /usr); keep /lib a link
rmdir "$R/lib/x86_64-linux-gnu" 2>/dev/null || true
rm -rf "${R:?}/lib"; ln -s usr/lib "$R/lib"
[ -e "$R/lib64/ld-linux-x86-64.so.2" ] || cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"
# busybox applets for everything not provided otherwise
for a in $("$R/bin/busybox" --list-full); do
  [ -e "$R/$a" ] || [ -e "$R/usr/bin/$(basename "$a")" ] || [ -e "$R/bin/$(basename "$a")" ] && continue
  mkdir -p "$R/$(dirname "$a")"
  ln -s /bin/busybox "$R/$a"
done
echo "root:x:0:0:root:/root:/bin/sh" > "$R/etc/passwd"
echo "root:x:0:" > "$R/etc/group"
printf '127.0.0.1 localhost\n' > "$R/etc/hosts"

# modules: the ones the init loads (docs/interop.md order), their dependencies, and both siw builds
MODDIR="$K/lib/modules/$KREL"
RM="$R/lib/modules/$KREL"
RM="$R/usr/lib/modules/$KREL"
mkdir -p "$RM/kernel" "$RM/extra/siw-stock" "$RM/extra/siw-param"
LOAD=(virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci failover
      net_failover virtio_net crc32c_generic libcrc32c configfs ib_core ib_uverbs iw_cm ib_cm
      rdma_cm rdma_ucm crc32_generic udp_tunnel ip6_udp_tunnel rdma_rxe)
# LIO with iSER, loaded on demand from /etc/iw-modules-lio (crct10dif_generic: crc-t10dif asks
# the crypto API for it when it loads, and the guest has no modprobe helper to find it)
LIO=(crct10dif_common crct10dif_generic target_core_mod iscsi_target_mod ib_isert)
# load order: docs/interop.md's list, each module after its dependencies (modinfo depends)
: > "$R/etc/iw-modules"
: > "$R/etc/iw-modules-lio"
declare -A loaded=()
MODLIST="$R/etc/iw-modules"
add_mod() {
  local m="$1" p rel d
  [ -n "${loaded[$m]:-}" ] && return 0
  loaded[$m]=1
  p="$(find "$MODDIR/kernel" -name "$m.ko" | head -1)"
  [ -n "$p" ] || die "module $m not found in linux-image-$KREL"
  for d in $(modinfo -F depends "$p" | tr ',' ' '); do add_mod "$d"; done
  rel="${p#"$MODDIR"/}"
  mkdir -p "$RM/$(dirname "$rel")"
  cp "$p" "$RM/$rel"
  echo "/lib/modules/$KREL/$rel" >> "$MODLIST"
}
for m in "${LOAD[@]}"; do add_mod "$m"; done
MODLIST="$R/etc/iw-modules-lio"
for m in "${LIO[@]}"; do add_mod "$m"; done
for d in $(modinfo -F depends "$WORK/siw-stock/siw.ko" | tr ',' ' '); do
  [ -n "${loaded[$d]:-}" ] || die "siw needs $d, which the init does not load"
done
cp "$WORK/siw-stock/siw.ko" "$RM/extra/siw-stock/siw.ko"
cp "$WORK/siw-param/siw.ko" "$RM/extra/siw-param/siw.ko"
cp "$MODDIR"/modules.{order,builtin,builtin.modinfo} "$RM/" 2>/dev/null || true
depmod -b "$R/usr" "$KREL" 2>/dev/null || depmod -b "$R" "$KREL" || die "depmod failed"
modinfo "$RM/extra/siw-param/siw.ko" | grep -q "parm:.*mpa_version" || die "siw-param has no mpa_version parameter"

install -m 0755 "$HERE/guest-init.sh" "$R/init"
install -m 0755 "$HERE/guest-lio.sh" "$R/usr/bin/iw-lio"
printf '%s' "$versions" > "$R/etc/iw-versions"

log "pack"
(cd "$R" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) > "$WORK/out/initrd.img"
printf '%s' "$versions" > "$WORK/out/versions.txt"
echo "script $script_hash" >> "$WORK/out/versions.txt"
rm -rf "$IMG"
mv "$WORK/out" "$IMG"
# images of older package versions or older scripts are dead weight
for old in "$CACHE"/img-*; do
  [ "$old" = "$IMG" ] || rm -rf "$old"
done
log "done: $IMG ($(du -sh "$IMG" | cut -f1))"
echo "$IMG"
