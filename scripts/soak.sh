#!/usr/bin/env bash
# Runs kelp servers, each with its node, for a long time and prints what they
# cost minute by minute; it never judges the figures. The machine is noisy:
# compare figures of one run.
#
# Usage: scripts/soak.sh idle|churn|crash     (as root, from anywhere)
#   KILLS=200          crash: SIGKILLs per datastore
#   WINDOW=1800        idle: seconds measured once the nodes are Ready
#   DURATION=7200      churn: seconds of churn once the node is Ready
#   KELP=bin/kelp
#   LOGDIR=            if set, kelp's, containerd's and the audit logs, the
#                      timer lines and the trace (trace.tsv) are copied there
#   KELP_ARGS=         more flags for every kelp server
#   LEAF_LIFETIME=30m  churn: the server's KELP_TEST_LEAF_LIFETIME (a test
#                      hook of internal/certrenew): leaves are renewed in the
#                      last third of their life, so every 20 min; empty: a
#                      year, and the renewal loop only looks, hourly
#   TOKEN_TTL=10m      churn: --ttl of the join token made at the start
#
# Each server runs in network, mount and cgroup namespaces and cgroups of its own,
# like the cluster tests (lib/bench.sh start_node), after a first run that
# staged the bundle, as bench-node.sh does. Windows are whole minutes.
#   idle   three servers at once, nothing deployed beyond the built-in parts:
#            sqlite       SQLite with the RAM store (kelp's default)
#            sqlite-disk  SQLite, --disable-ram-store
#            etcd         embedded etcd, --cluster-init
#   churn  one server (SQLite, RAM store), and over DURATION: a Deployment of
#          the test image (from the airgap images directory) scaled to 10 and
#          to 0 in turn every minute, a ConfigMap updated and an Event made
#          every 10 s; timers made to fire within the run: snapshots every 15
#          min (retention 2), an audit log rotated at 1 MiB (3 kept),
#          LEAF_LIFETIME, a join token of TOKEN_TTL; compaction (every 5 min),
#          the renewal loop's look (at the latest hourly: maxWait in
#          internal/certrenew/loop.go) and the event TTL (the apiserver's
#          --event-ttl, 1 h unless KELP_ARGS says otherwise) need nothing.
#   crash  server/crash_test.go's TestCrash with KILLS kills instead of CI's
#          10, SQLite and embedded etcd at once: writers update ConfigMaps,
#          kelp is SIGKILLed at a random moment, the datastore's files are
#          checked (SQLite integrity_check, etcd's bbolt check and HashKV
#          history), and after the restart every acknowledged write must be
#          there. Prints each datastore's summary: kills, writes
#          acknowledged, lost (0, or the run fails at the first loss),
#          restart times. A kill during a datastore migration is
#          TestMigrateKilledMidway (internal/datastore).
# kelp runs with --debug, for kine's "COMPACT compacted from" lines and the
# renewal loop's; what that logging costs is in the figures. Its output goes
# to a tmpfs (/dev/shm), so that its writes are not counted; data dirs are
# under TMPDIR (/tmp). Drivers (kubectl, etcdctl) run in the node's network
# namespace only, outside what is measured.
# Figures, per server:
#   CPU per minute   % of one core of kelp + containerd + shims (utime + stime
#                    of /proc/PID/stat; a process that started within the
#                    minute counts whole, one that ended loses its last
#                    part), and of the node's cgroups (its pods and
#                    short-lived processes too). Marks: C a compaction of the
#                    datastore, R one of the RAM store. SQLite: kine's
#                    "COMPACT compacted from" line, logged only where it
#                    deleted something: kine keeps the last 1000 revisions,
#                    so the apiserver's calls (every 5 min) leave no mark
#                    until a store has more. etcd: the version of the
#                    apiserver's compact_rev_key went up, as it does at each
#                    interval before it compacts to the revision of the last
#   every 5 minutes  RSS and PSS (smaps_rollup) of kelp + containerd + shims,
#                    bytes they wrote (/proc/PID/io write_bytes) in the 5
#                    minutes, the size of state.db (+ its WAL; etcd: its db)
#                    and of the RAM store's state.db (+ WAL)
#   at the end       idle: mean CPU over the window and over its last 30
#                    minutes, the highest minute, RSS and PSS at start and
#                    end, MB written, the sizes; churn: mean CPU, the memory
#                    slope in MiB/hour from minute 60 on (least squares over
#                    the 5-minute samples), the sizes, and each timer with the
#                    minutes it fired at
set -euo pipefail

