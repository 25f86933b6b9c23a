#!/usr/bin/env bash
# Builds the runtime bundle kelp embeds (embed/bundle.tar.zst + embed/bundle.sha256)
# from the Go modules pinned in scripts/bundle/go.mod:
#
#   bin/runc                            runc, cgo + libseccomp, statically linked
#   bin/containerd                      containerd with kelp's plugins
#                                       (scripts/bundle/containerd), CGO_ENABLED=0
#   bin/containerd-shim-runc-v2         its runc shim, CGO_ENABLED=0
#   bin/bridge bin/host-local           CNI reference plugins, CGO_ENABLED=0
#   bin/loopback bin/bandwidth
#   images/pause.tar                    OCI layout tarball of scripts/bundle/pause
#   MANIFEST                            sha256 and size of every file above
#
# usage: scripts/bundle.sh [ARCH] [OUTDIR]
#   ARCH    GOARCH to build for (default: go env GOARCH); amd64 or arm64
#   OUTDIR  where bundle.tar.zst and bundle.sha256 go (default: <repo>/embed)
#
# Nothing is rebuilt when scripts/bundle/**, this script, ARCH, CC, the Go
# version and the libseccomp package are unchanged since the last build: the
# cached bundle is reused (copied to OUTDIR if needed). The cache is the
# machine's, beside Go's build cache ($KELP_CACHE, default ~/.cache/kelp), so
# a fresh clone (CI) finds it too: what decides its content is in the stamp.
#
# Packages it needs (gcc, pkg-config, libseccomp-dev, file) are installed with
# apt-get when missing, which needs root. Building for another architecture
# cross-compiles runc with a cross gcc (gcc-aarch64-linux-gnu on amd64,
# gcc-x86-64-linux-gnu on arm64) against that architecture's libseccomp-dev,
# which is downloaded from the host's apt sources and unpacked into a sysroot
# in the cache: the host's dpkg architectures stay as they are.
# Set CC to use another compiler; the script then installs no compiler for it.
set -euo pipefail

# The pause image's name; must equal embed.PauseImage (checked by go test ./embed/).
PAUSE_IMAGE=docker.io/kelp-dev/pause:1.0.0

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ARCH=${1:-$(go env GOARCH)}
OUTDIR=${2:-$ROOT/embed}
MOD=$ROOT/scripts/bundle
CACHE_ROOT=${KELP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kelp}/bundle
CACHE=$CACHE_ROOT/$ARCH
HOSTARCH=$(go env GOHOSTARCH)

log() { printf 'bundle: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

case $ARCH in
amd64) TRIPLET=x86_64-linux-gnu; CROSS_GCC=gcc-x86-64-linux-gnu; MACHINE=x86-64 ;;
arm64) TRIPLET=aarch64-linux-gnu; CROSS_GCC=gcc-aarch64-linux-gnu; MACHINE='ARM aarch64' ;;
*) die "unsupported ARCH $ARCH (want amd64 or arm64)" ;;
esac
DEBARCH=$ARCH # Debian and Go agree on these two names

# Packages: the host gets gcc/pkg-config/file, and patch for build.sh's
# scripts/overlay.sh; the target arch gets libseccomp (installed for the
# host's own, unpacked into SYSROOT for another).
pkgs=(pkg-config file patch)
SYSROOT=
if [[ $ARCH == "$HOSTARCH" ]]; then
	CC=${CC:-gcc}
	pkgs+=(gcc "libseccomp-dev:$DEBARCH")
else
	if [[ -z ${CC:-} ]]; then
		CC=$TRIPLET-gcc
		pkgs+=("$CROSS_GCC")
	fi
	SYSROOT=$CACHE_ROOT/sysroot-$DEBARCH
fi

