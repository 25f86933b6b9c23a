#!/usr/bin/env bash
# Copies the Gateway API's standard-channel CRDs from the module go.mod pins
# (sigs.k8s.io/gateway-api) into embed/gateway-crds/, which go:embed reads
# (embed.GatewayCRDs): kelp applies them at every server start. Like the
# bundle, they are built, never committed. The safe-upgrades
# ValidatingAdmissionPolicy is left out: it is no CRD, and it would refuse a
# user's experimental-channel CRDs.
#
# usage: scripts/gateway-crds.sh
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)
[[ -n $src ]] || { go mod download sigs.k8s.io/gateway-api && src=$(go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api); }
dst=embed/gateway-crds
tmp=$(mktemp -d embed/.gateway-crds.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
for f in "$src"/config/crd/standard/gateway.networking.k8s.io_*.yaml; do
  [[ $f == *_vap_* ]] && continue
  cp "$f" "$tmp/"
done
chmod 0644 "$tmp"/*.yaml
if ! diff -rq "$tmp" "$dst" >/dev/null 2>&1; then
  rm -rf "$dst.old"
  [[ ! -e $dst ]] || mv "$dst" "$dst.old"
  mv "$tmp" "$dst"
  rm -rf "$dst.old"
fi