mode=${1:-}
WINDOW=${WINDOW:-1800}
DURATION=${DURATION:-7200}
LEAF_LIFETIME=${LEAF_LIFETIME-30m}
TOKEN_TTL=${TOKEN_TTL:-10m}
# shellcheck source=lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_init soak

# seconds_of DURATION: a Go-style duration of one unit (90s, 10m, 1h) in seconds.
seconds_of() {
  [[ $1 =~ ^([0-9]+)([smh])$ ]] || return 1
  case ${BASH_REMATCH[2]} in s) echo "${BASH_REMATCH[1]}" ;; m) echo $(( BASH_REMATCH[1] * 60 )) ;; h) echo $(( BASH_REMATCH[1] * 3600 )) ;; esac
}
case $mode in
  idle) seconds=$WINDOW var=WINDOW ;;
  churn) seconds=$DURATION var=DURATION ;;
  crash) ;;
  *) die "usage: soak.sh idle|churn|crash (got '$mode'); see the comment at its top" ;;
esac
if [[ $mode == crash ]]; then
  KILLS=${KILLS:-200}
  [[ $KILLS =~ ^[1-9][0-9]*$ ]] || die "KILLS must be a number of kills, got '$KILLS'"
  out=${LOGDIR:-$(mktemp -d "${TMPDIR:-/tmp}/kelp-soak-crash.XXXXXX")}/crash.log
  mkdir -p "$(dirname "$out")"
  echo "soak crash: $KILLS kills per datastore; the test's log goes to $out"
  status=0
  (cd "$repo" && CGO_ENABLED=0 KELP_BIN=$KELP KELP_CRASH_KILLS=$KILLS \
    go test -count=1 -timeout 0 -v -run '^TestCrash$' ./server/ >"$out" 2>&1) || status=$?
  grep -E -- '--- (PASS|FAIL)|[0-9]+ kills, ' "$out" | sed 's/^ *//'
  (( status == 0 )) || die "TestCrash failed (exit $status): see $out"
  exit 0
fi
[[ $seconds =~ ^[1-9][0-9]*$ && $seconds -ge 60 ]] || die "$var must be a number of seconds, at least 60 (one minute of the trace), got '$seconds'"
[[ -z $LEAF_LIFETIME ]] || (( $(seconds_of "$LEAF_LIFETIME" || echo 0) >= 60 )) ||
  die "LEAF_LIFETIME must be empty or a duration of at least 1m such as 30m, got '$LEAF_LIFETIME'"
(( $(seconds_of "$TOKEN_TTL" || echo 0) >= 1 )) || die "TOKEN_TTL must be a duration such as 10m, got '$TOKEN_TTL'"
[[ -d /dev/shm && $(stat -f -c %T /dev/shm) == tmpfs ]] || die "/dev/shm is no tmpfs: kelp's logs would count as its disk writes"
minutes=$(( seconds / 60 ))

case $mode in
  idle)
    nodes=(sqlite sqlite-disk etcd)
    declare -A node_args=([sqlite]="" [sqlite-disk]="--disable-ram-store" [etcd]="--cluster-init")
    ;;
  churn)
    nodes=(churn)
    declare -A node_args=([churn]="--snapshot-retention 2 --audit-log-maxsize 1 --audit-log-maxbackup 3")
    ;;
