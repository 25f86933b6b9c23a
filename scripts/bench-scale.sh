#!/usr/bin/env bash
# Measures the API of a kelp server as its datastore grows, SQLite against
# embedded etcd, and prints the figures; it never judges them. The machine is
# noisy: compare the etcd/sqlite ratios of one run, not figures across runs.
#
# Usage: scripts/bench-scale.sh     (as root, from anywhere; needs go)
#   SIZES="1000 10000 50000"  ConfigMaps of 1 KiB at which figures are taken,
#                ascending (SIZES="200" is a quick try)
#   BATCH=500    single-writer creates of the write figure at each size
#   WRITERS=8    concurrent writers of the fill between sizes
#   LISTS=20     LISTs of each kind per figure, watch cache on
#   DS_LISTS=3   the same, watch cache off (each whole LIST reads the datastore)
#   LIMIT=500    objects per page of the paged LISTs
#   GETS=200     GETs of one ConfigMap per figure
#   KELP=bin/kelp
#   LOGDIR=      if set, kelp's logs are copied there
#
# For SQLite, then embedded etcd (--cluster-init), one `kelp server
# --disable-agent` on a fresh data dir, in network, mount and cgroup
# namespaces of its own (lib/bench.sh start_node: 10.99.0.2 on a bridge,
# private /run/kelp and kubelet dirs). Reads and writes come from
# scripts/benchha (client-go, no client-side rate limit, protobuf for the
# reads), run in the node, on
# ConfigMaps of 1 KiB in the default namespace. A "ready" server is one whose
# /readyz answers ok and whose log says "kelp server is ready". At each size:
#   fill         WRITERS writers create ConfigMaps up to the size less BATCH
#   write        BATCH creates one after another, up to the size: median and
#                99th percentile of one create
#   RSS          kelp's VmRSS before the reads (it holds the datastore, the
#                apiserver and its watch cache), and after them
#   disk         the datastore's files: state.db and its WAL, or etcd's
#                bbolt db and its WAL files (preallocated 64 MiB each)
#   reads        `benchha list`, LISTS times each kind, in turns: paged (the
#                whole list in pages of LIMIT through continue tokens, as
#                kubectl does; one figure per whole list), quorum
#                (one LIST, resourceVersion ""), cache (resourceVersion "0"),
#                and GETS GETs of one ConfigMap (resourceVersion "": they
#                always read the datastore). Kubernetes (1.36 on) serves these
#                LISTs from the apiserver's watch cache, consistent ones after
#                asking the datastore for its current revision, so these
#                figures are the apiserver's more than the datastore's. The
#                apiserver's metrics say how many LISTs its watch cache
#                answered and how many went to the datastore (a consistent
#                read from the cache costs one small LIST there, for the
#                revision).
#   datastore    the server restarted with the watch cache of ConfigMaps off
#                (--kube-apiserver-arg=watch-cache-sizes=configmaps#0), so
#                every LIST and GET reads the datastore: start -> ready, and
#                the reads again, DS_LISTS times each; then restarted as
#                before (start -> ready) for the next size.
# Then the etcd/sqlite ratio of every figure.
set -euo pipefail

SIZES=${SIZES:-1000 10000 50000}
BATCH=${BATCH:-500}
WRITERS=${WRITERS:-8}
LISTS=${LISTS:-20}
DS_LISTS=${DS_LISTS:-3}
LIMIT=${LIMIT:-500}
GETS=${GETS:-200}
# shellcheck source=lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_init bench-scale unshare nsenter ip curl awk du go

