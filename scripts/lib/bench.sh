# shellcheck shell=bash
# Helpers the bench scripts share; sourced by them, not run. The script
# defines die MESSAGE (says it and exits) and KELP (the binary).

# Where a node keeps state outside its data dir. Each node gets an empty
# tmpfs over each of them in its mount namespace, as in the cluster tests
# (internal/testcluster): two kelps on one machine must not share them, pod
# logs neither, whose housekeeping removes the files of pods it does not know.
readonly private_dirs=(/run/kelp /run/netns /var/lib/kubelet /var/log/pods /var/log/containers)

# The nodes of a bench, by name ("server", "agent"): holder is the pid that
# holds the node's namespaces, kelp_pid that of its kelp; for a node with
# cgroups of its own, cg_dirs the host paths of its subtrees, one per
# hierarchy, and cg_procs the cgroup.procs files a process joins to be in
# the node.
declare -A holder=() kelp_pid=() cg_dirs=() cg_procs=()
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

# Runs "$@" after moving itself into the cgroups listed in $1; the sh
# execs, so the pid is the command's.
# shellcheck disable=SC2016 # expanded by sh
readonly join_cgroups='for f in $1; do echo $$ >"$f"; done; shift; exec "$@"'

# enter_node NODE: sets enter to the command that runs what follows it in
# the node's namespaces (start_node), and in its cgroups if it has its own: entering a
# cgroup namespace moves no process, so the command joins the node's
# cgroups first, or it would run outside the node's view.
enter_node() {
  enter=(nsenter --target "${holder[$1]}" --net --mount --uts)
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

# --- nodes, their own cgroups, and a lab of them ---------------------------------
#
# A node is a network, mount and UTS namespace held by a sleeping shell, its
# holder, with private_dirs of its own and its name as its hostname, as in
# the cluster tests (internal/testcluster/node.go): kelp and upstream derive
# identities from the hostname (node name, etcd member, leader election,
# the apiserver's identity), and a server refuses to join a cluster where a
# server of its hostname runs. start_node makes one alone,
# start_lab_node one wired to the lab of start_lab, and end_node ends
# either. A node that runs a kubelet (kelp agent, kelp server without
# --disable-agent) needs cgroups of its own too ("cgroups"): a subtree in
# every hierarchy, which the node sees as its cgroup root through a cgroup
# namespace, as internal/testcluster/cgroup.go makes them. Two kubelets with
# one kubepods fight over it, each removing the pod cgroups it does not
# know, and their pods restart: kelp gives a node whose data dir is not the
# default a cgroup root of its own (internal/nodepaths), but a node of an
# earlier kelp shares the machine's, and a subtree of its own keeps what a
# node uses, and so its figures, apart.

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
    echo "$mountpoint $(sort_list "$opts")"
  done
}
# sort_list LIST: the comma-separated LIST, sorted.
sort_list() { tr , '\n' <<<"$1" | sort | paste -sd, -; }

# make_cgroups NODE: a kelp-bench-NODE-<random> cgroup in every hierarchy,
# below the cgroup this script runs in on v1 (so the machine's limits on it
# cover the node), below the root on v2 (a cgroup holding processes cannot
# pass controllers on), where the node's processes live in the leaf init.
# Sets cg_dirs[NODE] (as it makes them, for remove_cgroups), cg_procs[NODE],
# and for hold_node cg_join, the cgroup.procs the holder joins before it
# makes the node's cgroup namespace, whose root they become, and cg_setup:
# the commands that, in the node's new mount and cgroup namespaces, replace
# the host's cgroup mounts by the node's view.
make_cgroups() {
  local node=$1 base='' mountpoint opts parent d f ctrls path
  local -A own=()
  while IFS=: read -r _ ctrls path; do
    [[ -n $ctrls ]] && own[$(sort_list "$ctrls")]=$path
  done </proc/self/cgroup
  cg_dirs[$node]='' cg_procs[$node]='' cg_join='' cg_setup=''
  while read -r mountpoint opts; do
    parent=$mountpoint
    if [[ $opts != v2 ]]; then
      [[ -n ${own[$opts]:-} ]] || die "cgroup hierarchy $mountpoint ($opts) is not in /proc/self/cgroup"
      parent=$mountpoint${own[$opts]%/}
    fi
    if [[ -z $base ]]; then
      d=$(mktemp -d "$parent/kelp-bench-$node-XXXXXX") || die "make the $node's cgroup in $parent"
      base=$(basename "$d")
    else
      d=$parent/$base
      mkdir "$d" || die "make the $node's cgroup $d"
    fi
    cg_dirs[$node]+="$d "
    cg_join+="$d/cgroup.procs "
    # Unmounted, not mounted over: kubelet and runc would find both mounts.
    if [[ $opts == v2 ]]; then
      # Only leaves may hold processes once the node's kubelet enables
      # controllers at its root, as kind does it with its /init.
      mkdir "$d/init"
      cg_procs[$node]+="$d/init/cgroup.procs "
      cg_setup+="; umount $mountpoint; mount -t cgroup2 cgroup2 $mountpoint; echo \$\$ >$mountpoint/init/cgroup.procs"
    else
      # A new v1 cpuset takes no process until it has CPUs and memory nodes.
      for f in cpuset.cpus cpuset.mems; do
        [[ -f $parent/$f ]] && cat "$parent/$f" >"$d/$f"
      done
      cg_procs[$node]+="$d/cgroup.procs "
      cg_setup+="; umount $mountpoint; mount -t cgroup -o $opts cgroup $mountpoint"
    fi
  done < <(cgroup_hierarchies)
  [[ -n $base ]] || die "no cgroup hierarchy is mounted"
}

