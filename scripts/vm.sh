#!/usr/bin/env bash
# The VM lab: kelp on the machines it is for, in virtual machines under qemu
# (TCG: no KVM needed), from Debian's packages only. Run as root; it
# installs what it needs (qemu, mmdebstrap), builds its images once into
# /var/cache/kelp-vm (VM_CACHE), takes the release from dist/
# (scripts/release.sh) or builds one (see release below), runs one scenario
# and prints a table: scenario, step, result, seconds.
#
# usage: scripts/vm.sh SCENARIO [OPTIONS]
#
#   amd64-systemd     Debian with systemd and cgroup v2: the README's
#                     curl-pipe install from an https mirror inside the
#                     guest, Type=notify, node Ready, a pod from the airgap
#                     images answering through a Service by DNS name,
#                     `systemctl restart kelp` keeping the pod's container,
#                     a reboot coming back Ready, an uninstall leaving
#                     nothing; then the README's GitHub Actions recipe
#                     for `kelp cluster` (three nodes, an app, delete)
#   gha-recipe        that recipe alone
#   arm64-systemd     the same on arm64 (qemu virt, Cortex-A72), 4 vCPU and
#                     2 GiB by default: the shape of a Pi 4. Its image is
#                     built without binfmt_misc: debootstrap --foreign, then
#                     the second stage in the guest (an hour or more)
#   arm64-small       the arm64 VM with 1 GiB: the server and five pods for
#                     VM_SOAK_MINUTES (30), a line of memory figures a
#                     minute, no OOM kill, no restart
#   powercut-sqlite   a server on SQLite under systemd, written to from the
#                     host; the VM killed (SIGKILL to qemu) at a random
#                     moment --cuts N times (default 50); after each boot
#                     kelp is back by itself, PRAGMA integrity_check is ok,
#                     no acknowledged write is lost, the node is Ready;
#                     then a cut during an upgrade (install.sh of another
#                     release) and one during `kelp datastore migrate`
#   powercut-etcd     the same with embedded etcd (server --cluster-init),
#                     but for the migration; its check is etcd's own
#                     (etcdctl endpoint health)
#
# Environment: VM_CACHE (default /var/cache/kelp-vm), VM_CPUS (2),
# VM_MEMORY (MiB, 4096), VM_KEEP=1 keeps the VM's disk and console log,
# VM_DISK=volatile gives the guest a disk whose write cache a power cut
# empties (scripts/vm/flushdisk; see vm_start in lib/vm.sh).
# The commands run in the guest are single-quoted: the guest's shell expands them.
# shellcheck disable=SC2016
set -euo pipefail
cd "$(dirname "$0")/.."
VM_LIB_DIR=$PWD/scripts/lib
# shellcheck source=lib/vm.sh
source scripts/lib/vm.sh

[[ $(id -u) == 0 ]] || vm_die "run as root (mmdebstrap builds images as root)"
scenario=${1:-}
shift || true
cuts=50
while (($#)); do
  case $1 in
  --cuts) cuts=$2; shift 2 ;;
  --cuts=*) cuts=${1#--cuts=}; shift ;;
  *) vm_die "unknown option $1" ;;
  esac
done

case $scenario in
amd64-systemd | gha-recipe | powercut-sqlite | powercut-etcd | nomemcg) arch=amd64 init=systemd ;;
arm64-systemd) arch=arm64 init=systemd VM_CPUS=${VM_CPUS:-4} VM_MEMORY=${VM_MEMORY:-2048} ;;
arm64-small) arch=arm64 init=systemd VM_CPUS=${VM_CPUS:-4} VM_MEMORY=${VM_MEMORY:-1024} ;;
openrc) arch=amd64 init=openrc ;;
*) vm_die "usage: scripts/vm.sh amd64-systemd|gha-recipe|arm64-systemd|arm64-small|powercut-sqlite|powercut-etcd|openrc|nomemcg [--cuts N]" ;;
esac
VM_CPUS=${VM_CPUS:-2}
VM_MEMORY=${VM_MEMORY:-4096}

trap 'vm_cleanup' EXIT
trap 'exit 130' INT TERM

vm_host_packages "$arch"
mkdir -p "$VM_CACHE"
vm_keys

