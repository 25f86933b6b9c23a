#!/usr/bin/env bash
# What a default kelp server with its node holds in memory once it has idled:
# starts one `kelp server` with no flags beyond its paths, nothing deployed
# beyond the built-in parts, waits MINUTES once the Node is Ready, and prints
# the memory of kelp, containerd and the shims; it never judges the figures.
# The machine is noisy: compare figures of one run, or of runs one after the
# other on an idle machine (say, a binary before and after a change: KELP).
#
# Usage: scripts/bench-memory.sh [-m MINUTES]     (as root, from anywhere)
#   -m MINUTES  idle minutes once the Node is Ready (default 10); a figure
#               claimed in the README needs 30: the apiserver compacts every
#               5 minutes and the caches grow until their first resyncs
#   KELP=bin/kelp
#   LOGDIR=     if set, kelp's and containerd's logs are copied there
#
# The node is lib/bench.sh's (start_node): network, mount and cgroup
# namespaces of its own, like the cluster tests. Figures, at the end of the
# idle wait, measured over 30 s (measure_node in lib/bench.sh): RSS and PSS
# (/proc/PID/smaps_rollup) of kelp, containerd and the shims, their CPU and
# writes, and the working set; then kelp's Go heap in use (HeapInuse) and
# goroutines (its pprof endpoint, --pprof-address), threads and open file
# descriptors.
set -euo pipefail

minutes=10
while getopts m: opt; do
  case $opt in
    m) minutes=$OPTARG ;;
    *) exit 2 ;;
  esac
done
# shellcheck source=lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_init bench-memory
[[ $minutes =~ ^[1-9][0-9]*$ ]] || die "-m wants a positive number of minutes, got '$minutes'"

readonly pprof=127.0.0.1:6061
start_server_bench bench-memory
launch server "$work/kelp.log" server --data-dir "$work/data" --write-kubeconfig "$work/kelp.yaml" --pprof-address "$pprof"
node_ready() { [[ $(kubectl get nodes -o 'jsonpath={.items[0].status.conditions[?(@.type=="Ready")].status}') == True ]]; }
wait_for "node Ready" node_ready
echo "bench-memory: node Ready; idle for $minutes min" >&2
sleep $(( minutes * 60 ))

measure_node server 30 "$work/measure"
pid=${kelp_pid[server]}
goroutines=$(in_node server curl -sf "http://$pprof/debug/pprof/goroutine?debug=1" | sed -nE '1s/.*total ([0-9]+).*/\1/p')
heap=$(in_node server curl -sf "http://$pprof/debug/pprof/heap?debug=1" | awk '$2 == "HeapInuse" { printf "%.0f", $4 / 1048576 }')
threads=$(awk '$1 == "Threads:" { print $2 }' "/proc/$pid/status")
fds=$(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 | wc -l)

bench_header "idle $minutes min after node Ready, then measured over 30 s"
echo "kelp server, default flags (pids alive at both ends):"
print_measure "$work/measure"
echo "  (RSS counts pages shared by processes once per process; PSS shares them out)"
printf '    %-26s Go heap in use %s MiB  goroutines %d  threads %d  fds %d\n' "kelp" "${heap:--}" "${goroutines:-0}" "$threads" "$fds"
