#!/usr/bin/env bash
# Proves a real upgrade: a cluster made by an earlier kelp is upgraded in
# place to this tree's, and everything it held is still there.
#
# Usage: scripts/upgrade-check.sh     (as root, from anywhere)
#   FROM=7fb5335   the earlier kelp's git revision (default: the last that
#                  ran Kubernetes v1.36); it is built in a worktree
#   KELP=bin/kelp  the kelp to upgrade to (build it with scripts/build.sh)
#
# The cluster is a `kelp cluster` (a server and an agent in namespaces of
# their own on this machine) made by the earlier kelp, holding a CRD and
# one of its objects, a Secret encrypted at rest, a PVC whose
# volume holds a file, and a Deployment using it. The cluster is stopped,
# its kelp replaced by the new one, and started: the new kelp must be
# Ready on both nodes, report its Kubernetes version, and hold all of it.
# The server takes its pre-upgrade snapshot on the way. Not in CI: it
# builds a second kelp (about 7 minutes cold).
set -euo pipefail

die() { echo "upgrade-check: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "run as root"
repo=$(cd "$(dirname "$0")/.." && pwd)
FROM=${FROM:-7fb5335}
KELP=$(readlink -f "${KELP:-$repo/bin/kelp}")
[[ -x $KELP ]] || die "$KELP is missing: build it with scripts/build.sh"
git -C "$repo" rev-parse --verify -q "$FROM^{commit}" >/dev/null || die "FROM=$FROM is not a commit of this repository"

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