# release finds the release artifacts of ARCH: dist/ as scripts/release.sh
# left it, or else (release.sh's zstd --ultra -22 and xz -9e take many
# minutes on a busy machine, and the guests have no zstd) the same names
# made quicker in $VM_CACHE/release-ARCH (one per ARCH, so runs of two
# architectures at once do not race): the binary of scripts/build.sh,
# compressed with xz -1 (one block, CRC32, as release.sh), install.sh and
# sha256sums.txt. VM_RELEASE=release runs scripts/release.sh first;
# VM_KELP=PATH takes that kelp binary instead of building one. With
# VM_REUSE_RELEASE=1 a release already in $VM_CACHE/release-ARCH is kept.
release() {
  if [[ ${VM_RELEASE:-} == release ]]; then
    scripts/release.sh "$arch" >"$VM_CACHE/release-$arch.log" 2>&1 || { tail -n 20 "$VM_CACHE/release-$arch.log" >&2; return 1; }
  fi
  if [[ -f dist/kelp-linux-$arch.xz && -f dist/sha256sums.txt ]]; then
    RELEASE_DIR=$PWD/dist
  elif [[ -n ${VM_REUSE_RELEASE:-} && -f $VM_CACHE/release-$arch/kelp-linux-$arch.xz ]]; then
    RELEASE_DIR=$VM_CACHE/release-$arch
  else
    RELEASE_DIR=$VM_CACHE/release-$arch
    mkdir -p "$RELEASE_DIR"
    if [[ -n ${VM_KELP:-} ]]; then
      cp "$VM_KELP" "$RELEASE_DIR/kelp-linux-$arch"
    else
      scripts/build.sh "$arch" "$RELEASE_DIR/kelp-linux-$arch" >"$VM_CACHE/release-$arch.log" 2>&1 ||
        { tail -n 20 "$VM_CACHE/release-$arch.log" >&2; return 1; }
    fi
    xz -1 -T1 --check=crc32 -c "$RELEASE_DIR/kelp-linux-$arch" >"$RELEASE_DIR/kelp-linux-$arch.xz"
  fi
  vm_log "release from $RELEASE_DIR"
  # install.sh of this tree, which may be newer than the release's.
  install -m 0644 install.sh "$RELEASE_DIR/install.sh"
  (cd "$RELEASE_DIR" && sha256sum -- kelp-linux-* install.sh >sha256sums.txt)
}

# testapp builds the cluster tests' app (internal/testcluster/testapp) as
# the OCI image docker.io/kelp-test/testapp:1.0, as the tests do.
testapp() {
  local out=$VM_CACHE/testapp-$arch
  mkdir -p "$out"
  CGO_ENABLED=0 GOARCH=$arch go build -trimpath -o "$out/testapp" ./internal/testcluster/testapp
  (cd scripts/bundle && go run ./mkimage -binary "$out/testapp" -path /testapp \
    -name docker.io/kelp-test/testapp:1.0 -arch "$arch" -out "$out/testapp.tar")
}

# --- steps in the guest ----------------------------------------------------

boot() { # [KERNEL ARGS]
  vm_start "$@"
  vm_wait_ssh "${VM_BOOT_TIMEOUT:-900}"
}

cgroup_v2() { vm_ssh '[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && [ -d /run/systemd/system ]'; }

# serve_release puts the release into the guest and starts its https
# server on 127.0.0.1:443, named releases.kelp.test by /etc/hosts and
# trusted through the lab's CA.
serve_release() {
  local d=/root/lab/www/kelp-dev/kelp/releases
  vm_ssh "mkdir -p $d/download/$VM_RELEASE_VERSION $d/latest/download" &&
    vm_scp "$RELEASE_DIR/kelp-linux-$arch.xz" "$RELEASE_DIR/install.sh" "$RELEASE_DIR/sha256sums.txt" "$d/download/$VM_RELEASE_VERSION/" &&
    vm_ssh "cp $d/download/$VM_RELEASE_VERSION/install.sh $d/latest/download/ &&
      (setsid python3 /root/lab/releases.py /root/lab/www $VM_RELEASE_VERSION /root/lab/server.crt /root/lab/server.key \
        </dev/null >/root/lab/releases.log 2>&1 &) &&
      for i in 1 2 3 4 5 6 7 8 9 10; do curl -sfo /dev/null $VM_RELEASE_BASE/tag/$VM_RELEASE_VERSION && exit 0; sleep 2; done; exit 1"
}

airgap_image() {
  vm_ssh 'mkdir -p /var/lib/kelp/agent/images' &&
    vm_scp "$VM_CACHE/testapp-$arch/testapp.tar" /var/lib/kelp/agent/images/
}

# install_kelp [ARGS] runs the README's line against the lab's mirror:
#   curl -sfL …/releases/latest/download/install.sh | sh -s - ARGS
# (step passes ARGS, which shellcheck does not see.)
# shellcheck disable=SC2120
install_kelp() {
  vm_ssh "curl -sfL $VM_RELEASE_BASE/latest/download/install.sh | ${VM_INSTALL_ENV:-} INSTALL_KELP_URL=$VM_RELEASE_BASE/download sh -s - $*"
}

service_notify_active() {
  vm_ssh '[ "$(systemctl show -p Type --value kelp)" = notify ] && systemctl is-active --quiet kelp'
}

