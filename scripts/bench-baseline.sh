#!/usr/bin/env bash
# Measures kelp against the same upstream components run as separate
# processes, one after the other in one run, and prints the figures and
# kelp ÷ baseline; it never judges them. The machine is noisy: compare the
# ratios of one run.
#
# Usage: scripts/bench-baseline.sh     (as root, from anywhere)
#   IDLE=300     seconds of each idle window
#   SETTLE=30    seconds between node Ready and the start of the idle window
#   KELP=bin/kelp  built from this tree (see "the flags" below)
#   KELP_ARGS=   more flags for every kelp server run
#   TRIMMED=1    also measure kelp with its own parts off (0: skip that run)
#   BASELINE_GOGC=25  GOGC of the separate Go components: kelp runs its
#                in-process components at 25 (main.go); empty: Go's 100
#   LOGDIR=      if set, every run's logs are copied there
#
# The baseline, built once into .cache/baseline/ARCH (rebuilt when go.mod,
# go.sum, the Go version or scripts/bundle's containerd change),
# static, CGO_ENABLED=0, -ldflags "-s -w" as kelp, from the module graph of
# this repo's go.mod, so every version is kelp's:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet
#                (k8s.io/kubernetes/cmd/...), kine (github.com/k3s-io/kine,
#                with all its drivers, as kine ships),
#   containerd   the one of kelp's staged bundle (kelp's plugins only,
#                scripts/bundle/containerd), which kelp runs too; for a kelp
#                from before the bundle had one (which ran `kelp containerd`),
#                scripts/bundle/containerd built into that cache.
#
# The flags: a first `kelp server --debug` (which also stages the bundle)
# writes the PKI, kubeconfigs, the kubelet's and containerd's configuration
# files and the CNI configuration into a data dir, and logs the command line
# it gives each upstream component (kubeargs.Log: msg="command line",
# component=NAME, args=JSON). The separate binaries get exactly those, on
# that data dir. kine, which kelp runs through kine's Go API, gets the
# command-line equivalent of kelp's settings (kine's defaults are kelp's),
# one kine per datastore socket the apiserver
# is given (its datastore and, on SQLite, its RAM store for Leases and
# Events), with kelp's SQLite parameters read from internal/datastore (the
# one thing taken from the source tree, not from the binary).
#
# Runs, each in a node of its own (lib/bench.sh start_node: network, mount,
# cgroup and UTS namespaces and cgroups of its own), each on that data dir with
# an empty datastore (the bundle, certificates, configuration and the pause
# image in containerd's root are kept):
#   kelp         kelp server
#   trimmed      kelp server with its own parts off: --disable coredns,
#                servicelb, local-storage, metrics-server, helm-controller,
#                --disable-network-policy, --disable-snapshots (the Service
#                proxy, the overlay, node addresses, the join API stay)
#   baseline     kine, kube-apiserver, kube-controller-manager,
#                kube-scheduler, containerd, kubelet, started in kelp's order,
#                each once the one before answers
# Figures: node Ready (launch of the first process until the Node's Ready
# condition is True), then after SETTLE, over IDLE s: RSS and PSS of every
# process of the node, CPU % of one core, bytes written to storage
# (/proc/PID/io write_bytes) per second, and the working set (the memory
# touched in the window: measure_node in lib/bench.sh). No workload pods run.
#
# The baseline leaves out what is kelp's own: the Service proxy, DNS, the
# overlay, network policy, servicelb, metrics, the Helm controller, local
# storage, snapshots, node addresses (its node keeps the uninitialized
# taint of --cloud-provider=external), the join API, kelp's system objects
# and addons, IP forwarding and masquerading. And two settings kelp makes
# in-process, which no flag gives a separate kube-apiserver: the identity
# lease renewed every minute instead of every 10 s, and the encryption
# configuration polled more often.
set -euo pipefail

IDLE=${IDLE:-300}
SETTLE=${SETTLE:-30}
TRIMMED=${TRIMMED:-1}
BASELINE_GOGC=${BASELINE_GOGC-25}
# shellcheck source=lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_init bench-baseline go jq curl unshare nsenter ip awk flock

