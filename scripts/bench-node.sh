#!/usr/bin/env bash
# Measures a kelp server with its node (`kelp server`) and prints the figures;
# it never judges them. The machine is noisy: compare figures of one run.
#
# Usage: scripts/bench-node.sh     (as root, from anywhere)
#   IDLE=300   seconds of the idle window, after the first pod runs
#   KELP=bin/kelp
#   LOGDIR=    if set, kelp's and containerd's logs are copied there
#   KELP_ARGS= more flags for kelp server, e.g. "--disable metrics-server"
#   PODS=      if set (> 2), the app is then scaled to PODS pods
#   SERVICES=  if set, that many Services of 10 endpoints each are then made
#
# kelp runs in a network and mount namespace of its own, with private
# /run/kelp, /run/netns, /var/lib/kubelet and pod logs, and cgroups of its
# own that it sees as its cgroup root, like the cluster tests (lib/bench.sh
# start_node): its kubelet leaves the host's kubepods, and another kelp's,
# alone. Figures:
#   node Ready       launch of `kelp server` (fresh data dir, bundle staged by a
#                    first run) until the Node's Ready condition is True
#   first pod        launch until a pod of the test image (from the airgap
#                    images directory) is Running; the Deployment and its
#                    Service are created as soon as the apiserver answers
#   app by DNS name  launch until the app answers through its Service by DNS
#                    name (a pod of it asks web.default.svc.cluster.local);
#                    "-" with --disable coredns
#   idle             over IDLE s: RSS and PSS of kelp + containerd + shims, CPU %
#                    of one core, bytes written (/proc/PID/io write_bytes)
#                    per second, and the working set: the memory touched in
#                    the window (see measure_node in lib/bench.sh)
#   PODS pods        with PODS set: the app scaled from 2 to PODS pods, time
#                    until all Running, then after 60 s the node's RSS, PSS and
#                    CPU over 60 s, and the PSS growth per added pod of kelp +
#                    containerd and of the shims
#   SERVICES         with SERVICES set: that many Services without a selector,
#                    each with an EndpointSlice of 10 addresses (nothing behind
#                    them), applied in batches of 100; the time until the proxy
#                    has programmed them all (kelp's debug log, so KELP_ARGS
#                    must hold --debug), then after 30 s the node's RSS and PSS
#                    over 30 s and their growth per Service; then one endpoint
#                    of one Service moved: the proxy's own time for that sync
#                    and whether it updated the table or replaced it
#   restart          SIGTERM, start again: node Ready and pods Running with the
#                    same containers
set -euo pipefail

IDLE=${IDLE:-300}
# shellcheck source=lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_init bench-node

[[ $IDLE =~ ^[1-9][0-9]*$ ]] || die "IDLE must be a positive integer (seconds)"
[[ -z ${PODS:-} || $PODS =~ ^[0-9]+$ && $PODS -gt 2 ]] || die "PODS must be a number above 2, got '$PODS'"
[[ -z ${SERVICES:-} || $SERVICES =~ ^[1-9][0-9]*$ && $SERVICES -le 25000 ]] || die "SERVICES must be a number from 1 to 25000, got '$SERVICES'"
[[ -z ${SERVICES:-} || " ${KELP_ARGS:-} " == *" --debug "* ]] || die "SERVICES needs KELP_ARGS=--debug: the proxy's timings are in kelp's debug log"

start_server_bench bench-node
build_test_image "$repo" "$work"

web_app 2 >"$work/app.yaml"

start_kelp() { # LOG: launches kelp server in the node
  # shellcheck disable=SC2086 # KELP_ARGS is a list of flags
  launch server "$work/$1" server --data-dir "$work/data" --write-kubeconfig "$work/kelp.yaml" ${KELP_ARGS:-}
}
node_ready() { [[ $(kubectl get nodes -o 'jsonpath={.items[0].status.conditions[?(@.type=="Ready")].status}') == True ]]; }
want_pods=2
pods_running() {
  local phases
  phases=$(kubectl get pods -l app=web -o 'jsonpath={range .items[*]}{.status.phase}{"\n"}{end}')
  [[ $(grep -c '^Running$' <<<"$phases") == "$want_pods" && $(wc -l <<<"$phases") == "$want_pods" ]]
}

