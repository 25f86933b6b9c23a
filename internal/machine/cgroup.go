package machine

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

// V2Leaf is where a node's processes live in a cgroup v2 Hierarchy, below
// the root of its subtree. cgroup v2 lets only leaves hold processes once
// controllers are enabled for the children, and the node's kubelet and runc
// enable them at the node's root to make kubepods; so nothing may stay in
// that root, as kind does it with its /init.
const V2Leaf = "init"

// Cgroups is a machine's own subtree in every mounted cgroup hierarchy.
// Two kubelets sharing one set of cgroups would fight over kubepods, each
// removing the pod cgroups it does not know.
type Cgroups struct {
	Hierarchies []Hierarchy `json:"hierarchies"`
}

// Hierarchy is one mounted cgroup hierarchy and the machine's subtree in it.
type Hierarchy struct {
	Mountpoint string `json:"mountpoint"` // on the host, and where the machine mounts its view
	V2         bool   `json:"v2,omitempty"`
	Options    string `json:"options,omitempty"` // v1: the -o that selects this hierarchy when mounting
	Dir        string `json:"dir"`               // host path of the root of the machine's subtree
}

// ProcsDir is the cgroup a process joins to be in the machine.
func (h Hierarchy) ProcsDir() string {
	if h.V2 {
		return filepath.Join(h.Dir, V2Leaf)
	}
	return h.Dir
}

// Placement says where the cgroups of new machines go in each hierarchy.
type Placement struct {
	// V1 and V2 give the parent, a host path, of a machine's subtree in a
	// v1 Hierarchy (by its -o options) and in the v2 one.
	V1 func(h Hierarchy) (string, error)
	V2 string
}

// BelowCaller places machines below the caller's cgroups on cgroup v1, so
// whatever limits or accounting the machine put on the caller cover its
// machines too. On cgroup v2 they go below the root: a cgroup that holds
// processes (the caller's own) cannot pass controllers on to its children,
// and the root is exempt from that rule.
func BelowCaller() (Placement, error) {
	own, err := ownCgroups()
	if err != nil {
		return Placement{}, err
	}
	return Placement{V1: func(h Hierarchy) (string, error) {
		path, ok := own[h.Options]
		if !ok {
			return "", fmt.Errorf("cgroup hierarchy %s (%s) is not in /proc/self/cgroup", h.Mountpoint, h.Options)
		}
		return filepath.Join(h.Mountpoint, path), nil
	}}, nil
}

// parent is the host path below which p places a cgroup in h.
func (p Placement) parent(h Hierarchy) (string, error) {
	switch {
	case !h.V2:
		return p.V1(h)
	case p.V2 != "":
		return p.V2, nil
	}
	return h.Mountpoint, nil
}

// AtRoot places machines at the root of every hierarchy.
func AtRoot() Placement {
	return Placement{V1: func(h Hierarchy) (string, error) { return h.Mountpoint, nil }}
}

// Below places machines below c, in each hierarchy c is in.
func (c *Cgroups) Below() Placement {
	p := Placement{}
	for _, h := range c.Hierarchies {
		if h.V2 {
			p.V2 = h.Dir
		}
	}
	p.V1 = func(h Hierarchy) (string, error) {
		for _, mine := range c.Hierarchies {
			if !mine.V2 && mine.Mountpoint == h.Mountpoint {
				return mine.Dir, nil
			}
		}
		return "", fmt.Errorf("cgroup hierarchy %s was not mounted when the parent cgroup was made", h.Mountpoint)
	}
	return p
}

// NewCgroups makes a cgroup named name in every mounted hierarchy, below
// the parents p gives, for machines to be placed Below it.
func NewCgroups(p Placement, name string) (*Cgroups, error) {
	return newCgroupTree(p, name, false)
}