install_missing() {
	local missing=() p
	for p in "${pkgs[@]}"; do
		dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
	done
	((${#missing[@]})) || return 0
	[[ $(id -u) == 0 ]] || die "missing packages: ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root"
	log "installing ${missing[*]}"
	apt-get update -q >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
}

# Unpacks DEBARCH's libseccomp-dev and libseccomp2 into SYSROOT, fetched with
# a private apt state that knows only DEBARCH. Kept until the cache goes.
fetch_sysroot() {
	[[ -f $SYSROOT/.done ]] && return 0
	local apt=$CACHE_ROOT/apt-$DEBARCH deb
	rm -rf "$SYSROOT" "$apt"
	mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/debs" "$SYSROOT"
	local opts=(-q -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
		-o Dir::State::status=/dev/null -o "APT::Architecture=$DEBARCH"
		-o "APT::Architectures::=$DEBARCH" -o APT::Sandbox::User=root)
	log "fetching libseccomp-dev:$DEBARCH into $SYSROOT"
	apt-get "${opts[@]}" update >/dev/null || die "apt-get update for $DEBARCH failed"
	(cd "$apt/debs" && apt-get "${opts[@]}" download "libseccomp-dev:$DEBARCH" "libseccomp2:$DEBARCH" >/dev/null) ||
		die "cannot download libseccomp-dev:$DEBARCH from the host's apt sources"
	for deb in "$apt/debs"/*.deb; do
		dpkg-deb -x "$deb" "$SYSROOT"
	done
	ls "$apt/debs" >"$SYSROOT/.done"
	rm -rf "$apt"
}

# kelp's ctr and containerd client talk to the bundle's containerd: both
# modules pin the same containerd and API. Checked before the cache, which
# kelp's go.mod is no input of.
containerd_modules=(github.com/containerd/containerd/v2 github.com/containerd/containerd/api)
want=$(cd "$ROOT" && go list -m -f '{{.Path}}@{{.Version}}' "${containerd_modules[@]}")
got=$(cd "$MOD" && GOWORK=off go list -m -f '{{.Path}}@{{.Version}}' "${containerd_modules[@]}")
[[ $got == "$want" ]] || die "scripts/bundle/go.mod pins ${got//$'\n'/ }, kelp's go.mod ${want//$'\n'/ }: run (cd scripts/bundle && go get ${want//$'\n'/ } && go mod tidy)"

# Two runs at once (parallel test jobs) share the cache: take turns.
mkdir -p "$CACHE_ROOT" "$OUTDIR"
exec 9>"$CACHE_ROOT/.lock"
flock 9

install_missing
[[ -z $SYSROOT ]] || fetch_sysroot

# Everything that decides the bundle's content.
inputs=$(
	cd "$ROOT"
	echo "arch=$ARCH cc=$CC image=$PAUSE_IMAGE"
	go version
	if [[ -n $SYSROOT ]]; then cat "$SYSROOT/.done"; else dpkg-query -W "libseccomp-dev:$DEBARCH"; fi
	find scripts/bundle scripts/bundle.sh -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
)
inputs_hash=$(sha256sum <<<"$inputs" | cut -d' ' -f1)

publish() {
	# Replace each file in one step so a concurrent go build never embeds half of it.
	local f
	for f in bundle.tar.zst bundle.sha256; do
		cp "$CACHE/out/$f" "$OUTDIR/.$f.tmp"
		mv -f "$OUTDIR/.$f.tmp" "$OUTDIR/$f"
	done
}

if [[ -f $CACHE/stamp && $(<"$CACHE/stamp") == "$inputs_hash" && -f $CACHE/out/bundle.tar.zst ]]; then
	if cmp -s "$CACHE/out/bundle.sha256" "$OUTDIR/bundle.sha256" && cmp -s "$CACHE/out/bundle.tar.zst" "$OUTDIR/bundle.tar.zst"; then
		log "up to date ($ARCH, $(cut -c1-12 "$OUTDIR/bundle.sha256"))"
	else
		publish
		log "copied cached $ARCH bundle to $OUTDIR"
	fi
	exit 0
fi

start=$SECONDS
rm -rf "$CACHE"
mkdir -p "$CACHE/bin" "$CACHE/images" "$CACHE/tools" "$CACHE/out"
cd "$MOD"
export GOWORK=off GOFLAGS="${GOFLAGS:-} -trimpath -buildvcs=false"

log "building tools"
GOOS=$(go env GOHOSTOS) GOARCH=$HOSTARCH CGO_ENABLED=0 go build -o "$CACHE/tools/" ./mkimage ./mkbundle

log "building runc $(go list -m -f '{{.Version}}' github.com/opencontainers/runc) for $ARCH"
# The same recipe as runc's `make static`: static-pie on amd64/arm64.
GOOS=linux GOARCH=$ARCH CGO_ENABLED=1 CC=$CC \
	PKG_CONFIG_LIBDIR=$SYSROOT/usr/lib/$TRIPLET/pkgconfig:$SYSROOT/usr/share/pkgconfig \
	PKG_CONFIG_SYSROOT_DIR=$SYSROOT \
	go build -buildmode=pie -tags "seccomp urfave_cli_no_docs netgo osusergo" \
	-ldflags "-s -w -linkmode external -extldflags -static-pie" \
	-o "$CACHE/bin/runc" github.com/opencontainers/runc
runc_file=$(file -b "$CACHE/bin/runc")
[[ $runc_file == *", $MACHINE,"* ]] || die "runc is not an $ARCH binary: $runc_file"
[[ $runc_file =~ static-pie\ linked|statically\ linked ]] || die "runc is not statically linked: $runc_file"
# A runc for another architecture runs under qemu-user where that is installed
# (Debian: qemu-user-static); invoked directly, it needs no binfmt_misc.
qemu=()
if [[ $ARCH != "$HOSTARCH" ]]; then
	q=$(command -v "qemu-${TRIPLET%%-*}-static" "qemu-${TRIPLET%%-*}" | head -n1) || true
	[[ -n $q ]] && qemu=("$q")
fi
if [[ $ARCH == "$HOSTARCH" || ${#qemu[@]} -gt 0 ]]; then
	"${qemu[@]}" "$CACHE/bin/runc" --version | grep -q '^libseccomp: ' || die "runc was built without seccomp"
else
	log "no qemu-${TRIPLET%%-*}: cannot run the $ARCH runc to check that it has seccomp"
fi

cni_version=$(go list -m -f '{{.Version}}' github.com/containernetworking/plugins)
log "building CNI plugins $cni_version for $ARCH"
GOOS=linux GOARCH=$ARCH CGO_ENABLED=0 go build \
	-ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$cni_version" \
	-o "$CACHE/bin/" \
	github.com/containernetworking/plugins/plugins/main/bridge \
	github.com/containernetworking/plugins/plugins/ipam/host-local \
	github.com/containernetworking/plugins/plugins/main/loopback \
	github.com/containernetworking/plugins/plugins/meta/bandwidth

containerd_version=$(go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
log "building containerd and containerd-shim-runc-v2 $containerd_version for $ARCH"
# Binaries of their own rather than kelp's: kelp's package initialisation
# alone costs some 40 MiB per process (115 MiB RSS as `kelp containerd`
# against 35 MiB for this one), and a shim runs for every pod.
GOOS=linux GOARCH=$ARCH CGO_ENABLED=0 go build -tags urfave_cli_no_docs \
	-ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version" \
	-o "$CACHE/bin/" ./containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2

log "building pause image $PAUSE_IMAGE"
GOOS=linux GOARCH=$ARCH CGO_ENABLED=0 go build -ldflags "-s -w" -o "$CACHE/pause" ./pause
"$CACHE/tools/mkimage" -binary "$CACHE/pause" -path /pause -user 65535:65535 \
	-name "$PAUSE_IMAGE" -arch "$ARCH" -out "$CACHE/images/pause.tar"

log "packing bundle"
args=()
for f in runc containerd containerd-shim-runc-v2 bridge host-local loopback bandwidth; do
	args+=("bin/$f=$CACHE/bin/$f")
done
args+=("images/pause.tar=$CACHE/images/pause.tar")
"$CACHE/tools/mkbundle" -out "$CACHE/out/bundle.tar.zst" -sha256 "$CACHE/out/bundle.sha256" "${args[@]}"

publish
echo "$inputs_hash" >"$CACHE/stamp"
log "built $ARCH bundle in $((SECONDS - start))s: $(du -h "$OUTDIR/bundle.tar.zst" | cut -f1), sha256 $(cut -c1-12 "$OUTDIR/bundle.sha256")"
