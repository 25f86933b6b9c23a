#!/usr/bin/env bash
# Measures kelp servers on SQLite, on one embedded etcd member and on three,
# and their snapshots, and prints the figures; it never judges them. The
# machine is noisy: compare figures of one run, as ratios.
#
# Usage: scripts/bench-ha.sh     (as root, from anywhere; needs go)
#   OBJECTS=10000  ConfigMaps of 1 KiB written before each snapshot
#   WRITES=1000    ConfigMaps of each latency figure, created one after another
#   WRITERS=8      concurrent writers of the throughput figures
#   KELP=bin/kelp
#   LOGDIR=        if set, kelp's logs are copied there
#
# The nodes are wired as in the cluster tests (internal/testcluster/lab.go): a
# lab network namespace with a bridge lab0, and per node network, mount and
# cgroup namespaces and cgroups of its own, eth0 10.99.0.x/24 on the bridge
# (server-1 .2, server-2 .3, server-3 .4) and private /run/kelp, /run/netns,
# /var/lib/kubelet and pod logs. Every server runs with --disable-agent. Writes come from scripts/benchha (client-go, no client-side rate limit),
# run inside a node, creating ConfigMaps of 1 KiB in the default namespace.
# A "ready" server is one whose /readyz answers ok and whose log says "kelp
# server is ready". Figures:
#   single server, SQLite and etcd (--cluster-init) in turn, each on a fresh
#   data dir:
#     start -> ready     launch of `kelp server` until ready (the first run
#                        stages the runtime bundle too; later data dirs get a
#                        copy of it, as a first run leaves it)
#     latency            WRITES creates one after another: median and 99th
#                        percentile of one create, and objects/s
#     throughput         WRITERS writers creating OBJECTS ConfigMaps: objects/s
#     snapshot           `kelp snapshot save` of the running server holding the
#                        WRITES + OBJECTS ConfigMaps: its run time and the size
#                        of the snapshot file
#     restore            a ConfigMap is written after the snapshot and the
#                        server stopped (SIGTERM); then SQLite `kelp snapshot
#                        restore`, etcd `kelp server --cluster-init
#                        --cluster-reset --cluster-reset-restore-path`, each
#                        run to its end, and `kelp server` until ready: each
#                        time and the sum. The ConfigMaps are counted after:
#                        the later one must be gone.
#   three servers on embedded etcd:
#     join -> ready      server-1 runs (--cluster-init); launch of `kelp server
#                        --server https://10.99.0.2:6443 --token <server token>`
#                        on server-2 (fresh data dir but for the runtime bundle,
#                        a copy of the one the first run staged) until ready,
#                        and until a log says "Promoted etcd learner to voting
#                        member"; then the same for server-3
#     latency            as above through server-1's apiserver, with one etcd
#                        member (before the joins) and with three; with three
#                        also through a follower's apiserver (its etcd member
#                        forwards to the leader); throughput with WRITERS
#                        writers creating WRITES ConfigMaps through server-1
#     leader loss        the etcd leader (`kelp etcdctl endpoint status
#                        --cluster`) is killed with SIGKILL while a writer on
#                        one of the others creates ConfigMaps through both
#                        other apiservers, one writer each, a create at most
#                        every 10 ms and each given up after 2 s. Writes
#                        stopped for: from the last create acknowledged before
#                        the kill to the first one after it; and, for each
#                        apiserver, from the kill to its first acknowledged
#                        create.
set -euo pipefail

OBJECTS=${OBJECTS:-10000}
WRITES=${WRITES:-1000}
WRITERS=${WRITERS:-8}
# shellcheck source=lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_init bench-ha unshare nsenter ip curl awk go

for v in OBJECTS WRITES WRITERS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer"
done

declare -A ip=([server-1]=10.99.0.2 [server-2]=10.99.0.3 [server-3]=10.99.0.4)
work=$(mktemp -d "${TMPDIR:-/tmp}/kelp-bench-ha.XXXXXX")
dir=''    # $work/<phase>, the nodes' files: $dir/<node>/{data,kelp.yaml,*.log}
writer='' # pid of the leader-loss writer

