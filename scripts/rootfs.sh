#!/usr/bin/env bash
# Builds the root filesystem of kelp's container image into OUTDIR. The
# Dockerfile's last stage is this directory and nothing else
# (COPY --from=build /rootfs/ /), so a test can run exactly what the image
# holds without a container engine (internal/container).
#
#   /bin/kelp                          the kelp binary ($KELP_BIN, default bin/kelp)
#   /bin/kubectl /bin/crictl /bin/ctr  links to kelp, for `docker exec NAME kubectl …`
#   /bin/busybox /bin/mount /bin/umount
#                                      static busybox from Debian's busybox-static: the
#                                      kubelet runs mount/umount for tmpfs volumes
#                                      (Secrets, service-account tokens); nothing else
#   /usr/share/doc/busybox-static/copyright   busybox's licence, which ships with it
#   /etc/ssl/certs/ca-certificates.crt the build host's CA bundle (package
#                                      ca-certificates), for registries over TLS
#   /etc/passwd /etc/group             root and nobody: the kubelet looks its own user
#                                      up and fails without a passwd file; HOME=/root
#   /tmp                               mode 1777: containerd unpacks images through it
#   /run, /var/run -> ../run           one /run, whichever of the two docker mounts over
#   /var/lib/kelp /var/lib/kubelet /var/log   the image's volumes (empty)
#
# usage: scripts/rootfs.sh OUTDIR [ARCH]
#   OUTDIR  a directory that does not exist or is empty
#   ARCH    Debian/Go architecture of the image, amd64 or arm64 (default: the
#           build host's); the kelp binary must be built for it
#
# busybox-static is fetched with `apt-get download` and unpacked, never
# installed: it would replace the host's busybox. The .deb is kept under
# .cache/rootfs/ARCH for the next run. Packages it needs (ca-certificates)
# are installed with apt-get when missing, which needs root.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:?usage: scripts/rootfs.sh OUTDIR [ARCH]}
ARCH=${2:-$(dpkg --print-architecture)}
KELP_BIN=${KELP_BIN:-$ROOT/bin/kelp}
CACHE=$ROOT/.cache/rootfs/$ARCH

log() { printf 'rootfs: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The ELF e_machine of each architecture, as od prints the two bytes at 18.
case $ARCH in
amd64) MACHINE=62 ;;
arm64) MACHINE=183 ;;
*) die "unsupported ARCH $ARCH (want amd64 or arm64)" ;;
esac

[[ -f $KELP_BIN ]] || die "no kelp binary at $KELP_BIN: build it with scripts/build.sh $ARCH or set KELP_BIN"
machine=$(od -An -tu2 -j18 -N2 "$KELP_BIN" | tr -d ' ')
[[ $machine == "$MACHINE" ]] || die "$KELP_BIN is not a $ARCH binary (ELF machine $machine)"
if [[ -e $OUT ]] && [[ -n $(ls -A "$OUT") ]]; then
	die "$OUT is not empty"
fi

apt_update() {
	log "apt-get update"
	apt-get update -q >/dev/null
}

if ! dpkg -s ca-certificates >/dev/null 2>&1; then
	[[ $(id -u) == 0 ]] || die "missing package ca-certificates; install it or run as root"
	apt_update
	log "installing ca-certificates"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q ca-certificates >/dev/null
fi

# Two runs at once (parallel tests) share the cache: take turns.
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
deb=$(find "$CACHE" -maxdepth 1 -name 'busybox-static_*.deb' | head -n1)
if [[ -z $deb ]]; then
	if [[ $ARCH != "$(dpkg --print-architecture)" ]] && ! dpkg --print-foreign-architectures | grep -qx "$ARCH"; then
		log "adding dpkg architecture $ARCH"
		dpkg --add-architecture "$ARCH"
		apt_update
	fi
	log "downloading busybox-static:$ARCH"
	# apt's sandbox user may not write to the cache dir; nothing runs from
	# the download but dpkg-deb below.
	download() { (cd "$CACHE" && apt-get download -q -o APT::Sandbox::User=root "busybox-static:$ARCH" >/dev/null); }
	download || { apt_update && download; } || die "cannot download busybox-static:$ARCH"
	deb=$(find "$CACHE" -maxdepth 1 -name 'busybox-static_*.deb' | head -n1)
fi
exec 9>&-

mkdir -p "$OUT"
cd "$OUT"
mkdir -p bin etc/ssl/certs root tmp run var/lib/kelp var/lib/kubelet var/log usr/share/doc/busybox-static
chmod 1777 tmp
chmod 0700 root
ln -s ../run var/run

cp "$KELP_BIN" bin/kelp
chmod 0755 bin/kelp
for tool in kubectl crictl ctr; do
	ln -s kelp "bin/$tool"
done

dpkg-deb --fsys-tarfile "$deb" | tar -x -O ./bin/busybox >bin/busybox
dpkg-deb --fsys-tarfile "$deb" | tar -x -O ./usr/share/doc/busybox-static/copyright >usr/share/doc/busybox-static/copyright
chmod 0755 bin/busybox
machine=$(od -An -tu2 -j18 -N2 bin/busybox | tr -d ' ')
[[ $machine == "$MACHINE" ]] || die "busybox from $deb is not a $ARCH binary"
for applet in mount umount; do
	ln -s busybox "bin/$applet"
done

printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' >etc/passwd
printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >etc/group
chmod 0644 etc/passwd etc/group

cp -L /etc/ssl/certs/ca-certificates.crt etc/ssl/certs/ca-certificates.crt
chmod 0644 etc/ssl/certs/ca-certificates.crt

log "built $OUT ($ARCH, $(du -sh --apparent-size . | cut -f1), busybox $(dpkg-deb -f "$deb" Version))"