node_ready() { # [TIMEOUT]
  until_true "${1:-900}" vm_ssh 'kelp kubectl get nodes --no-headers 2>/dev/null | grep -qw Ready'
}

# The guest's kubectl: the installed server's, or (GHA recipe) a
# `kelp cluster`'s through its kubeconfig.
KUBECTL='kelp kubectl'

apply_app() {
  vm_ssh "$KUBECTL apply -f - >/dev/null" <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: web, image: docker.io/kelp-test/testapp:1.0, imagePullPolicy: Never, args: [serve]}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  containers:
  - {name: client, image: docker.io/kelp-test/testapp:1.0, imagePullPolicy: Never, args: [serve]}
EOF
}

# app_answers: the client pod reaches the web pod through its Service, by
# the Service's DNS name.
app_answers() {
  until_true "${1:-600}" vm_ssh "$KUBECTL exec client -- /testapp get http://web.default.svc.cluster.local/ | grep -q '^web-'"
}

web_container() { vm_ssh 'kelp crictl ps --name "^web$" -q'; }

restart_keeps_container() {
  local before after
  before=$(web_container) && [[ -n $before ]] || return 1
  vm_ssh 'systemctl restart kelp' || return 1
  node_ready 600 || return 1
  after=$(web_container)
  vm_log "web's container: before $before, after $after"
  [[ $before == "$after" ]] &&
    vm_ssh '[ "$(kelp kubectl get pod -l app=web -o jsonpath={.items[0].status.containerStatuses[0].restartCount})" = 0 ]'
}

ssh_down() { ! vm_ssh true; }

reboot_guest() {
  vm_ssh 'systemctl reboot' || true
  # The reboot takes ssh down first; wait for that, then for it to return.
  until_true 120 ssh_down || true
  vm_wait_ssh "${VM_BOOT_TIMEOUT:-900}"
}

uninstall() { vm_ssh /usr/local/bin/kelp-uninstall.sh >/dev/null; }

# nothing_left lists whatever kelp left behind, and fails if it finds any.
nothing_left() {
  vm_ssh 'left=
    for f in /usr/local/bin/kelp /usr/local/bin/kelp.previous /usr/local/bin/kelp-uninstall.sh /usr/local/bin/kelp-killall.sh \
      /usr/local/bin/kubectl /usr/local/bin/crictl /usr/local/bin/ctr /usr/local/bin/etcdctl \
      /etc/kelp /var/lib/kelp /var/lib/kubelet /run/kelp /var/log/pods /var/log/containers /var/lib/cni /etc/cni \
      /etc/systemd/system/kelp.service /etc/systemd/system/kelp.service.env /etc/systemd/system/multi-user.target.wants/kelp.service \
      /etc/init.d/kelp /etc/runlevels/default/kelp /var/log/kelp.log /run/kelp.pid; do
      [ -e "$f" ] || [ -L "$f" ] && left="$left file:$f"
    done
    m=$(grep -E "kelp|kubelet|containerd|/run/netns" /proc/self/mountinfo | cut -d" " -f5 | tr "\n" " ")
    [ -z "$m" ] || left="$left mounts:$m"
    c=$(find /sys/fs/cgroup -type d \( -name "*kelp*" -o -name "*kubepods*" -o -name "*containerd*" \) 2>/dev/null | tr "\n" " ")
    [ -z "$c" ] || left="$left cgroups:$c"
    n=$(nft list tables 2>/dev/null | tr "\n" " ")
    [ -z "$n" ] || left="$left nft:$n"
    i=$(ip -o link show | awk -F": " "{print \$2}" | grep -vxE "lo|eth0" | tr "\n" " ")
    [ -z "$i" ] || left="$left links:$i"
    ns=$(ip netns list 2>/dev/null | tr "\n" " ")
    [ -z "$ns" ] || left="$left netns:$ns"
    p=$(ps -eo pid=,comm= | grep -E "kelp|containerd|runc|pause|testapp|kubelet" | tr "\n" " ")
    [ -z "$p" ] || left="$left processes:$p"
    [ -z "$left" ] || { echo "left behind:$left" >&2; exit 1; }'
}

# --- scenarios -------------------------------------------------------------