esac

work=$(mktemp -d "${TMPDIR:-/tmp}/kelp-soak-$mode.XXXXXX")
logs=$(mktemp -d "/dev/shm/kelp-soak-$mode.XXXXXX")
declare -A data=()
for node in "${nodes[@]}"; do data[$node]=$work/$node-data; done
bg_pids=()
cleanup() {
  local rc=$? node pid
  trap - EXIT
  set +e
  for pid in "${bg_pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  for node in "${nodes[@]}"; do
    if [[ -n ${holder[$node]:-} ]]; then
      in_node "$node" "$KELP" killall --data-dir "${data[$node]}" >/dev/null 2>&1
      [[ -n ${kelp_pid[$node]:-} ]] && stop_kelp "$node" # reaps it
    fi
    end_node "$node"
  done
  if [[ -n $LOGDIR ]]; then
    mkdir -p "$LOGDIR"
    cp "$logs"/* "$LOGDIR"/ 2>/dev/null
    cp "$work"/trace.tsv "$work"/*.timers "$LOGDIR"/ 2>/dev/null
    for node in "${nodes[@]}"; do
      cp "${data[$node]}/agent/containerd/containerd.log" "$LOGDIR/$node-containerd.log" 2>/dev/null
      [[ -d ${data[$node]}/audit ]] && cp -r "${data[$node]}/audit" "$LOGDIR/$node-audit" 2>/dev/null
    done
  fi
  rm -rf "$work" "$logs"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# Copies: the binary may be rebuilt during the hours of a run, and
# sample_node knows kelp's processes by their executable. Each server has
# its own, as on a machine of its own: a binary's pages that several
# processes map count in the PSS of each by a share, so a server sharing
# its copy with the others, or with kubectl, would look smaller.
declare -A bin=()
for node in "${nodes[@]}"; do
  bin[$node]=$work/kelp-$node
  cp "$KELP" "${bin[$node]}"
done
cp "$KELP" "$work/kelp"
KELP=$work/kelp

# kc NODE ARGS...: kubectl against the node's apiserver, from its network
# namespace only: it is no process of the node's.
kc() {
  local node=$1
  shift
  nsenter --target "${holder[$node]}" --net -- "$KELP" kubectl --kubeconfig "$work/$node.yaml" --request-timeout=5s "$@"
}
node_ready() { [[ $(kc "$1" get nodes -o 'jsonpath={.items[0].status.conditions[?(@.type=="Ready")].status}') == True ]]; }

# start_kelp NODE LOG: launches kelp server in the node.
start_kelp() {
  local node=$1 a
  read -ra a <<<"${node_args[$node]} ${KELP_ARGS:-}"
  if [[ $mode == churn ]]; then a+=(--snapshot-schedule-cron "*/15 * * * *" --audit-log-path "${data[$node]}/audit/audit.log"); fi
  KELP=${bin[$node]} launch "$node" "$logs/$2" server --data-dir "${data[$node]}" --write-kubeconfig "$work/$node.yaml" --debug "${a[@]}"
}

if [[ $mode == churn ]]; then
  build_test_image "$repo" "$work"
  if [[ -n $LEAF_LIFETIME ]]; then export KELP_TEST_LEAF_LIFETIME=$LEAF_LIFETIME; fi
fi

for node in "${nodes[@]}"; do start_node "$node" "$work"; done
# A first run stages the bundle, as an install does; then a fresh start.
for node in "${nodes[@]}"; do start_kelp "$node" "$node-stage.log"; done
for node in "${nodes[@]}"; do wait_for "the first start of $node" grep -q "kelp node is running" "$logs/$node-stage.log"; done
for node in "${nodes[@]}"; do
  stop_kelp "$node"
  in_node "$node" "$KELP" killall --data-dir "${data[$node]}" >/dev/null 2>&1 || die "kelp killall in the $node failed"
  find "${data[$node]}" -mindepth 1 -maxdepth 1 ! -name data -exec rm -rf {} +
  if [[ $mode == churn ]]; then mkdir -p "${data[$node]}/agent/images" && cp "$work/testapp.tar" "${data[$node]}/agent/images/"; fi
