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
    # debootstrap, kmod (depmod, modprobe) and cpio make the image and
    # its first boot: see vm_image_foreign.
    [[ $p == arm64 ]] && pkgs+=(qemu-system-arm debootstrap kmod cpio)
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

# vm_image_dir ARCH INIT names the cached image: by its suite and package
# list too, so a change of either builds a new one.
vm_image_dir() {
  local id
  id=$(printf '%s %s\n' "$VM_SUITE" "$(vm_image_packages "$2")" | sha256sum | cut -c1-8)
  echo "$VM_CACHE/images/$1-$2-$id"
}

# vm_image ARCH INIT builds, once, the image of Debian $VM_SUITE for ARCH
# with INIT (systemd or openrc) as PID 1: $(vm_image_dir ARCH INIT) holds
# disk.raw (ext4, labelled root, no partition table), vmlinuz and
# initrd.img for qemu's direct kernel boot. No loop mount: the root file
# system is made in a directory and packed by mkfs.ext4 -d.
#
# What makes a Debian root a guest of the lab is written once, for either
# way of building it: vm_image_overlay lays the lab's files over the root,
# vm_image_setup prints the commands run inside it.
vm_image() {
  local arch=$1 init=$2 dir
  dir=$(vm_image_dir "$1" "$2")
  [[ -f $dir/disk.raw ]] && return 0
  local tmp=$dir.tmp
  # An mmdebstrap that was killed may have left /proc or /dev mounted in
  # its root: never rm -rf through them.
  if grep -q " $tmp/" /proc/self/mountinfo; then
    vm_die "something is still mounted below $tmp: unmount it, then run again"
  fi
  rm -rf "$tmp"
  mkdir -p "$tmp/root"
  vm_image_overlay "$init" "$tmp/overlay"
  if [[ $arch == "$(dpkg --print-architecture)" ]]; then
    vm_image_native "$arch" "$init" "$tmp"
  else
    vm_image_foreign "$arch" "$init" "$tmp"
  fi
  rm -rf "$tmp/root" "$tmp/overlay"
  rm -rf "$dir"
  mv "$tmp" "$dir"
}

# e2fsprogs: fsck.ext4, so that a boot after a power cut checks the root
# file system as a real Debian does (without it systemd skips the check
# and OpenRC stops in a maintenance shell).
vm_image_packages() { # INIT
  local pkgs=(openssh-server ca-certificates curl xz-utils python3 iproute2 kmod procps
    sqlite3 nftables initramfs-tools less e2fsprogs)
  case $1 in
  systemd) pkgs+=(systemd systemd-sysv dbus udev) ;;
  openrc) pkgs+=(sysvinit-core openrc ifupdown udev) ;;
  esac
  (IFS=,; echo "${pkgs[*]}")
}

# vm_image_overlay INIT DIR writes the lab's files into DIR, a tree laid
# over the root once its packages are installed.
vm_image_overlay() {
  local init=$1 o=$2
  mkdir -p "$o/etc/initramfs-tools/conf.d" "$o/etc/initramfs-tools/hooks" "$o/root/.ssh" "$o/root/lab" \
    "$o/usr/local/share/ca-certificates"
  chmod 0700 "$o/root"
  echo kelp-vm >"$o/etc/hostname"
  printf '127.0.0.1 localhost %s\n127.0.1.1 kelp-vm\n' "$VM_RELEASE_HOST" >"$o/etc/hosts"
  printf 'LABEL=root / ext4 defaults 0 1\n' >"$o/etc/fstab"
  # qemu's user network: the guest is always 10.0.2.15, its gateway
  # 10.0.2.2 (which, with restrict=on, forwards nothing out).
  printf 'nameserver 10.0.2.3\n' >"$o/etc/resolv.conf"
  case $init in
  systemd)
    mkdir -p "$o/etc/systemd/network"
    printf '[Match]\nName=eth0\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\nDNS=10.0.2.3\n' \
      >"$o/etc/systemd/network/eth0.network"
    ;;
  openrc)
    mkdir -p "$o/etc/network"
    printf 'auto lo\niface lo inet loopback\nauto eth0\niface eth0 inet static\n  address 10.0.2.15/24\n  gateway 10.0.2.2\n' \
      >"$o/etc/network/interfaces"
    ;;
  esac
  # The initramfs holds only what finds the root disk: with every module
  # (MODULES=most) mkinitramfs takes many minutes on a busy machine, and
  # far longer under emulation.
  echo MODULES=list >"$o/etc/initramfs-tools/conf.d/kelp-vm.conf"
  cat >"$o/etc/initramfs-tools/hooks/kelp-vm" <<'EOF'
