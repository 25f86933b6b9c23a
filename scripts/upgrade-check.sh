#!/usr/bin/env bash
# Proves a real upgrade: a cluster made by an earlier kelp is upgraded in
# place to this tree's, and everything it held is still there. Not in CI:
# it builds a second kelp (about 7 minutes cold, 15 on a loaded machine).
#
# Usage: scripts/upgrade-check.sh [swap|fleet]   (as root, from anywhere)
#   KELP=bin/kelp  the kelp to upgrade to (build it with scripts/build.sh)
#
# swap (the default): the binary swapped by hand.
#   FROM=7fb5335   the earlier kelp's git revision (default: the last that
#                  ran Kubernetes v1.36); it is built in a worktree
# The cluster is a `kelp cluster` (a server and an agent in namespaces of
# their own on this machine) made by the earlier kelp, holding a CRD and
# one of its objects, a Secret encrypted at rest, a PVC whose
# volume holds a file, and a Deployment using it. The cluster is stopped,
# its kelp replaced by the new one, and started: the new kelp must be
# Ready on both nodes, report its Kubernetes version, and hold all of it.
# The server takes its pre-upgrade snapshot on the way.
#
# fleet: the upgrade done from inside the cluster, by an Upgrade
# (kelp.io/v1). The earlier kelp is this tree's committed HEAD built on
# the Kubernetes before the move to the new one (MOVE=f12a701, Kubernetes
# v1.37.2): in a worktree, go.mod as before MOVE with the modules required
# since added, and MOVE's other changes that follow the dependencies
# (scripts/bundle's modules, ctr and the bundle's containerd on urfave/cli
# v2) undone. A commit before the fleet upgrades (such as 7fb5335) has no
# executor to upgrade, and kelp cluster's nodes refuse fleet upgrades
# (they share the machine's kelp), so the cluster is the one of
# TestFleetUpgradeFromEarlier (server/fleetfrom_test.go): a server with
# its node and an agent, each installed as install.sh does, in network
# namespaces of their own; the test prints each check and the rollout's
# timings.
#   FROM_KELP=path an earlier kelp built already (skips the build)
#   MOVE=f12a701   the commit whose dependency move is undone
set -euo pipefail