done
declare -A t_ready=()
t_launch=$(now_ms)
for node in "${nodes[@]}"; do start_kelp "$node" "$node.log"; done
for node in "${nodes[@]}"; do
  wait_for "node $node Ready" node_ready "$node"
  t_ready[$node]=$(( $(now_ms) - t_launch ))
done

bench_header "$mode, $minutes min once Ready, kelp server --debug${KELP_ARGS:+ $KELP_ARGS}"
for node in "${nodes[@]}"; do
  printf '  %-12s %-28s node Ready after %ss\n' "$node" "${node_args[$node]:-(default)}" "$(secs "${t_ready[$node]}")"
done
if [[ $mode == churn ]]; then
  echo "  --snapshot-schedule-cron '*/15 * * * *', KELP_TEST_LEAF_LIFETIME=${LEAF_LIFETIME:-(unset)}, join token --ttl $TOKEN_TTL"
fi

# --- what the nodes do -------------------------------------------------------

# ram_store DATADIR: the RAM store's directory in the node's mount namespace,
# as internal/layout RAMStore names it.
ram_store() { echo "/run/kelp/ram/$(printf %s "$1" | sha256sum | cut -c1-16)"; }
# size NODE PATH...: the sum of the sizes of the files in the node's mount
# namespace that exist, in bytes; - where none does.
size() {
  local node=$1 f sum='' s
  shift
  for f; do
    s=$(stat -c %s "/proc/${holder[$node]}/root$f" 2>/dev/null) || continue
    sum=$(( ${sum:-0} + s ))
  done
  echo "${sum:--}"
}
db_size() {
  local d=${data[$1]}/server/db
  if [[ $1 == etcd ]]; then size "$1" "$d/etcd/member/snap/db"; else size "$1" "$d/state.db" "$d/state.db-wal"; fi
}
ram_size() { local r; r=$(ram_store "${data[$1]}"); size "$1" "$r/state.db" "$r/state.db-wal"; }
mib() { awk -v b="$1" 'BEGIN { if (b == "-") print "-"; else printf "%.1f", b / 1048576 }'; }

# Lines of kelp's log that say a timer fired: kept in WORK/NODE.timers as
# they come, by log_timers (a byte offset into the log, so that each look
# reads only what is new).
readonly timer_lines='COMPACT compacted from|next look at the certificates|reissued certificate|snapshot taken|pruned snapshot'
declare -A log_off=()
log_timers() { # NODE: appends the new timer lines to WORK/NODE.timers, prints them
  local node=$1 f=$logs/$1.log size off
  size=$(stat -c %s "$f")
  off=${log_off[$node]:-0}
  log_off[$node]=$size
  tail -c +"$(( off + 1 ))" "$f" | head -c "$(( size - off ))" | { grep -aE "$timer_lines" || true; } | tee -a "$work/$node.timers"
}
# timer_kind: for each timer line on stdin its kind: compaction (datastore),
# compaction (RAM store) — its revisions start at the time in microseconds,
# internal/datastore/ramstore.go —, certificate look, certificate renewed,
# snapshot, snapshot pruned.
timer_kind() {
  awk '/COMPACT compacted from/ { match($0, /from [0-9]+/); print (substr($0, RSTART + 5, RLENGTH - 5) + 0 > 1e12 ? "compaction-ram" : "compaction"); next }
    /next look at the certificates/ { print "cert-look"; next }
    /reissued certificate/ { print "cert-renewed"; next }
    /snapshot taken/ { print "snapshot"; next }
    /pruned snapshot/ { print "snapshot-pruned" }'
}
declare -A compact_version=()
# etcd_compacted NODE: whether the apiserver's compact_rev_key moved since the
# last look: the apiserver writes it at each compaction interval and then
# compacts etcd to the revision it wrote the time before. etcd logs its
# compactions at Info, which kelp drops (internal/datastore/etcd.go).
etcd_compacted() {
  local v
  v=$(nsenter --target "${holder[$1]}" --net -- "$KELP" etcdctl --data-dir "${data[$1]}" get compact_rev_key -w json 2>/dev/null |
    grep -o '"version":[0-9]*' | cut -d: -f2) || true
  [[ -n $v ]] || return 1
  local before=${compact_version[$1]:-0}
  compact_version[$1]=$v
  (( v > before ))
}

