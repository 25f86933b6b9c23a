#!/usr/bin/env bash
# Measures `kelp cluster` and prints the figures; it never judges them. The
# machine is noisy: compare figures of one run.
#
# Usage: scripts/bench-cluster.sh     (as root, from anywhere)
#   ROUNDS=3   rounds of each timed figure; the medians are printed
#   KELP=bin/kelp
#
# The clusters are made on a "host" that is a node of lib/bench.sh
# (start_node: network, mount and cgroup namespaces of its own), so the
# machine's own namespaces are never touched; `kelp cluster` makes its nodes
# inside it as it would on a machine.
# Figures:
#   create -> Ready       `kelp cluster create --agents 2` (a server and two
#                         agents, the test image given with --image) until it
#                         returns, which it does once all 3 Nodes are Ready
#   create -> app by DNS  the same create, then a Deployment of 3 pods, one
#                         per node, and its Service; until a pod on every
#                         node got an answer from the Service by its DNS name
#                         (a Job per node running testapp firstanswer)
#   delete                `kelp cluster delete` of that cluster
#   fork -> Ready         `kelp cluster create --from` a snapshot of a 3-node
#                         cluster holding 20 CRDs, a Helm release (a chart in
#                         a HelmChart's chartContent) and the test image,
#                         until all 3 Nodes are Ready; and the save itself
#   memory                PSS (MiB) of every process of a 3-node cluster
#                         (its cgroups: kelp, containerd, shims, pods) and of
#                         its forwarder, after 60 s of quiet; against 3 x a
#                         cluster of one server measured the same way
set -euo pipefail

ROUNDS=${ROUNDS:-3}
# shellcheck source=lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_init bench-cluster


work=$(mktemp -d /tmp/kelp-bench-cluster.XXXXXX)
root=$work/clusters
cleanup() {
  if [[ -n ${holder[host]:-} ]]; then
    in_node host env KELP_CLUSTER_ROOT="$root" "$KELP" cluster delete --all >/dev/null 2>&1 || true
    end_node host
  fi
  rm -rf "$work"
}
trap cleanup EXIT

build_test_image "$repo" "$work" >/dev/null
start_node host "$work"

kc() { in_node host env KELP_CLUSTER_ROOT="$root" "$KELP" cluster "$@"; }

apply() { # CLUSTER: the manifest on stdin
  cat >"$work/manifest.yaml"
  kc kubectl "$1" apply -f "$work/manifest.yaml" >/dev/null
}

app_manifest() {
  cat <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: app}
spec:
  replicas: 3
  selector: {matchLabels: {app: app}}
  template:
    metadata: {labels: {app: app}}
    spec:
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: app}}}
      containers:
      - {name: app, image: docker.io/kelp-test/testapp:1.0, imagePullPolicy: Never, args: [serve]}
---
apiVersion: v1
kind: Service
metadata: {name: app}
spec:
  selector: {app: app}
  ports: [{port: 8080}]
EOF
  for node in server-1 agent-1 agent-2; do
    cat <<EOF
---
apiVersion: batch/v1
kind: Job
metadata: {name: dns-$node}
spec:
  backoffLimit: 10
  template:
    spec:
      restartPolicy: OnFailure
      nodeSelector: {kubernetes.io/hostname: $node}
      containers:
      - {name: get, image: docker.io/kelp-test/testapp:1.0, imagePullPolicy: Never, args: [firstanswer, "http://app.default.svc.cluster.local:8080/"]}
EOF
  done
}

