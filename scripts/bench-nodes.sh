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
# The nodes are wired as in the cluster tests (internal/testcluster/lab.go): a
# lab network namespace with a bridge lab0, and per node network, mount and
# cgroup namespaces, eth0 10.99.0.x/24 on the bridge, private /run/kelp,
# /run/netns, /var/lib/kubelet and pod logs, and a cgroup subtree of its own
# that the node sees as its cgroup root, so the two kubelets do not fight
# over the host's kubepods. The server is 10.99.0.2 and the agent, agent-1,
# 10.99.0.3. Both have the test image in their airgap images directory.
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
#   agent idle     after the throughput rounds and IDLE s of quiet, with the 3
#                  pods running: RSS (and its anon part) and PSS of the agent's
#                  kelp process and its containerd child (not the shims, listed
#                  apart), and their CPU % of one core over the IDLE s. Both are
#                  the kelp binary: RSS counts its resident file pages in each,
#                  PSS divides them among all that map them, here the server's
#                  kelp and containerd too.
set -euo pipefail

BACKENDS=${BACKENDS:-vxlan host-gw}
BLAST=${BLAST:-5}
IDLE=${IDLE:-60}
KELP=$(readlink -f "${KELP:-$(dirname "$0")/../bin/kelp}")
LOGDIR=${LOGDIR:+$(readlink -f "$LOGDIR")}
repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/bench.sh
source "$repo/scripts/lib/bench.sh"

readonly image=docker.io/kelp-test/testapp:1.0
readonly server_ip=10.99.0.2 agent_ip=10.99.0.3 agent_name=agent-1

