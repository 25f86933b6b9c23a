# shellcheck shell=bash
# Helpers the bench scripts share; sourced by them, not run. A script
# calls bench_init first, which gives it repo, KELP (the binary, which also
# makes the nodes: see "nodes" below), LOGDIR and die.

# bench_init NAME [--no-kelp] [TOOL...]: the preamble of every bench. It
# sets repo (the tree the script is in), KELP (the KELP variable or
# bin/kelp, resolved: a bench may change directory) and LOGDIR (resolved,
# if set), makes die say "NAME: MESSAGE" and exit 1, and checks that it
# runs as root, that KELP is built and that every TOOL is installed; with
# --no-kelp (a bench of Go code alone) only the tools.
bench_init() {
  bench_name=$1
  shift
  repo=$(cd "$(dirname "${BASH_SOURCE[1]}")/.." && pwd)
  KELP=$(readlink -m "${KELP:-$repo/bin/kelp}")
  LOGDIR=${LOGDIR:+$(readlink -m "$LOGDIR")}
  if [[ ${1:-} == --no-kelp ]]; then
    shift
  else
    [[ $(id -u) == 0 ]] || die "run as root: kelp needs it"
    [[ -x $KELP ]] || die "$KELP is missing: build it with scripts/build.sh"
  fi
  local tool
  for tool; do
    command -v "$tool" >/dev/null || die "$tool is missing"
  done
}

die() { echo "${bench_name:-bench}: $*" >&2; exit 1; }

# bench_header [SETTINGS]: the first line of every bench's figures: what
# was measured (the bench, the kelp, the machine and its load) and the
# settings that shape the figures.
bench_header() {
  local built="the code of $repo"
  [[ ! -x $KELP ]] || built=$("$KELP" --version | head -1)
  echo "kelp $bench_name: $built, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)${1:+; $1}"
}

# Where a node keeps state outside its data dir. Each node gets an empty
# tmpfs over each of them in its mount namespace, as in the cluster tests
# (internal/testcluster): two kelps on one machine must not share them, pod
# logs neither, whose housekeeping removes the files of pods it does not know.
readonly private_dirs=(/run/kelp /run/netns /var/lib/kubelet /var/log/pods /var/log/containers)

# The nodes of a bench, by name ("server", "agent"): holder is the pid that
# holds the node's namespaces, kelp_pid that of its kelp, cg_dirs the host
# paths of its cgroup subtrees, one per hierarchy; node_enter the shell
# words that enter it and node_state its state file (hold_node).
declare -A holder=() kelp_pid=() cg_dirs=() node_enter=() node_state=()
# Processes other than kelp that a bench runs in a node, by name: wait_for
# watches them as it watches kelp.
declare -A procs=()

now_ms() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }
secs() { awk -v ms="$1" 'BEGIN { if (ms == "") print "-"; else printf "%.2f", ms / 1000 }'; }
# median: of the numbers on stdin, one a line.
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# alive PID: the process runs and is not a zombie.
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ -n $stat && ${stat%% *} != [ZX] ]]
}

# build_test_image REPO DIR: the test image, testapp packed by the bundle's
# image tool, as DIR/testapp.tar (docker.io/kelp-test/testapp:1.0).
build_test_image() {
  CGO_ENABLED=0 go build -C "$1" -trimpath -o "$2/testapp" ./internal/testcluster/testapp
  (cd "$1/scripts/bundle" && go run ./mkimage -binary "$2/testapp" -path /testapp \
    -name docker.io/kelp-test/testapp:1.0 -arch "$(go env GOARCH)" -out "$2/testapp.tar")
}

# enter_node NODE: sets enter to the command that runs what follows it in
# the node, as `kelp cluster machine make` gave it (hold_node): a shell that
# joins the node's cgroups and execs nsenter into its namespaces, which
# execs the command, so the pid is the command's. Its words come from kelp,
# quoted for this eval.
enter_node() {
  [[ -n ${node_enter[$1]:-} ]] || die "there is no node $1: start_node or start_lab_node it first"
  eval "enter=(${node_enter[$1]})"
}

