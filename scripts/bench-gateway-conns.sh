#!/usr/bin/env bash
# Measures what idle connections cost the Gateway data path's process, with
# and without its connection caps, and prints the figures; it never judges
# them. It runs internal/gateway's BenchmarkIdleConnections, each case in a
# process of its own (RSS does not shrink): a data path serving one HTTP
# port on 127.0.0.1 with the default limits, CONNS connections to it that
# send nothing (bare sockets, which cost the process nothing of their own),
# then a request from another client address.
#   uncapped           caps above CONNS, connections from one address
#   capped             the default caps, connections from one address
#   capped-64-sources  the default caps, connections from 64 addresses
# Figures: the connections the data path keeps open, the growth of the
# process's RSS and of the Go heap and stacks, per connection kept, the
# status of the other address's request (0: refused), and the ratio of
# uncapped to capped.
#
# Usage: scripts/bench-gateway-conns.sh    (from anywhere; no root needed)
#   CONNS=5000   connections opened in each case (two file descriptors each)
set -euo pipefail
# shellcheck source=lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_init bench-gateway-conns --no-kelp go

CONNS=${CONNS:-5000}
[[ $CONNS =~ ^[1-9][0-9]*$ ]] || die "CONNS must be a positive integer"
(( 2 * CONNS + 100 <= $(ulimit -Hn) )) || die "CONNS=$CONNS needs $(( 2 * CONNS + 100 )) open files; the limit is $(ulimit -Hn)"
ulimit -n "$(ulimit -Hn)"
cd "$repo"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The same build as kelp's (its patches to upstream modules), sharing the
# build cache with scripts/build.sh and scripts/test.sh.
modfile=$(scripts/patches.sh .cache/patched)
CGO_ENABLED=0 go test -modfile="$modfile" -c -o "$work/gateway.test" ./internal/gateway/

bench_header "$CONNS idle connections to one HTTP port"
printf '  %-18s %6s %9s %10s %17s %10s %7s\n' case kept 'RSS +MiB' 'KiB/conn' 'heap+stacks +MiB' 'KiB/conn' status
for case in uncapped capped capped-64-sources; do
  # "BenchmarkIdleConnections/capped-2  1  N ns/op  V UNIT  V UNIT ..."
  "$work/gateway.test" -test.run '^$' -test.bench "^BenchmarkIdleConnections/$case\$" -test.benchtime 1x \
    -idle-conns "$CONNS" >"$work/$case.out" 2>&1 || die "the benchmark of $case failed: $(tail -n 20 "$work/$case.out")"
  grep '^BenchmarkIdleConnections/' "$work/$case.out" | tail -n 1 | awk -v c="$case" '{
    for (i = 3; i < NF; i += 2) v[$(i + 1)] = $i
    k = v["kept"] ? v["kept"] : 1
    printf "  %-18s %6d %9.1f %10.1f %17.1f %10.1f %7d\n", c, v["kept"], v["RSS-MiB"], v["RSS-MiB"] * 1024 / k,
      v["heap+stacks-MiB"], v["heap+stacks-MiB"] * 1024 / k, v["status"]
  }' | tee -a "$work/figures"
done
awk '{ rss[$1] = $3; heap[$1] = $5 } END {
  printf "  uncapped / capped (one address): RSS %.1f, heap+stacks %.1f\n", rss["uncapped"] / rss["capped"], heap["uncapped"] / heap["capped"] }' "$work/figures"
