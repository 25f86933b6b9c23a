# shellcheck shell=bash
# Helpers the bench scripts share; sourced by them, not run. The script
# defines die MESSAGE (says it and exits) and KELP (the binary).

# Where a node keeps state outside its data dir. Each node gets an empty
# tmpfs over each of them in its mount namespace, as in the cluster tests
# (internal/testcluster): two kelps on one machine must not share them, pod
# logs neither, whose housekeeping removes the files of pods it does not know.
readonly private_dirs=(/run/kelp /run/netns /var/lib/kubelet /var/log/pods /var/log/containers)

# The nodes of a bench, by name ("server", "agent"): holder is the pid that
# holds the node's namespaces, kelp_pid that of its kelp, and cg_procs the
# cgroup.procs files a process joins to be in the node, for a node with
# cgroups of its own.
declare -A holder=() kelp_pid=() cg_procs=()
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

# start_node NODE WORK: a network and mount namespace for one kelp node, like
# the cluster tests': loopback, a bridge with 10.99.0.2, and private_dirs of
# its own. Sets holder[NODE].
start_node() {
  local d
  for d in "${private_dirs[@]}"; do mkdir -p "$d"; done
  mkfifo "$2/ready"
  # shellcheck disable=SC2016 # expanded by sh
  unshare --net --mount --propagation private sh -ec '
    ip link set lo up
    ip link add kelp-lab type bridge
    ip addr add 10.99.0.2/24 dev kelp-lab
    ip link set kelp-lab up
    for d; do mount -t tmpfs -o mode=0755 kelp-bench "$d"; done
    echo ready > "$0"
    exec sleep infinity' "$2/ready" "${private_dirs[@]}" &
  holder[$1]=$!
  read -r _ <"$2/ready"
}

# Runs "$@" after moving itself into the cgroups listed in $1; the sh
# execs, so the pid is the command's.
# shellcheck disable=SC2016 # expanded by sh
readonly join_cgroups='for f in $1; do echo $$ >"$f"; done; shift; exec "$@"'

# enter_node NODE: sets enter to the command that runs what follows it in
# the node's namespaces, and in its cgroups if it has its own: entering a
# cgroup namespace moves no process, so the command joins the node's
# cgroups first, or it would run outside the node's view.
enter_node() {
  enter=(nsenter --target "${holder[$1]}" --net --mount)
  if [[ -n ${cg_procs[$1]:-} ]]; then
    enter=(sh -c "$join_cgroups" kelp-bench-node "${cg_procs[$1]}" "${enter[@]}" --cgroup)
  fi
  enter+=(--)
}

# in_node NODE CMD...: runs CMD in the node.
in_node() {
  local enter
  enter_node "$1"
  shift
  "${enter[@]}" "$@"
}

# launch NODE LOG ARGS...: starts `$KELP ARGS` in the node in the background,
# its output to LOG, and sets kelp_pid[NODE]. sh and nsenter exec, so the
# pid is kelp's own (a function run with & would be a subshell, which a
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

# --- a lab of nodes that run no agent -------------------------------------------

# lab_holder: the pid that holds the lab's network namespace (start_lab);
# lab_links: how many nodes were wired to it, for their link names.
lab_holder='' lab_links=0

# await_ready NAME PID OUT: waits up to 30 s for PID, a shell that makes
# namespaces, to write "ready" to OUT, its output.
await_ready() {
  local deadline=$(( $(now_ms) + 30000 ))
  until grep -qx ready "$3" 2>/dev/null; do
    alive "$2" || die "set up the namespaces of the $1: $(cat "$3")"
    (( $(now_ms) < deadline )) || die "the namespaces of the $1 were not set up within 30 s"
    sleep 0.05
  done
}

in_lab() { nsenter --target "$lab_holder" --net -- "$@"; }

# start_lab WORK: the network namespace of a lab as the cluster tests make it
# (internal/testcluster/lab.go), with a bridge lab0 and no address on it: the
# nodes' gateway 10.99.0.1 answers nothing. Sets lab_holder.
start_lab() {
  # The lab is wire, not a firewall: a kelp node turns on
  # bridge-nf-call-iptables in its network namespace, and lab0 must pass
  # what the nodes send each other without consulting netfilter.
  # shellcheck disable=SC2016 # expanded by sh
  unshare --net sh -ec '
    ip link set lo up
    ip link add lab0 type bridge
    ip link set lab0 up
    if [ -d /proc/sys/net/bridge ]; then
      for f in iptables ip6tables arptables; do echo 0 >/proc/sys/net/bridge/bridge-nf-call-$f; done
    fi
    echo ready
    exec sleep infinity' >"$1/lab.holder" 2>&1 &
  lab_holder=$!
  await_ready lab "$lab_holder" "$1/lab.holder"
}