# A first run stages the bundle, as an install does; then a fresh start.
start_kelp stage.log
wait_for "the first start" grep -q "kelp node is running" "$work/stage.log"
stop_kelp server
in_node server "$KELP" killall --data-dir "$work/data" >/dev/null
find "$work/data" -mindepth 1 -maxdepth 1 ! -name data -exec rm -rf {} +
mkdir -p "$work/data/agent/images" && cp "$work/testapp.tar" "$work/data/agent/images/"

t0=$(now_ms)
start_kelp first.log
wait_for "the apiserver" kubectl get --raw /readyz
t_api=$(( $(now_ms) - t0 ))
wait_for "applying the Deployment" kubectl apply -f "$work/app.yaml"
wait_for "node Ready" node_ready
t_node=$(( $(now_ms) - t0 ))
wait_for "pods Running" pods_running
t_pod=$(( $(now_ms) - t0 ))
app_by_name() {
  local pod
  pod=$(kubectl get pods -l app=web -o 'jsonpath={.items[0].metadata.name}')
  [[ $(kubectl exec "$pod" -- /testapp get http://web.default.svc.cluster.local/) == web-* ]]
}
# Without the cluster DNS (KELP_ARGS --disable coredns) there is no name to ask.
t_dns=
if [[ " ${KELP_ARGS:-} " != *" --disable coredns "* ]]; then
  wait_for "the app by DNS name" app_by_name
  t_dns=$(( $(now_ms) - t0 ))
fi
bench_header "${KELP_ARGS:+kelp server $KELP_ARGS}"
printf 'fresh start: apiserver %ss, node Ready %ss, 2 pods Running %ss, app answers by DNS name %ss\n' \
  "$(secs "$t_api")" "$(secs "$t_node")" "$(secs "$t_pod")" "$(secs "$t_dns")"

# measure SECONDS TITLE: the figures of every process of the node over
# SECONDS (measure_node: kelp, containerd and the runc shims), under TITLE.
measure() {
  measure_node server "$1" "$work/measure"
  echo
  echo "$2 (pids alive at both ends):"
  print_measure "$work/measure"
  echo "  (RSS counts pages shared by processes once per process; PSS shares them out)"
}
# kib COLUMN REGEX: the sum of a column of sample_node (5: RSS, 6: PSS) over
# the processes whose names match REGEX, at the end of the last measure.
kib() { awk -v c="$1" -v re="$2" '$1 ~ re { sum += $c } END { print sum + 0 }' "$work/measure.after"; }
readonly core='^(kelp-.*|containerd)$' shims='^containerd-shim'
measure "$IDLE" "idle ${IDLE}s"

if [[ -n ${PODS:-} ]]; then
  core_before=$(kib 6 "$core") shims_before=$(kib 6 "$shims")
  want_pods=$PODS
  t0=$(now_ms)
  kubectl scale deployment/web --replicas="$PODS" >/dev/null
  wait_for "$PODS pods Running" pods_running
  t_scale=$(( $(now_ms) - t0 ))
  echo
  printf '%s pods: scaled from 2, all Running after %ss\n' "$PODS" "$(secs $t_scale)"
  sleep 60
  measure 60 "$PODS pods, 60 s after all Running, over 60 s"
  awk -v n=$(( PODS - 2 )) -v core="$(( $(kib 6 "$core") - core_before ))" -v shims="$(( $(kib 6 "$shims") - shims_before ))" \
    'BEGIN { printf "  growth per added pod: kelp + containerd PSS %.2f MiB, shims PSS %.2f MiB\n", core / 1024 / n, shims / 1024 / n }'
  want_pods=2
  kubectl scale deployment/web --replicas=2 >/dev/null
  wait_for "back to 2 pods" pods_running
fi

if [[ -n ${SERVICES:-} ]]; then
  # service_yaml I ADDR: Service bench-I and its EndpointSlice of ADDR and
  # 10.44.0.2-10 (nothing answers there; the proxy does not know).
  service_yaml() {
    local j
    printf -- '---\napiVersion: v1\nkind: Service\nmetadata: {name: bench-%d}\nspec: {ports: [{port: 80}]}\n' "$1"
    printf -- '---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: bench-%d, labels: {kubernetes.io/service-name: bench-%d}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints:\n' "$1" "$1"
    printf -- '- addresses: ["%s"]\n' "$2"
    for j in $(seq 2 10); do printf -- '- addresses: ["10.44.0.%d"]\n' "$j"; done
  }
  core_before=$(kib 6 "$core") rss_before=$(kib 5 '^kelp-')
  programmed() { grep -F 'msg="programmed Services"' "$work/first.log" | tail -1; }
  [[ $(programmed) =~ ports=([0-9]+) ]] || die "no \"programmed Services\" in kelp's log: is --debug in KELP_ARGS?"
  want_ports=$(( BASH_REMATCH[1] + SERVICES ))
  t0=$(now_ms)
  for ((b = 0; b < SERVICES; b += 100)); do
    for ((i = b; i < b + 100 && i < SERVICES; i++)); do service_yaml "$i" "10.44.255.1"; done >"$work/services.yaml"
    wait_for "applying Services $b.." kubectl apply -f "$work/services.yaml"
  done
  all_programmed() { [[ $(programmed) =~ ports=([0-9]+) ]] && (( BASH_REMATCH[1] >= want_ports )); }
  wait_for "the proxy programming $SERVICES Services" all_programmed
  t_services=$(( $(now_ms) - t0 ))
  echo
  printf '%s Services x 10 endpoints: applied and programmed after %ss\n' "$SERVICES" "$(secs $t_services)"
  sleep 30
  measure 30 "$SERVICES Services, 30 s after, over 30 s"
  awk -v n="$SERVICES" -v pss="$(( $(kib 6 "$core") - core_before ))" -v rss="$(( $(kib 5 '^kelp-') - rss_before ))" \
    'BEGIN { printf "  growth per Service: kelp RSS %.1f KiB, kelp + containerd PSS %.1f KiB\n", rss / n, pss / n }'
  before_line=$(programmed)
  moved=$(( SERVICES / 2 ))
  service_yaml "$moved" "10.44.254.1" | kubectl apply -f - >/dev/null
  moved_programmed() { [[ $(programmed) != "$before_line" ]]; }
  wait_for "the proxy programming the moved endpoint" moved_programmed
  line=$(programmed)
  [[ $line =~ table=([a-z]+) ]] && how=${BASH_REMATCH[1]}
  [[ $line =~ took=([0-9.a-zµ]+) ]] && took=${BASH_REMATCH[1]}
  printf '  one endpoint moved: the proxy %s its table in %s\n' "${how:-?}" "${took:-?}"
fi

ids() { kubectl get pods -l app=web -o 'jsonpath={range .items[*]}{.status.containerStatuses[0].containerID}{" "}{end}'; }
before_ids=$(ids)
stop_kelp server
t0=$(now_ms)
start_kelp restart.log
wait_for "node Ready after restart" node_ready
t_node=$(( $(now_ms) - t0 ))
wait_for "pods Running after restart" pods_running
echo
printf 'restart: node Ready %ss; containers kept: %s\n' "$(secs $t_node)" "$([[ $(ids) == "$before_ids" ]] && echo yes || echo NO)"
echo
echo "goals (issues 3 and 4), for context: node Ready <= 10 s; first pod Running <= 15 s; app by"
echo "  DNS name <= 15 s; idle RSS of kelp + containerd + shims <= 350 MB; idle CPU <= 3 %;"
echo "  idle writes <= 2 kB/s"