# cluster_pss NAME: PSS in MiB of every process in the cluster's cgroups,
# and of its forwarder.
cluster_pss() {
  local pids
  # shellcheck disable=SC2016 # expanded by the node's sh
  pids=$(in_node host sh -c 'for d in /sys/fs/cgroup/memory/kelp-cluster-$1 /sys/fs/cgroup/kelp-cluster-$1; do
      [ -d "$d" ] && find "$d" -name cgroup.procs -exec cat {} + && break
    done; pgrep -f "cluster forward" || true' pss "$1" | sort -u)
  for p in $pids; do
    awk '/^Pss:/ { print $2 }' "/proc/$p/smaps_rollup" 2>/dev/null || true
  done | awk '{ kib += $1 } END { printf "%.0f", kib / 1024 }'
}

declare -a ready=() app=() deletes=() forks=() saves=()
for ((round = 1; round <= ROUNDS; round++)); do
  start=$(now_ms)
  kc create bench --agents 2 --image "$work/testapp.tar" --wait 5m >/dev/null
  ready+=($(( $(now_ms) - start )))
  app_manifest | apply bench
  for node in server-1 agent-1 agent-2; do
    kc kubectl bench wait --for=condition=complete --timeout=300s "job/dns-$node" >/dev/null
  done
  app+=($(( $(now_ms) - start )))
  start=$(now_ms)
  kc delete bench >/dev/null
  deletes+=($(( $(now_ms) - start )))
done

# A prepared cluster: 20 CRDs, a Helm release, the test image.
kc create prepared --agents 2 --image "$work/testapp.tar" --wait 5m >/dev/null
for i in $(seq 1 20); do
  cat <<EOF
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets$i.bench.kelp.io}
spec:
  group: bench.kelp.io
  scope: Namespaced
  names: {plural: widgets$i, singular: widget$i, kind: Widget$i}
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
EOF
done | apply prepared
mkdir -p "$work/chart/templates"
printf 'apiVersion: v2\nname: demo\nversion: 1.0.0\n' >"$work/chart/Chart.yaml"
printf 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: demo}\ndata: {release: "{{ .Release.Name }}"}\n' >"$work/chart/templates/cm.yaml"
tar -C "$work" -czf "$work/demo.tgz" chart
apply prepared <<EOF
apiVersion: helm.cattle.io/v1
kind: HelmChart
metadata: {name: demo, namespace: kube-system}
spec:
  targetNamespace: default
  chartContent: $(base64 -w0 "$work/demo.tgz")
EOF
wait_for "the Helm release of the prepared cluster" kc kubectl prepared get configmap demo
start=$(now_ms)
kc save prepared snap >/dev/null
saves+=($(( $(now_ms) - start )))
kc delete prepared >/dev/null
for ((round = 1; round <= ROUNDS; round++)); do
  start=$(now_ms)
  kc create fork --from snap --wait 5m >/dev/null
  forks+=($(( $(now_ms) - start )))
  kc kubectl fork get configmap demo >/dev/null || die "the fork has no Helm release"
  kc delete fork >/dev/null
done

kc create mem --agents 2 --image "$work/testapp.tar" --wait 5m >/dev/null
app_manifest | apply mem
sleep 60
mem3=$(cluster_pss mem)
kc delete mem >/dev/null
kc create one --image "$work/testapp.tar" --wait 5m >/dev/null
sleep 60
mem1=$(cluster_pss one)
kc delete one >/dev/null

med() { printf '%s\n' "$@" | median; }
bench_header "kelp cluster, $ROUNDS rounds (medians, seconds)"
echo "  create 1+2 -> Ready        $(secs "$(med "${ready[@]}")")"
echo "  create 1+2 -> app by DNS   $(secs "$(med "${app[@]}")")"
echo "  delete                     $(secs "$(med "${deletes[@]}")")"
echo "  save (3 nodes, running)    $(secs "${saves[0]}")"
echo "  fork 1+2 -> Ready          $(secs "$(med "${forks[@]}")")"
echo "memory (PSS, MiB, after 60 s)"
echo "  3-node cluster with app    $mem3"
echo "  1-node cluster             $mem1   (x3 = $((mem1 * 3)), ratio $(awk -v a="$mem3" -v b="$mem1" 'BEGIN { printf "%.2f", a / (3 * b) }'))"