# start_lab_node NODE IP WORK: a node of the lab for a kelp that runs no
# agent (kelp server --disable-agent), so no cgroups of its own: network and
# mount namespaces, private_dirs of its own, eth0 with IP/24 on lab0 and a
# default route via 10.99.0.1. Sets holder[NODE].
start_lab_node() {
  local node=$1 ip=$2 setup="ip link set lo up" d veth
  for d in "${private_dirs[@]}"; do
    mkdir -p "$d" # an empty mount point on the host changes nothing there
    setup+="; mount -t tmpfs -o mode=0755 kelp-bench $d"
  done
  unshare --net --mount --propagation private sh -ec "$setup; echo ready; exec sleep infinity" \
    >"$3/$node.holder" 2>&1 &
  holder[$node]=$!
  await_ready "$node" "${holder[$node]}" "$3/$node.holder"
  # The veth pair is made in the lab and its far end moved to the node:
  # neither end is ever in the machine's own namespace.
  veth=veth$(( ++lab_links ))
  in_lab ip link add "$veth" type veth peer name eth0 netns "${holder[$node]}"
  in_lab ip link set "$veth" master lab0 up
  in_node "$node" ip addr add "$ip/24" dev eth0
  in_node "$node" ip link set eth0 up
  in_node "$node" ip route add default via 10.99.0.1 dev eth0
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
# PSS and Referenced (smaps: pages touched since clear_refs) in KiB.
sample_node() {
  local pid name stat argv
  for pid in $(node_pids "$1"); do
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    stat=${stat##*) }
    mapfile -d "" -t argv <"/proc/$pid/cmdline" 2>/dev/null || continue
    name=${argv[0]##*/}
    if [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$KELP" ]]; then name=kelp-${argv[1]:-}; fi
    echo "$name $pid $(awk '{print $12 + $13}' <<<"$stat") \
$(awk '$1 == "write_bytes:" {print $2}' "/proc/$pid/io" 2>/dev/null) \
$(awk '$1 == "VmRSS:" {print $2}' "/proc/$pid/status" 2>/dev/null) \
$(awk '$1 == "Pss:" || $1 == "Referenced:" {printf "%s ", $2}' "/proc/$pid/smaps_rollup" 2>/dev/null)"
  done
}

# measure_node NODE SECONDS OUT: samples the node (sample_node) at both ends
# of SECONDS and writes to OUT, for the processes alive at both ends, a line
# per program and a TOTAL line:
#   NAME PROCESSES RSS-MiB PSS-MiB CPU-%-OF-A-CORE WRITES-KiB/s WORKING-SET-MiB
# The working set is the memory the processes touched in the window (smaps
# Referenced, their referenced bits cleared at its start through
# /proc/PID/clear_refs): RSS also holds pages touched once, e.g. at start,
# which the kernel takes back first when memory runs short. The samples stay
# in OUT.before and OUT.after.
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

# print_measure OUT: the figures of measure_node, a line per program and one
# for the whole node, indented.
print_measure() {
  awk '{
    printf "    %-26s %2d  RSS %5.0f MiB  PSS %5.0f MiB  CPU %5.2f%%  writes %7.2f KiB/s  working set %5.0f MiB\n",
      ($1 == "TOTAL" ? "the whole node" : $1), $2, $3, $4, $5, $6, $7
  }' "$1"
}

# end_node NODE: SIGKILL to what still runs in the node (stop its kelp with
# stop_kelp first), then to its holder: the namespaces and their mounts go
# with it. Forgets the node.
end_node() {
  local pids
  [[ -n ${holder[$1]:-} ]] || return 0
  pids=$(node_pids "$1")
  # shellcheck disable=SC2086 # a list of pids
  if [[ -n $pids ]]; then kill -KILL $pids 2>/dev/null || true; fi
  kill -KILL "${holder[$1]}" 2>/dev/null || true
  wait "${holder[$1]}" 2>/dev/null || true
  unset "holder[$1]"
}

# end_lab: SIGKILL to the lab's holder (end its nodes first).
end_lab() {
  [[ -n $lab_holder ]] || return 0
  kill -KILL "$lab_holder" 2>/dev/null || true
  wait "$lab_holder" 2>/dev/null || true
  lab_holder=''
}