# teardown: stops the phase's kelps (all at once: a server that waits for
# its peers must not hold up the others' stop) and removes its nodes.
teardown() {
  local node
  for node in "${!kelp_pid[@]}"; do kill -TERM "${kelp_pid[$node]}" 2>/dev/null || true; done
  for node in "${!kelp_pid[@]}"; do stop_kelp "$node"; done
  for node in "${!holder[@]}"; do end_node "$node"; done
  if [[ -n $LOGDIR && -n $dir ]]; then
    mkdir -p "$LOGDIR"
    for f in "$dir"/*/*.log; do
      [[ -f $f ]] && cp "$f" "$LOGDIR/$(basename "$dir")-$(basename "$(dirname "$f")")-$(basename "$f")"
    done
  fi
  [[ -n $dir ]] && rm -rf "$dir"
  dir=''
}

cleanup() {
  local rc=$?
  trap - EXIT
  trap '' INT TERM # a second Ctrl-C must not cut the cleanup short
  set +eu
  if [[ -n $writer ]]; then kill -KILL "$writer" 2>/dev/null; wait "$writer" 2>/dev/null; fi
  teardown
  end_lab
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

go build -C "$repo" -o "$work/benchha" ./scripts/benchha

# --- servers ------------------------------------------------------------------

server_args() { # NODE EXTRA...: sets args
  local node=$1
  shift
  args=(server --data-dir "$dir/$node/data" --write-kubeconfig "$dir/$node/kelp.yaml"
    --node-name "$node" --disable-agent "$@")
}

new_node() { # NODE: the node, with an empty directory for its files
  mkdir -p "$dir/$1"
  start_lab_node "$1" "${ip[$1]}" "$dir"
}

ready() { # NODE LOG
  [[ $(in_node "$1" curl -sk --max-time 2 "https://${ip[$1]}:6443/readyz") == ok ]] &&
    grep -q "kelp server is ready" "$2"
}

# start_server NODE LOG EXTRA...: launches kelp server with server_args and
# waits until it is ready; sets took to the milliseconds since the launch.
start_server() {
  local node=$1 log=$2 t0 args
  shift 2
  server_args "$node" "$@"
  t0=$(now_ms)
  launch "$node" "$log" "${args[@]}"
  wait_for "$node ready" ready "$node" "$log"
  took=$(( $(now_ms) - t0 ))
}

# run_kelp NODE LOG ARGS...: runs kelp ARGS in the node to its end, output to
# LOG; sets took to its run time in ms.
run_kelp() {
  local node=$1 log=$2 t0
  shift 2
  t0=$(now_ms)
  in_node "$node" "$KELP" "$@" >"$log" 2>&1 || die "kelp $* on $node failed: $(tail -n 5 "$log")"
  took=$(( $(now_ms) - t0 ))
}

# bench NODE ARGS...: benchha in the node against its own apiserver; prints
# its key=value line.
bench() {
  local node=$1 cmd=$2
  shift 2
  in_node "$node" "$work/benchha" "$cmd" -kubeconfig "$dir/$node/kelp.yaml" "$@"
}

field() { # KEY LINE: the value of KEY in a benchha key=value line
  awk -v k="$1" '{ for (i = 1; i <= NF; i++) if (index($i, k "=") == 1) print substr($i, length(k) + 2) }' <<<"$2"
}

# write_figures LABEL KEY LINE: prints a benchha write line, keeps its
# figures in r[KEY,*].
declare -A r
write_figures() {
  local f
  for f in rate p50_ms p99_ms seconds; do r[$2,$f]=$(field "$f" "$3"); done
  printf '  %-42s %6s objects/s  (p50 %s ms, p99 %s ms; %s objects, %s writers, %ss)\n' "$1" \
    "${r[$2,rate]}" "${r[$2,p50_ms]}" "${r[$2,p99_ms]}" "$(field objects "$3")" "$(field writers "$3")" "${r[$2,seconds]}"
}

# --- single server: latency, throughput, snapshot and restore ------------------

single() { # DATASTORE: sqlite or etcd
  local ds=$1 node=server-1 extra=() args line name snap f n
  [[ $ds == etcd ]] && extra=(--cluster-init)
  dir=$work/$ds
  new_node "$node"
  if [[ -n ${bundle:-} ]]; then mkdir -p "$dir/$node/data" && cp -a "$bundle" "$dir/$node/data/"; fi
  echo
  echo "single server, $ds:"
  start_server "$node" "$dir/$node/start.log" "${extra[@]}"
  if [[ -z ${bundle:-} ]]; then
    printf '  %-42s %6ss  (the first run: the runtime bundle is staged too)\n' "start -> ready" "$(secs "$took")"
    cp -a "$dir/$node/data/data" "$work/" && bundle=$work/data
  else
    printf '  %-42s %6ss\n' "start -> ready" "$(secs "$took")"
  fi

  line=$(bench "$node" write -n "$WRITES" -writers 1 -prefix seq) || die "the latency writes on $ds failed"
  write_figures "latency, one writer" "$ds,seq" "$line"
  line=$(bench "$node" write -n "$OBJECTS" -writers "$WRITERS" -prefix fill) || die "the throughput writes on $ds failed"
  write_figures "throughput, $WRITERS writers" "$ds,fill" "$line"

  run_kelp "$node" "$dir/$node/save.log" snapshot save --data-dir "$dir/$node/data" --name bench
  r[$ds,save]=$took
  snap=''
  for f in "$dir/$node/data/server/db/snapshots"/bench-*; do
    [[ $f == *.json ]] || snap=$f
  done
  [[ -n $snap ]] || die "no snapshot bench-* in $dir/$node/data/server/db/snapshots: $(cat "$dir/$node/save.log")"
  name=$(basename "$snap")
  r[$ds,size]=$(awk -v b="$(stat -c %s "$snap")" 'BEGIN { printf "%.1f", b / 1048576 }')
  printf '  %-42s %6ss, %s MiB  (%s)\n' "snapshot save, $(( OBJECTS + WRITES )) ConfigMaps" \
    "$(secs "$took")" "${r[$ds,size]}" "$name"

  bench "$node" write -n 1 -prefix after-snapshot >/dev/null || die "the write after the snapshot on $ds failed"
  stop_kelp "$node"
  server_args "$node" "${extra[@]}"
  if [[ $ds == sqlite ]]; then
    run_kelp "$node" "$dir/$node/restore.log" snapshot restore --data-dir "$dir/$node/data" "$name"
  else
    run_kelp "$node" "$dir/$node/restore.log" "${args[@]}" --cluster-reset --cluster-reset-restore-path "$name"
  fi
  r[$ds,restore]=$took
  start_server "$node" "$dir/$node/restart.log" "${extra[@]}"
  r[$ds,restart]=$took
  r[$ds,restore_total]=$(( r[$ds,restore] + took ))
  printf '  %-42s %6ss  (restore %ss, then start -> ready %ss)\n' "restore -> ready" \
    "$(secs "${r[$ds,restore_total]}")" "$(secs "${r[$ds,restore]}")" "$(secs "$took")"
  n=$(bench "$node" count -prefix fill)/$(bench "$node" count -prefix seq)/$(bench "$node" count -prefix after-snapshot)
  if [[ $n == "$OBJECTS/$WRITES/0" ]]; then
    echo "  restored: $OBJECTS + $WRITES ConfigMaps, the later one gone"
  else
    echo "  note: after the restore, fill/seq/after-snapshot ConfigMaps are $n, not $OBJECTS/$WRITES/0"
  fi
  teardown
}

# --- three servers: joins, latency, leader loss --------------------------------

promotions() { cat "$dir"/*/*.log | grep -c "Promoted etcd learner to voting member" || true; }

