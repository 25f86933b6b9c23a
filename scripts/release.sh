#!/usr/bin/env bash
# Builds the release artifacts into dist/, for each ARCH (default: amd64 arm64):
#
#   kelp-linux-ARCH       the static binary
#   kelp-linux-ARCH.zst   zstd --ultra -22 --long=27; its 128 MiB window is the
#                         largest a plain `zstd -d` accepts without --long/-M
#   kelp-linux-ARCH.xz    xz -9e, one block, CRC32 check: for hosts without
#                         zstd, including busybox unxz
#   install.sh            the installer, served beside them
#   sha256sums.txt        `sha256sum` lines for every file above
#   sha256sums.txt.sig    with KELP_RELEASE_SIGNING_KEY=PRIVATE_KEY.pem: its
#                         Ed25519 signature (scripts/sign-release.sh), which
#                         install.sh checks with INSTALL_KELP_PUBLIC_KEY
#
# install.sh downloads these names. Each ARCH is built by scripts/build.sh
# straight into dist/ with its bundle embedded through an overlay, so a
# release leaves bin/ and embed/bundle.* as they are.
#
# usage: scripts/release.sh [ARCH...]
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'release: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

arches=("$@")
((${#arches[@]})) || arches=(amd64 arm64)
for arch in "${arches[@]}"; do
  case $arch in
  amd64 | arm64) ;;
  *) die "unsupported ARCH $arch (want amd64 or arm64)" ;;
  esac
done
for tool in zstd xz file; do
  command -v "$tool" >/dev/null || die "$tool is missing: apt-get install zstd xz-utils file"
done

host_arch=$(go env GOHOSTARCH)

# Elapsed seconds since $1 (date +%s%N), to a hundredth.
since() {
  local ns=$(($(date +%s%N) - $1))
  printf '%d.%02d' $((ns / 1000000000)) $((ns / 10000000 % 100))
}

rm -rf dist
mkdir -p dist
for arch in "${arches[@]}"; do
  bin=kelp-linux-$arch
  case $arch in
  amd64) machine=x86_64 file_machine=x86-64 ;;
  arm64) machine=aarch64 file_machine='ARM aarch64' ;;
  esac
  log "building $bin"
  scripts/build.sh "$arch" "dist/$bin"

  kind=$(file -b "dist/$bin")
  [[ $kind == *", $file_machine,"* && $kind == *"statically linked"* ]] ||
    die "dist/$bin is not a static $arch binary: $kind"
  # Another architecture's binary runs under qemu-user where that is
  # installed (Debian: qemu-user-static); invoked directly it needs no binfmt.
  run=()
  if [[ $arch != "$host_arch" ]]; then
    qemu=$(command -v "qemu-$machine-static" "qemu-$machine" | head -n1) || true
    [[ -n $qemu ]] && run=("$qemu")
  fi
  if [[ $arch == "$host_arch" || ${#run[@]} -gt 0 ]]; then
    log "$bin --version: $("${run[@]}" "dist/$bin" --version | sed -n 1p)"
  else
    log "no qemu-$machine: $bin not run"
  fi

  start=$(date +%s%N)
  zstd -q --ultra -22 --long=27 "dist/$bin" -o "dist/$bin.zst"
  zstd_s=$(since "$start")
  start=$(date +%s%N)
  xz -9e -T1 --check=crc32 -c "dist/$bin" >"dist/$bin.xz"
  xz_s=$(since "$start")
  chmod 0644 "dist/$bin.zst" "dist/$bin.xz"
  log "$bin: $(stat -c %s "dist/$bin") bytes;" \
    "zst $(stat -c %s "dist/$bin.zst") bytes in ${zstd_s}s;" \
    "xz $(stat -c %s "dist/$bin.xz") bytes in ${xz_s}s"
done

install -m 0644 install.sh dist/install.sh
(cd dist && sha256sum -- kelp-linux-* install.sh >sha256sums.txt)
if [[ -n ${KELP_RELEASE_SIGNING_KEY:-} ]]; then
  scripts/sign-release.sh "$KELP_RELEASE_SIGNING_KEY" dist
else
  log "KELP_RELEASE_SIGNING_KEY is not set: sha256sums.txt is not signed"
fi
log "wrote dist/:"
ls -l dist >&2