#!/bin/sh
[ "$1" = prereqs ] && exit 0
. /usr/share/initramfs-tools/hook-functions
manual_add_modules virtio_pci virtio_mmio virtio_blk ext4 crc32c_generic libcrc32c
EOF
  chmod 0755 "$o/etc/initramfs-tools/hooks/kelp-vm"
  install -m 0600 "$VM_CACHE/keys/id_ed25519.pub" "$o/root/.ssh/authorized_keys"
  install -m 0644 "$VM_CACHE/keys/ca.crt" "$o/usr/local/share/ca-certificates/kelp-vm-lab.crt"
  install -m 0600 "$VM_CACHE/keys/server.key" "$VM_CACHE/keys/server.crt" "$o/root/lab/"
  install -m 0755 "$VM_LIB_DIR/../vm/releases.py" "$o/root/lab/releases.py"
}

# vm_image_setup INIT prints the commands that finish the root from
# inside it, after the overlay.
vm_image_setup() {
  case $1 in
  systemd)
    echo 'systemctl enable systemd-networkd'
    # Nothing that would reach out or churn the disk while a scenario runs.
    echo 'systemctl mask apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer fstrim.timer || true'
    ;;
  openrc)
    # A login on the serial console, for a look by hand.
    echo "sed -i 's/^#\\?T0:.*/T0:23:respawn:\\/sbin\\/getty -L ttyS0 115200 vt100/' /etc/inittab"
    ;;
  esac
  echo 'update-ca-certificates'
  echo 'rm -rf /var/cache/apt/archives/*.deb /var/lib/apt/lists/*_Packages'
}

# vm_image_native ARCH INIT TMP: mmdebstrap builds the root in a chroot,
# which runs the packages' scripts on the host.
vm_image_native() {
  local arch=$1 init=$2 tmp=$3 root=$3/root
  vm_log "building the $arch-$init image (mmdebstrap $VM_SUITE; a few minutes)"
  # The initramfs settings go in before the kernel, whose package makes
  # the initramfs.
  mmdebstrap --arch="$arch" --variant=apt --include="linux-image-$arch,$(vm_image_packages "$init")" \
    --essential-hook="cp -r $tmp/overlay/etc/initramfs-tools \"\$1/etc/\"" \
    "$VM_SUITE" "$root" "$VM_MIRROR" >"$tmp/mmdebstrap.log" 2>&1 ||
    vm_die "mmdebstrap failed: see $tmp/mmdebstrap.log"
  cp -a --remove-destination "$tmp/overlay/." "$root/"
  chroot "$root" sh -ec "$(vm_image_setup "$init")" >"$tmp/setup.log" 2>&1 ||
    vm_die "setting up the image failed: see $tmp/setup.log"
  cp -L "$root/vmlinuz" "$tmp/vmlinuz" 2>/dev/null || cp "$root"/boot/vmlinuz-* "$tmp/vmlinuz"
  cp -L "$root/initrd.img" "$tmp/initrd.img" 2>/dev/null || cp "$root"/boot/initrd.img-* "$tmp/initrd.img"
  mkfs.ext4 -q -L root -d "$root" "$tmp/disk.raw" 8G
}

