// Package killall stops the kelp node of one data dir completely: its kelp
// server or agent, containerd, every shim and container, and removes what
// they set up on the host (mounts, interfaces, nftables tables, cgroups).
// Data in the data dir is kept. The nodes of other data dirs, and kelp's
// tools (kubectl, crictl, ctr) are left running.
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
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/nft"
	"github.com/kelp-dev/kelp/internal/overlay"
)

var log = logrus.WithField("component", "killall")

// cgroupRoot is where the cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// Run stops everything the kelp node with dataDir started.
func Run(dataDir string) error {
	if os.Geteuid() != 0 {
		return errors.New("kelp killall must run as root")
	}
	c, err := newClassifier(dataDir)
	if err != nil {
		return err
	}
	procs, err := readProcesses()
	if err != nil {
		return fmt.Errorf("read the process table: %w", err)
	}
	p, err := c.plan(procs, os.Getpid(), podProcesses())
	errs := []error{err}
	killed, err := killAll(p.kill)
	errs = append(errs, err)
	log.WithField("processes", killed).Info("stopped kelp, containerd, shims and containers")
	if len(p.others) > 0 {
		// Two nodes cannot share one machine's /run/kelp, kubelet root,
		// network and kubepods: they are the running node's.
		log.WithField("pids", p.others).Warnf("a kelp node with another data dir runs here: only the mounts under %s are removed; kelp killall with that node's --data-dir removes the rest", c.dataDir)
		errs = append(errs, unmountUnder(c.dataDir))
		return errors.Join(errs...)
	}
	errs = append(errs, unmountUnder(c.dataDir, layout.KubeletRoot, layout.RunDir, layout.NetnsDir))
	removeNetns()
	errs = append(errs, removeNetwork())
	errs = append(errs, removeCgroups())
	errs = append(errs, emptyDir(layout.RunDir))
	return errors.Join(errs...)
}

// newClassifier tells the processes of the node with dataDir, a relative
// one taken from the current directory, from the rest of the machine's.
func newClassifier(dataDir string) (classifier, error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return classifier{}, fmt.Errorf("data dir %s: %w", dataDir, err)
	}
	return classifier{dataDir: resolveSymlinks(abs), root: configFiles("/"), resolve: resolveSymlinks}, nil
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

// killAll sends SIGKILL to pids and waits until they are gone.
func killAll(pids []int) (int, error) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				return len(pids), fmt.Errorf("process %d did not die after SIGKILL", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return len(pids), nil
}

// unmountUnder detaches every mount below the given directories, deepest
// first. The directories themselves stay mounted: a data dir on a disk of
// its own is the user's.
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
	return errors.Join(errs...)
}

// removeNetns removes the pods' network namespace files the CNI plugins
// left, once unmounted.
func removeNetns() {
	matches, _ := filepath.Glob(filepath.Join(layout.NetnsDir, "cni-*"))
	for _, m := range matches {
		_ = os.Remove(m)
	}
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

// podCgroups returns the kubelet's pod cgroups, kubepods (cgroupfs) or
// kubepods.slice (systemd), at the root of every hierarchy mounted under
// root. On the unified hierarchy the directories under root are cgroups,
// not hierarchies: a kubepods below one of them is some other machine's,
// a test node's say (internal/testcluster).
func podCgroups(root string) []string {
	hierarchies := []string{root}
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
		hierarchies, _ = filepath.Glob(filepath.Join(root, "*"))
	}
	var dirs []string
	for _, h := range hierarchies {
		for _, name := range []string{"kubepods", "kubepods.slice"} {
			if info, err := os.Stat(filepath.Join(h, name)); err == nil && info.IsDir() {
				dirs = append(dirs, filepath.Join(h, name))
			}
		}
	}
	return dirs
}

// podProcesses are the processes in the pod cgroups.
func podProcesses() []int {
	var pids []int
	for _, dir := range podCgroups(cgroupRoot) {
		pids = append(pids, cgroupProcs(dir)...)
	}
	return pids
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
	for _, root := range podCgroups(cgroupRoot) {
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
