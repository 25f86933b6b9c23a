// Package killall stops the kelp node of one data dir completely: its kelp
// server or agent, containerd, every shim and container, and removes what
// they set up on the host (mounts, interfaces, nftables tables, pod
// cgroups and pod logs). Data in the data dir is kept. The nodes of other
// data dirs, in any mount namespace of the machine, and kelp's tools
// (kubectl, crictl, ctr) are left running, with whatever of the machine
// they use too.
package killall

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/cni"
	"github.com/kelp-dev/kelp/internal/dns"
	"github.com/kelp-dev/kelp/internal/gateway"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/nft"
	"github.com/kelp-dev/kelp/internal/nodepaths"
	"github.com/kelp-dev/kelp/internal/overlay"
)

var log = logrus.WithField("component", "killall")

// cgroupsMount is where the cgroup hierarchies are mounted.
const cgroupsMount = "/sys/fs/cgroup"

// Run stops everything the kelp node with dataDir started and removes
// what it set up, except what another node on the machine uses too.
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
	p, err := c.plan(procs, os.Getpid(), podProcesses(cgroupsMount, c.paths.CgroupRoot))
	errs := []error{c.pathsErr, err}
	killed, err := killAll(p.kill)
	errs = append(errs, err)
	log.WithField("processes", killed).Info("stopped kelp, containerd, shims and containers")
	if p.keep.any() {
		log.WithFields(logrus.Fields{
			"pids": p.others, "directories": p.keep.dirs, "network": p.keep.network,
			"podCgroups": p.keep.cgroups, "podLogs": p.keep.podLogs,
		}).Warn("kelp nodes with other data dirs run here: what they use too is left to them; kelp killall with their --data-dir removes it")
	}
	dirs := []string{c.dataDir}
	for _, d := range machineDirs {
		if !slices.Contains(p.keep.dirs, d) {
			dirs = append(dirs, d)
		}
	}
	errs = append(errs, unmountUnder(dirs...))
	if !slices.Contains(p.keep.dirs, layout.NetnsDir) {
		removeNetns()
	}
	// The node's Gateway addresses are its own, whoever else uses the
	// network.
	errs = append(errs, removeGatewayAddresses(c.dataDir))
	if !p.keep.network {
		errs = append(errs, removeNetwork(c.dataDir))
	}
	errs = append(errs, removeCNIResults(layout.Agent(c.dataDir).ContainerdRoot, cniCacheDir))
	if !p.keep.cgroups {
		// A slice left is a unit systemd keeps, not data in use: it does
		// not fail killall (the uninstaller would keep the data dir).
		if err := stopSlices(c.paths.CgroupRoot, systemdRuns, stopUnit); err != nil {
			log.WithError(err).Warn("the pods' systemd slices stay: systemctl stop them by hand (systemctl list-units --type=slice)")
		}
		errs = append(errs, removeCgroups(cgroupsMount, c.paths.CgroupRoot))
	}
	if !p.keep.podLogs {
		errs = append(errs, removePodLogs(c.paths.PodLogsDir))
	}
	if !slices.Contains(p.keep.dirs, layout.RunDir) {
		errs = append(errs, emptyRunDir(c.dataDir))
	}
	return errors.Join(errs...)
}

// newClassifier tells the processes of the node with dataDir, a relative
// one taken from the current directory, from the rest of the machine's.
func newClassifier(dataDir string) (classifier, error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return classifier{}, fmt.Errorf("data dir %s: %w", dataDir, err)
	}
	abs = resolveSymlinks(abs)
	c := classifier{dataDir: abs, root: configFiles("/"), resolve: resolveSymlinks, pathsOf: pathsOf, sameDir: sameDir}
	// A record that cannot be read does not keep the node running: its
	// processes are stopped all the same, and the error reported.
	if c.paths, c.pathsErr = nodepaths.Load(abs); c.pathsErr != nil {
		c.paths = nodepaths.Derive(abs)
	}
	return c, nil
}