readonly core='^(kelp-server|containerd|containerd-shim.*)$'
hz=$(getconf CLK_TCK)
declare -A t_prev=() cg_prev=() written=() written5=() rss0=() pss0=() rss=() pss=()
# take NODE M: samples the node at minute M (sample_node) into WORK/NODE.M and
# sets cpu and cg_cpu to its CPU % of one core since minute M-1, of the
# processes and of its cgroups.
take() {
  local node=$1 m=$2 t cg ticks wb r p
  alive "${kelp_pid[$node]}" || die "kelp on the $node exited at minute $m (its log: $logs/$node.log, copied to LOGDIR)"
  t=$(now_ms)
  cg=$(cgroup_cpu_us "$node")
  KELP=${bin[$node]} sample_node "$node" >"$work/$node.$m"
  if (( m == 0 )); then
    read -r ticks wb r p < <(sample_sum /dev/null "$work/$node.0" "$core")
  else
    read -r ticks wb r p < <(sample_sum "$work/$node.$(( m - 1 ))" "$work/$node.$m" "$core")
  fi
  rss[$node]=$r pss[$node]=$p
  if (( m == 0 )); then
    rss0[$node]=${rss[$node]} pss0[$node]=${pss[$node]} written[$node]=0 written5[$node]=0
  else
    cpu=$(awk -v t="$ticks" -v hz="$hz" -v ms=$(( t - t_prev[$node] )) 'BEGIN { printf "%.2f", 100 * t / hz / (ms / 1000) }')
    cg_cpu=$(awk -v us=$(( cg - cg_prev[$node] )) -v ms=$(( t - t_prev[$node] )) 'BEGIN { printf "%.2f", us / 10 / ms }')
    written[$node]=$(( written[$node] + wb )) written5[$node]=$(( written5[$node] + wb ))
    rm -f "$work/$node.$(( m - 1 ))"
  fi
  t_prev[$node]=$t cg_prev[$node]=$cg
}

# --- churn -------------------------------------------------------------------