# in_node NODE CMD...: runs CMD in the node.
in_node() {
  local enter
  enter_node "$1"
  shift
  "${enter[@]}" "$@"
}

# launch NODE LOG ARGS...: starts `$KELP ARGS` in the node in the background,
# its output to LOG, and sets kelp_pid[NODE]. The pid is kelp's own
# (enter_node) (a function run with & would be a subshell, which a
# signal to it never reaches).
launch() {
  local node=$1 log=$2 enter
  shift 2
  enter_node "$node"
  "${enter[@]}" "$KELP" "$@" >"$log" 2>&1 &
  kelp_pid[$node]=$!
}

# launch_proc NAME NODE LOG CMD...: starts CMD in the node in the
# background, its output to LOG, and sets procs[NAME] (see launch).
launch_proc() {
  local name=$1 node=$2 log=$3 enter
  shift 3
  enter_node "$node"
  "${enter[@]}" "$@" >"$log" 2>&1 &
  procs[$name]=$!
}

# stop_pid PID: SIGTERM, SIGKILL if it is still there after 30 s; reaps it.
# Sets stop_rc to its exit status (137: it was killed).
# shellcheck disable=SC2034 # stop_rc is for the caller
stop_pid() {
  local deadline
  deadline=$(( $(now_ms) + 30000 ))
  kill -TERM "$1" 2>/dev/null || true
  while alive "$1" && (( $(now_ms) < deadline )); do sleep 0.05; done
  if alive "$1"; then kill -KILL "$1" 2>/dev/null || true; fi
  stop_rc=0
  wait "$1" 2>/dev/null || stop_rc=$?
}

# stop_kelp NODE: stop_pid of the node's kelp, then forgets it.
stop_kelp() {
  stop_pid "${kelp_pid[$1]}"
  unset "kelp_pid[$1]"
}

# stop_proc NAME: stop_pid of procs[NAME], then forgets it.
stop_proc() {
  stop_pid "${procs[$1]}"
  unset "procs[$1]"
}

# wait_for WHAT CMD...: polls CMD every 100 ms for up to 5 minutes; gives up
# when a kelp of kelp_pid or a process of procs exits meanwhile.
wait_for() {
  local what=$1 node name deadline
  shift
  deadline=$(( $(now_ms) + 300000 ))
  until "$@" >/dev/null 2>&1; do
    (( $(now_ms) < deadline )) || die "$what did not happen within 5 minutes"
    for node in "${!kelp_pid[@]}"; do
      alive "${kelp_pid[$node]}" || die "kelp on the $node exited while waiting for $what"
    done
    for name in "${!procs[@]}"; do
      alive "${procs[$name]}" || die "$name exited while waiting for $what"
    done
    sleep 0.1
  done
}


# --- nodes, and a lab of them -------------------------------------------------
#
# A node is a machine as kelp makes them (internal/machine), through its
# hidden commands `kelp cluster machine` and `kelp cluster network`: the
# benches run in the machines of the cluster tests (internal/testcluster)
# and of `kelp cluster`, not in a copy. A node has network, mount, cgroup and
# UTS namespaces held by a sleeping process, its holder, private_dirs of its
# own, its name as its hostname, and a kelp-bench-NODE-<random> cgroup in
# every hierarchy (below this script's cgroup on v1, so the machine's
# limits on it cover the node), which it sees as its cgroup root. kelp and
# upstream derive identities from the hostname (node name, etcd member,
# leader election, the apiserver's identity), and a server refuses to join
# a cluster where a server of its hostname runs; two kubelets in one
# machine's cgroups fight over kubepods, each removing the pod cgroups it
# does not know. start_node makes a node alone, start_lab_node one wired to
# the lab of start_lab, and end_node ends either.

