#!/usr/bin/env bash
# Measures a cluster of two kelp nodes on one machine, a server (`kelp server`)
# and an agent (`kelp agent`), with each overlay backend, and prints the
# figures; it never judges them. The machine is noisy: compare figures of one
# run.
#
# Usage: scripts/bench-nodes.sh     (as root, from anywhere)
#   BACKENDS="vxlan host-gw"  overlay backends (`kelp server --overlay`), a new
#                             cluster for each
#   BLAST=5    seconds of each throughput transfer (3 rounds of 2)
#   IDLE=60    seconds of quiet before the agent's memory is read
#   KELP=bin/kelp
#   LOGDIR=    if set, kelp's and containerd's logs are copied there
#
# The nodes are wired as in the cluster tests (internal/testcluster/lab.go),
# by lib/bench.sh start_lab and start_lab_node: a lab network namespace with
# a bridge lab0, and per node network, mount and cgroup namespaces, eth0
# 10.99.0.x/24 on the bridge, private /run/kelp, /run/netns, /var/lib/kubelet
# and pod logs, and a cgroup subtree of its own that the node sees as its
# cgroup root, so the two kubelets do not fight over the host's kubepods.
# The server is 10.99.0.2 and the agent, agent-1, 10.99.0.3. Both have the
# test image in their airgap images directory.
# Figures, per backend:
#   agent join -> Ready  with the server running and its node Ready: launch of
#                  `kelp agent` (fresh data dir but for the runtime bundle,
#                  staged as a first run leaves it: a copy of the server's)
#                  until the Node agent-1 is Ready (polled with kubectl); and
#                  when the agent logged "kelp node is running"
#   throughput     one TCP connection writing as fast as it can for BLAST s to a
#                  sink pod on the agent, from a client pod on the server
#                  (cross-node, through the overlay) and from a client pod on
#                  the agent (same node), in turn, 3 times each: the medians in
#                  MB/s and the ratio cross-node / same node. Both nodes share
#                  this machine's CPUs, so the ratio is what the overlay's path
#                  costs in CPU, not what a network would carry.
#   agent idle     after the throughput rounds, over IDLE s of quiet with the 3
#                  pods running: every process of the agent's node by program
#                  (lib/bench.sh measure_node: RSS, PSS, CPU % of one core,
#                  writes, and the working set, the memory touched in the
#                  window), and the agent proper: its kelp process and its
#                  containerd child, not the shims, whose RSS (and its anon
#                  part), PSS, working set and CPU the summary gives. RSS
#                  counts resident file pages (the binaries') in each process,
#                  PSS divides them among all that map them, here the server's
#                  processes too.
set -euo pipefail

BACKENDS=${BACKENDS:-vxlan host-gw}
BLAST=${BLAST:-5}
IDLE=${IDLE:-60}
# shellcheck source=lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_init bench-nodes unshare nsenter ip awk find mountpoint

readonly image=docker.io/kelp-test/testapp:1.0
readonly server_ip=10.99.0.2 agent_ip=10.99.0.3 agent_name=agent-1