# vm_image_foreign ARCH INIT TMP builds the root of another architecture
# without running any of its programs on the host (no binfmt_misc here):
# debootstrap --foreign only unpacks the packages; the guest itself, booted
# once under qemu from a kernel and a small initramfs of the same packages,
# runs debootstrap's second stage and vm_image_setup, and powers off.
vm_image_foreign() {
  local arch=$1 init=$2 tmp=$3 root=$3/root
  vm_log "building the $arch-$init image (debootstrap $VM_SUITE, then its second stage under qemu: long)"
  mkdir -p "$VM_CACHE/debs-$arch"
  # busybox-static: the first boot's initramfs takes its shell from it.
  debootstrap --foreign --arch="$arch" --variant=minbase --cache-dir="$VM_CACHE/debs-$arch" \
    --include="linux-image-$arch,busybox-static,$(vm_image_packages "$init")" \
    "$VM_SUITE" "$root" "$VM_MIRROR" >"$tmp/debootstrap.log" 2>&1 ||
    vm_die "debootstrap failed: see $tmp/debootstrap.log"
  cp -r "$tmp/overlay/etc/initramfs-tools" "$root/etc/"
  vm_first_boot "$tmp" || vm_die "the first boot's kernel and initramfs: see $tmp"
  mkdir -p "$root/kelp-vm"
  cp -a "$tmp/overlay" "$root/kelp-vm/overlay"
  cp "$tmp/first-boot/busybox" "$root/kelp-vm/busybox"
  {
    echo 'set -e'
    echo 'cp -a --remove-destination /kelp-vm/overlay/. /'
    vm_image_setup "$init"
  } >"$root/kelp-vm/setup"
  cat >"$root/kelp-vm/stage2" <<'EOF'
# PID 1 of the first boot, run by busybox from the root disk.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
if /debootstrap/debootstrap --second-stage && sh -x /kelp-vm/setup && ls /boot/vmlinuz-* /boot/initrd.img-*; then
  echo "kelp-vm: second stage ok"
else
  echo "kelp-vm: second stage failed"
  tail -n 40 /debootstrap/debootstrap.log 2>/dev/null
fi
# busybox from memory (/dev is devtmpfs) once /kelp-vm is gone: PID 1
# must not exit, which is a panic, but power off. The shell's own binary
# is deleted and open, so only the emergency remount makes / read-only.
cp /kelp-vm/busybox /dev/busybox
rm -rf /kelp-vm
/dev/busybox mount -t proc proc /proc 2>/dev/null
sync
echo u >/proc/sysrq-trigger
/dev/busybox sleep 2
exec /dev/busybox poweroff -f
EOF
  mkfs.ext4 -q -L root -d "$root" "$tmp/disk.raw" 8G
  # -no-reboot: a panic of the first boot ends qemu too. VM_PID lets
  # vm_cleanup end it if the lab is stopped meanwhile.
  qemu-system-aarch64 -machine virt -cpu cortex-a72 -accel tcg,thread=multi -smp "$VM_CPUS" -m "$VM_MEMORY" \
    -kernel "$tmp/first-boot/vmlinuz" -initrd "$tmp/first-boot/initrd.img" \
    -append "console=ttyAMA0 panic=1" -no-reboot \
    -drive "file=$tmp/disk.raw,if=virtio,format=raw" -nic none \
    -display none -monitor none -serial "file:$tmp/first-boot.log" -no-user-config \
    </dev/null >"$tmp/qemu.log" 2>&1 &
  VM_PID=$!
  local deadline=$((SECONDS + ${VM_IMAGE_TIMEOUT:-14400}))
  while kill -0 "$VM_PID" 2>/dev/null; do
    ((SECONDS < deadline)) || { vm_kill; vm_die "the first boot took too long: see $tmp/first-boot.log"; }
    sleep 10
  done
  wait "$VM_PID" || { VM_PID=; vm_die "qemu failed: see $tmp/qemu.log"; }
  VM_PID=
  grep -q '^kelp-vm: second stage ok' "$tmp/first-boot.log" ||
    vm_die "the second stage failed: see $tmp/first-boot.log"
  local f
  for f in vmlinuz initrd.img; do
    local name
    name=$(debugfs -R 'ls -p /boot' "$tmp/disk.raw" 2>/dev/null | cut -d/ -f6 | grep "^$f-" | sort -V | tail -n 1)
    [[ -n $name ]] || vm_die "no /boot/$f-* in the image"
    debugfs -R "dump /boot/$name $tmp/$f" "$tmp/disk.raw" >/dev/null 2>&1
    [[ -s $tmp/$f ]] || vm_die "could not copy /boot/$name out of the image"
  done
  rm -rf "$tmp/first-boot"
}

# vm_first_boot TMP makes TMP/first-boot/: vmlinuz and the modules that
# find the root disk, from the kernel package that debootstrap fetched,
# busybox from busybox-static, and an initramfs whose /init loads the
# modules, mounts /dev/vda and hands it /kelp-vm/stage2.
vm_first_boot() {
  local tmp=$1 debs=$1/root/var/cache/apt/archives fb=$1/first-boot
  local kdir=$fb/kernel ird=$fb/initramfs kver m
  mkdir -p "$kdir" "$ird/bin" "$ird/lib" "$fb/busybox-static"
  local kernels=("$debs"/linux-image-[0-9]*.deb)
  dpkg-deb -x "${kernels[-1]}" "$kdir" || return 1
  dpkg-deb -x "$debs"/busybox-static_*.deb "$fb/busybox-static" || return 1
  kver=$(ls "$kdir/lib/modules")
  cp "$kdir/boot/vmlinuz-$kver" "$fb/vmlinuz"
  cp "$fb/busybox-static/bin/busybox" "$fb/busybox"
  cp "$fb/busybox" "$ird/bin/busybox"
  depmod -b "$kdir" "$kver"
  # The kernel's config has virtio, PCI and the PL011 console built in;
  # these are modules (crc32c: ext4 asks for it by name, not as a symbol).
  for m in virtio_pci virtio_mmio virtio_blk crc32c_generic ext4; do
    modprobe -d "$kdir" -S "$kver" --show-depends "$m" || return 1
  done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' >"$fb/modules"
  : >"$ird/modules"
  while read -r m; do
    cp "$m" "$ird/lib/"
    basename "$m" >>"$ird/modules"
  done <"$fb/modules"
  cat >"$ird/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /proc /dev /newroot
mount -t proc proc /proc
mount -t devtmpfs dev /dev
for m in $(cat /modules); do insmod "/lib/$m"; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 60 ]; do sleep 1; i=$((i + 1)); done
mount -t ext4 /dev/vda /newroot || { echo "kelp-vm: no root disk"; poweroff -f; }
mount --move /dev /newroot/dev
umount /proc
exec switch_root /newroot /kelp-vm/busybox sh /kelp-vm/stage2
EOF
  chmod 0755 "$ird/init"
  (cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) >"$fb/initrd.img"
}