# amd64-systemd and arm64-systemd: the same steps, on $arch.
scenario_systemd() {
  local s=$scenario
  step "$s" "the release ($arch)" release
  step "$s" "build the test app image" testapp
  step "$s" "image debian $VM_SUITE $arch $init (cached)" vm_image "$arch" "$init"
  vm_new "$arch" "$init"
  step "$s" "boot" boot
  step "$s" "systemd is PID 1, cgroup v2" cgroup_v2
  step "$s" "release served on https://$VM_RELEASE_HOST" serve_release
  step "$s" "testapp.tar into the airgap images dir" airgap_image
  step "$s" "curl -sfL …/install.sh | sh - (until ready)" install_kelp
  step "$s" "kelp.service Type=notify, active" service_notify_active
  step "$s" "node Ready" node_ready
  step "$s" "deploy web (Deployment+Service) and client" apply_app
  step "$s" "client gets web.default.svc.cluster.local" app_answers
  step "$s" "systemctl restart kelp keeps web's container" restart_keeps_container
  step "$s" "app answers after the restart" app_answers
  step "$s" "reboot" reboot_guest
  step "$s" "kelp active after the reboot" until_true 900 service_notify_active
  step "$s" "node Ready after the reboot" node_ready
  step "$s" "app answers after the reboot" app_answers
  step "$s" "kelp-uninstall.sh" uninstall
  step "$s" "nothing left: files mounts cgroups nft links procs" nothing_left
}

# The README's GitHub Actions recipe for `kelp cluster`, as written but
# for the image (the test app's, not docker save's) and --wait (30m, not
# 3m: three nodes start under emulation).
gha_install() { VM_INSTALL_ENV=INSTALL_KELP_SKIP_ENABLE=true install_kelp; }

gha_create() {
  vm_scp "$VM_CACHE/testapp-$arch/testapp.tar" /root/app.tar || return 1
  vm_ssh 'kelp cluster create ci --agents 2 --image /root/app.tar --wait 30m >/root/create.log 2>&1' || {
    vm_ssh 'tail -n 30 /root/create.log; for l in /var/lib/kelp/clusters/ci/nodes/*/kelp.log; do
      echo "== $l"; grep "^kelp: \|level=fatal\|level=error" "$l" | tail -n 15; done' >&2
    return 1
  }
  vm_ssh 'kelp cluster kubeconfig ci >/root/kubeconfig &&
    [ "$(kelp kubectl --kubeconfig /root/kubeconfig get nodes --no-headers | grep -cw Ready)" = 3 ]'
}

gha_rollout() { vm_ssh "$KUBECTL rollout status deploy/web --timeout 15m >/dev/null"; }

gha_delete() { vm_ssh 'kelp cluster delete --all >/dev/null && [ "$(kelp cluster list | wc -l)" = 1 ]'; }

# gha_steps: the recipe on a guest that has booted and serves the release.
gha_steps() {
  local s=gha-recipe KUBECTL='kelp kubectl --kubeconfig /root/kubeconfig'
  step "$s" "curl … | INSTALL_KELP_SKIP_ENABLE=true sh -" gha_install
  step "$s" "kelp cluster create ci --agents 2 --image (3 Ready)" gha_create
  step "$s" "kubectl apply" apply_app
  step "$s" "kubectl rollout status deploy/web" gha_rollout
  step "$s" "the app answers by DNS name" app_answers
  step "$s" "kelp cluster delete --all" gha_delete
  step "$s" "kelp-uninstall.sh" uninstall
  step "$s" "nothing left: files mounts cgroups nft links procs" nothing_left
}

scenario_amd64_systemd() {
  scenario_systemd
  gha_steps
}

# gha-recipe: the recipe alone, on the amd64-systemd image.
scenario_gha_recipe() {
  local s=$scenario
  step "$s" "the release ($arch)" release
  step "$s" "build the test app image" testapp
  step "$s" "image debian $VM_SUITE $arch $init (cached)" vm_image "$arch" "$init"
  vm_new "$arch" "$init"
  step "$s" "boot" boot
  step "$s" "systemd is PID 1, cgroup v2" cgroup_v2
  step "$s" "release served on https://$VM_RELEASE_HOST" serve_release
  gha_steps
}
scenario_arm64_systemd() { scenario_systemd; }

# --- a small board ---------------------------------------------------------

apply_five_pods() {
  vm_ssh 'kelp kubectl apply -f - >/dev/null' <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: five}
spec:
  replicas: 5
  selector: {matchLabels: {app: five}}
  template:
    metadata: {labels: {app: five}}
    spec:
      containers:
      - {name: app, image: docker.io/kelp-test/testapp:1.0, imagePullPolicy: Never, args: [serve]}
EOF
  vm_ssh 'kelp kubectl rollout status deploy/five --timeout 20m >/dev/null'
}

# node_memory prints one line: the guest's MemAvailable, the PSS of kelp,
# of containerd and the shims, the OOM kills since boot and kelp's
# restarts by systemd.
node_memory() {
  vm_ssh 'pss() { s=0; for p in $(pgrep -x "$1"); do
      v=$(awk "/^Pss:/ {print \$2}" /proc/$p/smaps_rollup 2>/dev/null) && s=$((s + v)); done; echo $((s / 1024)); }
    echo "available $(($(awk "/^MemAvailable:/ {print \$2}" /proc/meminfo) / 1024)) MiB," \
      "kelp $(pss kelp) MiB, containerd $(pss containerd) MiB, shims $(pss containerd-shim) MiB PSS," \
      "oom_kill $(awk "/^oom_kill / {print \$2}" /proc/vmstat), restarts $(systemctl show -p NRestarts --value kelp)"'
}