# join NODE PROMOTED: starts the node as a server joining server-1 and waits
# until it is ready and the logs tell PROMOTED promotions in all; sets took
# and promoted_ms, the milliseconds from the launch to each.
join() {
  local node=$1 log=$dir/$1/start.log t0 args
  mkdir -p "$dir/$node/data" && cp -a "$bundle" "$dir/$node/data/"
  server_args "$node" --server "https://${ip[server-1]}:6443" --token "$token"
  took='' promoted_ms=''
  t0=$(now_ms)
  launch "$node" "$log" "${args[@]}"
  until [[ -n $took && -n $promoted_ms ]]; do
    (( $(now_ms) - t0 < 300000 )) || die "$node was not ready with its etcd member promoted within 5 minutes"
    alive "${kelp_pid[$node]}" || die "kelp on $node exited while joining: see $log"
    [[ -z $promoted_ms ]] && (( $(promotions) >= $2 )) && promoted_ms=$(( $(now_ms) - t0 ))
    [[ -z $took ]] && ready "$node" "$log" && took=$(( $(now_ms) - t0 ))
    sleep 0.1
  done
}

# leader: the node whose etcd member leads, as server-1's etcdctl sees it.
leader() {
  local out
  out=$(in_node server-1 "$KELP" etcdctl --data-dir "$dir/server-1/data" endpoint status --cluster -w json) ||
    die "kelp etcdctl endpoint status on server-1 failed: $out"
  # [{"Endpoint":"https://10.99.0.2:2379","Status":{"header":{...,"member_id":N,...},...,"leader":N,...}},...]
  grep -oE '"Endpoint":"[^"]*"|"member_id":[0-9]+|"leader":[0-9]+' <<<"$out" | awk -F'"' '
    $2 == "Endpoint" { split($4, u, "[/:]"); ep = u[4] }
    $2 == "member_id" { id = substr($3, 2) }
    $2 == "leader" && substr($3, 2) == id { print ep }' | head -1
}

