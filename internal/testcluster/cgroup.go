package testcluster

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// v2Leaf is where a node's processes live in a cgroup v2 hierarchy, below
// the root of its subtree. cgroup v2 lets only leaves hold processes once
// controllers are enabled for the children, and the node's kubelet and runc
// enable them at the node's root to make kubepods; so nothing may stay in
// that root, as kind does it with its /init.
const v2Leaf = "init"

// cgroupTree is a node's own subtree in every mounted cgroup hierarchy.
// Two kubelets sharing one set of cgroups would fight over kubepods, each
// removing the pod cgroups it does not know.
type cgroupTree struct {
	hierarchies []hierarchy
}

// hierarchy is one mounted cgroup hierarchy and the node's subtree in it.
type hierarchy struct {
	mountpoint string // on the host, and where the node mounts its view
	v2         bool
	options    string // v1: the -o that selects this hierarchy when mounting
	dir        string // host path of the root of the node's subtree
}

// procsDir is the cgroup a process joins to be in the node.
func (h hierarchy) procsDir() string {
	if h.v2 {
		return filepath.Join(h.dir, v2Leaf)
	}
	return h.dir
}

// newCgroupTree makes a kelp-test-<name>-<random> cgroup in every mounted
// hierarchy. On cgroup v1 it goes below the cgroup the test runs in, so
// whatever limits or accounting the machine put on the test cover the node
// too. On cgroup v2 it goes below the root: a cgroup that holds processes
// (the test's own) cannot pass controllers on to its children, and the
// root is exempt from that rule.
func newCgroupTree(name string) (*cgroupTree, error) {
	mounted, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	own, err := ownCgroups()
	if err != nil {
		return nil, err
	}
	tree := &cgroupTree{}
	base := ""
	for _, h := range mounted {
		parent := h.mountpoint
		if !h.v2 {
			path, ok := own[h.options]
			if !ok {
				_ = tree.remove()
				return nil, fmt.Errorf("cgroup hierarchy %s (%s) is not in /proc/self/cgroup", h.mountpoint, h.options)
			}
			parent = filepath.Join(h.mountpoint, path)
		}
		if base == "" {
			// A random name, unique among all the tests of all test
			// binaries running at once; the other hierarchies reuse it.
			dir, err := os.MkdirTemp(parent, "kelp-test-"+name+"-")
			if err != nil {
				return nil, fmt.Errorf("make node cgroup: %w", err)
			}
			h.dir, base = dir, filepath.Base(dir)
		} else {
			h.dir = filepath.Join(parent, base)
			if err := os.Mkdir(h.dir, 0o755); err != nil {
				_ = tree.remove()
				return nil, fmt.Errorf("make node cgroup: %w", err)
			}
		}
		tree.hierarchies = append(tree.hierarchies, h)
		if err := initCgroup(h, parent); err != nil {
			_ = tree.remove()
			return nil, err
		}
	}
	if len(tree.hierarchies) == 0 {
		return nil, errors.New("no cgroup hierarchy is mounted")
	}
	return tree, nil
}

// initCgroup prepares the new subtree of h so processes can join it.
func initCgroup(h hierarchy, parent string) error {
	if h.v2 {
		if err := os.Mkdir(h.procsDir(), 0o755); err != nil {
			return fmt.Errorf("make node cgroup: %w", err)
		}
		return nil
	}
	// A new v1 cpuset starts with no CPUs and no memory nodes, and takes no
	// process until it has some: give it its parent's.
	for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
		value, err := os.ReadFile(filepath.Join(parent, file))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(h.dir, file), value, 0o644)
		}
		if err != nil {
			return fmt.Errorf("copy %s to the node cgroup: %w", file, err)
		}
	}
	return nil
}

// cgroupMounts lists the cgroup hierarchies mounted on the host, each once.
func cgroupMounts() ([]hierarchy, error) {
	enabled, err := cgroupControllers()
	if err != nil {
		return nil, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []hierarchy
	seen := map[string]bool{} // device numbers: a hierarchy may be mounted twice
	scan := bufio.NewScanner(f)
	for scan.Scan() {
		// 32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
		fields := strings.Fields(scan.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || len(fields) < sep+4 || seen[fields[2]] {
			continue
		}
		h := hierarchy{mountpoint: fields[4]}
		switch fields[sep+1] {
		case "cgroup2":
			h.v2 = true
		case "cgroup":
			// Mounting a v1 hierarchy again needs exactly its controllers
			// or its name; flags such as release_agent are the host's.
			var opts []string
			for _, o := range strings.Split(fields[sep+3], ",") {
				if enabled[o] || strings.HasPrefix(o, "name=") {
					opts = append(opts, o)
				}
			}
			sort.Strings(opts)
			h.options = strings.Join(opts, ",")
		default:
			continue
		}
		seen[fields[2]] = true
		out = append(out, h)
	}
	return out, scan.Err()
}

// cgroupControllers are the v1 controller names the kernel knows.
func cgroupControllers() (map[string]bool, error) {
	data, err := os.ReadFile("/proc/cgroups")
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
			names[f[0]] = true
		}
	}
	return names, nil
}