# --- a running VM ----------------------------------------------------------

VM_PID=
VM_DISK_PID=
VM_DIR=
VM_SSH_PORT=
VM_API_PORT=

# vm_new ARCH INIT makes a fresh disk for a scenario: a qcow2 overlay on
# the cached image, which stays as it was.
vm_new() {
  local arch=$1 init=$2
  VM_ARCH=$arch
  VM_IMAGE=$(vm_image_dir "$arch" "$init")
  VM_DIR=$(mktemp -d "$VM_CACHE/run.XXXXXX")
  if [[ ${VM_DISK:-} == volatile ]]; then
    go build -o "$VM_CACHE/flushdisk" ./scripts/vm/flushdisk
    cp --sparse=always "$VM_IMAGE/disk.raw" "$VM_DIR/disk.raw"
  else
    qemu-img create -q -f qcow2 -F raw -b "$VM_IMAGE/disk.raw" "$VM_DIR/disk.qcow2"
  fi
  VM_SSH_PORT=$((20000 + RANDOM % 20000))
  VM_API_PORT=$((VM_SSH_PORT + 1))
}

# vm_start [EXTRA KERNEL ARGUMENTS] boots the VM in the background.
#
# The disk is cache=none (O_DIRECT on the host): a write the guest's
# kernel sent to its disk is in the host's hands, and what the guest
# holds in its own page cache is not. Killing qemu with SIGKILL is then a
# power cut of the guest that keeps what it flushed... and also what it
# only wrote. VM_DISK=volatile is a card with a write cache that a power
# cut empties: the disk is scripts/vm/flushdisk, an NBD server that puts
# writes into the image only when the guest flushes, and drops the rest
# when qemu dies (vm_new made a private copy of the image for it).
vm_start() {
  local console=ttyS0 qemu=(qemu-system-x86_64 -machine q35 -cpu max)
  # A Pi 4's cores; under TCG also quicker than -cpu max, whose pointer
  # authentication qemu computes the slow way.
  [[ $VM_ARCH == arm64 ]] && console=ttyAMA0 qemu=(qemu-system-aarch64 -machine virt -cpu cortex-a72)
  local append="root=LABEL=root rw console=$console net.ifnames=0 panic=10 $*"
  local drive="file=$VM_DIR/disk.qcow2,if=virtio,format=qcow2,cache=none,discard=unmap"
  if [[ ${VM_DISK:-} == volatile ]]; then
    rm -f "$VM_DIR/nbd.sock"
    "$VM_CACHE/flushdisk" -socket "$VM_DIR/nbd.sock" "$VM_DIR/disk.raw" 2>>"$VM_DIR/flushdisk.log" &
    VM_DISK_PID=$!
    until [[ -S $VM_DIR/nbd.sock ]]; do sleep 0.2; done
    drive="file=nbd+unix:///?socket=$VM_DIR/nbd.sock,if=virtio,format=raw,cache=writeback"
  fi
  "${qemu[@]}" -accel tcg,thread=multi -smp "$VM_CPUS" -m "$VM_MEMORY" \
    -kernel "$VM_IMAGE/vmlinuz" -initrd "$VM_IMAGE/initrd.img" -append "$append" \
    -drive "$drive" \
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
  # The disk's server ends with its connection, dropping what the guest
  # had not flushed; it says how much in flushdisk.log.
  if [[ -n ${VM_DISK_PID:-} ]]; then
    wait "$VM_DISK_PID" 2>/dev/null || true
    VM_DISK_PID=
    [[ ! -s $VM_DIR/flushdisk.log ]] || vm_log "disk: $(tail -n 1 "$VM_DIR/flushdisk.log")"
  fi
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
    vm_log "kelp's last errors (the lines 'kelp: …' it ends with):"
    vm_ssh '{ journalctl -u kelp --no-pager -o cat 2>/dev/null || cat /var/log/kelp.log; } | grep "^kelp: " | tail -n 5' >&2 || true
  fi
}