if [[ $mode == churn ]]; then
  cat >"$work/app.yaml" <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 0
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - {name: web, image: docker.io/kelp-test/testapp:1.0, imagePullPolicy: IfNotPresent, args: [serve]}
YAML
  # event NAME MESSAGE: an Event about the ConfigMap soak.
  event() {
    local now
    now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    printf -- '---\napiVersion: v1\nkind: Event\nmetadata: {name: %s, namespace: default}\ninvolvedObject: {apiVersion: v1, kind: ConfigMap, name: soak, namespace: default}\nreason: SoakTick\nmessage: "%s"\ntype: Normal\nsource: {component: soak}\nfirstTimestamp: "%s"\nlastTimestamp: "%s"\ncount: 1\n' \
      "$1" "$2" "$now" "$now"
  }
  configmap() { printf -- '---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: soak, namespace: default}\ndata: {tick: "%s"}\n' "$1"; }
  { cat "$work/app.yaml"; configmap 0; event soak-ttl-probe "made at the start: it goes when the event TTL fires"; } >"$work/start.yaml"
  wait_for "applying the Deployment" kc churn apply -f "$work/start.yaml"
  token=$(nsenter --target "${holder[churn]}" --net -- "$KELP" token create --data-dir "${data[churn]}" --ttl "$TOKEN_TTL" --description soak) ||
    die "kelp token create failed"
  [[ $token =~ ([a-z0-9]{6})\.[a-z0-9]{16} ]] || die "kelp token create printed no bootstrap token: $token"
  token_secret=bootstrap-token-${BASH_REMATCH[1]}
  kc churn -n kube-system get secret "$token_secret" >/dev/null || die "the join token's Secret $token_secret is missing"

  # Drivers, in the background until cleanup: each sleeps in a child it
  # ends on TERM, so that none outlives the script.
  # shellcheck disable=SC2016 # expanded by the drivers' shells
  readonly driver_trap='trap '\''kill $! 2>/dev/null; exit 0'\'' TERM'
  (
    eval "$driver_trap"
    replicas=10
    while :; do
      kc churn scale deployment/web --replicas="$replicas" >/dev/null 2>&1 || echo "soak: scaling to $replicas failed at $(date -u +%T)" >&2
      replicas=$(( 10 - replicas ))
      sleep 60 & wait $!
    done
  ) &
  bg_pids+=($!)
  (
    eval "$driver_trap"
    i=0
    while :; do
      i=$(( i + 1 ))
      { configmap "$i"; event "soak-$i" "tick $i"; } | kc churn apply -f - >/dev/null 2>&1 || echo "soak: tick $i failed at $(date -u +%T)" >&2
      sleep 10 & wait $!
    done
  ) &
  bg_pids+=($!)
fi
declare -A gone=()
# churn_probes M: the timers found by looking rather than in kelp's log:
# the token's Secret gone (the controller-manager's token cleaner), the
# probe Event gone (the event TTL), audit logs rotated. Sets probes to the
# names of those that fired since the last look.
declare -A rotated=()
churn_probes() {
  local m=$1 f out=()
  # Not a pipe into grep: under pipefail, kubectl's failure (the one we
  # look for) would fail the pipe.
  if [[ -z ${gone[token]:-} && $(kc churn -n kube-system get secret "$token_secret" 2>&1) == *NotFound* ]]; then
    gone[token]=$m
    out+=(token-expired)
    echo "$m token-expired $token_secret" >>"$work/churn.timers"
  fi
  if [[ -z ${gone[event]:-} && $(kc churn get event soak-ttl-probe 2>&1) == *NotFound* ]]; then
    gone[event]=$m
    out+=(event-ttl)
    echo "$m event-ttl soak-ttl-probe" >>"$work/churn.timers"
  fi
  for f in "${data[churn]}"/audit/audit-*.log; do
    [[ -e $f && -z ${rotated[$f]:-} ]] || continue
    rotated[$f]=$m
    out+=(audit-rotated)
    echo "$m audit-rotated ${f##*/}" >>"$work/churn.timers"
  done
  probes=${out[*]}
}

# --- the window ----------------------------------------------------------------

# sleep_until MS: sleeps until now_ms is MS.
sleep_until() {
  local d=$(( $1 - $(now_ms) ))
  if (( d > 0 )); then sleep "$(secs "$d")"; fi
}
# row5 NODE M: the 5-minute figures of the node.
row5() {
  printf '        %-12s RSS %6.1f MiB  PSS %6.1f MiB  written %7.2f MB  state.db %7s MiB  RAM store %7s MiB\n' "$1" \
    "$(awk -v k="${rss[$1]}" 'BEGIN { print k / 1024 }')" "$(awk -v k="${pss[$1]}" 'BEGIN { print k / 1024 }')" \
    "$(awk -v b="${written5[$1]}" 'BEGIN { print b / 1e6 }')" "$(mib "$(db_size "$1")")" "$(mib "$(ram_size "$1")")"
  printf '%s\tmem\t%d\t%.1f\t%.1f\t%d\t%s\t%s\n' "$1" "$2" "$(awk -v k="${rss[$1]}" 'BEGIN { print k / 1024 }')" \
    "$(awk -v k="${pss[$1]}" 'BEGIN { print k / 1024 }')" "${written5[$1]}" "$(db_size "$1")" "$(ram_size "$1")" >>"$work/trace.tsv"
  written5[$1]=0
}

