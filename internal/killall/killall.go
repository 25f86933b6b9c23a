// Package killall stops a kelp node completely: kelp, containerd, every
// shim and container, and removes what they set up on the host (mounts,
// interfaces, nftables tables, cgroups). Data in the data dir is kept.
package killall

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/cni"
	"github.com/kelp-dev/kelp/internal/dns"
	"github.com/kelp-dev/kelp/internal/nft"
	"github.com/kelp-dev/kelp/internal/overlay"
)

var log = logrus.WithField("component", "killall")

// shimBinary is the runc shim of the bundle; shims detach from containerd
// and must be found on their own.
const shimBinary = "containerd-shim-runc-v2"

// Paths whose mounts belong to a node besides its data dir.
const (
	kubeletRoot = "/var/lib/kubelet"
	runDir      = "/run/kelp"
	netnsDir    = "/run/netns"
)

// Run stops everything the kelp node with dataDir started.
func Run(dataDir string) error {
	if os.Geteuid() != 0 {
		return errors.New("kelp killall must run as root")
	}
	var errs []error
	killed, err := killProcesses()
	errs = append(errs, err)
	log.WithField("processes", killed).Info("stopped kelp, containerd, shims and containers")
	errs = append(errs, unmountUnder(dataDir, kubeletRoot, runDir, netnsDir))
	errs = append(errs, removeNetwork())
	errs = append(errs, removeCgroups())
	errs = append(errs, emptyDir(runDir))
	return errors.Join(errs...)
}

// mountsBelow lists the mount points in mountinfo strictly below dirs,
// deepest first.
func mountsBelow(mountinfo string, dirs ...string) []string {
	var targets []string
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescape(f[4])
		for _, d := range dirs {
			if strings.HasPrefix(mp, strings.TrimSuffix(d, "/")+"/") {
				targets = append(targets, mp)
				break
			}
		}
	}
	sort.Slice(targets, func(i, j int) bool { return len(targets[i]) > len(targets[j]) })
	return slices.Compact(targets)
}

// emptyDir removes what is in dir but not dir itself: it may be a mount
// point (a tmpfs of its own), and removing it would detach that mount in
// every mount namespace of the machine.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
	}
	return errors.Join(errs...)
}

// killProcesses kills every process in this mount namespace that runs the
// kelp binary (the server, containerd) or the bundle's shim, everything
// they started (the containers), and whatever is left in the pods'
// cgroups. It waits until they are gone.
func killProcesses() (int, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	selfInfo, err := os.Stat(self)
	if err != nil {
		return 0, err
	}
	ownNS, _ := os.Readlink("/proc/self/ns/mnt")
	parents := map[int][]int{} // ppid → children
	var roots []int
	for _, pid := range allPIDs() {
		if pid == os.Getpid() {
			continue
		}
		if ppid, ok := parentOf(pid); ok {
			parents[ppid] = append(parents[ppid], pid)
		}
		if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); ns != ownNS {
			continue
		}
		exe := fmt.Sprintf("/proc/%d/exe", pid)
		if info, err := os.Stat(exe); err == nil && os.SameFile(info, selfInfo) {
			roots = append(roots, pid)
		} else if target, _ := os.Readlink(exe); filepath.Base(strings.TrimSuffix(target, " (deleted)")) == shimBinary {
			roots = append(roots, pid)
		}
	}
	victims := map[int]bool{}
	var walk func(int)
	walk = func(pid int) {
		if victims[pid] || pid == os.Getpid() {
			return
		}
		victims[pid] = true
		for _, c := range parents[pid] {
			walk(c)
		}
	}
	for _, r := range roots {
		walk(r)
	}
	for _, dir := range podCgroups() {
		for _, pid := range cgroupProcs(dir) {
			walk(pid)
		}
	}
	for pid := range victims {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for pid := range victims {
		for alive(pid) {
			if time.Now().After(deadline) {
				return len(victims), fmt.Errorf("process %d did not die after SIGKILL", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return len(victims), nil
}

func allPIDs() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

func parentOf(pid int) (int, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name may hold spaces; the fields after it do not.
	rest := string(data[strings.LastIndexByte(string(data), ')')+1:])
	f := strings.Fields(rest)
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// alive is true while pid exists and is not a zombie.
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	rest := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(rest) > 0 && rest[0] != "Z"
}

// unmountUnder detaches every mount below the given directories, deepest
// first, and removes the CNI network namespace files. The directories
// themselves stay mounted: a data dir on a disk of its own is the user's.
func unmountUnder(dirs ...string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range mountsBelow(string(data), dirs...) {
		if err := unix.Unmount(t, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", t, err))
		}
	}
	if matches, _ := filepath.Glob(filepath.Join(netnsDir, "cni-*")); len(matches) > 0 {
		for _, m := range matches {
			_ = os.Remove(m)
		}
	}
	return errors.Join(errs...)
}

// unescape decodes the octal escapes of /proc/self/mountinfo (\040 is a
// space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// removeNetwork deletes the pod bridge, the veths still on it, the cluster
// DNS address, the overlay's device and routes, and kelp's nftables tables.
func removeNetwork() error {
	var errs []error
	if err := overlay.Remove(); err != nil {
		errs = append(errs, err)
	}
	if bridge, err := netlink.LinkByName(cni.Bridge); err == nil {
		links, _ := netlink.LinkList()
		for _, l := range links {
			if l.Attrs().MasterIndex == bridge.Attrs().Index {
				_ = netlink.LinkDel(l)
			}
		}
		if err := netlink.LinkDel(bridge); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", cni.Bridge, err))
		}
	}
	if lo, err := netlink.LinkByName("lo"); err == nil {
		addrs, _ := netlink.AddrList(lo, netlink.FAMILY_ALL)
		for _, a := range addrs {
			if a.Label == dns.AddressLabel {
				if err := netlink.AddrDel(lo, &a); err != nil {
					errs = append(errs, fmt.Errorf("remove the cluster DNS address %s: %w", a.IPNet, err))
				}
			}
		}
	}
	c, err := nft.New()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	tables, err := c.ListTables()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("list nftables tables: %w", err))...)
	}
	for _, t := range tables {
		if t.Name == cni.Table || strings.HasPrefix(t.Name, cni.Table+"-") {
			c.DelTable(t)
		}
	}
	if err := c.Flush(); err != nil {
		errs = append(errs, fmt.Errorf("delete nftables tables: %w", err))
	}
	return errors.Join(errs...)
}

// podCgroups returns the kubelet's pod cgroup roots on every hierarchy.
func podCgroups() []string {
	var dirs []string
	for _, name := range []string{"kubepods", "kubepods.slice"} {
		m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", name))
		dirs = append(dirs, m...)
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", name)); err == nil {
			dirs = append(dirs, filepath.Join("/sys/fs/cgroup", name))
		}
	}
	return dirs
}

func cgroupProcs(root string) []int {
	var pids []int
	_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		data, _ := os.ReadFile(path)
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// removeCgroups removes the pod cgroups, children before parents.
func removeCgroups() error {
	var errs []error
	for _, root := range podCgroups() {
		var dirs []string
		_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}