# lab_state: the state file of the lab's network (start_lab); lab_links:
# how many nodes were wired to it, for their link names.
lab_state='' lab_links=0

# hold_node NODE WORK [SETUP...]: makes the node (kelp cluster machine make),
# its state file WORK/NODE.machine; SETUP are shell commands run in its new
# network namespace once loopback is up. Sets holder[NODE], cg_dirs[NODE],
# node_enter[NODE] and node_state[NODE].
hold_node() {
  local node=$1 work=$2 out key value d args=()
  shift 2
  [[ -z ${node_state[$node]:-} ]] || die "node $node exists already: end_node it first"
  for d in "${private_dirs[@]}"; do args+=(--private "$d"); done
  for d in "$@"; do args+=(--network "$d"); done
  out=$("$KELP" cluster machine make --name "$node" --state "$work/$node.machine" \
    --cgroup-prefix "kelp-bench-$node-" "${args[@]}") || die "could not make the $node (see above)"
  node_state[$node]=$work/$node.machine
  while IFS='=' read -r key value; do
    case $key in
      holder) holder[$node]=$value ;;
      cgroups) cg_dirs[$node]=$value ;;
      enter) node_enter[$node]=$value ;;
    esac
  done <<<"$out"
  [[ -n ${holder[$node]:-} && -n ${node_enter[$node]:-} ]] || die "kelp cluster machine make printed no holder= and enter= for the $node: $out"
}

# start_node NODE WORK: a node alone, as in the cluster tests: a bridge
# kelp-lab with 10.99.0.2/24 and no route out. WORK holds its state file.
start_node() {
  hold_node "$1" "$2" "ip link add kelp-lab type bridge" "ip addr add 10.99.0.2/24 dev kelp-lab" "ip link set kelp-lab up"
}

# start_lab WORK: the network of a lab as the cluster tests make it
# (internal/testcluster/lab.go): a bridge lab0 in a network namespace of its
# own, with no address: the nodes' gateway 10.99.0.1 answers nothing, as on
# a machine whose gateway drops what it cannot deliver. Its state file is
# WORK/lab.network. Sets lab_state.
start_lab() {
  [[ -z $lab_state ]] || die "a lab runs already: end_lab it first"
  "$KELP" cluster network make --bridge lab0 --state "$1/lab.network" >/dev/null || die "could not make the lab (see above)"
  lab_state=$1/lab.network
}

# start_lab_node NODE IP WORK: a node of the lab (hold_node, its state file
# in WORK), with eth0 IP/24 on lab0 and a default route via 10.99.0.1.
start_lab_node() {
  local node=$1 ip=$2
  [[ -n $lab_state ]] || die "no lab for the $node: start_lab first"
  hold_node "$node" "$3"
  "$KELP" cluster network wire --network "$lab_state" --machine "${node_state[$node]}" \
    --link "veth$(( ++lab_links ))" --address "$ip/24" --gateway 10.99.0.1 || die "could not wire the $node to the lab (see above)"
}

# end_node NODE: kills what still runs in the node, its containers too
# (stop its kelp with stop_kelp first, and run kelp killall in it for a
# clean end of its containers), and removes its cgroups; its namespaces and
# their mounts and interfaces go with the last process in them. Forgets the
# node; a node it does not know is no error.
end_node() {
  if [[ -n ${node_state[$1]:-} ]] && ! "$KELP" cluster machine remove --state "${node_state[$1]}"; then
    echo "${0##*/}: the $1 is not all gone (see above)" >&2
  fi
  unset "holder[$1]" "cg_dirs[$1]" "node_enter[$1]" "node_state[$1]"
}