echo
echo "CPU per minute, % of one core: kelp + containerd + shims / the node's cgroups (pods, short-lived processes);"
echo "  C a compaction of the datastore, R one of the RAM store; every 5 minutes memory, writes and sizes"
printf '  %4s' min
for node in "${nodes[@]}"; do printf '  %-24s' "$node"; done
if [[ $mode == churn ]]; then printf '  timers'; fi
echo
t0=$(now_ms)
for node in "${nodes[@]}"; do
  take "$node" 0
  log_timers "$node" >/dev/null
  if [[ $node == etcd ]]; then etcd_compacted "$node" || true; fi
done
for ((m = 1; m <= minutes; m++)); do
  sleep_until $(( t0 + m * 60000 ))
  printf '  %4d' "$m"
  for node in "${nodes[@]}"; do
    take "$node" "$m"
    log_timers "$node" >"$work/new-timers" # not in a pipe: it moves its offset
    kinds=$(timer_kind <"$work/new-timers" | sort -u)
    marks=''
    if grep -qx compaction <<<"$kinds"; then marks+=C; fi
    if grep -qx compaction-ram <<<"$kinds"; then marks+=R; fi
    if [[ $node == etcd ]] && etcd_compacted "$node"; then
      marks+=C
      echo "$m compaction compact_rev_key version ${compact_version[$node]}" >>"$work/$node.timers"
    fi
    printf '  %6s / %6s %-8s' "$cpu" "$cg_cpu" "$marks"
    printf '%s\tcpu\t%d\t%s\t%s\t%s\n' "$node" "$m" "$cpu" "$cg_cpu" "$marks" >>"$work/trace.tsv"
    echo "$cpu" >>"$work/$node.cpu"
  done
  if [[ $mode == churn ]]; then
    churn_probes "$m"
    printf '  %s' "$(tr '\n' ' ' <<<"$kinds" | sed 's/compaction-ram//; s/compaction//') $probes"
  fi
  echo
  if (( m % 5 == 0 )); then
    for node in "${nodes[@]}"; do row5 "$node" "$m"; done
  fi
done
if (( minutes % 5 != 0 )); then
  for node in "${nodes[@]}"; do row5 "$node" "$minutes"; done
fi

# --- the end -------------------------------------------------------------------

echo
echo "over $minutes min:"
for node in "${nodes[@]}"; do
  awk -v node="$node" -v last=30 '
    { v[NR] = $1; sum += $1; if ($1 > max) { max = $1; at = NR } }
    END {
      from = NR > last ? NR - last + 1 : 1
      for (i = from; i <= NR; i++) tail += v[i]
      printf "  %-12s CPU mean %.2f %%, last %d min %.2f %%, highest %.2f %% (minute %d)\n", node, sum / NR, NR - from + 1, tail / (NR - from + 1), max, at
    }' "$work/$node.cpu"
  printf '  %-12s RSS %.1f -> %.1f MiB, PSS %.1f -> %.1f MiB, written %.2f MB, state.db %s MiB, RAM store %s MiB\n' "" \
    "$(awk -v k="${rss0[$node]}" 'BEGIN { print k / 1024 }')" "$(awk -v k="${rss[$node]}" 'BEGIN { print k / 1024 }')" \
    "$(awk -v k="${pss0[$node]}" 'BEGIN { print k / 1024 }')" "$(awk -v k="${pss[$node]}" 'BEGIN { print k / 1024 }')" \
    "$(awk -v b="${written[$node]}" 'BEGIN { print b / 1e6 }')" "$(mib "$(db_size "$node")")" "$(mib "$(ram_size "$node")")"
  if [[ $node == etcd ]]; then
    printf '  %-12s compactions (compact_rev_key moved) at minutes: %s\n' "" "$(awk '$2 == "compaction" { printf "%s ", $1 }' "$work/$node.timers")"
  fi
