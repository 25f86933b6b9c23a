#!/usr/bin/env bash
# Builds bin/kelp: the runtime bundle first (scripts/bundle.sh), then kelp
# itself, static, with versions stamped in.
# Usage: scripts/build.sh [ARCH]   (default: the host's, e.g. amd64 or arm64)
set -euo pipefail
cd "$(dirname "$0")/.."

arch=${1:-$(go env GOARCH)}
scripts/bundle.sh "$arch"

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

mkdir -p bin
CGO_ENABLED=0 GOOS=linux GOARCH="$arch" go build -ldflags "$ldflags" -o bin/kelp .
echo "built bin/kelp ($version, $arch)"