# soak MINUTES: the node idles with its pods; a line of figures a minute.
# It fails on an OOM kill, a restart of kelp, or a pod not Running.
soak() {
  local m line
  for ((m = 1; m <= $1; m++)); do
    sleep 60
    line=$(node_memory) || return 1
    vm_log "minute $m: $line"
    [[ $line == *"oom_kill 0, restarts 0" ]] || return 1
  done
  vm_ssh '[ "$(kelp kubectl get pods -l app=five --no-headers | grep -c " Running ")" = 5 ]' &&
    vm_ssh '! kelp kubectl get pods -l app=five -o jsonpath="{.items[*].status.containerStatuses[0].restartCount}" | grep -q "[1-9]"'
}

# arm64-small: the arm64 VM with 1 GiB, the server and five pods for
# $VM_SOAK_MINUTES (30) minutes, without the OOM killer.
scenario_arm64_small() {
  local s=$scenario minutes=${VM_SOAK_MINUTES:-30}
  step "$s" "the release ($arch)" release
  step "$s" "build the test app image" testapp
  step "$s" "image debian $VM_SUITE $arch $init (cached)" vm_image "$arch" "$init"
  vm_new "$arch" "$init"
  step "$s" "boot (${VM_MEMORY} MiB)" boot
  step "$s" "release served on https://$VM_RELEASE_HOST" serve_release
  step "$s" "testapp.tar into the airgap images dir" airgap_image
  step "$s" "curl -sfL …/install.sh | sh - (until ready)" install_kelp
  step "$s" "node Ready" node_ready
  step "$s" "five pods Running" apply_five_pods
  step "$s" "$minutes minutes: no OOM kill, no restart" soak "$minutes"
}

openrc_init() { vm_ssh '[ "$(cat /proc/1/comm)" = init ] && command -v openrc >/dev/null && [ ! -d /run/systemd/system ]'; }

openrc_service() {
  vm_ssh 'head -n 1 /etc/init.d/kelp | grep -q openrc-run && rc-update show default | grep -qw kelp && rc-service kelp status >/dev/null'
}

openrc_restart() { vm_ssh 'rc-service kelp restart >/dev/null' && node_ready 900; }

openrc_stop() {
  vm_ssh 'rc-service kelp stop >/dev/null; sleep 5; ! rc-service kelp status >/dev/null 2>&1 && ! pgrep -x kelp >/dev/null'
}

openrc_start() { vm_ssh 'rc-service kelp start >/dev/null' && node_ready 900; }

scenario_openrc() {
  local s=$scenario
  step "$s" "the release ($arch)" release
  step "$s" "build the test app image" testapp
  step "$s" "image debian $VM_SUITE $arch $init (cached)" vm_image "$arch" "$init"
  vm_new "$arch" "$init"
  step "$s" "boot" boot
  step "$s" "OpenRC is init" openrc_init
  step "$s" "release served on https://$VM_RELEASE_HOST" serve_release
  step "$s" "testapp.tar into the airgap images dir" airgap_image
  step "$s" "curl -sfL …/install.sh | sh -" install_kelp
  step "$s" "install.sh chose OpenRC: /etc/init.d/kelp, default runlevel" openrc_service
  step "$s" "node Ready" node_ready
  step "$s" "deploy web (Deployment+Service) and client" apply_app
  step "$s" "client gets web.default.svc.cluster.local" app_answers
  step "$s" "reboot" reboot_guest
  step "$s" "kelp started at boot" until_true 900 openrc_service
  step "$s" "node Ready after the reboot" node_ready
  step "$s" "app answers after the reboot" app_answers
  step "$s" "rc-service kelp restart, node Ready" openrc_restart
  step "$s" "rc-service kelp stop: stopped" openrc_stop
  step "$s" "rc-service kelp start, node Ready" openrc_start
  step "$s" "kelp-uninstall.sh" uninstall
  step "$s" "nothing left: files mounts cgroups nft links procs" nothing_left
}

# --- no memory cgroup ------------------------------------------------------

no_memory_cgroup() { vm_ssh '! grep -qw memory /sys/fs/cgroup/cgroup.controllers'; }

# The fix, as the README's Troubleshooting gives it.
memory_line='cgroup_enable=memory cgroup_memory=1'

install_refused() {
  local out
  out=$(install_kelp "" 2>&1) && { vm_log "install.sh installed kelp without a memory cgroup"; return 1; }
  printf '%s\n' "$out" | tail -n 15 >&2
  grep -qF "$memory_line" <<<"$out" && grep -qF cmdline.txt <<<"$out" &&
    vm_ssh '[ ! -e /usr/local/bin/kelp ] && [ ! -e /etc/systemd/system/kelp.service ]'
}

