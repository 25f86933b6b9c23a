#!/usr/bin/env bash
# Measures a kelp control plane (`kelp server --disable-agent`) with SQLite and
# with embedded etcd, and prints the figures; it never judges them. The machine
# is noisy: compare the etcd/sqlite ratios of one run, not figures across runs.
#
# Usage: scripts/bench.sh          (as root, from anywhere)
#   RUNS=3     warm starts per datastore; min/median/max are printed
#   IDLE=60    seconds of the idle window on a running server
#   SETTLE=10  seconds between "ready" and the start of the idle window
#   KELP=bin/kelp  (of this repo; a relative path given is taken from the caller's cwd)
#   POLL=curl  /readyz client polled every 50 ms in kelp's netns: curl (with the
#              admin client certificate) or kubectl (`kelp kubectl`, ~0.1 s a call)
#   LOGDIR=    if set, kelp's logs are copied there; otherwise they are deleted
#
# Per datastore it does, each kelp in a network+mount namespace of its own:
#   cold start   fresh data dir: the runtime bundle is extracted, PKI created
#   first boot   fresh state and PKI, but the bundle already staged
#   warm start   RUNS restarts on the same data dir; the last one also idles
#                SETTLE+IDLE seconds and reports RSS, CPU and disk writes
#   stop         SIGTERM until the process is gone, after every start
# Start times run from launching kelp until /readyz answers "ok" ("/readyz"), and
# until the "kelp server is ready" log line appears, i.e. controller-manager and
# scheduler are up as well ("log").
# KELP_* variables are unset so that kelp runs on its defaults.
set -euo pipefail

RUNS=${RUNS:-3}
IDLE=${IDLE:-60}
SETTLE=${SETTLE:-10}
POLL=${POLL:-curl}
# shellcheck source=lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_init bench

readonly port=6443 poll_interval=0.05 ready_timeout_s=300
readonly datastores=(sqlite etcd)