[[ $IDLE =~ ^[1-9][0-9]*$ ]] || die "IDLE must be a positive integer (seconds), got '$IDLE'"
[[ $SETTLE =~ ^[0-9]+$ ]] || die "SETTLE must be an integer (seconds), got '$SETTLE'"
[[ $TRIMMED == [01] ]] || die "TRIMMED must be 0 or 1, got '$TRIMMED'"
[[ -z $BASELINE_GOGC || $BASELINE_GOGC =~ ^([1-9][0-9]*|off)$ ]] || die "BASELINE_GOGC must be a positive integer, off or empty, got '$BASELINE_GOGC'"

# --- the baseline's binaries --------------------------------------------------

arch=$(go env GOARCH)
cache=$repo/.cache/baseline/$arch
bin=$cache/bin
readonly components=(kube-apiserver kube-controller-manager kube-scheduler kubelet)

# build_baseline: the separate binaries into $bin, unless they are there
# from the same inputs. Two runs at once take turns.
build_baseline() (
  local kube_version ldflags inputs stamp tmp d
  mkdir -p "$cache"
  exec 8>"$cache/.lock"
  flock 8
  cd "$repo"
  kube_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
  ldflags="-s -w"
  # As kelp's build stamps them (scripts/build.sh): clients check them.
  for d in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $d.gitVersion=$kube_version -X $d.gitMajor=1 -X $d.gitMinor=$(cut -d. -f2 <<<"$kube_version")"
    ldflags+=" -X $d.gitTreeState=clean"
  done
  ldflags+=" -X github.com/k3s-io/kine/pkg/version.Version=$(go list -m -f '{{.Version}}' github.com/k3s-io/kine)"
  inputs=$(
    echo "arch=$arch ldflags=$ldflags"
    go version
    sha256sum go.mod go.sum
    find scripts/bundle/containerd scripts/bundle/go.mod scripts/bundle/go.sum -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  )
  stamp=$(sha256sum <<<"$inputs" | cut -d' ' -f1)
  [[ -f $cache/stamp && $(<"$cache/stamp") == "$stamp" && -d $bin ]] && return
  echo "bench-baseline: building the baseline's binaries into $bin (minutes when cold)" >&2
  tmp=$(mktemp -d "$cache/build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  # The flags of scripts/build.sh (no -trimpath), so the packages compiled
  # for kelp's builds are reused from the build cache.
  CGO_ENABLED=0 GOOS=linux GOARCH="$arch" go build -ldflags "$ldflags" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet github.com/k3s-io/kine
  # For a kelp whose bundle has no containerd of its own (before issue 15):
  # the bundle's containerd, built as scripts/bundle.sh builds it.
  (cd scripts/bundle && GOWORK=off GOFLAGS="${GOFLAGS:-} -trimpath -buildvcs=false" CGO_ENABLED=0 GOOS=linux GOARCH="$arch" \
    go build -tags urfave_cli_no_docs -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$(go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)" \
    -o "$tmp/" ./containerd)
  rm -rf "$bin"
  mv "$tmp" "$bin"
  echo "$stamp" >"$cache/stamp"
)
build_baseline

# --- the runs -----------------------------------------------------------------

work=$(mktemp -d "${TMPDIR:-/tmp}/kelp-bench-baseline.XXXXXX")
data=$work/data
cleanup() {
  local rc=$? node name
  trap - EXIT
  set +e
  for name in "${!procs[@]}"; do kill -KILL "${procs[$name]}" 2>/dev/null; done
  for node in "${!kelp_pid[@]}"; do kill -KILL "${kelp_pid[$node]}" 2>/dev/null; done
  for node in "${!holder[@]}"; do
    in_node "$node" "$KELP" killall --data-dir "$data" >/dev/null 2>&1
    end_node "$node"
  done
  if [[ -n $LOGDIR ]]; then
    mkdir -p "$LOGDIR" && cp "$work"/*.log "$LOGDIR"/ 2>/dev/null
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT

admin=$work/kelp.yaml
kubectl() { in_node "$here" "$KELP" kubectl --kubeconfig "$admin" --request-timeout=5s "$@"; }
node_ready() { [[ $(kubectl get nodes -o 'jsonpath={.items[0].status.conditions[?(@.type=="Ready")].status}') == True ]]; }

# new_node NAME: a fresh node (start_node) for the run NAME; sets here, the
# node of the run (not "node", which the functions of lib/bench.sh use). It
# has one name in every run, and so one hostname: the runs share a data dir,
# and kelp names its node after the hostname.
new_node() {
  here=bench
  mkdir -p "$work/ns-$1"
  start_node "$here" "$work/ns-$1"
}

# end_run: what still runs in the node goes (kelp killall: containers,
# mounts, interfaces), then the node; the datastore is emptied for the next
# run.
end_run() {
  in_node "$here" "$KELP" killall --data-dir "$data" >/dev/null 2>&1
  end_node "$here"
  rm -rf "$data/server/db"
}

# start_kelp LOG ARGS...: kelp server on the data dir, in the node.
start_kelp() {
  local log=$1
  shift
  # shellcheck disable=SC2086 # KELP_ARGS is a list of flags
  launch "$here" "$work/$log" server --data-dir "$data" --write-kubeconfig "$admin" ${KELP_ARGS:-} "$@"
}

# The first run: the data dir, and the command lines.
new_node prime
start_kelp prime.log --debug
wait_for "the first start" grep -q "kelp node is running" "$work/prime.log"
wait_for "the CNI configuration" compgen -G "$data/agent/etc/cni/net.d/*.conflist"
stop_kelp "$here"
end_run

# args_of COMPONENT: its command line from the first run, one argument a line.
args_of() {
  local line
  line=$(grep -F 'msg="command line"' "$work/prime.log" | grep -E "component=$1( |\$)" | tail -1) ||
    die "$KELP logged no command line of $1 with --debug: build it from this tree (scripts/build.sh)"
  # logrus quotes the field as Go does, which for this JSON is JSON too.
  sed -E 's/.* args=("([^"\\]|\\.)*").*/\1/' <<<"$line" | jq -r 'fromjson | .[]'
}
declare -A cmdline=()
for c in "${components[@]}"; do
  cmdline[$c]=$(args_of "$c")
done

# The apiserver's datastores: each kine kelp started, as "SOCKET ENDPOINT"
# (its debug line "starting kine"; logrus quotes a value with spaces or '&').
mapfile -t kines < <(grep -F 'msg="starting kine"' "$work/prime.log" |
  sed -E 's/.* endpoint="?([^" ]*)"? .*listen="?([^" ]*)"?.*/\2 \1/' | sort -u)
((${#kines[@]})) || die "$KELP logged no \"starting kine\" with --debug: is the datastore not SQLite, or is $KELP older than this script?"
staged=$(compgen -G "$data/data/*/bin" | head -1)
containerd_bin=$bin/containerd
[[ -x $staged/containerd ]] && containerd_bin=$staged/containerd

declare -A t_ready=() summary=()

# idle NAME: after SETTLE, measure_node over IDLE s into $work/NAME.idle;
# summary[NAME] holds the node's totals: processes RSS-MiB PSS-MiB CPU-%
# writes-KiB/s working-set-MiB.
idle() {
  sleep "$SETTLE"
  measure_node "$here" "$IDLE" "$work/$1.idle"
  summary[$1]=$(awk '$1 == "TOTAL" { $1 = ""; print substr($0, 2) }' "$work/$1.idle")
}

# run_kelp NAME ARGS...: a measured kelp server run.
run_kelp() {
  local name=$1 t0
  shift
  new_node "$name"
  t0=$(now_ms)
  start_kelp "$name.log" "$@"
  wait_for "node Ready ($name)" node_ready
  t_ready[$name]=$(( $(now_ms) - t0 ))
  idle "$name"
  stop_kelp "$here"
  end_run
}

# start_component NAME CMD...: launch_proc in the node, with BASELINE_GOGC
# unless it is containerd (kelp's own child runs at Go's default).
start_component() {
  local name=$1 env=(env "PATH=$data/agent/bin:$staged:$PATH")
  shift
  [[ $name == containerd || -z $BASELINE_GOGC ]] || env+=("GOGC=$BASELINE_GOGC")
  launch_proc "$name" "$here" "$work/baseline-$name.log" "${env[@]}" "$@"
}
healthz() { in_node "$here" curl -ksf --max-time 2 "https://127.0.0.1:$1/healthz"; }
flag_of() { sed -n "s/^--$2=//p" <<<"${cmdline[$1]}"; }

run_baseline() {
  local t0 kine sock endpoint dir i=0 c
  new_node baseline
  t0=$(now_ms)
  for kine in "${kines[@]}"; do
    sock=${kine%% *} endpoint=${kine#* }
    dir=$(dirname "${sock#unix://}")
    in_node "$here" mkdir -p -m 0700 "$dir"
    # kine's command-line defaults are kelp's settings (internal/datastore
    # kineConfig); kelp serves no kine metrics.
    start_component "kine-$((i++))" "$bin/kine" --listen-address="$sock" \
      --endpoint="$endpoint" --metrics-bind-address=0
    wait_for "kine at $sock" in_node "$here" test -S "${sock#unix://}"
  done
  for c in "${components[@]}"; do
    case $c in
    kubelet)
      start_component containerd "$containerd_bin" --config "$data/agent/etc/containerd/config.toml"
      wait_for "containerd" in_node "$here" "$KELP" ctr version
      ;;
    esac
    mapfile -t args <<<"${cmdline[$c]}"
    start_component "$c" "$bin/$c" "${args[@]}"
    case $c in
    kube-apiserver) wait_for "the apiserver" kubectl get --raw /readyz ;;
    kube-controller-manager | kube-scheduler) wait_for "$c" healthz "$(flag_of "$c" secure-port)" ;;
    kubelet) wait_for "node Ready (baseline)" node_ready ;;
    esac
  done
  t_ready[baseline]=$(( $(now_ms) - t0 ))
  idle baseline
  for c in kubelet containerd kube-scheduler kube-controller-manager kube-apiserver; do stop_proc "$c"; done
  for ((i--; i >= 0; i--)); do stop_proc "kine-$i"; done
  end_run
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
run_kelp kelp
run_baseline
runs=(kelp baseline)
if ((TRIMMED)); then
  run_kelp trimmed --disable coredns --disable servicelb --disable local-storage --disable metrics-server \
    --disable helm-controller --disable-network-policy --disable-snapshots
  runs+=(trimmed)
fi

# --- the figures ------------------------------------------------------------------

bench_header "load $load_before before${KELP_ARGS:+, kelp server $KELP_ARGS}"
echo "baseline: $("$bin/kube-apiserver" --version), kine $("$bin/kine" --version | awk '{print $3}'), $("$containerd_bin" --version | awk '{print $1, $3}'), GOGC=${BASELINE_GOGC:-100} (containerd: 100)"
echo "idle ${IDLE}s after node Ready + ${SETTLE}s, no workload pods; the whole node: every process of its namespaces"
for r in "${runs[@]}"; do
  echo
  echo "$r: node Ready $(secs "${t_ready[$r]}")s"
  print_measure "$work/$r.idle"
done

# ratio A B: A ÷ B for every figure, and A − B for the memory.
ratio() {
  local ra pa ca wa sa rb pb cb wb sb
  read -r _ ra pa ca wa sa <<<"${summary[$1]}"
  read -r _ rb pb cb wb sb <<<"${summary[$2]}"
  awk -v ta="${t_ready[$1]}" -v tb="${t_ready[$2]}" -v ra="$ra" -v rb="$rb" -v pa="$pa" -v pb="$pb" \
    -v ca="$ca" -v cb="$cb" -v wa="$wa" -v wb="$wb" -v sa="$sa" -v sb="$sb" -v a="$1" -v b="$2" '
    function r(x, y) { return y > 0 ? sprintf("%.2f", x / y) : "-" }
    BEGIN {
      printf "%-8s ÷ %-8s node Ready %s, RSS %s (%+.0f MiB), PSS %s (%+.0f MiB), CPU %s, writes %s, working set %s (%+.0f MiB)\n",
        a, b, r(ta, tb), r(ra, rb), ra - rb, r(pa, pb), pa - pb, r(ca, cb), r(wa, wb), r(sa, sb), sa - sb
    }'
}
echo
ratio kelp baseline
if ((TRIMMED)); then
  ratio trimmed baseline
  ratio kelp trimmed
  echo "  trimmed − baseline: what one binary saves or costs for the same components (but the proxy, the"
  echo "  overlay and node addresses, which trimmed still runs); kelp − trimmed: what kelp's own parts cost"
fi
echo "  RSS counts shared pages once per process; PSS shares them out. Left out of the baseline: see the"
echo "  header of $0"