check_config_names_line() {
  local out
  out=$(vm_ssh 'cd /tmp && xz -dc /root/lab/www/kelp-dev/kelp/releases/download/*/kelp-linux-*.xz >kelp && chmod +x kelp && ./kelp check-config' 2>&1) &&
    { vm_log "check-config passed without a memory cgroup"; return 1; }
  printf '%s\n' "$out" | grep -i memory >&2
  grep -qF "$memory_line" <<<"$out" && grep -qF cmdline.txt <<<"$out"
}

install_skip_check() {
  # The start fails, which install.sh's systemctl restart reports.
  vm_ssh "curl -sfL $VM_RELEASE_BASE/latest/download/install.sh | INSTALL_KELP_SKIP_CHECK=true INSTALL_KELP_URL=$VM_RELEASE_BASE/download sh -" >/dev/null 2>&1 || true
  vm_ssh 'test -x /usr/local/bin/kelp'
}

server_error_names_line() {
  local out
  out=$(vm_ssh 'sleep 20; journalctl -u kelp --no-pager -o cat | grep "^kelp: " | tail -n 1') || return 1
  vm_log "kelp's error: $out"
  grep -qF "$memory_line" <<<"$out" && grep -qF cmdline.txt <<<"$out"
}

# nothing_half_started: the failed starts left no containerd, mount,
# interface or nftables table behind.
nothing_half_started() {
  vm_ssh 'systemctl stop kelp; left=
    m=$(grep -E "kelp|kubelet|containerd" /proc/self/mountinfo | cut -d" " -f5 | tr "\n" " ")
    [ -z "$m" ] || left="$left mounts:$m"
    n=$(nft list tables 2>/dev/null | tr "\n" " ")
    [ -z "$n" ] || left="$left nft:$n"
    i=$(ip -o link show | awk -F": " "{print \$2}" | grep -vxE "lo|eth0" | tr "\n" " ")
    [ -z "$i" ] || left="$left links:$i"
    p=$(ps -eo pid=,comm= | grep -E "kelp|containerd|runc|kubelet" | tr "\n" " ")
    [ -z "$p" ] || left="$left processes:$p"
    [ -z "$left" ] || { echo "left behind:$left" >&2; exit 1; }'
}

scenario_nomemcg() {
  local s=$scenario
  step "$s" "the release ($arch)" release
  step "$s" "image debian $VM_SUITE $arch $init (cached)" vm_image "$arch" "$init"
  vm_new "$arch" "$init"
  step "$s" "boot with cgroup_disable=memory" boot cgroup_disable=memory
  step "$s" "no memory controller in cgroup v2" no_memory_cgroup
  step "$s" "release served on https://$VM_RELEASE_HOST" serve_release
  step "$s" "install.sh refuses, names the cmdline.txt line" install_refused
  step "$s" "kelp check-config names the cmdline.txt line" check_config_names_line
  step "$s" "INSTALL_KELP_SKIP_CHECK=true install" install_skip_check
  step "$s" "the server's error names the cmdline.txt line" server_error_names_line
  step "$s" "nothing half-started (mounts nft links procs)" nothing_half_started
  step "$s" "kelp-uninstall.sh" uninstall
  step "$s" "nothing left: files mounts cgroups nft links procs" nothing_left
}

# --- power cuts ------------------------------------------------------------

# The host writes ConfigMaps through the apiserver forwarded to its
# loopback; a name goes into $acked only after kubectl reported success.
host_kubeconfig() {
  vm_ssh 'cat /etc/kelp/kelp.yaml' | sed "s#server: https://127.0.0.1:6443#server: https://127.0.0.1:$VM_API_PORT#" >"$VM_DIR/kubeconfig"
  grep -q "127.0.0.1:$VM_API_PORT" "$VM_DIR/kubeconfig"
}

host_kubectl() { "$RELEASE_DIR/kelp-linux-$arch" kubectl --kubeconfig "$VM_DIR/kubeconfig" --request-timeout=20s "$@"; }

writer() { # ACKED_FILE
  local i=0 name
  while :; do
    i=$((i + 1))
    name=pc-$(date +%s%N)-$i
    if host_kubectl create configmap "$name" --from-literal=i="$i" >/dev/null 2>&1; then
      echo "$name" >>"$1"
    else
      sleep 1
    fi
  done
}

WRITER_PID=
stop_writer() {
  [[ -n $WRITER_PID ]] || return 0
  kill "$WRITER_PID" 2>/dev/null || true
  wait "$WRITER_PID" 2>/dev/null || true
  WRITER_PID=
}

