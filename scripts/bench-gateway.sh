#!/usr/bin/env bash
# Measures kelp's Gateway API data path on a kelp server with its node (`kelp
# server`) and prints the figures; it never judges them. The machine is noisy:
# compare figures of one run.
#
# Usage: scripts/bench-gateway.sh     (as root, from anywhere)
#   SECONDS_EACH=10  seconds of each load run
#   CONNS=16         connections of each load run, one request at a time each
#   ROUNDS=5         HTTPRoutes created for the route-to-traffic figure
#   ROUTES=100       HTTPRoutes of the memory figure
#   SETTLE=20        seconds kelp is left alone before each memory sample
#   KELP=bin/kelp
#   LOGDIR=          if set, kelp's and containerd's logs are copied there
#
# kelp runs in network, mount and cgroup namespaces and cgroups of its own,
# with private /run/kelp, /run/netns, /var/lib/kubelet and pod logs, like the
# cluster tests (lib/bench.sh start_node); it starts once, on a fresh data dir
# with the test image in its airgap images directory. The app is one pod of
# the test image (testapp serve) behind a Service; a Gateway of the
# GatewayClass kelp listens on port 80 of the node's address. Figures, in
# the order they are taken:
#   memory         RSS and PSS of the kelp process (which serves the Gateway),
#                  SETTLE s after the Gateway is Programmed with no HTTPRoute,
#                  and SETTLE s after ROUTES HTTPRoutes (a hostname each, all to
#                  the Service) answer: both and the difference, before any
#                  load has grown kelp's heap. The routes stay for the rest.
#   route -> 200   a poller in the node GETs the Gateway every 5 ms as the
#                  host of an HTTPRoute that does not exist yet; then the
#                  HTTPRoute is created (curl to the apiserver). The time from
#                  just before the create request until the first 200 OK:
#                  controller, status, data path. ROUNDS routes, each figure
#                  and the median.
#   load           testapp httpbench, run in the node's network namespace (not
#                  in a pod), GETs / for SECONDS_EACH s on CONNS kept-alive
#                  connections: to the pod's IP directly, then through the
#                  Gateway (Host of an HTTPRoute to the Service): requests/s,
#                  p50 and p99 latency, and the ratios gateway / direct
set -euo pipefail

SECONDS_EACH=${SECONDS_EACH:-10}
CONNS=${CONNS:-16}
ROUNDS=${ROUNDS:-5}
ROUTES=${ROUTES:-100}
SETTLE=${SETTLE:-20}
# shellcheck source=lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_init bench-gateway unshare nsenter ip curl awk

for v in SECONDS_EACH CONNS ROUNDS ROUTES SETTLE; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer"
done
(( ROUTES <= 1000 )) || die "ROUTES must be at most 1000"

start_server_bench bench-gateway
testapp() { in_node server "$work/testapp" "$@"; }
build_test_image "$repo" "$work"
mkdir -p "$work/data/agent/images" && cp "$work/testapp.tar" "$work/data/agent/images/"

web_app 1 >"$work/app.yaml"
cat >>"$work/app.yaml" <<'YAML'
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: bench}
spec:
  gatewayClassName: kelp
  listeners: [{name: http, port: 80, protocol: HTTP}]
YAML