ha() {
  local node line t0 kill_ms l survivors=() urls='' acks log
  dir=$work/ha
  for node in server-1 server-2 server-3; do new_node "$node"; done
  mkdir -p "$dir/server-1/data" && cp -a "$bundle" "$dir/server-1/data/"
  echo
  echo "three servers, embedded etcd:"
  start_server server-1 "$dir/server-1/start.log" --cluster-init
  printf '  %-42s %6ss\n' "server-1 start -> ready" "$(secs "$took")"
  line=$(bench server-1 write -n "$WRITES" -writers 1 -prefix seq1) || die "the latency writes with one member failed"
  write_figures "1 member: latency, one writer" "ha1,seq" "$line"
  line=$(bench server-1 write -n "$WRITES" -writers "$WRITERS" -prefix par1) || die "the throughput writes with one member failed"
  write_figures "1 member: throughput, $WRITERS writers" "ha1,par" "$line"

  token=$(<"$dir/server-1/data/server/token")
  join server-2 1
  r[join2]=$took r[promote2]=$promoted_ms
  printf '  %-42s %6ss  (etcd member promoted at %ss)\n' "server-2 join -> ready" "$(secs "$took")" "$(secs "$promoted_ms")"
  join server-3 2
  r[join3]=$took r[promote3]=$promoted_ms
  printf '  %-42s %6ss  (etcd member promoted at %ss)\n' "server-3 join -> ready" "$(secs "$took")" "$(secs "$promoted_ms")"

  l=$(leader)
  [[ -n $l ]] || die "no etcd leader found"
  for node in server-1 server-2 server-3; do
    [[ ${ip[$node]} == "$l" ]] && l=$node
  done
  echo "  etcd leader: $l"
  for node in server-1 server-2 server-3; do
    [[ $node == "$l" ]] || { survivors+=("$node"); urls+="${urls:+,}https://${ip[$node]}:6443"; }
  done
  r[role1]=follower
  [[ $l == server-1 ]] && r[role1]=leader
  line=$(bench server-1 write -n "$WRITES" -writers 1 -prefix seq3) || die "the latency writes with three members failed"
  write_figures "3 members: latency via server-1 (${r[role1]})" "ha3,seq" "$line"
  r[follower]=${survivors[0]}
  line=$(bench "${r[follower]}" write -n "$WRITES" -writers 1 -prefix seqf) || die "the latency writes through ${r[follower]} failed"
  write_figures "3 members: latency via ${r[follower]} (follower)" "ha3f,seq" "$line"
  line=$(bench server-1 write -n "$WRITES" -writers "$WRITERS" -prefix par3) || die "the throughput writes with three members failed"
  write_figures "3 members: throughput, $WRITERS writers" "ha3,par" "$line"

  # The leader goes while a writer on another server writes through both
  # others.
  acks=$dir/${survivors[0]}/acks
  log=$dir/${survivors[0]}/writer.log
  enter_node "${survivors[0]}"
  "${enter[@]}" "$work/benchha" outage -kubeconfig "$dir/${survivors[0]}/kelp.yaml" -servers "$urls" >"$acks" 2>"$log" &
  writer=$!
  # shellcheck disable=SC2016 # awk's
  wait_for "writes acknowledged by both ${survivors[*]}" \
    awk '$1 == "ack" { n[$3]++ } END { exit !(n[0] >= 100 && n[1] >= 100) }' "$acks"
  kill_ms=$(now_ms)
  kill -KILL "${kelp_pid[$l]}"
  wait "${kelp_pid[$l]}" 2>/dev/null || true
  unset "kelp_pid[$l]"
  # Until both apiservers acknowledged writes again for 5 s.
  t0=$(now_ms)
  until awk -v k="$kill_ms" '$1 == "ack" && $2 > k { first[$3] = first[$3] ? first[$3] : $2; last[$3] = $2 }
      END { exit !((0 in first) && (1 in first) && last[0] - first[0] > 5000 && last[1] - first[1] > 5000) }' "$acks"; do
    (( $(now_ms) - t0 < 180000 )) || die "writes did not resume within 3 minutes of killing $l: $(tail -n 5 "$log")"
    sleep 0.2
  done
  kill -TERM "$writer"
  wait "$writer" || true
  writer=''
  read -r 'r[gap]' 'r[first0]' 'r[first1]' 'r[errors]' < <(awk -v k="$kill_ms" '
    $1 != "ack" { next }
    $2 <= k { before = $2 }
    $2 > k && !after { after = $2 }
    $2 > k && !(($3) in first) { first[$3] = $2 - k }
    END { print after - before, first[0], first[1] }' "$acks" | tr '\n' ' '; grep -c . "$log" || true)
  printf '  %-42s %6ss  (last acknowledged create before the kill to the first after)\n' \
    "leader loss: writes stopped" "$(secs "${r[gap]}")"
  printf '  %-42s %6ss through %s, %ss through %s; %s creates failed or timed out\n' "  from the kill to a write" \
    "$(secs "${r[first0]}")" "${survivors[0]}" "$(secs "${r[first1]}")" "${survivors[1]}" "${r[errors]}"
  r[leader]=$l
  teardown
}

# --- the runs -------------------------------------------------------------------

bench_header "OBJECTS=$OBJECTS WRITES=$WRITES WRITERS=$WRITERS"
t_run=$(now_ms)
start_lab "$work"
single sqlite
single etcd
ha
end_lab

echo
echo "summary (single server unless said; latency: one writer, WRITES=$WRITES; objects/s):"
printf '  %-40s %10s %10s\n' "" sqlite etcd
printf '  %-40s %10s %10s\n' "latency p50 (ms)" "${r[sqlite,seq,p50_ms]}" "${r[etcd,seq,p50_ms]}"
printf '  %-40s %10s %10s\n' "latency p99 (ms)" "${r[sqlite,seq,p99_ms]}" "${r[etcd,seq,p99_ms]}"
printf '  %-40s %10s %10s\n' "throughput, $WRITERS writers (objects/s)" "${r[sqlite,fill,rate]}" "${r[etcd,fill,rate]}"
printf '  %-40s %10s %10s\n' "snapshot save (s)" "$(secs "${r[sqlite,save]}")" "$(secs "${r[etcd,save]}")"
printf '  %-40s %10s %10s\n' "snapshot size (MiB)" "${r[sqlite,size]}" "${r[etcd,size]}"
printf '  %-40s %10s %10s\n' "restore -> ready (s)" "$(secs "${r[sqlite,restore_total]}")" "$(secs "${r[etcd,restore_total]}")"
printf '  %-40s %10s %10s\n' "  of which start -> ready (s)" "$(secs "${r[sqlite,restart]}")" "$(secs "${r[etcd,restart]}")"
awk -v s="${r[sqlite,fill,rate]}" -v e="${r[etcd,fill,rate]}" 'BEGIN { printf "  throughput etcd / sqlite = %.2f\n", e / s }'
echo
printf '  %-40s %10s %10s\n' "embedded etcd, via server-1 (${r[role1]})" "1 member" "3 members"
printf '  %-40s %10s %10s\n' "latency p50 (ms)" "${r[ha1,seq,p50_ms]}" "${r[ha3,seq,p50_ms]}"
printf '  %-40s %10s %10s\n' "latency p99 (ms)" "${r[ha1,seq,p99_ms]}" "${r[ha3,seq,p99_ms]}"
printf '  %-40s %10s %10s\n' "throughput, $WRITERS writers (objects/s)" "${r[ha1,par,rate]}" "${r[ha3,par,rate]}"
awk -v a="${r[ha1,seq,p50_ms]}" -v b="${r[ha3,seq,p50_ms]}" -v c="${r[ha1,par,rate]}" -v d="${r[ha3,par,rate]}" \
  'BEGIN { printf "  3 members / 1: latency p50 %.2f, throughput %.2f\n", b / a, d / c }'
echo "  3 members via a follower's apiserver (${r[follower]}): latency p50 ${r[ha3f,seq,p50_ms]} ms, p99 ${r[ha3f,seq,p99_ms]} ms"
echo "  join -> ready: server-2 $(secs "${r[join2]}")s, server-3 $(secs "${r[join3]}")s;" \
  "leader (${r[leader]}) killed: writes stopped $(secs "${r[gap]}")s"
echo "run time $(secs $(( $(now_ms) - t_run )))s"