// FindCgroups returns the cgroups named name below the parents p gives,
// in every mounted hierarchy that has one; nil if none has.
func FindCgroups(p Placement, name string) (*Cgroups, error) {
	mounted, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	found := &Cgroups{}
	for _, h := range mounted {
		parent, err := p.parent(h)
		if err != nil {
			return nil, err
		}
		h.Dir = filepath.Join(parent, name)
		if _, err := os.Stat(h.Dir); err == nil {
			found.Hierarchies = append(found.Hierarchies, h)
		}
	}
	if len(found.Hierarchies) == 0 {
		return nil, nil
	}
	return found, nil
}

// Remove kills every process left in c and in the cgroups below it, and
// removes them all.
func (c *Cgroups) Remove() error { return c.remove() }

// newCgroupTree makes a <prefix><random> cgroup in every mounted Hierarchy,
// or <prefix> itself when random is false, below the parents p gives.
func newCgroupTree(p Placement, prefix string, random bool) (*Cgroups, error) {
	mounted, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	tree := &Cgroups{}
	base := ""
	if !random {
		base = prefix
	}
	for _, h := range mounted {
		parent, err := p.parent(h)
		if err != nil {
			_ = tree.remove()
			return nil, err
		}
		if base == "" {
			// A random name, unique among all the machines of all
			// processes making them at once; the other hierarchies reuse it.
			dir, err := os.MkdirTemp(parent, prefix)
			if err != nil {
				return nil, fmt.Errorf("make machine cgroup: %w", err)
			}
			h.Dir, base = dir, filepath.Base(dir)
		} else {
			h.Dir = filepath.Join(parent, base)
			if err := os.Mkdir(h.Dir, 0o755); err != nil {
				_ = tree.remove()
				return nil, fmt.Errorf("make machine cgroup: %w", err)
			}
		}
		tree.Hierarchies = append(tree.Hierarchies, h)
		if err := initCgroup(h, parent); err != nil {
			_ = tree.remove()
			return nil, err
		}
	}
	if len(tree.Hierarchies) == 0 {
		return nil, errors.New("no cgroup hierarchy is mounted")
	}
	return tree, nil
}

// initCgroup prepares the new subtree of h so processes can join it.
func initCgroup(h Hierarchy, parent string) error {
	if h.V2 {
		if err := delegate(h.Mountpoint, parent); err != nil {
			return err
		}
		if err := os.Mkdir(h.ProcsDir(), 0o755); err != nil {
			return fmt.Errorf("make machine cgroup: %w", err)
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
			err = os.WriteFile(filepath.Join(h.Dir, file), value, 0o644)
		}
		if err != nil {
			return fmt.Errorf("copy %s to the node cgroup: %w", file, err)
		}
	}
	return nil
}

// delegate passes every controller on from the v2 root mounted at mount
// down to dir, so the cgroups made below dir have them all: the kubelet
// and runc of a machine enable them inside its subtree, which they see as
// their root, and find only those its parent passed on. Each cgroup on
// the way must hold no process (the no-internal-processes rule), as
// newCgroupTree's parents and a delegated systemd scope whose processes
// were moved to a leaf do not.
func delegate(mount, dir string) error {
	rel, err := filepath.Rel(mount, dir)
	if err != nil || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("cgroup %s is not below %s", dir, mount)
	}
	path := mount
	for _, elem := range append([]string{""}, strings.Split(rel, string(filepath.Separator))...) {
		if elem == "." {
			continue
		}
		path = filepath.Join(path, elem)
		data, err := os.ReadFile(filepath.Join(path, "cgroup.controllers"))
		if err != nil {
			return fmt.Errorf("delegate cgroup controllers: %w", err)
		}
		var enable []string
		for _, c := range strings.Fields(string(data)) {
			enable = append(enable, "+"+c)
		}
		if len(enable) == 0 {
			continue
		}
		// One write per controller: the kernel refuses a whole line for
		// the one controller it cannot enable here (a cpu controller held
		// back by a realtime process, say), and the others still matter.
		var failed []string
		for _, c := range enable {
			if err := os.WriteFile(filepath.Join(path, "cgroup.subtree_control"), []byte(c), 0o644); err != nil {
				failed = append(failed, c[1:])
			}
		}
		if slices.Contains(failed, "memory") || slices.Contains(failed, "pids") || slices.Contains(failed, "cpu") {
			return fmt.Errorf("cgroup %s does not pass on the controllers %s: a kubelet below it needs cpu, memory and pids; move the processes in it to a child cgroup, or run kelp from a systemd scope with Delegate=yes", path, strings.Join(failed, ", "))
		}
	}
	return nil
}

