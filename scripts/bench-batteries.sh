#!/usr/bin/env bash
# What each built-in battery costs at idle: runs scripts/bench-node.sh once
# with everything on, once with each battery turned off alone, and once with
# all of them off, and prints the idle figures of the whole node (kelp +
# containerd + shims) side by side. One run each on a noisy machine:
# compare the figures of one run of this script, never across runs.
#
# Usage: scripts/bench-batteries.sh     (as root)
#   IDLE=120   seconds of each idle window
#   KELP=bin/kelp
set -euo pipefail
# shellcheck source=lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_init bench-batteries
export IDLE=${IDLE:-120} KELP

all_off="--disable metrics-server --disable helm-controller --disable local-storage --disable coredns --disable servicelb --disable-network-policy"
configs=(
  "all on|"
  "no metrics-server|--disable metrics-server"
  "no helm-controller|--disable helm-controller"
  "no local-storage|--disable local-storage"
  "no coredns|--disable coredns"
  "no servicelb|--disable servicelb"
  "no network-policy|--disable-network-policy"
  "all off|$all_off"
)
declare -A line
for c in "${configs[@]}"; do
  name=${c%%|*}
  out=$(KELP_ARGS=${c#*|} "$repo/scripts/bench-node.sh")
  line[$name]=$(grep -m1 '^ *the whole node ' <<<"$out")
  echo "$name: ${line[$name]#*: }" >&2
done

field() { # NAME WHAT: the number after WHAT in NAME's figures
  sed -E "s/.*$2 +([0-9.]+).*/\1/" <<<"${line[$1]}"
}
bench_header "idle ${IDLE}s each, whole node"
printf '  %-20s %9s %9s %12s %14s %13s\n' "" "RSS MiB" "PSS MiB" "CPU % core" "writes KiB/s" "working set"
for c in "${configs[@]}"; do
  name=${c%%|*}
  printf '  %-20s %9s %9s %12s %14s %13s\n' "$name" "$(field "$name" RSS)" "$(field "$name" PSS)" "$(field "$name" CPU)" "$(field "$name" writes)" "$(field "$name" 'working set')"
done
awk -v a="${line[all on]}" -v b="${line[all off]}" 'function num(s, what) { match(s, what " +[0-9.]+"); split(substr(s, RSTART, RLENGTH), f, / +/); return f[2] }
  BEGIN { printf "  %-20s %9.0f %9.0f %12.1f\n", "all on - all off", num(a, "RSS") - num(b, "RSS"), num(a, "PSS") - num(b, "PSS"), num(a, "CPU") - num(b, "CPU") }'