die() { echo "upgrade-check: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "run as root"
repo=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-swap}
[[ $# -le 1 && $mode =~ ^(swap|fleet)$ ]] || die "usage: scripts/upgrade-check.sh [swap|fleet]"
KELP=$(readlink -f "${KELP:-$repo/bin/kelp}")
[[ -x $KELP ]] || die "$KELP is missing: build it with scripts/build.sh"

work=$(mktemp -d "${TMPDIR:-/tmp}/kelp-upgrade-check.XXXXXX")
cleanup() {
  local rc=$?
  trap - EXIT
  set +e
  [[ -x $work/kelp ]] && "$work/kelp" cluster delete check --root "$work/root" >/dev/null 2>&1
  git -C "$repo" worktree remove --force "$work/src" >/dev/null 2>&1
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT

# build_before_move builds this tree's committed HEAD on the dependencies
# from before commit MOVE into $work/from-kelp.
build_before_move() {
  local move=$1 m
  git -C "$repo" rev-parse --verify -q "$move^{commit}" >/dev/null || die "MOVE=$move is not a commit of this repository"
  echo "building the earlier kelp: HEAD ($(git -C "$repo" rev-parse --short HEAD)) on the modules from before $move"
  git -C "$repo" worktree add -q --detach "$work/src" HEAD
  cp -a "$repo/.cache" "$work/src/" 2>/dev/null || true
  (
    cd "$work/src"
    # go.mod as before the move, with what HEAD requires since (modules
    # added, or at a newer version); go.sum of both, for Go to choose.
    git checkout -q "$move^" -- go.mod
    { git show "$move^:go.sum" && git show HEAD:go.sum; } | sort -u >go.sum
    for m in $(git diff "$move" HEAD -- go.mod | sed -n 's/^+\t\([^ ]*\) \(v[^ ]*\).*/\1@\2/p'); do
      go mod edit -require="$m"
    done
    # The rest of the move but its documentation: the changes that follow
    # the dependencies.
    git diff "$move" "$move^" -- . ':(exclude)go.mod' ':(exclude)go.sum' ':(exclude)*.md' | git apply --3way --whitespace=nowarn
  ) >"$work/build.log" 2>&1 || die "undoing $move's dependency move on HEAD failed: $(tail -5 "$work/build.log")"
  (cd "$work/src" && scripts/build.sh amd64 "$work/from-kelp" >>"$work/build.log" 2>&1) ||
    die "the build of HEAD before $move failed: $(tail -5 "$work/build.log")"
}

# fleet upgrades a cluster made by an earlier kelp by an Upgrade: the
# cluster test TestFleetUpgradeFromEarlier, its checks and timings shown.
fleet() {
  local from start rc=0
  start=$SECONDS
  if [[ -n ${FROM_KELP:-} ]]; then
    from=$(readlink -f "$FROM_KELP")
    [[ -x $from ]] || die "FROM_KELP=$FROM_KELP is not an executable file"
  else
    build_before_move "${MOVE:-f12a701}"
    from=$work/from-kelp
    echo "built in $((SECONDS - start)) s"
  fi
  echo "from: $("$from" --version | head -2 | paste -sd' ')"
  echo "to:   $("$KELP" --version | head -2 | paste -sd' ')"
  start=$SECONDS
  (cd "$repo" && CGO_ENABLED=0 KELP_BIN=$KELP KELP_UPGRADE_FROM=$from \
    go test -count=1 -timeout 45m -v -run '^TestFleetUpgradeFromEarlier$' ./server/ >"$work/test.log" 2>&1) || rc=$?
  grep -E '^\s+fleet(from)?_test\.go:[0-9]+: |^(--- |ok|FAIL|PASS)' "$work/test.log" | sed -E 's/^\s+fleet(from)?_test\.go:[0-9]+: /  /'
  if ((rc != 0)); then
    cp "$work/test.log" "${TMPDIR:-/tmp}/upgrade-check-fleet.log"
    die "the fleet upgrade failed (above); the test's whole output: ${TMPDIR:-/tmp}/upgrade-check-fleet.log"
  fi
  grep -q -- '--- PASS: TestFleetUpgradeFromEarlier' "$work/test.log" || die "TestFleetUpgradeFromEarlier did not run: $(tail -5 "$work/test.log")"
  echo "fleet upgrade from $("$from" --version | head -1) to $("$KELP" --version | head -1): nothing lost ($((SECONDS - start)) s)"
}

if [[ $mode == fleet ]]; then
  fleet
  exit 0
fi

FROM=${FROM:-7fb5335}
git -C "$repo" rev-parse --verify -q "$FROM^{commit}" >/dev/null || die "FROM=$FROM is not a commit of this repository"
echo "building the earlier kelp ($FROM)"
git -C "$repo" worktree add -q --detach "$work/src" "$FROM"
cp -a "$repo/.cache" "$work/src/" 2>/dev/null || true
(cd "$work/src" && scripts/build.sh amd64 "$work/old-kelp" >"$work/build.log" 2>&1) ||
  die "the build of $FROM failed: $(tail -5 "$work/build.log")"
cp "$work/old-kelp" "$work/kelp"
kelp() { "$work/kelp" "$@"; }
kubectl() { "$work/kelp" kubectl --kubeconfig "$work/root/check/kubeconfig" "$@"; }

kelp cluster create check --root "$work/root" --agents 1 --wait 4m >/dev/null
# Secrets encrypted at rest: a server setting only (flags after -- reach
# the agents too), so in the server node's config file, and a restart.
config=$work/root/check/nodes/server-1/data/cluster-node.yaml
[[ -f $config ]] || die "no $config: where does kelp cluster keep a node's config now?"
kelp cluster stop check --root "$work/root" >/dev/null
echo "secrets-encryption: true" >>"$config"
kelp cluster start check --root "$work/root" --wait 4m >/dev/null
before=$(kubectl version -o json | sed -n 's/.*"gitVersion": "\([^"]*\)".*/\1/p' | tail -1)
kubectl apply -f - >/dev/null <<'YAML'
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.upgrade.kelp.io}
spec:
  group: upgrade.kelp.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
---
apiVersion: v1
kind: Secret
metadata: {name: kept}
stringData: {password: before-the-upgrade}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 10Mi}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: keep}
spec:
  replicas: 1
  selector: {matchLabels: {app: keep}}
  template:
    metadata: {labels: {app: keep}}
    spec:
      containers: [{name: c, image: docker.io/kelp-dev/pause:1.0.0, imagePullPolicy: Never}]
      volumes: [{name: d, persistentVolumeClaim: {claimName: data}}]