die() { echo "bench-nodes: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "run as root"
for v in BLAST IDLE; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (seconds)"
done
read -ra backends <<<"$BACKENDS"
(( ${#backends[@]} > 0 )) || die "BACKENDS is empty"
for b in "${backends[@]}"; do
  [[ $b == vxlan || $b == host-gw ]] || die "BACKENDS: unknown overlay backend '$b' (vxlan or host-gw)"
done
[[ -x $KELP ]] || die "$KELP is missing: build it with scripts/build.sh"
for tool in unshare nsenter ip awk find mountpoint; do
  command -v "$tool" >/dev/null || die "$tool is missing"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/kelp-bench-nodes.XXXXXX")

# --- state of the cluster being measured, for teardown ------------------------

# holder, kelp_pid and cg_procs are lib/bench.sh's, by node.
dir=                 # $work/<backend>
lab=                 # pid of the lab's holder
declare -A cg_dirs   # node -> host paths of its cgroup subtrees, one per hierarchy
cg_root_procs='' cg_mounts='' # of the node being made, see make_cgroups
started=''           # pid of the last holder start_holder started

in_lab() { nsenter --target "$lab" --net -- "$@"; }
kubectl() { in_node server "$KELP" kubectl --kubeconfig "$dir/server/kelp.yaml" --request-timeout=5s "$@"; }

teardown_node() { # NODE: removes everything of the node
  local node=$1
  [[ -n ${kelp_pid[$node]:-} ]] && stop_kelp "$node"
  if [[ -n ${holder[$node]:-} ]]; then
    # Shims and containers outlive kelp on purpose; killall removes them,
    # their mounts, interfaces and cgroups.
    in_node "$node" "$KELP" killall --data-dir "$dir/$node/data" >"$dir/$node/killall.log" 2>&1 ||
      { echo "bench-nodes: kelp killall on the $node failed:" >&2; tail -n 5 "$dir/$node/killall.log" >&2; }
    kill "${holder[$node]}" 2>/dev/null; wait "${holder[$node]}" 2>/dev/null || true
  fi
  [[ -n ${cg_dirs[$node]:-} ]] && remove_cgroups "$node"
  unset "holder[$node]" "cg_dirs[$node]" "cg_procs[$node]"
}

teardown() { # removes the cluster of $dir
  local node f b
  # Both kelps stop before either node's killall: it removes the host's
  # /run/kelp, and with it the other node's private mount there.
  for node in agent server; do
    [[ -n ${kelp_pid[$node]:-} ]] && stop_kelp "$node"
  done
  teardown_node agent
  teardown_node server
  if [[ -n $lab ]]; then
    kill "$lab" 2>/dev/null; wait "$lab" 2>/dev/null || true
    lab=
  fi
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

# --- a node's own cgroups, as internal/testcluster/cgroup.go makes them ----------

# cgroup_hierarchies prints "MOUNTPOINT OPTIONS" for each mounted cgroup
# hierarchy, once: OPTIONS is v2 for cgroup2, and for v1 the -o that mounts
# the hierarchy again, its controllers or name sorted (flags such as
# release_agent are the host's).
cgroup_hierarchies() {
  awk 'NR == FNR { if ($1 !~ /^#/) known[$1] = 1; next }
    {
      # 32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
      for (sep = 7; sep <= NF && $sep != "-"; sep++) ;
      type = $(sep + 1)
      if ((type != "cgroup" && type != "cgroup2") || seen[$3]++) next
      if (type == "cgroup2") { print $5, "v2"; next }
      n = split($(sep + 3), o, ","); opts = ""
      for (i = 1; i <= n; i++) if ((o[i] in known) || o[i] ~ /^name=/) opts = opts (opts == "" ? "" : ",") o[i]
      print $5, opts
    }' /proc/cgroups /proc/self/mountinfo |
  while read -r mountpoint opts; do
    echo "$mountpoint $(sorted "$opts")"
  done
}
sorted() { tr , '\n' <<<"$1" | sort | paste -sd, -; }

# make_cgroups NODE: a kelp-bench-NODE-<random> cgroup in every hierarchy,
# below the cgroup this script runs in on v1 (so the machine's limits on it
# cover the node), below the root on v2 (a cgroup holding processes cannot
# pass controllers on), where the node's processes live in the leaf init.
# Sets cg_dirs, cg_procs, cg_root_procs (the cgroup.procs the holder joins
# before it makes the node's cgroup namespace, whose root they become) and
# cg_mounts: the commands that, in the node's new mount and cgroup
# namespaces, replace the host's cgroup mounts by the node's view.
make_cgroups() {
  local node=$1 base='' mountpoint opts parent d f ctrls path
  local -A own
  while IFS=: read -r _ ctrls path; do
    [[ -n $ctrls ]] && own[$(sorted "$ctrls")]=$path
  done </proc/self/cgroup
  cg_dirs[$node]='' cg_procs[$node]='' cg_root_procs='' cg_mounts=''
  while read -r mountpoint opts; do
    parent=$mountpoint
    if [[ $opts != v2 ]]; then
      [[ -n ${own[$opts]:-} ]] || die "cgroup hierarchy $mountpoint ($opts) is not in /proc/self/cgroup"
      parent=$mountpoint${own[$opts]%/}
    fi
    if [[ -z $base ]]; then
      d=$(mktemp -d "$parent/kelp-bench-$node-XXXXXX") || die "make the $node's cgroup"
      base=$(basename "$d")
    else
      d=$parent/$base
      mkdir "$d" || die "make the $node's cgroup $d"
    fi
    cg_dirs[$node]+="$d "
    cg_root_procs+="$d/cgroup.procs "
    # Unmounted, not mounted over: kubelet and runc would find both mounts.
    if [[ $opts == v2 ]]; then
      # Only leaves may hold processes once the node's kubelet enables
      # controllers at its root, as kind does it with its /init.
      mkdir "$d/init"
      cg_procs[$node]+="$d/init/cgroup.procs "
      cg_mounts+="; umount $mountpoint; mount -t cgroup2 cgroup2 $mountpoint; echo \$\$ >$mountpoint/init/cgroup.procs"
    else
      # A new v1 cpuset takes no process until it has CPUs and memory nodes.
      for f in cpuset.cpus cpuset.mems; do
        [[ -f $parent/$f ]] && cat "$parent/$f" >"$d/$f"
      done
      cg_procs[$node]+="$d/cgroup.procs "
      cg_mounts+="; umount $mountpoint; mount -t cgroup -o $opts cgroup $mountpoint"
    fi
  done < <(cgroup_hierarchies)
  [[ -n $base ]] || die "no cgroup hierarchy is mounted"
}

cgroup_pids() { # NODE
  local d
  # shellcheck disable=SC2086 # a list of paths without spaces
  for d in ${cg_dirs[$1]}; do find "$d" -name cgroup.procs -exec cat {} +; done | sort -un
}

# remove_cgroups NODE: kills what is left in the node's cgroups and removes
# them, children first; gives up after 30 s.
remove_cgroups() {
  local node=$1 deadline=$(( $(now_ms) + 30000 )) pids d sub
  while pids=$(cgroup_pids "$node"); [[ -n $pids ]]; do
    if (( $(now_ms) > deadline )); then
      echo "bench-nodes: processes $pids still in the $node's cgroups after SIGKILL" >&2
      break
    fi
    # A frozen process does not die of SIGKILL; runc freezes a container's
    # cgroup while it signals it, so a runc killed meanwhile leaves it frozen.
    # shellcheck disable=SC2086
    for d in ${cg_dirs[$node]}; do
      find "$d" -name freezer.state -exec sh -c 'for f; do echo THAWED >"$f"; done' sh {} + 2>/dev/null
      find "$d" -name cgroup.freeze -exec sh -c 'for f; do echo 0 >"$f"; done' sh {} + 2>/dev/null
    done
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null
    sleep 0.02
  done
  # shellcheck disable=SC2086
  for d in ${cg_dirs[$node]}; do
    [[ -d $d ]] || continue
    while read -r sub; do
      # A killed process leaves its cgroup a moment after it died.
      until rmdir "$sub" 2>/dev/null || [[ ! -d $sub ]]; do
        if (( $(now_ms) > deadline )); then
          echo "bench-nodes: cannot remove cgroup $sub" >&2
          break
        fi
        sleep 0.02
      done
    done < <(find "$d" -depth -type d)
  done
}

# --- the lab and its nodes --------------------------------------------------------

# start_holder NAME CMD...: runs CMD, a shell that sets up namespaces, says
# "ready" and sleeps, in the background; sets started to its pid.
start_holder() {
  local name=$1 out=$dir/$1.holder deadline=$(( $(now_ms) + 30000 )); shift
  "$@" >"$out" 2>&1 &
  started=$!
  until grep -qx ready "$out"; do
    alive "$started" || die "set up the namespaces of the $name: $(cat "$out")"
    (( $(now_ms) < deadline )) || die "the namespaces of the $name were not set up within 30 s"
    sleep 0.05
  done
}

make_lab() {
  # shellcheck disable=SC2016 # expanded by sh
  start_holder lab unshare --net sh -ec '
    ip link set lo up
    ip link add lab0 type bridge
    ip link set lab0 up
    # The lab is wire, not a firewall: kelp turns on bridge-nf-call-iptables
    # in its nodes (the setting is per network namespace), and this bridge
    # must pass what the nodes send each other without consulting netfilter.
    for f in iptables ip6tables arptables; do echo 0 >/proc/sys/net/bridge/bridge-nf-call-$f; done
    echo ready
    exec sleep infinity'
  lab=$started
}

make_node() { # NODE IP VETH: a node of the lab, eth0 with IP on lab0 through VETH
  local node=$1 ip=$2 veth=$3 setup d
  setup="ip link set lo up"
  for d in "${private_dirs[@]}"; do
    mkdir -p "$d" # an empty mount point on the host changes nothing there
    setup+="; mount -t tmpfs -o mode=0755 kelp-bench $d"
  done
  # Where systemd runs the host, kelp would ask it for cgroups outside the
  # node's subtree: hiding it makes kelp manage cgroups itself.
  [[ -d /run/systemd/system ]] && setup+="; mount -t tmpfs -o mode=0755 kelp-bench /run/systemd"
  make_cgroups "$node"
  setup+=$cg_mounts
  start_holder "$node" sh -c "$join_cgroups" kelp-bench-node "$cg_root_procs" \
    unshare --net --mount --cgroup --propagation private sh -ec "$setup; echo ready; exec sleep infinity"
  holder[$node]=$started
  # The veth pair is made in the lab and its far end moved to the node:
  # neither end is ever in the machine's own namespace.
  in_lab ip link add "$veth" type veth peer name eth0 netns "${holder[$node]}"
  in_lab ip link set "$veth" master lab0 up
  in_node "$node" ip addr add "$ip/24" dev eth0
  in_node "$node" ip link set eth0 up
  # Nothing answers at the gateway, as on a machine whose gateway drops what
  # it cannot deliver.
  in_node "$node" ip route add default via 10.99.0.1 dev eth0
}

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

# agent_processes prints "kind pid" for every process of the agent's node
# (containers have mount namespaces of their own): the agent's kelp, its
# containerd (a child of the agent: the bundle's, or the kelp binary of a kelp
# before it) and the rest (shims).
agent_processes() {
  local ns pid exe agent=${kelp_pid[agent]}
  ns=$(readlink "/proc/${holder[agent]}/ns/mnt")
  for pid in /proc/[0-9]*; do
    pid=${pid#/proc/}
    [[ $pid != "${holder[agent]}" && $(readlink "/proc/$pid/ns/mnt" 2>/dev/null) == "$ns" ]] || continue
    if [[ $pid == "$agent" ]]; then
      echo "kelp $pid"
    elif exe=$(readlink "/proc/$pid/exe" 2>/dev/null) && [[ ($exe == "$KELP" || ${exe##*/} == containerd) && $(awk '{ print $4 }' "/proc/$pid/stat") == "$agent" ]]; then
      echo "containerd $pid"
    else
      echo "other $pid"
    fi
  done
}
sample() { # prints: kind pid cputicks rss_kb anon_kb file_kb pss_kb command
  local kind pid stat
  agent_processes | while read -r kind pid; do
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    stat=${stat##*) }
    echo "$kind $pid $(awk '{ print $12 + $13 }' <<<"$stat")" \
      "$(awk '$1 ~ /^(VmRSS|RssAnon|RssFile):$/ { printf "%s ", $2 }' "/proc/$pid/status")" \
      "$(awk '$1 == "Pss:" { print $2 }' "/proc/$pid/smaps_rollup")" \
      "$(tr '\0' ' ' <"/proc/$pid/cmdline" | cut -c1-48)"
  done
}

declare -A r # results, keyed "backend,figure"

run_backend() { # BACKEND: a new cluster with it, measured, then removed
  local backend=$1 t0 t_log='' t_ready='' round target kind pod rate node d
  dir=$work/$backend
  mkdir -p "$dir/server" "$dir/agent"
  make_lab
  make_node server "$server_ip" veth1
  make_node agent "$agent_ip" veth2
  stage_images server

  launch server "$dir/server/kelp.log" server --data-dir "$dir/server/data" \
    --write-kubeconfig "$dir/server/kelp.yaml" --node-name server --overlay "$backend"
  wait_for "the server's node running" grep -q "kelp node is running" "$dir/server/kelp.log"
  wait_for "the server's node Ready" node_ready server

  # The agent's bundle staged as by a first run, without one: that run
  # would end with `kelp killall`, which removes the host's /run/kelp from
  # under the node's private mount, and so takes the server's /run/kelp away
  # too (an rmdir detaches the mounts on the directory in every namespace).
  # Both nodes run the same binary: the server's staged bundle is the agent's.
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

  sample >"$dir/before"
  t0=$(now_ms)
  sleep "$IDLE"
  sample >"$dir/after"
  local elapsed=$(( $(now_ms) - t0 ))
  grep -q '^kelp ' "$dir/after" || die "the agent's kelp process is not ${kelp_pid[agent]}"
  grep -q '^containerd ' "$dir/after" || die "no containerd child of the agent's kelp (${kelp_pid[agent]})"
  echo "  agent idle, ${IDLE}s after the transfers, 3 pods running (pids alive at both ends):"
  awk '
    NR == FNR { seen[$2] = 1; next }
    ($2 in seen) {
      cmd = $8; for (i = 9; i <= NF; i++) cmd = cmd " " $i
      printf "    %-10s pid %-7s RSS %4.0f MiB (anon %4.0f, file %4.0f)  PSS %4.0f MiB  %s\n",
        $1, $2, $4 / 1024, $5 / 1024, $6 / 1024, $7 / 1024, cmd
    }' "$dir/before" "$dir/after"
  read -r r["$backend,rss"] r["$backend,anon"] r["$backend,pss"] r["$backend,cpu"] < <(
    awk -v hz="$(getconf CLK_TCK)" -v ms="$elapsed" '
      NR == FNR { cpu[$2] = $3; next }
      ($2 in cpu) && $1 != "other" { dcpu += $3 - cpu[$2]; rss += $4; anon += $5; pss += $7 }
      END { printf "%.0f %.0f %.0f %.1f\n", rss / 1024, anon / 1024, pss / 1024, 100 * dcpu / hz / (ms / 1000) }' \
      "$dir/before" "$dir/after")
  printf '    kelp agent + containerd: RSS %s MiB (anon %s), PSS %s MiB, CPU %s%% of a core\n' \
    "${r[$backend,rss]}" "${r[$backend,anon]}" "${r[$backend,pss]}" "${r[$backend,cpu]}"
  awk 'NR == FNR { seen[$2] = 1; next }
    ($2 in seen) && $1 == "other" { n++; rss += $4; pss += $7 }
    END { printf "    others (shims), not counted: %d processes, RSS %.0f MiB, PSS %.0f MiB\n", n, rss / 1024, pss / 1024 }' \
    "$dir/before" "$dir/after"

  # `kelp killall` anywhere on this machine (a test's cleanup, say) removes
  # the host's /run/kelp, and with it the nodes' private mounts there.
  for node in server agent; do
    for d in "${private_dirs[@]}"; do
      in_node "$node" mountpoint -q "$d" ||
        echo "  note: the $node's private $d went away during the run: its kelp used the host's"
    done
  done

  teardown
}

# --- the runs -------------------------------------------------------------------

build_test_image "$repo" "$work"

echo "kelp bench-nodes: $("$KELP" --version | head -1), $(nproc) CPUs; a server and an agent on this machine"
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
row "agent idle CPU (% of a core)" cpu
echo
echo "RSS counts the pages of the kelp binary (file, not anon) once per process; PSS shares"
echo "  them out among every process mapping them, the server's kelp and containerd here too."
echo "goal (multi-node issue), for context: agent idle RSS (kelp + containerd) <= 150 MB;"
echo "  a k3s agent measures 275 MB."