// cgroupMounts lists the cgroup hierarchies mounted on the host, each once.
func cgroupMounts() ([]Hierarchy, error) {
	enabled, err := cgroupControllers()
	if err != nil {
		return nil, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Hierarchy
	seen := map[string]bool{} // device numbers: a Hierarchy may be mounted twice
	scan := bufio.NewScanner(f)
	for scan.Scan() {
		// 32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
		fields := strings.Fields(scan.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || len(fields) < sep+4 || seen[fields[2]] {
			continue
		}
		h := Hierarchy{Mountpoint: fields[4]}
		switch fields[sep+1] {
		case "cgroup2":
			h.V2 = true
		case "cgroup":
			// Mounting a v1 Hierarchy again needs exactly its controllers
			// or its name; flags such as release_agent are the host's.
			var opts []string
			for _, o := range strings.Split(fields[sep+3], ",") {
				if enabled[o] || strings.HasPrefix(o, "name=") {
					opts = append(opts, o)
				}
			}
			sort.Strings(opts)
			h.Options = strings.Join(opts, ",")
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

// ownCgroups maps the options of each v1 Hierarchy (as in Hierarchy) to
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
func (c *Cgroups) rootProcs() []string {
	var files []string
	for _, h := range c.Hierarchies {
		files = append(files, filepath.Join(h.Dir, "cgroup.procs"))
	}
	return files
}

// procs are the cgroup.procs a process joins to be in the node.
func (c *Cgroups) procs() []string {
	var files []string
	for _, h := range c.Hierarchies {
		files = append(files, filepath.Join(h.ProcsDir(), "cgroup.procs"))
	}
	return files
}

// mountScript are shell commands that, run inside the node's new mount and
// cgroup namespaces, replace the host's cgroup mounts by the node's view,
// in which its subtrees are the root: what the kubelet, containerd and
// runc read and write is then the node's alone. Mounting a cgroup file
// system inside a cgroup namespace roots it at the namespace's cgroup.
func (c *Cgroups) mountScript() []string {
	var script []string
	for _, h := range c.Hierarchies {
		mount := "mount -t cgroup -o " + h.Options + " cgroup " + h.Mountpoint
		if h.V2 {
			mount = "mount -t cgroup2 cgroup2 " + h.Mountpoint
		}
		// Unmounted, not mounted over: kubelet and runc would find both
		// mounts in mountinfo.
		script = append(script, "umount "+h.Mountpoint, mount)
		if h.V2 {
			script = append(script, "echo $$ > "+filepath.Join(h.Mountpoint, V2Leaf, "cgroup.procs"))
		}
	}
	return script
}

// remove kills every process left in the node's cgroups and removes them,
// children first. It gives up after 30 s.
func (c *Cgroups) remove() error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids := c.Pids()
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
	for _, h := range c.Hierarchies {
		dirs := cgroupDirs(h.Dir)
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
func (c *Cgroups) thaw() {
	for _, h := range c.Hierarchies {
		for _, dir := range cgroupDirs(h.Dir) {
			if h.V2 {
				_ = os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("0"), 0o644)
			} else {
				_ = os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0o644)
			}
		}
	}
}

// Pids are the processes in c and the cgroups below it.
func (c *Cgroups) Pids() []int {
	var pids []int
	for _, h := range c.Hierarchies {
		for _, dir := range cgroupDirs(h.Dir) {
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