// ownCgroups maps the options of each v1 hierarchy (as in hierarchy) to
// the cgroup the test runs in there.
func ownCgroups() (map[string]string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	own := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		// 4:memory:/some/path or 1:cpu,cpuacct:/ or 9:name=systemd:/
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || f[1] == "" {
			continue
		}
		opts := strings.Split(f[1], ",")
		sort.Strings(opts)
		own[strings.Join(opts, ",")] = f[2]
	}
	return own, nil
}

// rootProcs are the cgroup.procs of the roots of the node's subtrees: the
// process that makes the node's cgroup namespace joins them first, so they
// are the root of the node's view.
func (c *cgroupTree) rootProcs() []string {
	var files []string
	for _, h := range c.hierarchies {
		files = append(files, filepath.Join(h.dir, "cgroup.procs"))
	}
	return files
}

// procs are the cgroup.procs a process joins to be in the node.
func (c *cgroupTree) procs() []string {
	var files []string
	for _, h := range c.hierarchies {
		files = append(files, filepath.Join(h.procsDir(), "cgroup.procs"))
	}
	return files
}

// mountScript are shell commands that, run inside the node's new mount and
// cgroup namespaces, replace the host's cgroup mounts by the node's view,
// in which its subtrees are the root: what the kubelet, containerd and
// runc read and write is then the node's alone. Mounting a cgroup file
// system inside a cgroup namespace roots it at the namespace's cgroup.
func (c *cgroupTree) mountScript() []string {
	var script []string
	for _, h := range c.hierarchies {
		mount := "mount -t cgroup -o " + h.options + " cgroup " + h.mountpoint
		if h.v2 {
			mount = "mount -t cgroup2 cgroup2 " + h.mountpoint
		}
		// Unmounted, not mounted over: kubelet and runc would find both
		// mounts in mountinfo.
		script = append(script, "umount "+h.mountpoint, mount)
		if h.v2 {
			script = append(script, "echo $$ > "+filepath.Join(h.mountpoint, v2Leaf, "cgroup.procs"))
		}
	}
	return script
}

// remove kills every process left in the node's cgroups and removes them,
// children first. It gives up after 30 s.
func (c *cgroupTree) remove() error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids := c.pids()
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still in the node's cgroups after SIGKILL", pids)
		}
		c.thaw()
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var errs []error
	for _, h := range c.hierarchies {
		dirs := cgroupDirs(h.dir)
		for i := len(dirs) - 1; i >= 0; i-- {
			// A killed process leaves its cgroup a moment after it died.
			for {
				err := unix.Rmdir(dirs[i])
				if err == nil || errors.Is(err, unix.ENOENT) {
					break
				}
				if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
					errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	return errors.Join(errs...)
}

// thaw unfreezes the node's cgroups: a frozen process does not die of
// SIGKILL, and runc freezes a container's cgroup while it signals its
// processes, so a runc killed meanwhile leaves the cgroup frozen.
func (c *cgroupTree) thaw() {
	for _, h := range c.hierarchies {
		for _, dir := range cgroupDirs(h.dir) {
			if h.v2 {
				_ = os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("0"), 0o644)
			} else {
				_ = os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0o644)
			}
		}
	}
}

// pids are the processes in the node's cgroups.
func (c *cgroupTree) pids() []int {
	var pids []int
	for _, h := range c.hierarchies {
		for _, dir := range cgroupDirs(h.dir) {
			data, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			for _, f := range strings.Fields(string(data)) {
				var pid int
				if _, err := fmt.Sscan(f, &pid); err == nil && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids
}

// cgroupDirs lists the cgroup root and every cgroup below it, parents
// before children.
func cgroupDirs(root string) []string {
	var dirs []string
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	return dirs
}