# cgroup_pids NODE: the processes in the node's cgroups, its containers too.
cgroup_pids() {
  local d
  # shellcheck disable=SC2086 # a list of paths without spaces
  for d in ${cg_dirs[$1]}; do
    [[ -d $d ]] && find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -un
}

# remove_cgroups NODE: SIGKILL to what is left in the node's cgroups (its
# containers: they have mount namespaces of their own), then removes them,
# children first; says so and gives up after 30 s.
remove_cgroups() {
  local node=$1 deadline=$(( $(now_ms) + 30000 )) pids d sub
  while pids=$(cgroup_pids "$node"); [[ -n $pids ]]; do
    if (( $(now_ms) > deadline )); then
      echo "${0##*/}: processes $(tr '\n' ' ' <<<"$pids")still in the $node's cgroups after SIGKILL" >&2
      break
    fi
    # A frozen process does not die of SIGKILL; runc freezes a container's
    # cgroup while it signals it, so a runc killed meanwhile leaves it frozen.
    # shellcheck disable=SC2086 # a list of paths without spaces
    for d in ${cg_dirs[$node]}; do
      find "$d" -name freezer.state -exec sh -c 'for f; do echo THAWED >"$f"; done' sh {} + 2>/dev/null || true
      find "$d" -name cgroup.freeze -exec sh -c 'for f; do echo 0 >"$f"; done' sh {} + 2>/dev/null || true
    done
    # shellcheck disable=SC2086 # a list of pids
    kill -KILL $pids 2>/dev/null || true
    sleep 0.02
  done
  # shellcheck disable=SC2086 # a list of paths without spaces
  for d in ${cg_dirs[$node]}; do
    [[ -d $d ]] || continue
    while read -r sub; do
      # A killed process leaves its cgroup a moment after it died.
      until rmdir "$sub" 2>/dev/null || [[ ! -d $sub ]]; do
        if (( $(now_ms) > deadline )); then
          echo "${0##*/}: cannot remove cgroup $sub" >&2
          break
        fi
        sleep 0.02
      done
    done < <(find "$d" -depth -type d)
  done
  return 0
}