[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "RUNS must be a positive integer, got '$RUNS'"
[[ $IDLE =~ ^[1-9][0-9]*$ ]] || die "IDLE must be a positive integer (seconds), got '$IDLE'"
[[ $SETTLE =~ ^[0-9]+$ ]] || die "SETTLE must be an integer (seconds), got '$SETTLE'"
[[ $POLL == curl || $POLL == kubectl ]] || die "POLL must be curl or kubectl, got '$POLL'"
for tool in unshare nsenter ip awk $([[ $POLL == curl ]] && echo curl); do
  command -v "$tool" >/dev/null || die "$tool is missing"
done
while read -r var; do unset "$var"; done < <(compgen -e | grep '^KELP_' || true)

clk_tck=$(getconf CLK_TCK)
work=$(mktemp -d "${TMPDIR:-/tmp}/kelp-bench.XXXXXX")

# --- cleanup: no kelp, namespace or temp dir survives us --------------------

cleanup() {
  local rc=$?
  trap - EXIT ERR
  trap '' INT TERM # a second Ctrl-C must not cut the cleanup short
  set +eu          # nor may a half-set variable
  if [[ -n ${kelp_pid[server]:-} ]]; then
    echo "bench: stopping kelp (pid ${kelp_pid[server]})" >&2
    stop_kelp server
  fi
  if [[ -n $LOGDIR && -d $work/logs ]]; then
    mkdir -p "$LOGDIR" && cp "$work"/logs/*.log "$LOGDIR"/ 2>/dev/null
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "bench: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
trap 'exit 130' INT
trap 'exit 143' TERM

# --- helpers ----------------------------------------------------------------

now_us() { echo "${EPOCHREALTIME/./}"; }

# cpu_ticks PID: utime+stime of the whole process, in clock ticks.
cpu_ticks() {
  local stat
  stat=$(cat "/proc/$1/stat")
  stat=${stat##*) }
  awk '{print $12 + $13}' <<<"$stat"
}
status_kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
io_field() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/io"; }

# in_own_netns PID: kelp's shell has left the root network namespace, so a
# client entering it cannot reach anything else listening on the port.
in_own_netns() {
  local theirs
  theirs=$(readlink "/proc/$1/ns/net" 2>/dev/null) || return 1
  [[ $theirs != "$(readlink /proc/self/ns/net)" ]]
}

readyz_ok() {
  local dir=$1 out
  if [[ $POLL == curl ]]; then
    local tls=$dir/data/server/tls
    out=$(nsenter -t "${kelp_pid[server]}" -n curl -sf --max-time 2 --cacert "$tls/server-ca.crt" \
      --cert "$tls/client-admin.crt" --key "$tls/client-admin.key" \
      "https://127.0.0.1:$port/readyz" 2>/dev/null) || return 1
  else
    out=$(nsenter -t "${kelp_pid[server]}" -n "$KELP" kubectl --kubeconfig "$dir/kubeconfig" \
      --request-timeout=2s get --raw /readyz 2>/dev/null) || return 1
  fi
  [[ $out == ok ]]
}

ms() { echo $(( ($1 + 500) / 1000 )); }

# stats_s MS...: "min/median/max" of millisecond figures, in seconds.
stats_s() {
  printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 }
    END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
          printf "%.2f/%.2f/%.2f", v[1] / 1000, m / 1000, v[NR] / 1000 }'
}
mib() { awk -v k="$1" 'BEGIN { printf "%.0f", k / 1024 }'; }
kib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1024 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }

# --- one kelp ---------------------------------------------------------------

# start_kelp DS DIR LABEL: launches kelp and waits until /readyz is ok and the
# ready line is logged. Sets t_api, t_log, t_stage (ms since launch, t_stage
# empty when nothing was extracted), took (kelp's own figure) and log.
start_kelp() {
  local ds=$1 dir=$2 label=$3
  log=$work/logs/$ds-$label.log
  local args=(server --disable-agent --config "$work/config.yaml" --data-dir "$dir/data"
    --write-kubeconfig "$dir/kubeconfig")
  [[ $ds == etcd ]] && args+=(--cluster-init)

  t_api='' t_log='' t_stage='' took='' lines_at_ready=''
  local t0 now pid
  t0=$(now_us)
  # sh -e: a namespace that cannot be set up must not become a kelp in the
  # root namespace.
  # shellcheck disable=SC2016 # expanded by sh
  unshare --net --mount --propagation private sh -ec '
    ip link set lo up
    ip link add br0 type bridge
    ip addr add 10.99.0.2/24 dev br0
    ip link set br0 up
    exec "$0" "$@"' "$KELP" "${args[@]}" >"$log" 2>&1 &
  kelp_pid[server]=$!
  pid=${kelp_pid[server]}

  while :; do
    now=$(now_us)
    if ! alive "$pid"; then
      tail -n 30 "$log" >&2
      die "$ds $label: kelp exited before it was ready (log above)"
    fi
    if (( now - t0 > ready_timeout_s * 1000000 )); then
      tail -n 30 "$log" >&2
      die "$ds $label: not ready after ${ready_timeout_s}s (log above)"
    fi
    if [[ -z $t_stage ]] && grep -q 'Staged runtime bundle' "$log"; then
      t_stage=$(ms $((now - t0)))
    fi
    if [[ -z $t_api ]] && in_own_netns "$pid" && readyz_ok "$dir"; then
      t_api=$(ms $(($(now_us) - t0)))
    fi
    if [[ -z $t_log ]] && grep -q 'kelp server is ready' "$log"; then
      t_log=$(ms $((now - t0)))
    fi
    [[ -n $t_api && -n $t_log ]] && break
    sleep "$poll_interval"
  done
  took=$(grep -m1 'kelp server is ready' "$log" | sed -n 's/.*took=\([^ ]*\).*/\1/p')
  lines_at_ready=$(wc -l <"$log")
}

# stop_timed: stops kelp (stop_kelp) and sets t_stop (ms from SIGTERM until it
# is gone), stop_rc and stop_note.
stop_timed() {
  local t0
  lines_at_term=$(wc -l <"$log")
  t0=$(now_us)
  stop_kelp server
  t_stop=$(ms $(($(now_us) - t0)))
  stop_note=
  (( stop_rc != 137 )) || stop_note="SIGKILLed after 30 s"
  grep -q 'kelp server stopped' "$log" || stop_note+="${stop_note:+, }no \"kelp server stopped\" line"
  (( t_stop <= 10000 )) || stop_note+="${stop_note:+, }slower than 10 s"
  (( stop_rc == 0 )) || stop_note+="${stop_note:+, }exit status $stop_rc"
  # Log lines by phase, for the notes at the end.
  phases+=("$log ${lines_at_ready:-$lines_at_term} $lines_at_term")
}

# idle_window: lets the running kelp settle, then samples it over IDLE seconds.
idle_window() {
  local pid=${kelp_pid[server]} cpu0 cpu1 wb0 wb1 t0 t1
  sleep "$SETTLE"
  cpu0=$(cpu_ticks "$pid") wb0=$(io_field "$pid" write_bytes) t0=$(now_us)
  sleep "$IDLE"
  alive "$pid" || die "kelp died during the idle window"
  cpu1=$(cpu_ticks "$pid") wb1=$(io_field "$pid" write_bytes) t1=$(now_us)
  idle_rss=$(status_kb "$pid" VmRSS)
  idle_hwm=$(status_kb "$pid" VmHWM)
  idle_anon=$(status_kb "$pid" RssAnon)
  idle_cpu=$(awk -v d=$((cpu1 - cpu0)) -v hz="$clk_tck" -v us=$((t1 - t0)) 'BEGIN { printf "%.1f", 100 * d / hz / (us / 1e6) }')
  idle_wbps=$(awk -v d=$((wb1 - wb0)) -v us=$((t1 - t0)) 'BEGIN { printf "%.0f", d / (us / 1e6) }')
}

declare -A r # results, keyed "ds,figure"
phases=()

report_start() {
  local ds=$1 label=$2
  printf '%-6s %-11s /readyz %6ss  log %6ss (took=%s)%s  RSS %s MiB\n' "$ds" "$label" \
    "$(secs "$t_api")" "$(secs "$t_log")" "${took:--}" \
    "${t_stage:+  bundle staged at $(secs "$t_stage")s}" "$(( $(status_kb "${kelp_pid[server]}" VmRSS) / 1024 ))"
}
report_stop() {
  printf '%-6s %-11s stop %ss%s\n' "$1" "$2" "$(secs "$t_stop")" "${stop_note:+  ($stop_note)}"
}

# --- the runs ---------------------------------------------------------------

mkdir -p "$work/logs"
: >"$work/config.yaml"
fs=$(stat -f -c %T "$work")
bench_header ""
echo "RUNS=$RUNS IDLE=${IDLE}s SETTLE=${SETTLE}s POLL=$POLL (/readyz every ${poll_interval}s in kelp's netns), data dir on $fs ($work)"
[[ $fs == tmpfs ]] && echo "note: data dir on tmpfs: write_bytes counts no disk writes there"
others=$( (pgrep -x kelp || true) | wc -l)
(( others == 0 )) || echo "note: $others other kelp process(es) running: figures will be noisier"
echo

for ds in "${datastores[@]}"; do
  dir=$work/$ds
  mkdir -p "$dir"

  start_kelp "$ds" "$dir" cold
  report_start "$ds" cold
  r[$ds,cold_api]=$t_api r[$ds,cold_log]=$t_log r[$ds,stage]=$t_stage
  stop_timed
  report_stop "$ds" cold
  stops=("$t_stop")

  # Fresh state and PKI, bundle kept: the first boot of an installed node.
  rm -rf "$dir/data/server" "$dir/kubeconfig"
  start_kelp "$ds" "$dir" first-boot
  report_start "$ds" first-boot
  r[$ds,first_api]=$t_api r[$ds,first_log]=$t_log
  stop_timed
  report_stop "$ds" first-boot
  stops+=("$t_stop")
  r[$ds,stops]="${stops[*]}"
done

for run in $(seq 1 "$RUNS"); do
  for ds in "${datastores[@]}"; do
    start_kelp "$ds" "$work/$ds" "warm-$run"
    report_start "$ds" "warm-$run"
    r[$ds,warm_api]+="$t_api " r[$ds,warm_log]+="$t_log "
    if (( run == RUNS )); then
      idle_window
      r[$ds,rss]=$idle_rss r[$ds,hwm]=$idle_hwm r[$ds,anon]=$idle_anon
      r[$ds,cpu]=$idle_cpu r[$ds,wbps]=$idle_wbps
      printf '%-6s %-11s idle %ss: RSS %s MiB (anon %s), HWM %s MiB, CPU %s%% of a core, writes %s KiB/s\n' \
        "$ds" "warm-$run" "$IDLE" $((idle_rss / 1024)) $((idle_anon / 1024)) $((idle_hwm / 1024)) \
        "$idle_cpu" "$(kib "$idle_wbps")"
    fi
    stop_timed
    report_stop "$ds" "warm-$run"
    r[$ds,stops]+=" $t_stop"
  done
done

# --- summary ----------------------------------------------------------------

row() { printf '%-37s %-17s %-17s %s\n' "$@"; }
echo
echo "== summary: times in s (min/median/max; ratio of medians), idle = ${IDLE}s window after ${SETTLE}s settling =="
echo "   /readyz: launch until /readyz says ok; log: until \"kelp server is ready\" (controller-manager and scheduler up too)"
row "" sqlite etcd etcd/sqlite
for kind in api log; do
  name=$([[ $kind == api ]] && echo "/readyz" || echo "log")
  row "cold start (extracts bundle) $name" "$(secs "${r[sqlite,cold_$kind]}")" "$(secs "${r[etcd,cold_$kind]}")" \
    "$(ratio "${r[etcd,cold_$kind]}" "${r[sqlite,cold_$kind]}")"
done
row "  bundle staged, since launch" "$(secs "${r[sqlite,stage]}")" "$(secs "${r[etcd,stage]}")" \
  "$(ratio "${r[etcd,stage]}" "${r[sqlite,stage]}")"
for kind in api log; do
  name=$([[ $kind == api ]] && echo "/readyz" || echo "log")
  row "first boot (bundle staged) $name" "$(secs "${r[sqlite,first_$kind]}")" "$(secs "${r[etcd,first_$kind]}")" \
    "$(ratio "${r[etcd,first_$kind]}" "${r[sqlite,first_$kind]}")"
done
for kind in api log; do
  name=$([[ $kind == api ]] && echo "/readyz" || echo "log")
  # shellcheck disable=SC2086 # word lists of numbers
  row "warm start x$RUNS $name" "$(stats_s ${r[sqlite,warm_$kind]})" "$(stats_s ${r[etcd,warm_$kind]})" \
    "$(ratio "$(printf '%s\n' ${r[etcd,warm_$kind]} | median)" "$(printf '%s\n' ${r[sqlite,warm_$kind]} | median)")"
done
# shellcheck disable=SC2086
row "stop (SIGTERM to gone) x$((RUNS + 2))" "$(stats_s ${r[sqlite,stops]})" "$(stats_s ${r[etcd,stops]})" \
  "$(ratio "$(printf '%s\n' ${r[etcd,stops]} | median)" "$(printf '%s\n' ${r[sqlite,stops]} | median)")"
row "idle VmRSS (MiB)" "$(mib "${r[sqlite,rss]}")" "$(mib "${r[etcd,rss]}")" "$(ratio "${r[etcd,rss]}" "${r[sqlite,rss]}")"
row "idle RssAnon (MiB)" "$(mib "${r[sqlite,anon]}")" "$(mib "${r[etcd,anon]}")" "$(ratio "${r[etcd,anon]}" "${r[sqlite,anon]}")"
row "idle VmHWM (MiB)" "$(mib "${r[sqlite,hwm]}")" "$(mib "${r[etcd,hwm]}")" "$(ratio "${r[etcd,hwm]}" "${r[sqlite,hwm]}")"
row "idle CPU (% of one core)" "${r[sqlite,cpu]}" "${r[etcd,cpu]}" "$(ratio "${r[etcd,cpu]}" "${r[sqlite,cpu]}")"
row "idle disk writes (KiB/s)" "$(kib "${r[sqlite,wbps]}")" "$(kib "${r[etcd,wbps]}")" "$(ratio "${r[etcd,wbps]}" "${r[sqlite,wbps]}")"
echo
echo "goals, for context: ready <= 5 s with a staged bundle (first boot and warm start);"
echo "  control-plane idle RSS <= 250 MB (k3s's whole server idles at 500+ MB)."
echo "disk writes: /proc/PID/io write_bytes, i.e. bytes the whole kelp process dirtied for"
echo "  the disk (datastore, logs to files, anything else); journal and fsync cost not included."

# Errors and warnings in kelp's logs, by phase, deduplicated across all runs.
echo
echo "== kelp log: error/warning/fatal lines by phase (count, datastore, message) =="
for entry in "${phases[@]}"; do
  read -r file at_ready at_term <<<"$entry"
  ds=$(basename "$file"); ds=${ds%%-*}
  awk -v ds="$ds" -v work="$work" -v r="$at_ready" -v t="$at_term" '
    {
      level = ""; msg = ""
      if (match($0, /level=[a-z]+/)) level = substr($0, RSTART + 6, RLENGTH - 6)
      else if (match($0, /"level":"[a-z]+"/)) level = substr($0, RSTART + 9, RLENGTH - 10)
      if (match($0, /msg="([^"\\]|\\.)*"/)) msg = substr($0, RSTART + 5, RLENGTH - 6)
      else if (match($0, /"msg":"([^"\\]|\\.)*"/)) msg = substr($0, RSTART + 7, RLENGTH - 8)
      if (level == "" && $0 ~ /panic|fatal|[Ee]rror/) { level = "raw"; msg = $0 }
      if (level !~ /^(warn|warning|error|fatal|panic|raw)$/) next
      if (match($0, / error="([^"\\]|\\.)*"/)) msg = msg " [" substr($0, RSTART + 8, RLENGTH - 9) "]"
      else if (match($0, /"error":"([^"\\]|\\.)*"/)) msg = msg " [" substr($0, RSTART + 9, RLENGTH - 10) "]"
      gsub(work, "$WORK", msg); gsub(/0x[0-9a-f]+/, "0x?", msg)
      phase = NR <= r ? "1start" : (NR <= t ? "2running" : "3stop")
      print phase "\t" ds "\t" level "\t" substr(msg, 1, 160)
    }' "$file"
done | sort | uniq -c | sort -k2,2 -k1,1nr | awk -F'\t' '
  { split($1, a, " "); printf "%-7s %5d  %-6s %-5s %s\n", substr(a[2], 2), a[1], $2, $3, $4 }'
if [[ -n $LOGDIR ]]; then echo "(full logs are copied to $LOGDIR)"; fi