for v in BATCH WRITERS LISTS DS_LISTS LIMIT GETS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"
done
read -ra sizes <<<"$SIZES"
(( ${#sizes[@]} > 0 )) || die "SIZES is empty: give ConfigMap counts, e.g. SIZES=\"1000 10000\""
prev=0
for s in "${sizes[@]}"; do
  [[ $s =~ ^[1-9][0-9]*$ ]] || die "SIZES must be positive integers, got '$s'"
  (( s > prev )) || die "SIZES must ascend, got '$SIZES'"
  prev=$s
done

readonly srv=server ip=10.99.0.2 cache_off=--kube-apiserver-arg=watch-cache-sizes=configmaps#0
work=$(mktemp -d "${TMPDIR:-/tmp}/kelp-bench-scale.XXXXXX")
dir='' # $work/<datastore>: data, kelp.yaml, *.log

# teardown: stops kelp and removes the node and its files.
teardown() {
  [[ -n ${kelp_pid[$srv]:-} ]] && stop_kelp "$srv"
  end_node "$srv"
  if [[ -n $LOGDIR && -n $dir ]]; then
    mkdir -p "$LOGDIR"
    for f in "$dir"/*.log; do
      [[ -f $f ]] && cp "$f" "$LOGDIR/$(basename "$dir")-$(basename "$f")"
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
  teardown
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

go build -C "$repo" -o "$work/benchha" ./scripts/benchha

ready() { # LOG
  [[ $(in_node "$srv" curl -sk --max-time 2 "https://$ip:6443/readyz") == ok ]] &&
    grep -q "kelp server is ready" "$1"
}

# start_server LOG EXTRA...: launches kelp server and waits until it is
# ready; sets took to the milliseconds since the launch.
start_server() {
  local log=$1 t0
  shift
  t0=$(now_ms)
  launch "$srv" "$log" server --data-dir "$dir/data" --write-kubeconfig "$dir/kelp.yaml" \
    --node-name "$srv" --disable-agent "$@"
  wait_for "kelp server ready" ready "$log"
  took=$(( $(now_ms) - t0 ))
}

# bench CMD ARGS...: benchha in the node; prints its key=value line.
bench() {
  local cmd=$1
  shift
  in_node "$srv" "$work/benchha" "$cmd" -kubeconfig "$dir/kelp.yaml" "$@"
}

field() { # KEY LINE: the value of KEY in a benchha key=value line
  awk -v k="$1" '{ for (i = 1; i <= NF; i++) if (index($i, k "=") == 1) print substr($i, length(k) + 2) }' <<<"$2"
}

rss_mib() { awk '$1 == "VmRSS:" { printf "%.0f", $2 / 1024 }' "/proc/${kelp_pid[$srv]}/status"; }

# disk: the datastore's files in MiB, apparent size (etcd's WAL files are
# preallocated, so theirs is what the disk holds).
disk() {
  local db=$dir/data/server/db
  if [[ $ds == sqlite ]]; then
    du -cb "$db"/state.db* | awk 'END { printf "%.1f", $1 / 1048576 }'
  else
    du -cb "$db/etcd/member/snap/db" "$db/etcd/member/wal" | awk 'END { printf "%.1f", $1 / 1048576 }'
  fi
}

# reads KEY LINES: runs benchha list LINES times a kind and keeps its
# figures in r[KEY,*].
declare -A r
reads() {
  local key=$1 line f
  line=$(bench list -n "$2" -limit "$LIMIT" -gets "$GETS") || die "the reads ($key) failed"
  for f in paged quorum cache get; do
    r[$key,${f}_p50]=$(field "${f}_p50_ms" "$line")
    r[$key,${f}_p99]=$(field "${f}_p99_ms" "$line")
  done
  for f in objects cache_lists storage_lists; do r[$key,$f]=$(field "$f" "$line"); done
}

print_reads() { # LABEL KEY
  printf '    %-30s paged %s/%s  quorum %s/%s  cache %s/%s  get %s/%s ms (p50/p99)\n' "$1" \
    "${r[$2,paged_p50]}" "${r[$2,paged_p99]}" "${r[$2,quorum_p50]}" "${r[$2,quorum_p99]}" \
    "${r[$2,cache_p50]}" "${r[$2,cache_p99]}" "${r[$2,get_p50]}" "${r[$2,get_p99]}"
  printf '    %-30s %s objects; LISTs of the watch cache %s, of the datastore %s\n' "" \
    "${r[$2,objects]}" "${r[$2,cache_lists]}" "${r[$2,storage_lists]}"
}

run() { # DATASTORE: sqlite or etcd
  ds=$1
  local extra=() have=0 size batch fill line k
  [[ $ds == etcd ]] && extra=(--cluster-init)
  dir=$work/$ds
  mkdir -p "$dir"
  start_node "$srv" "$dir"
  echo
  echo "$ds:"
  start_server "$dir/start.log" "${extra[@]}"
  printf '  %-32s %ss\n' "start -> ready (fresh)" "$(secs "$took")"
  for size in "${sizes[@]}"; do
    k=$ds,$size
    batch=$(( size - have < BATCH ? size - have : BATCH ))
    fill=$(( size - have - batch ))
    if (( fill > 0 )); then
      bench write -n "$fill" -writers "$WRITERS" -prefix "fill$size" >/dev/null || die "the fill to $size on $ds failed"
    fi
    line=$(bench write -n "$batch" -writers 1 -prefix "write$size") || die "the writes at $size on $ds failed"
    have=$size
    r[$k,write_p50]=$(field p50_ms "$line") r[$k,write_p99]=$(field p99_ms "$line")
    r[$k,rss]=$(rss_mib)
    r[$k,disk]=$(disk)
    reads "$k,c" "$LISTS"
    r[$k,rss_after]=$(rss_mib)
    echo "  $size ConfigMaps:"
    printf '    %-30s %s/%s ms (p50/p99 of %s creates)\n' "write" "${r[$k,write_p50]}" "${r[$k,write_p99]}" "$batch"
    printf '    %-30s %s MiB, %s MiB after the reads;  disk %s MiB\n' "RSS" "${r[$k,rss]}" "${r[$k,rss_after]}" "${r[$k,disk]}"
    print_reads "reads, watch cache" "$k,c"

    stop_kelp "$srv"
    start_server "$dir/nocache-$size.log" "${extra[@]}" "$cache_off"
    r[$k,start_nocache]=$took
    reads "$k,d" "$DS_LISTS"
    print_reads "reads, datastore" "$k,d"
    stop_kelp "$srv"
    start_server "$dir/restart-$size.log" "${extra[@]}"
    r[$k,start]=$took
    printf '    %-30s %ss, %ss with no watch cache of ConfigMaps\n' "start -> ready" \
      "$(secs "${r[$k,start]}")" "$(secs "${r[$k,start_nocache]}")"
  done
  teardown
}

bench_header "SIZES=\"$SIZES\" BATCH=$BATCH WRITERS=$WRITERS LISTS=$LISTS DS_LISTS=$DS_LISTS LIMIT=$LIMIT GETS=$GETS"
t_run=$(now_ms)
run sqlite
run etcd

echo
echo "summary (ms but RSS and disk; p50/p99; etcd/sqlite the ratio of the p50s, of RSS and disk):"
printf '  %-8s %-22s %17s %17s %12s\n' size figure sqlite etcd etcd/sqlite
row() { # SIZE LABEL KEY: a p50/p99 row
  local s=$1 a=${r[sqlite,$1,$3_p50]} b=${r[etcd,$1,$3_p50]}
  printf '  %-8s %-22s %17s %17s %12s\n' "$s" "$2" "$a/${r[sqlite,$s,$3_p99]}" "$b/${r[etcd,$s,$3_p99]}" \
    "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", b / a }')"
}
one() { # SIZE LABEL KEY: a row of one figure
  local a=${r[sqlite,$1,$3]} b=${r[etcd,$1,$3]}
  printf '  %-8s %-22s %17s %17s %12s\n' "$1" "$2" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", b / a }')"
}
for size in "${sizes[@]}"; do
  row "$size" write write
  for f in paged quorum cache get; do row "$size" "$f, cache" "c,$f"; done
  for f in paged quorum get; do row "$size" "$f, datastore" "d,$f"; done
  one "$size" "RSS (MiB)" rss
  one "$size" "RSS after reads (MiB)" rss_after
  one "$size" "disk (MiB)" disk
  one "$size" "start -> ready (ms)" start
done
echo "run time $(secs $(( $(now_ms) - t_run )))s"