# start_server_bench NAME: the setup of a bench of one server with its node
# (bench-node, bench-services, bench-gateway): work, a temporary directory
# removed at exit; the node "server" (start_node); kubectl, for the kubeconfig
# the server writes to $work/kelp.yaml; and an EXIT trap that kills the
# bench's poller (a background pid it keeps in poller, if any), stops kelp
# and its containers, ends the node and copies the logs to LOGDIR if set.
start_server_bench() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/kelp-$1.XXXXXX")
  poller=
  trap end_server_bench EXIT
  # shellcheck disable=SC2317 # the bench calls it
  kubectl() { in_node server "$KELP" kubectl --kubeconfig "$work/kelp.yaml" --request-timeout=5s "$@"; }
  start_node server "$work"
}

end_server_bench() {
  local rc=$?
  trap - EXIT
  set +e
  [[ -n $poller ]] && kill "$poller" 2>/dev/null
  if [[ -n ${holder[server]:-} ]]; then
    in_node server "$KELP" killall --data-dir "$work/data" >/dev/null 2>&1
    [[ -n ${kelp_pid[server]:-} ]] && stop_kelp server # reaps it
  fi
  end_node server
  [[ -n $LOGDIR ]] && mkdir -p "$LOGDIR" && cp "$work"/*.log "$work"/data/agent/containerd/containerd.log "$LOGDIR"/ 2>/dev/null
  rm -rf "$work"
  exit "$rc"
}

# web_app REPLICAS: the app the one-server benches measure, a Deployment web
# of REPLICAS pods of the test image serving on 8080 behind a Service web on
# port 80, as YAML.
web_app() {
  cat <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: $1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: web, image: docker.io/kelp-test/testapp:1.0, imagePullPolicy: IfNotPresent, args: [serve]}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
YAML
}

# end_lab: removes the lab's network (end its nodes first).
end_lab() {
  [[ -n $lab_state ]] || return 0
  if ! "$KELP" cluster network remove --state "$lab_state"; then
    echo "${0##*/}: the lab is not all gone (see above)" >&2
  fi
  lab_state='' lab_links=0
}

# node_pids NODE: the processes in the node's mount namespace but its holder.
node_pids() {
  local ns p
  ns=$(readlink "/proc/${holder[$1]}/ns/mnt") || return 0
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ $p != "${holder[$1]}" && $(readlink "/proc/$p/ns/mnt" 2>/dev/null) == "$ns" ]] && echo "$p"
  done
  return 0
}