// pathsOf reads the cgroup root and pod log dir of another node, whose
// data dir is dataDir where its process p runs, through p's root. A node
// whose data dir cannot be told, or whose record cannot be read, may use
// the machine's: so it is taken to.
func pathsOf(p process, dataDir string) nodepaths.Paths {
	if dataDir == "" {
		return nodepaths.Legacy()
	}
	paths, err := nodepaths.LoadIn(fmt.Sprintf("/proc/%d/root", p.pid), dataDir)
	if err != nil {
		log.WithError(err).WithField("pid", p.pid).Warn("another node's cgroup root and pod log dir are not known: taken to be the machine's")
		return nodepaths.Legacy()
	}
	return paths
}

// sameDir says whether dir, as process p sees it through its root, is the
// directory own is in killall's mount namespace: the same directory, not
// one of the same name in another mount namespace (a tmpfs of its own).
func sameDir(p process, dir, own string) bool {
	theirs, err := os.Stat(filepath.Join(fmt.Sprintf("/proc/%d/root", p.pid), dir))
	if err != nil {
		return false
	}
	mine, err := os.Stat(own)
	return err == nil && os.SameFile(theirs, mine)
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

// emptyRunDir removes what is in /run/kelp but not /run/kelp itself: it
// may be a mount point (a tmpfs of its own), and removing it would detach
// that mount in every mount namespace of the machine. Of the servers' RAM
// stores and kine sockets there, only dataDir's go: a server without a
// node of its own (--disable-agent) may run beside this node.
func emptyRunDir(dataDir string) error {
	return emptyDir(layout.RunDir, keepOthersRun, layout.RAMStore(dataDir))
}

// keepOthersRun matches the entries of /run/kelp that are not the RAM
// stores or kine sockets of servers.
func keepOthersRun(name string) bool {
	return name != "ram" && !strings.HasPrefix(name, "kine-")
}

// emptyDir removes the entries of dir whose names match, and the paths
// also.
func emptyDir(dir string, match func(name string) bool, also ...string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if match(e.Name()) {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
		}
	}
	for _, path := range also {
		errs = append(errs, os.RemoveAll(path))
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
// DNS address of the node with dataDir, the overlay's device and routes,
// and kelp's nftables tables.
func removeNetwork(dataDir string) error {
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
		// An IPv6 cluster DNS address has no label: it is the one the
		// node's Corefile binds.
		dnsIPv6, _ := dns.BoundAddress(layout.Agent(dataDir).Corefile)
		for _, a := range addrs {
			ip, _ := netip.AddrFromSlice(a.IP)
			ones, _ := a.Mask.Size()
			if a.Label == dns.AddressLabel || (dnsIPv6.Is6() && ip == dnsIPv6 && ones == 128) {
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

// removeGatewayAddresses takes off the interfaces the Gateway addresses
// the node recorded as held, and no other.
func removeGatewayAddresses(dataDir string) error {
	if err := gateway.ReleaseRecorded(layout.Agent(dataDir).GatewayAddresses); err != nil {
		return fmt.Errorf("remove the node's Gateway addresses: %w", err)
	}
	return nil
}

// podCgroups returns the directories that hold the kubelet's pod cgroups
// for cgroup root (nodepaths.PodCgroups) at the root of every hierarchy
// mounted under root. On the unified hierarchy the directories under root
// are cgroups, not hierarchies: a kubepods below one of them is some other
// machine's, a test node's say (internal/testcluster).
func podCgroups(root, cgroupRoot string) []string {
	hierarchies := []string{root}
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
		hierarchies, _ = filepath.Glob(filepath.Join(root, "*"))
	}
	var dirs []string
	for _, h := range hierarchies {
		for _, name := range nodepaths.PodCgroups(cgroupRoot) {
			if info, err := os.Stat(filepath.Join(h, name)); err == nil && info.IsDir() {
				dirs = append(dirs, filepath.Join(h, name))
			}
		}
	}
	return dirs
}

// podProcesses are the processes in the pod cgroups of cgroupRoot in the
// hierarchies mounted at mount.
func podProcesses(mount, cgroupRoot string) []int {
	var pids []int
	for _, dir := range podCgroups(mount, cgroupRoot) {
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

// cniCacheDir is libcni's cache of what each pod's network setup returned,
// shared by every runtime on the machine: containerd has no setting to
// give a node its own.
const cniCacheDir = "/var/lib/cni"

// removeCNIResults removes the entries the node's pods left in the CNI
// cache: a sandbox torn down in order removes its own, a node killed with
// its pods leaves <network>-<sandbox ID>-<interface> for each, and the
// tests' and benches' nodes left thousands on one machine. The node's
// sandboxes are those containerd still keeps a directory for.
func removeCNIResults(containerdRoot, cacheDir string) error {
	sandboxes, err := os.ReadDir(filepath.Join(containerdRoot, "io.containerd.grpc.v1.cri", "sandboxes"))
	if err != nil || len(sandboxes) == 0 {
		return nil
	}
	results := filepath.Join(cacheDir, "results")
	entries, err := os.ReadDir(results)
	if err != nil {
		return nil
	}
	var errs []error
	for _, e := range entries {
		for _, sb := range sandboxes {
			if strings.Contains(e.Name(), "-"+sb.Name()+"-") {
				if err := os.Remove(filepath.Join(results, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, err)
				}
				break
			}
		}
	}
	// Emptied, the cache goes too; with other entries it stays.
	_ = os.Remove(results)
	_ = os.Remove(cacheDir)
	return errors.Join(errs...)
}

// stopSlices has systemd stop the slice units of the node's pods. Under
// systemd's cgroup driver the kubelet asks systemd for its slices
// (kubepods.slice, or kelp_<hash>.slice); removing their directories
// leaves the units active, and systemd makes the directories again at its
// next daemon-reload, as the uninstaller's (found by scripts/vm.sh
// amd64-systemd). Stopping the top slice stops the ones in it. Without
// systemd, or when it has no such unit, there is nothing to stop.
func stopSlices(cgroupRoot string, systemd func() bool, stop func(unit string) error) error {
	if !systemd() {
		return nil
	}
	var errs []error
	for _, name := range nodepaths.PodCgroups(cgroupRoot) {
		if strings.HasSuffix(name, ".slice") {
			errs = append(errs, stop(name))
		}
	}
	return errors.Join(errs...)
}

// systemdRuns tells whether systemd is the machine's init, as
// sd_booted(3) does.
func systemdRuns() bool {
	_, err := os.Stat("/run/systemd/system")
	return err == nil
}

// stopUnit stops a systemd unit and waits, at most 30 s, for the job; a
// unit systemd does not have is stopped already.
func stopUnit(unit string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := sddbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return fmt.Errorf("stop %s: reach systemd: %w", unit, err)
	}
	defer conn.Close()
	done := make(chan string, 1)
	if _, err := conn.StopUnitContext(ctx, unit, "replace", done); err != nil {
		var dbusErr godbus.Error
		if errors.As(err, &dbusErr) && dbusErr.Name == "org.freedesktop.systemd1.NoSuchUnit" {
			return nil
		}
		return fmt.Errorf("stop %s: %w", unit, err)
	}
	select {
	case result := <-done:
		if result != "done" {
			return fmt.Errorf("stop %s: systemd says %s", unit, result)
		}
		log.WithField("unit", unit).Info("stopped the pods' systemd slice")
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop %s: %w", unit, ctx.Err())
	}
}

// removeCgroups removes the pod cgroups of cgroupRoot in the hierarchies
// mounted at mount, children before parents, once what still runs in them
// is killed: a container the kubelet or containerd started while kelp
// killall read the process table, before they were killed, is in none of
// its plans, and a cgroup with a process cannot be removed.
func removeCgroups(mount, cgroupRoot string) error {
	for attempt := 0; ; attempt++ {
		pids := podProcesses(mount, cgroupRoot)
		if len(pids) == 0 {
			break
		}
		if attempt == 5 {
			return fmt.Errorf("processes %v keep appearing in the pod cgroups of %s: run kelp killall again", pids, cgroupRoot)
		}
		if _, err := killAll(pids); err != nil {
			return err
		}
	}
	var errs []error
	for _, root := range podCgroups(mount, cgroupRoot) {
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

// removePodLogs removes the node's pod logs and the kubelet's links to
// them in /var/log/containers, which every node shares. The directory
// stays: it may be a mount point.
func removePodLogs(dir string) error {
	err := emptyDir(dir, func(string) bool { return true })
	links, _ := filepath.Glob(filepath.Join(layout.ContainerLogsDir, "*.log"))
	for _, l := range links {
		if target, err := os.Readlink(l); err == nil && strings.HasPrefix(target, dir+"/") {
			_ = os.Remove(l)
		}
	}
	return err
}
