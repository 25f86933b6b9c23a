# shellcheck shell=bash
# The VM_* variables are read by scripts/vm.sh.
# shellcheck disable=SC2034
# The VM lab's pieces, sourced by scripts/vm.sh: Debian images made with
# mmdebstrap (cached under $VM_CACHE), qemu under TCG, ssh into the guest,
# and the table of steps.
#
# A guest has one network: qemu's user network with restrict=on, so it
# reaches nothing but what qemu forwards from the host's loopback (ssh and
# the apiserver). It gets its packages from the image, its release from a
# https server of its own on 127.0.0.1 (releases.kelp.test), and its
# images from the airgap directory.

VM_CACHE=${VM_CACHE:-/var/cache/kelp-vm}
VM_SUITE=${VM_SUITE:-bookworm}
VM_MIRROR=${VM_MIRROR:-http://deb.debian.org/debian}
VM_RELEASE_HOST=releases.kelp.test
VM_RELEASE_VERSION=v0.0.0-lab
# The README's curl-pipe line, with the release mirror of the lab.
VM_RELEASE_BASE=https://$VM_RELEASE_HOST/kelp-dev/kelp/releases

vm_log() { printf 'vm: %s\n' "$*" >&2; }
vm_die() { vm_log "error: $*"; exit 1; }

# --- the table -------------------------------------------------------------

VM_ROWS=()
VM_FAILED=

# step SCENARIO NAME COMMAND... runs COMMAND, records its result and time,
# and stops the scenario at the first failure.
step() {
  local scenario=$1 name=$2 start rc=0
  shift 2
  vm_log "$scenario: $name"
  start=$(date +%s%N)
  "$@" || rc=$?
  local ns=$(($(date +%s%N) - start)) result=ok
  ((rc == 0)) || result="FAIL ($rc)"
  VM_ROWS+=("$(printf '%-16s %-52s %-9s %8d.%d' "$scenario" "$name" "$result" $((ns / 1000000000)) $((ns / 100000000 % 10)))")
  if ((rc != 0)); then
    VM_FAILED="$scenario: $name"
    return 1
  fi
}

vm_table() {
  printf '\n%-16s %-52s %-9s %10s\n' scenario step result seconds
  local row
  for row in "${VM_ROWS[@]}"; do printf '%s\n' "$row"; done
}

# --- packages on the host --------------------------------------------------

vm_host_packages() { # ARCH...
  local need=() p pkgs=(qemu-system-x86 qemu-utils mmdebstrap e2fsprogs openssh-client openssl xz-utils zstd file)
  for p in "$@"; do
    [[ $p == arm64 ]] && pkgs+=(qemu-system-arm qemu-efi-aarch64)
  done
  for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  if ((${#need[@]})); then
    vm_log "installing ${need[*]}"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
  fi
}

# --- keys and certificates -------------------------------------------------

# vm_keys makes, once, the ssh key the host logs in with and the CA and
# certificate of the guest's release server.
vm_keys() {
  local k=$VM_CACHE/keys
  mkdir -p "$k"
  [[ -f $k/id_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -C kelp-vm -f "$k/id_ed25519"
  if [[ ! -f $k/server.crt ]]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
      -subj /CN=kelp-vm-lab-ca -keyout "$k/ca.key" -out "$k/ca.crt" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -subj "/CN=$VM_RELEASE_HOST" -keyout "$k/server.key" -out "$k/server.csr" 2>/dev/null
    openssl x509 -req -in "$k/server.csr" -CA "$k/ca.crt" -CAkey "$k/ca.key" -CAcreateserial -days 3650 \
      -extfile <(printf 'subjectAltName=DNS:%s,IP:127.0.0.1\n' "$VM_RELEASE_HOST") -out "$k/server.crt" 2>/dev/null
  fi
}

# --- images ----------------------------------------------------------------

# vm_image ARCH INIT builds, once, the image of Debian $VM_SUITE for ARCH
# with INIT (systemd or openrc) as PID 1: $VM_CACHE/images/ARCH-INIT/ holds
# disk.raw (ext4, labelled root, no partition table), vmlinuz and
# initrd.img for qemu's direct kernel boot. The root file system is made
# in a directory by mmdebstrap and packed by mkfs.ext4 -d: no loop mount.
vm_image() {
  local arch=$1 init=$2 dir=$VM_CACHE/images/$1-$2
  [[ -f $dir/disk.raw ]] && return 0
  local tmp=$dir.tmp root=$dir.tmp/root kernel=linux-image-$arch
  # An mmdebstrap that was killed may have left /proc or /dev mounted in
  # its root: never rm -rf through them.
  if grep -q " $tmp/" /proc/self/mountinfo; then
    vm_die "something is still mounted below $tmp: unmount it, then run again"
  fi
  rm -rf "$tmp"
  mkdir -p "$root"
  local pkgs=(openssh-server ca-certificates curl xz-utils python3 iproute2 kmod procps
    sqlite3 nftables initramfs-tools less)
  case $init in
  systemd) pkgs+=(systemd systemd-sysv dbus udev) ;;
  openrc) pkgs+=(sysvinit-core openrc ifupdown udev) ;;
  esac
  vm_log "building the $arch-$init image (mmdebstrap $VM_SUITE; a few minutes)"
  # The initramfs holds only what finds the root disk: with every module
  # (MODULES=most) mkinitramfs takes many minutes on a busy machine.
  mkdir -p "$tmp/initramfs/conf.d" "$tmp/initramfs/hooks"
  echo MODULES=list >"$tmp/initramfs/conf.d/kelp-vm.conf"
  cat >"$tmp/initramfs/hooks/kelp-vm" <<'EOF'
#!/bin/sh
[ "$1" = prereqs ] && exit 0
. /usr/share/initramfs-tools/hook-functions
manual_add_modules virtio_pci virtio_mmio virtio_blk ext4 crc32c_generic libcrc32c
EOF
  chmod 0755 "$tmp/initramfs/hooks/kelp-vm"
  mmdebstrap --arch="$arch" --variant=apt --include="$kernel,$(IFS=,; echo "${pkgs[*]}")" \
    --essential-hook="mkdir -p \"\$1/etc/initramfs-tools\" && cp -r $tmp/initramfs/conf.d $tmp/initramfs/hooks \"\$1/etc/initramfs-tools/\"" \
    "$VM_SUITE" "$root" "$VM_MIRROR" >"$tmp/mmdebstrap.log" 2>&1 ||
    vm_die "mmdebstrap failed: see $tmp/mmdebstrap.log"
  vm_image_finish "$init" "$tmp"
  rm -rf "$dir"
  mv "$tmp" "$dir"
}

# vm_image_finish INIT TMP makes the root file system TMP/root, as
# mmdebstrap left it, a guest of the lab, and packs it into TMP/disk.raw.
vm_image_finish() {
  local init=$1 tmp=$2 root=$2/root
  echo kelp-vm >"$root/etc/hostname"
  printf '127.0.0.1 localhost %s\n127.0.1.1 kelp-vm\n' "$VM_RELEASE_HOST" >"$root/etc/hosts"
  printf 'LABEL=root / ext4 defaults 0 1\n' >"$root/etc/fstab"
  # qemu's user network: the guest is always 10.0.2.15, its gateway
  # 10.0.2.2 (which, with restrict=on, forwards nothing out).
  rm -f "$root/etc/resolv.conf"
  printf 'nameserver 10.0.2.3\n' >"$root/etc/resolv.conf"
  case $init in
  systemd)
    mkdir -p "$root/etc/systemd/network"
    printf '[Match]\nName=eth0\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\nDNS=10.0.2.3\n' \
      >"$root/etc/systemd/network/eth0.network"
    chroot "$root" systemctl enable systemd-networkd >/dev/null 2>&1
    # Nothing that would reach out or churn the disk while a scenario runs.
    chroot "$root" systemctl mask apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer fstrim.timer >/dev/null 2>&1 || true
    ;;
  openrc)
    printf 'auto lo\niface lo inet loopback\nauto eth0\niface eth0 inet static\n  address 10.0.2.15/24\n  gateway 10.0.2.2\n' \
      >"$root/etc/network/interfaces"
    # A login on the serial console, for a look by hand.
    sed -i 's/^#\?T0:.*/T0:23:respawn:\/sbin\/getty -L ttyS0 115200 vt100/' "$root/etc/inittab"
    ;;
  esac
  mkdir -p "$root/root/.ssh"
  install -m 0600 "$VM_CACHE/keys/id_ed25519.pub" "$root/root/.ssh/authorized_keys"
  install -m 0644 "$VM_CACHE/keys/ca.crt" "$root/usr/local/share/ca-certificates/kelp-vm-lab.crt"
  chroot "$root" update-ca-certificates >/dev/null 2>&1
  mkdir -p "$root/root/lab"
  install -m 0600 "$VM_CACHE/keys/server.key" "$VM_CACHE/keys/server.crt" "$root/root/lab/"
  install -m 0755 "$VM_LIB_DIR/../vm/releases.py" "$root/root/lab/releases.py"

  cp -L "$root/vmlinuz" "$tmp/vmlinuz" 2>/dev/null || cp "$root"/boot/vmlinuz-* "$tmp/vmlinuz"
  cp -L "$root/initrd.img" "$tmp/initrd.img" 2>/dev/null || cp "$root"/boot/initrd.img-* "$tmp/initrd.img"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*_Packages
  mkfs.ext4 -q -L root -d "$root" "$tmp/disk.raw" 8G
  rm -rf "$root"
}

# --- a running VM ----------------------------------------------------------

VM_PID=
VM_DIR=
VM_SSH_PORT=
VM_API_PORT=

# vm_new ARCH INIT makes a fresh disk for a scenario: a qcow2 overlay on
# the cached image, which stays as it was.
vm_new() {
  local arch=$1 init=$2
  VM_ARCH=$arch
  VM_IMAGE=$VM_CACHE/images/$arch-$init
  VM_DIR=$(mktemp -d "$VM_CACHE/run.XXXXXX")
  qemu-img create -q -f qcow2 -F raw -b "$VM_IMAGE/disk.raw" "$VM_DIR/disk.qcow2"
  VM_SSH_PORT=$((20000 + RANDOM % 20000))
  VM_API_PORT=$((VM_SSH_PORT + 1))
}

# vm_start [EXTRA KERNEL ARGUMENTS] boots the VM in the background.
#
# The disk is cache=none (O_DIRECT on the host): a write the guest's
# kernel sent to its disk is in the host's hands, and what the guest
# holds in its own page cache is not. Killing qemu with SIGKILL is then a
# power cut of the guest that keeps what it flushed.
vm_start() {
  local append="root=LABEL=root rw console=ttyS0 net.ifnames=0 panic=10 $*"
  local qemu=(qemu-system-x86_64 -machine q35 -cpu max)
  [[ $VM_ARCH == arm64 ]] && qemu=(qemu-system-aarch64 -machine virt -cpu max)
  "${qemu[@]}" -accel tcg,thread=multi -smp "$VM_CPUS" -m "$VM_MEMORY" \
    -kernel "$VM_IMAGE/vmlinuz" -initrd "$VM_IMAGE/initrd.img" -append "$append" \
    -drive "file=$VM_DIR/disk.qcow2,if=virtio,format=qcow2,cache=none,discard=unmap" \
    -nic "user,model=virtio-net-pci,restrict=on,hostfwd=tcp:127.0.0.1:$VM_SSH_PORT-:22,hostfwd=tcp:127.0.0.1:$VM_API_PORT-:6443" \
    -display none -monitor none -serial "file:$VM_DIR/console.log" -no-user-config \
    </dev/null >>"$VM_DIR/qemu.log" 2>&1 &
  VM_PID=$!
}

# vm_kill ends the VM as a power cut does.
vm_kill() {
  [[ -n $VM_PID ]] || return 0
  kill -9 "$VM_PID" 2>/dev/null || true
  wait "$VM_PID" 2>/dev/null || true
  VM_PID=
}

vm_cleanup() {
  vm_kill
  if [[ -n $VM_DIR && -z ${VM_KEEP:-} ]]; then rm -rf "$VM_DIR"; fi
}

vm_ssh() {
  ssh -q -i "$VM_CACHE/keys/id_ed25519" -p "$VM_SSH_PORT" -o BatchMode=yes -o ConnectTimeout=10 \
    -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR \
    -o ServerAliveInterval=15 -o ServerAliveCountMax=8 root@127.0.0.1 "$@"
}

vm_scp() { # LOCAL... REMOTE_DIR
  local files=("${@:1:$#-1}") to=${*: -1}
  scp -q -i "$VM_CACHE/keys/id_ed25519" -P "$VM_SSH_PORT" -o BatchMode=yes -o StrictHostKeyChecking=no \
    -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR "${files[@]}" "root@127.0.0.1:$to"
}

# until_true SECONDS COMMAND... retries COMMAND every 5 s until it succeeds.
until_true() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    [[ -z $VM_PID ]] || kill -0 "$VM_PID" 2>/dev/null || { vm_log "qemu exited"; return 1; }
    sleep 5
  done
}

vm_wait_ssh() { until_true "${1:-600}" vm_ssh true; }

# vm_dump prints what a failure needs: the end of the console and kelp's log.
vm_dump() {
  [[ -n $VM_DIR ]] || return 0
  vm_log "console (last 40 lines):"
  tail -n 40 "$VM_DIR/console.log" 2>/dev/null | tr -d '\r' >&2 || true
  if [[ -n $VM_PID ]]; then
    vm_log "kelp's log (last 60 lines):"
    vm_ssh 'journalctl -u kelp --no-pager -n 60 2>/dev/null || tail -n 60 /var/log/kelp.log' >&2 || true
  fi
}