# sample_node NODE: one line per process of the node (node_pids): its name
# (the program's; kelp-SUBCOMMAND for the kelp binary), pid, CPU ticks
# (user + system), bytes written to storage (/proc/PID/io write_bytes), RSS,
# and from smaps PSS, Referenced (pages touched since clear_refs) and
# Anonymous (the anonymous part of RSS), in KiB.
sample_node() {
  local pid name stat argv
  for pid in $(node_pids "$1"); do
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    stat=${stat##*) }
    mapfile -d "" -t argv <"/proc/$pid/cmdline" 2>/dev/null || continue
    # A process that is exiting has no command line any more.
    (( ${#argv[@]} > 0 )) || continue
    name=${argv[0]##*/}
    if [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$KELP" ]]; then name=kelp-${argv[1]:-}; fi
    echo "$name $pid $(awk '{print $12 + $13}' <<<"$stat") \
$(awk '$1 == "write_bytes:" {print $2}' "/proc/$pid/io" 2>/dev/null) \
$(awk '$1 == "VmRSS:" {print $2}' "/proc/$pid/status" 2>/dev/null) \
$(awk '$1 == "Pss:" || $1 == "Referenced:" || $1 == "Anonymous:" {printf "%s ", $2}' "/proc/$pid/smaps_rollup" 2>/dev/null)"
  done
}

# measure_node NODE SECONDS OUT: samples the node (sample_node) at both ends
# of SECONDS and writes to OUT, for the processes alive at both ends, a line
# per program and a TOTAL line:
#   NAME PROCESSES RSS-MiB PSS-MiB CPU-%-OF-A-CORE WRITES-KiB/s WORKING-SET-MiB
# The working set is the memory the processes touched in the window (smaps
# Referenced, their referenced bits cleared at its start through
# /proc/PID/clear_refs): RSS also holds pages touched once, e.g. at start,
# which the kernel takes back first when memory runs short. The samples
# (sample_node) stay in OUT.before and OUT.after.
measure_node() {
  local t0 elapsed pid
  sample_node "$1" >"$3.before"
  while read -r _ pid _; do echo 1 2>/dev/null >"/proc/$pid/clear_refs" || true; done <"$3.before"
  t0=$(now_ms)
  sleep "$2"
  sample_node "$1" >"$3.after"
  elapsed=$(( $(now_ms) - t0 ))
  awk -v hz="$(getconf CLK_TCK)" -v s="$elapsed" '
    NF < 7 { next }
    NR == FNR { cpu[$2] = $3; wb[$2] = $4; next }
    ($2 in cpu) {
      k = $1; n[k]++; dcpu[k] += $3 - cpu[$2]; dwb[k] += $4 - wb[$2]; rss[k] += $5; pss[k] += $6; ws[k] += $7
      n["TOTAL"]++; dcpu["TOTAL"] += $3 - cpu[$2]; dwb["TOTAL"] += $4 - wb[$2]; rss["TOTAL"] += $5; pss["TOTAL"] += $6; ws["TOTAL"] += $7
    }
    function line(k) {
      return sprintf("%s %d %.1f %.1f %.3f %.3f %.1f", k, n[k], rss[k] / 1024, pss[k] / 1024,
        100 * dcpu[k] / hz / (s / 1000), dwb[k] / 1024 / (s / 1000), ws[k] / 1024)
    }
    END {
      for (k in n) if (k != "TOTAL") print line(k) | "sort"
      close("sort")
      print line("TOTAL")
    }' "$3.before" "$3.after" >"$3"
}

# sample_sum BEFORE AFTER REGEX: over the processes of AFTER (sample_node
# output) whose names match REGEX, "TICKS WRITTEN RSS PSS": CPU ticks and
# bytes written since BEFORE, counting the whole of a process that BEFORE
# lacks (it started since: a shim), and RSS and PSS in KiB at AFTER. What
# a process that ended in between did since BEFORE is lost.
sample_sum() {
  awk -v re="$3" '
    NF < 8 { next }
    FILENAME == ARGV[1] { cpu[$2] = $3; wb[$2] = $4; next }
    $1 ~ re { t += $3 - cpu[$2]; w += $4 - wb[$2]; rss += $5; pss += $6 }
    END { printf "%d %d %d %d\n", t, w, rss, pss }' "$1" "$2"
}

# cgroup_cpu_us NODE: the CPU time spent in the node's cgroups (hold_node),
# in microseconds: its pods' and that of processes that
# ended too, which sample_node cannot see. cpuacct.usage on cgroup v1,
# cpu.stat's usage_usec on v2.
cgroup_cpu_us() {
  local d
  # shellcheck disable=SC2086 # a list of paths without spaces
  for d in ${cg_dirs[$1]}; do
    if [[ -f $d/cpuacct.usage ]]; then echo $(( $(<"$d/cpuacct.usage") / 1000 )); return; fi
  done
  # shellcheck disable=SC2086 # a list of paths without spaces
  for d in ${cg_dirs[$1]}; do
    [[ -f $d/cpu.stat ]] && awk '$1 == "usage_usec" { print $2; found = 1 } END { exit !found }' "$d/cpu.stat" && return
  done
  return 0
}

# print_measure OUT: the figures of measure_node, a line per program and one
# for the whole node, indented.
print_measure() {
  awk '{
    printf "    %-26s %2d  RSS %5.0f MiB  PSS %5.0f MiB  CPU %5.2f%%  writes %7.2f KiB/s  working set %5.0f MiB\n",
      ($1 == "TOTAL" ? "the whole node" : $1), $2, $3, $4, $5, $6, $7
  }' "$1"
}
