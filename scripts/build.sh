#!/usr/bin/env bash
# Builds kelp: the runtime bundle first (scripts/bundle.sh), then kelp itself,
# static, with versions stamped in.
#
# usage: scripts/build.sh [ARCH [OUTPUT]]
#   ARCH    GOARCH to build for (default: go env GOARCH); amd64 or arm64
#   OUTPUT  the binary to write (default: bin/kelp for the host's ARCH,
#           bin/kelp-ARCH for another)
#
# Only the default build (the host's ARCH, no OUTPUT) writes embed/bundle.*,
# which go:embed reads and which `go build`/`go test` in this tree use. Any
# other build gets its bundle in a temporary directory and embeds it through
# `go build -overlay`, so a cross or release build never changes what the
# host's builds and tests embed. Every build applies kelp's patches to
# upstream modules (scripts/patches.sh).
set -euo pipefail
out=${2:-}
[[ -z $out || $out == /* ]] || out=$PWD/$out
cd "$(dirname "$0")/.."

host_arch=$(go env GOHOSTARCH)
arch=${1:-$(go env GOARCH)}
if [[ $arch == "$host_arch" && -z $out ]]; then
  out=bin/kelp
  overlay=()
  scripts/bundle.sh "$arch"
else
  out=${out:-bin/kelp-$arch}
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  scripts/bundle.sh "$arch" "$tmp"
  printf '{"Replace":{"%s":"%s","%s":"%s"}}\n' \
    "$PWD/embed/bundle.tar.zst" "$tmp/bundle.tar.zst" \
    "$PWD/embed/bundle.sha256" "$tmp/bundle.sha256" >"$tmp/overlay.json"
  overlay=(-overlay "$tmp/overlay.json")
fi

kube_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
kube_minor=$(echo "$kube_version" | cut -d. -f2)
version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)

ldflags="-s -w"
ldflags+=" -X github.com/kelp-dev/kelp/internal/version.Version=$version"
ldflags+=" -X github.com/kelp-dev/kelp/internal/version.Commit=$commit"
# The apiserver reports these at /version and clients check them.
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$kube_version+kelp -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kube_minor"
  ldflags+=" -X $pkg.gitCommit=$commit -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
done

# The Gateway API CRDs kelp applies (embed/gateway-crds/).
scripts/gateway-crds.sh

# kelp's patches to upstream modules (scripts/patches/).
modfile=$(scripts/patches.sh .cache/patched)

mkdir -p "$(dirname "$out")"
CGO_ENABLED=0 GOOS=linux GOARCH="$arch" go build -modfile="$modfile" "${overlay[@]}" -ldflags "$ldflags" -o "$out" .
echo "built $out ($version, $arch)"
