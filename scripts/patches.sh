#!/usr/bin/env bash
# Makes the upstream modules kelp patches, patched, and a go.mod that uses
# them, and prints that go.mod's path: every go build, vet and test of kelp
# takes it as -modfile (scripts/build.sh, scripts/test.sh). The module cache
# is never written, and Go refuses -overlay for files in it, so each patched
# module is a copy under DIR, named by a replace directive of that go.mod;
# go.mod and go.sum themselves are left as they are.
#
# usage: scripts/patches.sh DIR   (DIR is made anew unless it holds the
#                                 same patches of the same go.mod)
#
# A patch is scripts/patches/NAME.patch: a first line "module: PATH", then
# why (free text), then a unified diff with a/ and b/ paths relative to the
# module's root. One that no longer applies fails the build, loudly: after a
# version bump, update the patch or drop it.
set -euo pipefail
die() { echo "patches: $*" >&2; exit 1; }
[[ $# -eq 1 ]] || die "usage: scripts/patches.sh DIR"
dir=$(readlink -m "$1")
cd "$(dirname "$0")/.."
# The same DIR for every build keeps the Go build cache warm: the patched
# modules' paths are part of what it compiles.
stamp=$(cat go.mod go.sum scripts/patches.sh scripts/patches/*.patch 2>/dev/null | sha256sum | cut -c1-16)
if [[ -f $dir/stamp && $(<"$dir/stamp") == "$stamp" ]]; then
  echo "$dir/go.mod"
  exit 0
fi
rm -rf "$dir"
mkdir -p "$dir"
cp go.mod go.sum "$dir/"

for p in scripts/patches/*.patch; do
  [[ -e $p ]] || continue
  module=$(sed -n '1s/^module: //p' "$p")
  [[ -n $module ]] || die "$p: its first line must be 'module: <module path>'"
  version=$(go list -m -f '{{.Version}}' "$module")
  [[ -n $version ]] || die "$p: kelp does not use module $module"
  go mod download "$module"
  copy=$dir/$(basename "$p" .patch)
  [[ ! -e $copy ]] || die "$p: two patches of one module go in one file"
  cp -r "$(go list -m -f '{{.Dir}}' "$module")" "$copy"
  chmod -R u+w "$copy"
  patch -s -p1 -d "$copy" --no-backup-if-mismatch -r - -i "$PWD/$p" ||
    die "$p no longer applies to $module $version: update it or drop it"
  # -replace takes the place of a replace go.mod already has for the module
  # (every k8s.io staging module has one: DESIGN.md's version table).
  go mod edit -replace="$module=$copy" "$dir/go.mod"
done
echo "$stamp" >"$dir/stamp"
echo "$dir/go.mod"
