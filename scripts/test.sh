#!/usr/bin/env bash
# Runs the whole test suite: linters, unit tests and cluster tests, which start
# real kelp servers in network namespaces of their own. Run as root on a fresh
# machine: it installs what it needs (Debian packages) and builds kelp.
# Extra arguments go to `go test` (e.g. -run TestServerSQLite -v).
set -euo pipefail
cd "$(dirname "$0")/.."

[[ $(id -u) == 0 ]] || { echo "scripts/test.sh: run as root (cluster tests use namespaces and mounts)" >&2; exit 1; }

# Pinned: a new release brings new checks, which must not fail a run on code
# that did not change. 2026.2.2 knows Go 1.26.
staticcheck=honnef.co/go/tools/cmd/staticcheck@v0.8.2

# Packages the tests use: ip/nsenter/unshare/mount for node namespaces, pkill,
# PostgreSQL for the external-datastore test, shellcheck for the scripts,
# qemu-io (qemu-utils) as the client of the VM lab's disk (scripts/vm/flushdisk).
need=()
for p in iproute2 util-linux mount procps postgresql shellcheck busybox dash zstd xz-utils systemd qemu-utils; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
  echo "installing ${need[*]}"
  # Keep the package from starting a system-wide PostgreSQL: the tests run
  # their own, inside a node's namespace. The machine's own policy-rc.d, if
  # it has one, is moved aside meanwhile and back after, also on failure.
  policy=/usr/sbin/policy-rc.d
  saved=
  if [[ -e $policy || -L $policy ]]; then
    saved=$(mktemp "$policy.kelp-test.XXXXXX")
    mv -f "$policy" "$saved"
  fi
  restore_policy() {
    if [[ -n $saved ]]; then mv -f "$saved" "$policy"; else rm -f "$policy"; fi
  }
  trap restore_policy EXIT
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
  restore_policy
  trap - EXIT
fi

# Every kelp node holds about two dozen inotify instances (the kubelet's
# cAdvisor, certificate and manifest watchers, containerd), and the cluster
# tests run several multi-node clusters at once: Linux's default of 128
# instances per user runs out, and a kubelet that gets none never becomes
# Ready. Raise it as kind's docs advise; a higher setting is kept.
inotify=/proc/sys/fs/inotify/max_user_instances
if (($(cat "$inotify") < 8192)); then
  echo "raising fs.inotify.max_user_instances from $(cat "$inotify") to 8192 for the cluster tests"
  echo 8192 >"$inotify"
fi

unformatted=$(gofmt -l main.go agent embed internal server)
[[ -z $unformatted ]] || { echo "gofmt needed: $unformatted" >&2; exit 1; }
shellcheck --external-sources --source-path=SCRIPTDIR install.sh scripts/*.sh scripts/lib/*.sh .ci/run

scripts/build.sh
# The same build as bin/kelp (pure-Go SQLite, kelp's patches to upstream
# modules), sharing its build cache.
export CGO_ENABLED=0
modfile=$(scripts/patches.sh .cache/patched)
go vet -modfile="$modfile" ./...
go run "$staticcheck" ./...
# Cluster tests call t.Parallel: up to -parallel of them (by default
# GOMAXPROCS, the number of CPUs) run at once in each package, beside other
# packages' tests (-p). More at once does not pay on 2 CPUs: with 4, the
# server package took 1718 s against 1888 s, and the other cluster packages
# twice as long; six server tests took 360 s with 4 against 353 s with 2,
# the CPU 99 % busy while their nodes started (the nodes' CPU and a few
# long waits bound the run, not the number at once). Every
# node has its own namespaces and cgroups (internal/testcluster), so any of
# them may run together. ./server/ is
# named first so that its cluster tests, the longest package by far, start
# first instead of after every other package.
# The upstream Gateway API conformance suite runs too, as a cluster test of
# its own (internal/gatewayconformance, about a minute).
# -timeout is the bound of a hung package, not a budget: the server
# package takes 29-36 minutes on a 2-CPU machine (2172 s in a clean-clone
# run on an idle one), and at 35 a CI run once ended it in its last test. Each cluster test has bounds of its own.
KELP_BIN=$PWD/bin/kelp KELP_GATEWAY_CONFORMANCE=1 go test -modfile="$modfile" -count=1 -timeout 60m "$@" ./server/ ./...