writes_kept() { # ACKED_FILE
  local have missing
  have=$(host_kubectl get configmaps -o name) || return 1
  missing=$(comm -23 <(sort "$1") <(printf '%s\n' "${have//configmap\//}" | sort))
  vm_log "acknowledged writes: $(wc -l <"$1"), missing: $(echo -n "$missing" | grep -c . || true)"
  [[ -z $missing ]] || { vm_log "lost: $missing"; return 1; }
}

integrity_ok() {
  local out
  out=$(vm_ssh 'sqlite3 -readonly /var/lib/kelp/server/db/state.db "PRAGMA integrity_check"') || return 1
  vm_log "integrity_check: $out"
  [[ $out == ok ]]
}

etcd_healthy() {
  local out
  out=$(vm_ssh 'kelp etcdctl endpoint health 2>&1') || { vm_log "etcdctl endpoint health: $out"; return 1; }
  vm_log "etcdctl endpoint health: $out"
}

# snapshots_readable: kelp snapshot ls answers after the cut; a snapshot
# the cut broke off is not listed as one.
snapshots_readable() {
  local out
  out=$(vm_ssh 'kelp snapshot ls 2>&1') || { vm_log "kelp snapshot ls: $out"; return 1; }
  vm_log "snapshots: $(printf '%s\n' "$out" | tail -n +2 | wc -l)"
}

# --- cuts during an upgrade and a migration --------------------------------

# serve_upgrade puts a second release, $VM_UPGRADE_VERSION, beside the
# first: the same kelp with bytes appended, which install.sh takes for
# another binary (it keeps one it has already), so it swaps it in.
VM_UPGRADE_VERSION=v0.0.1-lab
serve_upgrade() {
  local d=$VM_DIR/upgrade w=/root/lab/www/kelp-dev/kelp/releases/download/$VM_UPGRADE_VERSION
  mkdir -p "$d"
  { xz -dc "$RELEASE_DIR/kelp-linux-$arch.xz" && printf '\nkelp lab upgrade\n'; } | xz -1 -T1 --check=crc32 >"$d/kelp-linux-$arch.xz"
  cp "$RELEASE_DIR/install.sh" "$d/"
  (cd "$d" && sha256sum -- "kelp-linux-$arch.xz" install.sh >sha256sums.txt)
  vm_ssh "mkdir -p $w" && vm_scp "$d/kelp-linux-$arch.xz" "$d/install.sh" "$d/sha256sums.txt" "$w/"
}

# upgrade_started runs the README's upgrade (install.sh again, here for
# $VM_UPGRADE_VERSION) in the guest, detached, so the cut can fall
# anywhere in it: download, check, the swap, kelp's restart.
upgrade_started() {
  vm_ssh "setsid sh -c 'curl -sfL $VM_RELEASE_BASE/latest/download/install.sh |
    INSTALL_KELP_VERSION=$VM_UPGRADE_VERSION INSTALL_KELP_URL=$VM_RELEASE_BASE/download sh - >/root/upgrade.log 2>&1' </dev/null >/dev/null 2>&1 &"
}

