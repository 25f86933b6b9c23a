#!/usr/bin/env bash
# Measures Services and cluster DNS on a kelp server with its node (`kelp
# server`) and prints the figures; it never judges them. The machine is noisy:
# compare figures of one run.
#
# Usage: scripts/bench-services.sh     (as root, from anywhere)
#   ROUNDS=5      Services created for the first figure
#   BLAST=5       seconds of each throughput transfer (3 to each address)
#   QUERIES=2000  DNS queries
#   KELP=bin/kelp
#   LOGDIR=       if set, kelp's and containerd's logs are copied there
#
# kelp runs in network, mount and cgroup namespaces and cgroups of its own,
# with private /run/kelp, /run/netns, /var/lib/kubelet and pod logs, like the
# cluster tests (lib/bench.sh start_node);
# it starts once, on a fresh data dir with the test image in its airgap images
# directory.
# Figures, all from pods of the test image on the node:
#   Service create -> answer  a client pod starts a GET of a ClusterIP every
#                  5 ms, each on a new connection; then a Service with that
#                  ClusterIP is created (curl to the apiserver) in front of pods
#                  that are already Ready. The time from just before the create
#                  request until the first answer: EndpointSlice controller,
#                  proxy (its coalescing included) and kernel. ROUNDS Services,
#                  each with another ClusterIP; each figure and the median.
#   throughput     one TCP connection from a client pod to a sink pod, writing
#                  as fast as it can for BLAST s, to the sink's pod IP and to its
#                  ClusterIP in turn, 3 times each: the medians in MB/s and the
#                  ratio ClusterIP / pod IP (what the proxy's NAT costs)
#   DNS            QUERIES lookups in a row of web.default.svc.cluster.local.
#                  (A only; the trailing dot skips the search path) by Go's
#                  resolver, which caches nothing, from a pod to the cluster
#                  DNS: median and 99th percentile
# The time from the start of kelp until an app answers through its Service by
# DNS name is scripts/bench-node.sh's.
set -euo pipefail

ROUNDS=${ROUNDS:-5}
BLAST=${BLAST:-5}
QUERIES=${QUERIES:-2000}
# shellcheck source=lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_init bench-services unshare nsenter ip curl awk

for v in ROUNDS BLAST QUERIES; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer"
done
(( ROUNDS <= 50 )) || die "ROUNDS must be at most 50 (one ClusterIP each)"

start_server_bench bench-services
build_test_image "$repo" "$work"
mkdir -p "$work/data/agent/images" && cp "$work/testapp.tar" "$work/data/agent/images/"

web_app 2 >"$work/app.yaml"
cat >>"$work/app.yaml" <<'YAML'
---
apiVersion: v1
kind: Pod
metadata: {name: sink, labels: {app: sink}}
spec:
  containers:
  - {name: sink, image: docker.io/kelp-test/testapp:1.0, imagePullPolicy: IfNotPresent, args: [sink, -listen, ":9000"]}
---
apiVersion: v1
kind: Service
metadata: {name: sink}
spec:
  selector: {app: sink}
  clusterIP: 10.43.200.1
  ports: [{port: 9000, targetPort: 9000}]
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  containers:
  - {name: client, image: docker.io/kelp-test/testapp:1.0, imagePullPolicy: IfNotPresent, args: [serve]}
YAML

launch server "$work/kelp.log" server --data-dir "$work/data" --write-kubeconfig "$work/kelp.yaml"
all_ready() {
  local ready
  ready=$(kubectl get pods -o 'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{" "}{end}')
  [[ $ready == "True True True True " ]]
}
wait_for "the apiserver" kubectl get --raw /readyz
wait_for "applying the workloads" kubectl apply -f "$work/app.yaml"
wait_for "4 pods Ready" all_ready
wait_for "the sink through its Service" kubectl exec client -- /testapp blast 10.43.200.1:9000 1
bench_header ""

# --- Service create -> first answer ----------------------------------------

tls=$work/data/server/tls
apiserver() { # METHOD PATH [JSON]: a request as admin, as fast as curl starts
  in_node server curl -sf --max-time 10 --cacert "$tls/server-ca.crt" --cert "$tls/client-admin.crt" \
    --key "$tls/client-admin.key" -X "$1" -H 'Content-Type: application/json' \
    ${3:+--data-binary "$3"} "https://127.0.0.1:6443$2" >/dev/null
}
probe_gone() {
  local services slices
  services=$(kubectl get services -o name) || return 1
  slices=$(kubectl get endpointslices -l kubernetes.io/service-name=probe -o name) || return 1
  ! grep -qx service/probe <<<"$services" && [[ -z $slices ]]
}
echo
echo "Service create -> first answer through its ClusterIP (pods already Ready):"
figures=()
for (( i = 1; i <= ROUNDS; i++ )); do
  ip=10.43.100.$(( 100 + i ))
  kubectl exec client -- /testapp firstanswer "http://$ip/" >"$work/poll.out" 2>&1 &
  poller=$!
  wait_for "the client polling $ip" grep -q '^polling' "$work/poll.out"
  t0=$(now_ms)
  apiserver POST /api/v1/namespaces/default/services \
    '{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "probe"},
      "spec": {"selector": {"app": "web"}, "clusterIP": "'"$ip"'", "ports": [{"port": 80, "targetPort": 8080}]}}'
  t_created=$(now_ms)
  wait "$poller" || die "no answer from $ip: $(cat "$work/poll.out")"
  poller=
  answered=$(tail -n 1 "$work/poll.out")
  figures+=($(( answered - t0 )))
  printf '  %-14s %4d ms  (the create request took %d ms)\n' "$ip" "$(( answered - t0 ))" "$(( t_created - t0 ))"
  apiserver DELETE /api/v1/namespaces/default/services/probe
  wait_for "the Service probe and its EndpointSlices to go" probe_gone
  sleep 1 # the proxy's sync of the deletion
done
printf '  median %d ms\n' "$(printf '%s\n' "${figures[@]}" | median)"

# --- Throughput: ClusterIP vs pod IP ------------------------------------------

sink_ip=$(kubectl get pod sink -o 'jsonpath={.status.podIP}')
echo
echo "throughput, one TCP connection from a pod, ${BLAST}s each:"
: >"$work/pod.rates"; : >"$work/clusterip.rates"
for round in 1 2 3; do
  for target in "pod $sink_ip" "clusterip 10.43.200.1"; do
    read -r kind addr <<<"$target"
    rate=$(kubectl exec client -- /testapp blast "$addr:9000" "$BLAST" | awk '{ print $1 }')
    echo "$rate" >>"$work/$kind.rates"
    printf '  round %d  %-9s %-13s %8.1f MB/s\n' "$round" "$kind" "$addr" "$rate"
  done
done
pod_rate=$(median <"$work/pod.rates")
cluster_rate=$(median <"$work/clusterip.rates")
awk -v p="$pod_rate" -v c="$cluster_rate" 'BEGIN {
  printf "  median: pod IP %.1f MB/s, ClusterIP %.1f MB/s; ClusterIP / pod IP = %.3f\n", p, c, c / p }'

# --- DNS ----------------------------------------------------------------------

echo
echo "DNS from a pod, web.default.svc.cluster.local. (A), one query at a time:"
echo "  $(kubectl exec client -- /testapp dnsbench web.default.svc.cluster.local. "$QUERIES")"
