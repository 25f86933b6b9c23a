#!/usr/bin/env bash
# Signs a release's checksums with the release's Ed25519 key, the
# signature install.sh checks when INSTALL_KELP_PUBLIC_KEY is set:
#
#   DIR/sha256sums.txt.sig   openssl pkeyutl -sign -rawin: the raw 64-byte
#                            Ed25519 signature of DIR/sha256sums.txt
#
# and checks it with the public key before it is published. Make the key
# pair once, and keep the private key off the build machines:
#
#   openssl genpkey -algorithm ed25519 -out kelp-release.key
#   openssl pkey -in kelp-release.key -pubout -out kelp-release.pub
#
# usage: scripts/sign-release.sh PRIVATE_KEY.pem [DIR]   (DIR: dist)
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf 'sign-release: error: %s\n' "$*" >&2; exit 1; }

key=${1:-}
dir=${2:-dist}
[[ -n $key ]] || die "usage: scripts/sign-release.sh PRIVATE_KEY.pem [DIR]"
[[ -r $key ]] || die "cannot read the private key $key"
[[ -f $dir/sha256sums.txt ]] || die "$dir/sha256sums.txt is missing: run scripts/release.sh first"
command -v openssl >/dev/null || die "openssl is missing: apt-get install openssl"
openssl pkey -in "$key" -noout -text 2>/dev/null | grep -q ED25519 ||
  die "$key is not an Ed25519 private key in PEM: make one with openssl genpkey -algorithm ed25519"

openssl pkeyutl -sign -inkey "$key" -rawin -in "$dir/sha256sums.txt" -out "$dir/sha256sums.txt.sig"
pub=$(mktemp)
trap 'rm -f "$pub"' EXIT
openssl pkey -in "$key" -pubout -out "$pub"
openssl pkeyutl -verify -pubin -inkey "$pub" -rawin -in "$dir/sha256sums.txt" -sigfile "$dir/sha256sums.txt.sig" >/dev/null ||
  die "the signature just made does not verify"
chmod 0644 "$dir/sha256sums.txt.sig"
printf 'sign-release: signed %s/sha256sums.txt with the key whose public half is:\n' "$dir" >&2
cat "$pub" >&2