# binary_whole: after the cut /usr/local/bin/kelp is one of the two
# releases, whole, and runs; kelp.previous, if any, runs too.
binary_whole() {
  local which
  which=$(vm_ssh 'b=/usr/local/bin/kelp
    /usr/local/bin/kelp --version >/dev/null || exit 1
    [ ! -e $b.previous ] || $b.previous --version >/dev/null || exit 1
    if tail -c 17 $b | grep -q "kelp lab upgrade"; then echo upgraded; else echo old; fi') || return 1
  vm_log "installed after the cut: the $which binary"
}

# migrate_started stops kelp and starts `kelp datastore migrate --to etcd`
# detached, so the cut can fall anywhere in it.
migrate_started() {
  vm_ssh "systemctl stop kelp && setsid sh -c 'kelp datastore migrate --to etcd >/root/migrate.log 2>&1' </dev/null >/dev/null 2>&1 &"
}

# migrate_outcome: after the cut the server runs on whichever datastore
# holds the cluster: SQLite if the migration had not switched over (kelp
# comes back by itself); embedded etcd if it had, which a server started
# with the old settings refuses, saying so, and which it then serves once
# started with --cluster-init, as the migration says to.
migrate_outcome() {
  if until_true 300 service_notify_active; then
    vm_log "after the cut: SQLite, the migration had not switched over"
    return 0
  fi
  vm_ssh 'journalctl -u kelp -b --no-pager | grep -q "an embedded etcd datastore exists"' || {
    vm_log "kelp neither runs nor says that an etcd datastore is in place"
    return 1
  }
  vm_log "after the cut: embedded etcd, the migration had switched over; installing with --cluster-init"
  install_kelp server --cluster-init
}

# migrate_redone: if the cut left SQLite in place, the migration runs
# again, to its end, and the server runs on etcd; nothing is lost.
migrate_redone() {
  vm_ssh '[ -d /var/lib/kelp/server/db/etcd ]' && return 0
  vm_ssh 'systemctl stop kelp && kelp datastore migrate --to etcd >/root/migrate.log 2>&1' || {
    vm_ssh 'tail -n 20 /root/migrate.log' >&2
    return 1
  }
  install_kelp server --cluster-init
}

scenario_powercut_sqlite() {
  powercut "" "PRAGMA integrity_check ok" integrity_ok
  local s=$scenario delay acked=$VM_DIR/acked
  # A cut during `kelp datastore migrate --to etcd`, at a random moment.
  delay=$((2 + RANDOM % 40))
  step "$s" "migrate: kelp datastore migrate --to etcd started" migrate_started
  step "$s" "migrate: SIGKILL qemu after ${delay}s" sleep "$delay"
  vm_kill
  step "$s" "migrate: boot" boot
  step "$s" "migrate: the server on SQLite, or refused and on etcd" migrate_outcome
  step "$s" "migrate: migrated to its end, on etcd" migrate_redone
  step "$s" "migrate: etcdctl endpoint health" etcd_healthy
  step "$s" "migrate: node Ready" node_ready
  step "$s" "migrate: no acknowledged write lost ($(wc -l <"$acked"))" writes_kept "$acked"
}
scenario_powercut_etcd() { powercut "server --cluster-init" "etcdctl endpoint health" etcd_healthy; }

# powercut INSTALL_ARGS CHECK_NAME CHECK: --cuts power cuts of a server
# installed with INSTALL_ARGS, each at a random moment while the host
# writes, and after each boot kelp back by itself, CHECK (the datastore's
# own integrity check), the snapshots readable, the node Ready and every
# acknowledged write there. The server takes a scheduled snapshot every
# minute, so some cuts fall into one.
powercut() {
  local VM_INSTALL_ENV="KELP_SNAPSHOT_SCHEDULE_CRON='@every 1m'"
  local install_args=$1 check_name=$2 check=$3 s=$scenario n acked delay
  step "$s" "the release ($arch)" release
  step "$s" "build the test app image" testapp
  step "$s" "image debian $VM_SUITE $arch $init (cached)" vm_image "$arch" "$init"
  vm_new "$arch" "$init"
  acked=$VM_DIR/acked
  : >"$acked"
  step "$s" "boot" boot
  step "$s" "release served on https://$VM_RELEASE_HOST" serve_release
  step "$s" "curl -sfL …/install.sh | sh -s - $install_args" install_kelp "$install_args"
  step "$s" "node Ready" node_ready
  step "$s" "host kubeconfig through the forwarded 6443" host_kubeconfig
  for ((n = 1; n <= cuts; n++)); do
    writer "$acked" &
    WRITER_PID=$!
    delay=$((5 + RANDOM % 55))
    step "$s" "cut $n: write for ${delay}s, then SIGKILL qemu" sleep "$delay"
    vm_kill
    stop_writer
    step "$s" "cut $n: boot" boot
    step "$s" "cut $n: kelp back under systemd by itself" until_true 900 service_notify_active
    step "$s" "cut $n: $check_name" "$check"
    step "$s" "cut $n: kelp snapshot ls" snapshots_readable
    step "$s" "cut $n: node Ready" node_ready
    step "$s" "cut $n: no acknowledged write lost ($(wc -l <"$acked"))" writes_kept "$acked"
  done
  # A cut during an upgrade: install.sh again, for another release.
  step "$s" "upgrade: release $VM_UPGRADE_VERSION served" serve_upgrade
  writer "$acked" &
  WRITER_PID=$!
  delay=$((5 + RANDOM % 90))
  step "$s" "upgrade: install.sh started" upgrade_started
  step "$s" "upgrade: SIGKILL qemu after ${delay}s" sleep "$delay"
  vm_kill
  stop_writer
  step "$s" "upgrade: boot" boot
  step "$s" "upgrade: kelp back under systemd by itself" until_true 900 service_notify_active
  step "$s" "upgrade: kelp (and kelp.previous) whole" binary_whole
  step "$s" "upgrade: $check_name" "$check"
  step "$s" "upgrade: node Ready" node_ready
  step "$s" "upgrade: no acknowledged write lost ($(wc -l <"$acked"))" writes_kept "$acked"
}

on_exit() {
  local rc=$?
  stop_writer
  [[ -z $VM_FAILED ]] || vm_dump
  vm_cleanup
  ((${#VM_ROWS[@]} == 0)) || vm_table
  [[ -z $VM_FAILED ]] || vm_log "failed: $VM_FAILED"
  exit "$rc"
}
trap on_exit EXIT

"scenario_${scenario//-/_}"