YAML
kubectl wait --for=condition=established --timeout=60s crd/widgets.upgrade.kelp.io >/dev/null
kubectl apply -f - >/dev/null <<'YAML'
apiVersion: upgrade.kelp.io/v1
kind: Widget
metadata: {name: w1}
spec: {colour: green}
YAML
kubectl rollout status deployment/keep --timeout=180s >/dev/null
node=$(kubectl get pods -l app=keep -o jsonpath='{.items[0].spec.nodeName}')
volume=$(kubectl get pv -o jsonpath='{.items[0].spec.local.path}{.items[0].spec.hostPath.path}')
[[ -n $volume ]] || die "the PVC's volume has no path"
kelp cluster exec check "$node" --root "$work/root" -- sh -c "echo kept > '$volume/file'"
echo "made by kelp $FROM (Kubernetes $before): a CRD and a Widget, an encrypted Secret, a PVC with a file on $node, a Deployment"

kelp cluster stop check --root "$work/root" >/dev/null
cp "$KELP" "$work/kelp.new" && mv "$work/kelp.new" "$work/kelp"
start=$SECONDS
kelp cluster start check --root "$work/root" --wait 4m >/dev/null
echo "started on $("$KELP" --version | head -1) in $((SECONDS - start)) s"

want=$("$KELP" --version | sed -n 's/^kubernetes //p')
fail=0
check() { if eval "$2"; then echo "  ok   $1"; else echo "  FAIL $1"; fail=1; fi; }
for n in server-1 agent-1; do
  check "$n reports Kubernetes $want" "[[ \$(kubectl get node $n -o jsonpath='{.status.nodeInfo.kubeletVersion}') == $want* ]]"
  check "$n Ready" "kubectl wait --for=condition=Ready --timeout=120s node/$n >/dev/null"
done
check "the Widget" "kubectl get widgets.upgrade.kelp.io w1 >/dev/null"
check "the Secret's value" "[[ \$(kubectl get secret kept -o jsonpath='{.data.password}' | base64 -d) == before-the-upgrade ]]"
check "the PVC bound" "[[ \$(kubectl get pvc data -o jsonpath='{.status.phase}') == Bound ]]"
check "the file in its volume" "[[ \$(kelp cluster exec check $node --root $work/root -- cat '$volume/file') == kept ]]"
check "the Deployment available" "kubectl rollout status deployment/keep --timeout=180s >/dev/null"
check "the Secret still encrypted at rest" "kelp cluster exec check server-1 --root $work/root -- $work/kelp etcdctl get /registry/secrets/default/kept 2>/dev/null | grep -q k8s:enc:"
check "the pre-upgrade snapshot" "grep -q 'Took a snapshot before the upgrade' '$work/root/check/nodes/server-1/kelp.log'"
((fail == 0)) || die "the upgrade lost something (above)"
echo "upgrade from $FROM to $("$KELP" --version | head -1): nothing lost"