for v in BLAST IDLE; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (seconds)"
done
read -ra backends <<<"$BACKENDS"
(( ${#backends[@]} > 0 )) || die "BACKENDS is empty"
for b in "${backends[@]}"; do
  [[ $b == vxlan || $b == host-gw ]] || die "BACKENDS: unknown overlay backend '$b' (vxlan or host-gw)"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/kelp-bench-nodes.XXXXXX")

# --- the cluster being measured, and its teardown ------------------------------

# The lab and the nodes, their kelps and cgroups are lib/bench.sh's.
dir= # $work/<backend>, the nodes' files: $dir/<node>/{data,kelp.yaml,*.log}

kubectl() { in_node server "$KELP" kubectl --kubeconfig "$dir/server/kelp.yaml" --request-timeout=5s "$@"; }

teardown() { # removes the cluster of $dir
  local node f b
  # Both kelps stop with SIGTERM first, as a user stops them; then each
  # node's killall.
  for node in agent server; do
    [[ -n ${kelp_pid[$node]:-} ]] && stop_kelp "$node"
  done
  for node in agent server; do
    # Shims and containers outlive kelp on purpose; killall removes them,
    # their mounts, interfaces and cgroups; end_node the rest.
    if [[ -n ${holder[$node]:-} ]] &&
      ! in_node "$node" "$KELP" killall --data-dir "$dir/$node/data" >"$dir/$node/killall.log" 2>&1; then
      echo "bench-nodes: kelp killall on the $node failed:" >&2
      tail -n 5 "$dir/$node/killall.log" >&2
    fi
    end_node "$node"
  done
  end_lab
  if [[ -n $LOGDIR && -n $dir ]]; then
    b=$(basename "$dir")
    mkdir -p "$LOGDIR"
    for node in server agent; do
      for f in "$dir/$node"/*.log "$dir/$node/data/agent/containerd/containerd.log"; do
        [[ -f $f ]] && cp "$f" "$LOGDIR/$b-$node-$(basename "$f")"
      done
    done
  fi
  [[ -n $dir ]] && rm -rf "$dir"
  dir=
}

cleanup() {
  local rc=$?
  trap - EXIT
  trap '' INT TERM # a second Ctrl-C must not cut the cleanup short
  set +eu
  teardown
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- kelp on the nodes ------------------------------------------------------------

node_ready() { # NAME
  [[ $(kubectl get node "$1" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == True ]]
}
pods_ready() {
  [[ $(kubectl get pods -o 'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{" "}{end}') == "True True True " ]]
}
stage_images() { # NODE: the test image in the node's airgap images directory
  mkdir -p "$dir/$1/data/agent/images" && cp "$work/testapp.tar" "$dir/$1/data/agent/images/"
}

# sink: the throughput server, on the agent. client-server and client-agent:
# where the transfers start, one on each node (they serve, to stay up).
cat >"$work/pods.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: sink}
spec:
  nodeName: $agent_name
  terminationGracePeriodSeconds: 0
  containers:
  - {name: sink, image: $image, imagePullPolicy: IfNotPresent, args: [sink, -listen, ":9000"]}
---
apiVersion: v1
kind: Pod
metadata: {name: client-server}
spec:
  nodeName: server
  terminationGracePeriodSeconds: 0
  containers:
  - {name: client, image: $image, imagePullPolicy: IfNotPresent, args: [serve]}
---
apiVersion: v1
kind: Pod
metadata: {name: client-agent}
spec:
  nodeName: $agent_name
  terminationGracePeriodSeconds: 0
  containers:
  - {name: client, image: $image, imagePullPolicy: IfNotPresent, args: [serve]}
YAML

declare -A r # results, keyed "backend,figure"

run_backend() { # BACKEND: a new cluster with it, measured, then removed
  local backend=$1 t0 t_log='' t_ready='' round target kind pod rate node d
  dir=$work/$backend
  mkdir -p "$dir/server" "$dir/agent"
  start_lab "$dir"
  start_lab_node server "$server_ip" "$dir"
  start_lab_node agent "$agent_ip" "$dir"
  stage_images server

  launch server "$dir/server/kelp.log" server --data-dir "$dir/server/data" \
    --write-kubeconfig "$dir/server/kelp.yaml" --node-name server --overlay "$backend"
  wait_for "the server's node running" grep -q "kelp node is running" "$dir/server/kelp.log"
  wait_for "the server's node Ready" node_ready server

  # The agent's bundle staged as by a first run, without one: both nodes
  # run the same binary, so the server's staged bundle is the agent's.
  mkdir -p "$dir/agent/data"
  cp -a "$dir/server/data/data" "$dir/agent/data/"
  stage_images agent

  t0=$(now_ms)
  launch agent "$dir/agent/kelp.log" agent --server "https://$server_ip:6443" \
    --token-file "$dir/server/data/server/token" --data-dir "$dir/agent/data" \
    --node-name "$agent_name" --node-ip "$agent_ip"
  until [[ -n $t_ready && -n $t_log ]]; do
    alive "${kelp_pid[agent]}" || die "kelp agent exited before its node was Ready: see $dir/agent/kelp.log"
    (( $(now_ms) - t0 < 300000 )) || die "the agent's node was not Ready and running within 5 minutes"
    [[ -z $t_log ]] && grep -q "kelp node is running" "$dir/agent/kelp.log" && t_log=$(( $(now_ms) - t0 ))
    [[ -z $t_ready ]] && node_ready "$agent_name" 2>/dev/null && t_ready=$(( $(now_ms) - t0 ))
    sleep 0.1
  done
  r[$backend,join]=$t_ready
  echo
  echo "$backend:"
  printf '  agent join -> Node Ready %ss  ("kelp node is running" logged at %ss)\n' "$(secs "$t_ready")" "$(secs "$t_log")"

  wait_for "creating the pods" kubectl apply -f "$work/pods.yaml"
  wait_for "3 pods Ready" pods_ready
  local sink_ip client_agent_ip
  sink_ip=$(kubectl get pod sink -o 'jsonpath={.status.podIP}')
  client_agent_ip=$(kubectl get pod client-agent -o 'jsonpath={.status.podIP}')
  # The overlay's routes may come a moment after the pods: the server's
  # client must reach a pod on the agent before anything is timed.
  wait_for "a pod on the agent reachable from the server's" \
    kubectl exec client-server -- /testapp get "http://$client_agent_ip:8080/" 2s

  echo "  throughput to the sink on $agent_name ($sink_ip), one TCP connection, ${BLAST}s each:"
  : >"$dir/cross.rates"; : >"$dir/same.rates"
  for round in 1 2 3; do
    for target in "cross client-server" "same client-agent"; do
      read -r kind pod <<<"$target"
      rate=$(kubectl exec "$pod" -- /testapp blast "$sink_ip:9000" "$BLAST" | awk '{ print $1 }') ||
        die "the transfer from $pod to $sink_ip:9000 failed"
      echo "$rate" >>"$dir/$kind.rates"
      printf '    round %d  %-10s from %-13s %8.1f MB/s\n' "$round" \
        "$([[ $kind == cross ]] && echo cross-node || echo same-node)" "$pod" "$rate"
    done
  done
  r[$backend,cross]=$(median <"$dir/cross.rates")
  r[$backend,same]=$(median <"$dir/same.rates")
  r[$backend,ratio]=$(awk -v c="${r[$backend,cross]}" -v s="${r[$backend,same]}" 'BEGIN { printf "%.3f", c / s }')
  printf '    median: cross-node %.1f MB/s, same node %.1f MB/s; cross-node / same node = %s\n' \
    "${r[$backend,cross]}" "${r[$backend,same]}" "${r[$backend,ratio]}"

  measure_node agent "$IDLE" "$dir/idle"
  echo "  agent idle, ${IDLE}s after the transfers, 3 pods running: its node's processes (alive at both ends):"
  print_measure "$dir/idle"
  # The agent proper: kelp agent and its containerd, the bundle's (or, for
  # a kelp before it, `kelp containerd`); shims apart.
  grep -q '^kelp-agent 1 ' "$dir/idle" || die "no kelp agent among the agent's processes: see $dir/idle.after"
  grep -Eq '^(kelp-)?containerd ' "$dir/idle" || die "no containerd among the agent's processes: see $dir/idle.after"
  local agent_re='^(kelp-agent|kelp-containerd|containerd)$'
  local rss pss cpu ws
  read -r rss pss cpu ws < <(awk -v re="$agent_re" '$1 ~ re { rss += $3; pss += $4; cpu += $5; ws += $7 }
    END { printf "%.0f %.0f %.1f %.0f\n", rss, pss, cpu, ws }' "$dir/idle")
  r[$backend,rss]=$rss r[$backend,pss]=$pss r[$backend,cpu]=$cpu r[$backend,ws]=$ws
  # measure_node sums no anon: its samples (sample_node) hold it, column 8.
  r[$backend,anon]=$(awk -v re="$agent_re" 'NR == FNR { seen[$2] = 1; next }
    ($2 in seen) && $1 ~ re { anon += $8 } END { printf "%.0f", anon / 1024 }' "$dir/idle.before" "$dir/idle.after")
  printf '    kelp agent + containerd: RSS %s MiB (anon %s), PSS %s MiB, working set %s MiB, CPU %s%% of a core\n' \
    "${r[$backend,rss]}" "${r[$backend,anon]}" "${r[$backend,pss]}" "${r[$backend,ws]}" "${r[$backend,cpu]}"

  teardown
}

# --- the runs -------------------------------------------------------------------

build_test_image "$repo" "$work"

bench_header "a server and an agent on this machine"
for backend in "${backends[@]}"; do
  run_backend "$backend"
done

echo
echo "summary (one server, one agent; throughput medians; agent = its kelp + containerd):"
printf '  %-32s' ""; printf ' %10s' "${backends[@]}"; echo
row() { # LABEL KEY
  printf '  %-32s' "$1"
  for b in "${backends[@]}"; do printf " %10s" "${r[$b,$2]}"; done
  echo
}
for b in "${backends[@]}"; do r[$b,join_s]=$(secs "${r[$b,join]}"); done
row "agent join -> Node Ready (s)" join_s
row "cross-node (MB/s)" cross
row "same node (MB/s)" same
row "cross-node / same node" ratio
row "agent idle RSS (MiB)" rss
row "  of which anon (MiB)" anon
row "agent idle PSS (MiB)" pss
row "agent idle working set (MiB)" ws
row "agent idle CPU (% of a core)" cpu
echo
echo "RSS counts the pages of the binaries (file, not anon) once per process; PSS shares them"
echo "  out among every process mapping them, the server's here too. Working set: the memory"
echo "  touched in the idle window (smaps Referenced, see measure_node in lib/bench.sh)."
echo "goal (multi-node issue), for context: agent idle RSS (kelp + containerd) <= 150 MB;"
echo "  a k3s agent measures 275 MB."