# route NAME HOSTNAME: an HTTPRoute of HOSTNAME on the Gateway to the Service.
route() {
  printf '{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "%s"},
    "spec": {"parentRefs": [{"name": "bench"}], "hostnames": ["%s"],
      "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}}' "$1" "$2"
}

launch server "$work/kelp.log" server --data-dir "$work/data" --write-kubeconfig "$work/kelp.yaml"
wait_for "the apiserver" kubectl get --raw /readyz
wait_for "the Gateway API (GatewayClass kelp)" kubectl get gatewayclass kelp
wait_for "applying the app and the Gateway" kubectl apply -f "$work/app.yaml"
wait_for "the Gateway Programmed" kubectl wait --for=condition=Programmed gateway/bench --timeout=5s
wait_for "the web pod Ready" kubectl wait --for=condition=Ready pod -l app=web --timeout=5s
gateway=$(kubectl get gateway bench -o 'jsonpath={.status.addresses[0].value}')
[[ -n $gateway ]] || die "the Gateway has no address in its status"
pod_ip=$(kubectl get pod -l app=web -o 'jsonpath={.items[0].status.podIP}')
bench_header "Gateway at $gateway, pod at $pod_ip"

# kelp_memory: "RSS PSS" of the kelp process, in KiB.
kelp_memory() {
  local pid=${kelp_pid[server]}
  echo "$(awk '$1 == "VmRSS:" {print $2}' "/proc/$pid/status") $(awk '$1 == "Pss:" {print $2}' "/proc/$pid/smaps_rollup")"
}

# --- Memory: 0 vs ROUTES HTTPRoutes, before any load ------------------------

sleep "$SETTLE"
read -r rss0 pss0 <<<"$(kelp_memory)"

{
  echo '{"apiVersion": "v1", "kind": "List", "items": ['
  for (( i = 1; i <= ROUTES; i++ )); do (( i == 1 )) || echo ','; route "r-$i" "r-$i.bench.test"; done
  echo ']}'
} >"$work/routes.json"
# ROUTES objects at once: more than the 5 s a request gets elsewhere on a
# busy machine.
kubectl apply --request-timeout=2m -f "$work/routes.json" >/dev/null
wait_for "the first of $ROUTES routes" testapp firstanswer -ok -host r-1.bench.test "http://$gateway/"
wait_for "the last of $ROUTES routes" testapp firstanswer -ok -host "r-$ROUTES.bench.test" "http://$gateway/"
sleep "$SETTLE"
read -r rss1 pss1 <<<"$(kelp_memory)"
echo
echo "memory of the kelp process (server, node and gateway), ${SETTLE}s after each step:"
awk -v r0="$rss0" -v p0="$pss0" -v r1="$rss1" -v p1="$pss1" -v n="$ROUTES" 'BEGIN {
  printf "  Gateway, 0 HTTPRoutes     RSS %6.1f MiB  PSS %6.1f MiB\n", r0 / 1024, p0 / 1024
  printf "  Gateway, %4d HTTPRoutes  RSS %6.1f MiB  PSS %6.1f MiB\n", n, r1 / 1024, p1 / 1024
  printf "  difference                RSS %+6.1f MiB  PSS %+6.1f MiB\n", (r1 - r0) / 1024, (p1 - p0) / 1024 }'

# --- HTTPRoute create -> first 200 --------------------------------------------

tls=$work/data/server/tls
apiserver() { # METHOD PATH [JSON]: a request as admin, as fast as curl starts
  in_node server curl -sf --max-time 10 --cacert "$tls/server-ca.crt" --cert "$tls/client-admin.crt" \
    --key "$tls/client-admin.key" -X "$1" -H 'Content-Type: application/json' \
    ${3:+--data-binary "$3"} "https://127.0.0.1:6443$2" >/dev/null
}
routes=/apis/gateway.networking.k8s.io/v1/namespaces/default/httproutes
echo
echo "HTTPRoute create -> first 200 through the Gateway (Gateway Programmed, pod Ready, $ROUTES other routes):"
figures=()
for (( i = 1; i <= ROUNDS; i++ )); do
  host=probe-$i.bench.test
  testapp firstanswer -ok -host "$host" "http://$gateway/" >"$work/poll.out" 2>&1 &
  poller=$!
  wait_for "the poller of $host" grep -q '^polling' "$work/poll.out"
  t0=$(now_ms)
  apiserver POST "$routes" "$(route "probe-$i" "$host")"
  t_created=$(now_ms)
  wait "$poller" || die "no 200 for $host: $(cat "$work/poll.out")"
  poller=
  answered=$(tail -n 1 "$work/poll.out")
  figures+=($(( answered - t0 )))
  printf '  %-22s %5d ms  (the create request took %d ms)\n' "$host" "$(( answered - t0 ))" "$(( t_created - t0 ))"
  apiserver DELETE "$routes/probe-$i"
done
printf '  median %d ms\n' "$(printf '%s\n' "${figures[@]}" | median)"

# --- Load: direct to the pod vs through the Gateway ---------------------------

echo
echo "load, $CONNS connections for ${SECONDS_EACH}s each, from the node's network namespace:"
kubectl apply -f - >/dev/null <<<"$(route web web.bench.test)"
wait_for "the route web.bench.test" testapp firstanswer -ok -host web.bench.test "http://$gateway/"
testapp httpbench -c "$CONNS" "http://$pod_ip:8080/" 1 >/dev/null             # warm-up
testapp httpbench -c "$CONNS" -host web.bench.test "http://$gateway/" 1 >/dev/null
direct=$(testapp httpbench -c "$CONNS" "http://$pod_ip:8080/" "$SECONDS_EACH")
through=$(testapp httpbench -c "$CONNS" -host web.bench.test "http://$gateway/" "$SECONDS_EACH")
printf '  %-8s %s\n' direct "$direct" gateway "$through"
# "N requests, R requests/s, p50 A ms, p99 B ms, F failed"
awk -v d="$direct" -v g="$through" 'BEGIN {
  split(d, dv, /[ ,]+/); split(g, gv, /[ ,]+/)
  printf "  gateway / direct: requests/s %.3f, p50 %.2f, p99 %.2f\n", gv[3] / dv[3], gv[6] / dv[6], gv[9] / dv[9] }'