# hold_node NODE WORK SETUP [cgroups]: starts the holder of a new node: a
# shell that, in the node's new namespaces, sets NODE as the hostname, brings
# up loopback, mounts private_dirs of its own and runs the shell commands
# SETUP, says "ready" to WORK/NODE.holder and sleeps. With "cgroups", the
# node has cgroups of its own (make_cgroups), which end_node removes. Sets
# holder[NODE].
hold_node() {
  local node=$1 work=$2 setup d ns=(unshare --net --mount --uts --propagation private)
  [[ $node =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "node name '$node' is no hostname: lower-case letters, digits and '-'"
  [[ -z ${4:-} || $4 == cgroups ]] || die "node $node: unknown option '$4' (cgroups or none)"
  [[ -z ${holder[$node]:-} ]] || die "node $node exists already: end_node it first"
  setup="echo $node >/proc/sys/kernel/hostname; ip link set lo up${3:+; $3}"
  for d in "${private_dirs[@]}"; do
    mkdir -p "$d" # an empty mount point on the host changes nothing there
    setup+="; mount -t tmpfs -o mode=0755 kelp-bench $d"
  done
  if [[ -n ${4:-} ]]; then
    # Where systemd runs the host, kelp would ask it for cgroups outside the
    # node's subtree: hiding it makes kelp manage cgroups itself.
    if [[ -d /run/systemd/system ]]; then setup+="; mount -t tmpfs -o mode=0755 kelp-bench /run/systemd"; fi
    make_cgroups "$node"
    setup+=$cg_setup
    # The holder joins the node's cgroups, then makes its cgroup namespace.
    ns=(sh -c "$join_cgroups" kelp-bench-node "$cg_join" "${ns[@]}" --cgroup)
  fi
  "${ns[@]}" sh -ec "$setup; echo ready; exec sleep infinity" >"$work/$node.holder" 2>&1 &
  holder[$node]=$!
  await_ready "$node" "${holder[$node]}" "$work/$node.holder"
}

# start_node NODE WORK [cgroups]: a node alone, as in the cluster tests: a
# bridge kelp-lab with 10.99.0.2/24 and no route out. WORK holds the
# holder's output; "cgroups" as for hold_node.
start_node() {
  hold_node "$1" "$2" \
    "ip link add kelp-lab type bridge; ip addr add 10.99.0.2/24 dev kelp-lab; ip link set kelp-lab up" "${3:-}"
}

in_lab() { nsenter --target "$lab_holder" --net -- "$@"; }

# start_lab WORK: the network namespace of a lab as the cluster tests make it
# (internal/testcluster/lab.go), with a bridge lab0 and no address on it: the
# nodes' gateway 10.99.0.1 answers nothing, as on a machine whose gateway
# drops what it cannot deliver. Sets lab_holder.
start_lab() {
  [[ -z $lab_holder ]] || die "a lab runs already: end_lab it first"
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

# start_lab_node NODE IP WORK [cgroups]: a node of the lab (hold_node, its
# holder's output in WORK), with eth0 IP/24 on lab0 and a default route via
# 10.99.0.1. "cgroups" as for hold_node: for a node that runs a kubelet.
start_lab_node() {
  local node=$1 ip=$2 veth
  [[ -n $lab_holder ]] || die "no lab for the $node: start_lab first"
  hold_node "$node" "$3" "" "${4:-}"
  # The veth pair is made in the lab and its far end moved to the node:
  # neither end is ever in the machine's own namespace.
  veth=veth$(( ++lab_links ))
  in_lab ip link add "$veth" type veth peer name eth0 netns "${holder[$node]}"
  in_lab ip link set "$veth" master lab0 up
  in_node "$node" ip addr add "$ip/24" dev eth0
  in_node "$node" ip link set eth0 up
  in_node "$node" ip route add default via 10.99.0.1 dev eth0
}

# end_node NODE: SIGKILL to what still runs in the node's mount namespace
# (stop its kelp with stop_kelp first, and run kelp killall in it for a
# clean end of its containers), then to its holder: the namespaces and
# their mounts go with it. A node with cgroups of its own loses them and
# what is left in them (remove_cgroups), its containers too. Forgets the
# node; a node it does not know is no error.
end_node() {
  local pids
  if [[ -n ${holder[$1]:-} ]]; then
    pids=$(node_pids "$1")
    # shellcheck disable=SC2086 # a list of pids
    if [[ -n $pids ]]; then kill -KILL $pids 2>/dev/null || true; fi
    kill -KILL "${holder[$1]}" 2>/dev/null || true
    wait "${holder[$1]}" 2>/dev/null || true
  fi
  if [[ -n ${cg_dirs[$1]:-} ]]; then remove_cgroups "$1"; fi
  unset "holder[$1]" "cg_dirs[$1]" "cg_procs[$1]"
}

# end_lab: SIGKILL to the lab's holder (end its nodes first).
end_lab() {
  [[ -n $lab_holder ]] || return 0
  kill -KILL "$lab_holder" 2>/dev/null || true
  wait "$lab_holder" 2>/dev/null || true
  lab_holder='' lab_links=0
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

# cgroup_cpu_us NODE: the CPU time spent in the node's cgroups (start_node
# with cgroups), in microseconds: its pods' and that of processes that
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