done

if [[ $mode == churn ]]; then
  # Least squares over the 5-minute samples from minute 60 on, x in hours.
  awk -F '\t' '$2 == "mem" && $3 >= 60 { n++; x = $3 / 60; sx += x; sxx += x * x; for (c = 4; c <= 5; c++) { sy[c] += $c; sxy[c] += x * $c } }
    END {
      if (n < 2) { print "  memory slope after the first hour: fewer than 2 samples from minute 60 on (the run is too short)"; exit }
      d = n * sxx - sx * sx
      printf "  memory slope after the first hour (%d samples): RSS %+.2f MiB/hour, PSS %+.2f MiB/hour\n", n,
        (n * sxy[4] - sx * sy[4]) / d, (n * sxy[5] - sx * sy[5]) / d
    }' "$work/trace.tsv"
  awk -v from=61 '{ sum += $1; if (NR >= from) { s2 += $1; n2++ } } END { if (n2) printf "  CPU mean from minute %d on: %.2f %%\n", from, s2 / n2 }' "$work/churn.cpu"

  echo
  echo "timers (minutes after the node was Ready; negative: as kelp started):"
  # minute_of LINE: the minute of a timer line of kelp's log, from its time=.
  t0_s=$(( t0 / 1000 ))
  timer_minutes() { # KIND: the minutes the timer of KIND fired at, from its log lines
    grep -a 'time=' "$work/churn.timers" | while read -r line; do
      [[ $(timer_kind <<<"$line") == "$1" && $line =~ time=\"([^\"]+)\" ]] || continue
      awk -v s=$(( $(date -d "${BASH_REMATCH[1]}" +%s) - t0_s )) 'BEGIN { printf "%.1f ", s / 60 }'
    done
  }
  probe_minutes() { awk -v k="$1" '$2 == k { printf "%s ", $1 }' "$work/churn.timers"; }
  timer() { # NAME MINUTES WHY-NOT
    if [[ -n $2 ]]; then printf '  %-34s %s\n' "$1" "$2"; else printf '  %-34s did not fire: %s\n' "$1" "$3"; fi
  }
  timer "compaction, datastore" "$(timer_minutes compaction)" "the apiserver compacts every 5 min (--etcd-compaction-interval)"
  timer "compaction, RAM store" "$(timer_minutes compaction-ram)" "as for the datastore"
  timer "certificate renewal loop, a look" "$(timer_minutes cert-look)" "it looks when a leaf is due, at the latest hourly (maxWait, internal/certrenew/loop.go)"
  timer "certificate renewed" "$(timer_minutes cert-renewed | awk '{ for (i = 1; i <= NF; i++) if (!seen[$i]++) printf "%s ", $i }')" \
    "leaves renew in the last third of their life; LEAF_LIFETIME=${LEAF_LIFETIME:-(a year)}"
  timer "join token expired (token cleaner)" "$(probe_minutes token-expired)" "--ttl $TOKEN_TTL, its Secret still there"
  timer "event TTL (probe Event gone)" "$(probe_minutes event-ttl)" "the apiserver's --event-ttl (1 h by default) is longer than the run"
  timer "scheduled snapshot" "$(timer_minutes snapshot)" "cron */15"
  timer "snapshot pruned (retention 2)" "$(timer_minutes snapshot-pruned)" "the third snapshot prunes the first"
  timer "audit log rotated (1 MiB)" "$(probe_minutes audit-rotated)" "less than 1 MiB of audit log"
fi
