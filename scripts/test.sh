#!/usr/bin/env bash
# Runs the whole test suite: unit tests and cluster tests, which start real
# kelp servers in network namespaces of their own. Run as root on a fresh
# machine: it installs what it needs (Debian packages) and builds kelp.
# Extra arguments go to `go test` (e.g. -run TestServerSQLite -v).
set -euo pipefail
cd "$(dirname "$0")/.."

[[ $(id -u) == 0 ]] || { echo "scripts/test.sh: run as root (cluster tests use namespaces and mounts)" >&2; exit 1; }

# Packages the cluster tests use: ip/nsenter/unshare/mount for node
# namespaces, pkill, PostgreSQL for the external-datastore test.
need=()
for p in iproute2 util-linux mount procps postgresql; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
  echo "installing ${need[*]}"
  # Keep the package from starting a system-wide PostgreSQL: the tests run
  # their own, inside a node's namespace.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
fi

scripts/build.sh
# The same build as bin/kelp (pure-Go SQLite), sharing its build cache.
export CGO_ENABLED=0
unformatted=$(gofmt -l main.go agent embed internal server)
[[ -z $unformatted ]] || { echo "gofmt needed: $unformatted" >&2; exit 1; }
go vet ./...
KELP_BIN=$PWD/bin/kelp go test -count=1 -timeout 25m "$@" ./...
