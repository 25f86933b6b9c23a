package killall

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/nodepaths"
)

// kelpProgram is the main package of the kelp binary, as its Go build info
// names it.
const kelpProgram = "github.com/kelp-dev/kelp"

// containerdProgram is the main package of the bundle's containerd, as its
// Go build info names it.
const containerdProgram = "github.com/kelp-dev/kelp/scripts/bundle/containerd"

// shimBinary is the runc shim of the bundle; shims detach from containerd
// and must be found on their own.
const shimBinary = "containerd-shim-runc-v2"

// deleted is what the kernel appends to /proc/PID/exe once the file a
// process runs was replaced (an upgrade, a rebuild) or removed.
const deleted = " (deleted)"

// A process is one row of the process table, as /proc shows it.
type process struct {
	pid, ppid int
	mountNS   string // target of /proc/PID/ns/mnt
	// cgroupNS and netNS are the targets of /proc/PID/ns/cgroup and
	// /proc/PID/ns/net.
	cgroupNS, netNS string
	exe             string // target of /proc/PID/exe, maybe ending in deleted
	// program is the main package in the Go build info of the file the
	// process runs; "" if it is not Go. The kernel keeps the file readable
	// through /proc/PID/exe after it was replaced, so a kelp that was
	// upgraded under its feet is still known as kelp.
	program string
	cmdline []string
	environ []string
	cwd     string // for a relative --config
	// root: every uid of the process is 0. Only root's processes can be a
	// node's; a local user's are no business of killall, which runs as
	// root and reads their config files.
	root bool
}

// owner says whose a process is.
type owner int

const (
	nobody owner = iota
	// thisNode: a process of the node killall stops.
	thisNode
	// otherNode: containerd or a shim of a kelp node with another data dir.
	otherNode
)

// A classifier tells the processes of the kelp node with one data dir from
// the rest.
type classifier struct {
	dataDir string // absolute, symlinks resolved
	root    fs.FS  // the file system, at "/": kelp's config files
	// resolve returns path with its symlinks resolved, or path itself
	// when it cannot: the kernel shows a shim's file by its real path,
	// and a data dir may be reached through a link.
	resolve func(path string) string
	// paths are the cgroup root and pod log dir of the node (package
	// nodepaths).
	paths nodepaths.Paths
	// pathsErr: the node's record of its paths could not be read, and
	// paths are derived from its data dir.
	pathsErr error
	// pathsOf returns the paths of another node, whose data dir is
	// dataDir in the mount namespace of its process p ("" if unknown).
	pathsOf func(p process, dataDir string) nodepaths.Paths
	// sameDir says whether dir, as process p sees it, is the directory
	// own is here.
	sameDir func(p process, dir, own string) bool
}

// A plan is what killall does with the processes of the machine, and
// what it leaves because another node uses it too.
type plan struct {
	// kill: the node's processes (kelp server or agent, containerd and the
	// shims), all they started, and what is left in its pod cgroups.
	kill []int
	// others: containerd and shims of other data dirs, in any mount
	// namespace of the machine.
	others []int
	keep   shared
}

// shared is what the node has in common with another node on the
// machine, which killall leaves alone.
type shared struct {
	// dirs are those of the kubelet root, /run/kelp and /run/netns that
	// another node uses: the same directory, in killall's mount namespace
	// or another.
	dirs []string
	// network: another node runs in this network namespace, so the pod
	// bridge, the overlay, the cluster DNS address and kelp's nftables
	// tables may be its.
	network bool
	// cgroups: another node's kubelet, in this cgroup namespace, puts its
	// pods under the same cgroup root.
	cgroups bool
	// podLogs: another node's kubelet writes to the same pod log dir.
	podLogs bool
}

func (s shared) any() bool { return len(s.dirs) > 0 || s.network || s.cgroups || s.podLogs }

// machineDirs are the fixed directories on the host that a node's kubelet,
// containerd and CNI plugins mount below.
var machineDirs = []string{layout.KubeletRoot, layout.RunDir, layout.NetnsDir}

// plan picks the processes to kill: the node's processes in the mount
// namespace of killall (self), never killall itself, and their
// descendants, the containers too. pods are the processes in the node's
// pod cgroups, which may have outlived their shims; they are killed unless
// another node's kubelet uses the same cgroups. The containerd and shims
// of other nodes, in any mount namespace, tell what the node shares with
// them. A kelp server or agent whose data dir cannot be told is left
// running and reported.
func (c classifier) plan(procs []process, self int, pods []int) (plan, error) {
	i := slices.IndexFunc(procs, func(p process) bool { return p.pid == self })
	if i < 0 {
		return plan{}, fmt.Errorf("process %d (kelp killall) is not in the process table", self)
	}
	me := procs[i]
	children := map[int][]int{}
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	kill := map[int]bool{}
	var walk func(int)
	walk = func(pid int) {
		if kill[pid] || pid == self {
			return
		}
		kill[pid] = true
		for _, child := range children[pid] {
			walk(child)
		}
	}
	var out plan
	var errs []error
	for _, p := range procs {
		if p.pid == self {
			continue
		}
		if p.mountNS != me.mountNS {
			if dir, ok := c.otherNodeDataDir(p); ok {
				out.others = append(out.others, p.pid)
				out.keep = out.keep.with(c.sharedWith(p, me, dir))
			}
			continue
		}
		switch o, err := c.ownerOf(p); {
		case err != nil:
			errs = append(errs, err)
		case o == thisNode:
			walk(p.pid)
		case o == otherNode:
			out.others = append(out.others, p.pid)
			out.keep = out.keep.with(c.sharedWith(p, me, c.dataDirOfOther(p)))
		}
	}
	if !out.keep.cgroups {
		for _, pid := range pods {
			walk(pid)
		}
	}
	out.kill = slices.Sorted(maps.Keys(kill))
	return out, errors.Join(errs...)
}

// with is s and t together.
func (s shared) with(t shared) shared {
	dirs := append(slices.Clone(s.dirs), t.dirs...)
	slices.Sort(dirs)
	return shared{dirs: slices.Compact(dirs), network: s.network || t.network, cgroups: s.cgroups || t.cgroups, podLogs: s.podLogs || t.podLogs}
}

// sharedWith is what the node shares with the other node of process p,
// whose data dir is dataDir where p runs ("" if unknown). killall (me)
// runs in the node's namespaces.
func (c classifier) sharedWith(p, me process, dataDir string) shared {
	var s shared
	for _, d := range machineDirs {
		if c.sameDir(p, d, d) {
			s.dirs = append(s.dirs, d)
		}
	}
	s.network = p.netNS == me.netNS
	paths := c.pathsOf(p, dataDir)
	s.cgroups = p.cgroupNS == me.cgroupNS && paths.CgroupRoot == c.paths.CgroupRoot
	s.podLogs = c.sameDir(p, paths.PodLogsDir, c.paths.PodLogsDir)
	return s
}

// otherNodeDataDir tells whether p, in another mount namespace than
// killall's, is the containerd or a shim of a kelp node, and that node's
// data dir as its mount namespace names it ("" if it cannot be told).
// Such a node may share the machine's cgroups, network, pod logs or
// directories with this one, whatever its mount namespace.
func (c classifier) otherNodeDataDir(p process) (string, bool) {
	if !p.root {
		return "", false
	}
	if p.program == containerdProgram && len(p.cmdline) > 0 {
		return dataDirOfConfig(p.cmdline[1:]), true
	}
	if p.program == kelpProgram && len(p.cmdline) > 1 && p.cmdline[1] == "containerd" {
		return dataDirOfConfig(p.cmdline[2:]), true
	}
	if filepath.Base(strings.TrimSuffix(p.exe, deleted)) == shimBinary && len(p.cmdline) > 0 &&
		last(flagValues(p.cmdline[1:], "-address", "--address")) == layout.ContainerdAddress {
		return dataDirOfShim(p.exe), true
	}
	return "", false
}

// dataDirOfOther is the data dir of another node's containerd or shim p
// in killall's mount namespace.
func (c classifier) dataDirOfOther(p process) string {
	if filepath.Base(strings.TrimSuffix(p.exe, deleted)) == shimBinary {
		return dataDirOfShim(p.exe)
	}
	if p.program == kelpProgram && len(p.cmdline) > 1 {
		return dataDirOfConfig(p.cmdline[2:])
	}
	if len(p.cmdline) > 0 {
		return dataDirOfConfig(p.cmdline[1:])
	}
	return ""
}

// dataDirOfConfig is the data dir of a kelp node's containerd with args
// (after its program name), which kelp starts with --config
// <data-dir>/agent/etc/containerd/config.toml; "" if it cannot be told.
func dataDirOfConfig(args []string) string {
	config := last(flagValues(args, "--config", "-config", "--c", "-c"))
	suffix := strings.TrimPrefix(layout.Agent("/").ContainerdConfig, "/")
	if dir, ok := strings.CutSuffix(filepath.Clean(config), "/"+suffix); ok && filepath.IsAbs(config) {
		return dir
	}
	return ""
}

// dataDirOfShim is the data dir of a kelp node's runc shim that runs the
// file exe, <data-dir>/data/<bundle>/bin/containerd-shim-runc-v2; "" if
// it cannot be told.
func dataDirOfShim(exe string) string {
	exe = strings.TrimSuffix(exe, deleted)
	bin := filepath.Dir(exe)
	bundles := filepath.Dir(filepath.Dir(bin))
	if filepath.Base(bin) != "bin" || !filepath.IsAbs(exe) || bundles != layout.BundleDir(filepath.Dir(bundles)) {
		return ""
	}
	return filepath.Dir(bundles)
}

// ownerOf tells whose p is. A process that is not root's is nobody's: a
// user's `kelp server --config /tmp/fifo` would otherwise have killall
// open the user's file, and a user's fake shim on kelp's socket address
// would make killall leave the machine's pods and network alone.
func (c classifier) ownerOf(p process) (owner, error) {
	if !p.root {
		return nobody, nil
	}
	if filepath.Base(strings.TrimSuffix(p.exe, deleted)) == shimBinary {
		return c.shimOwner(p), nil
	}
	if p.program == containerdProgram && len(p.cmdline) > 0 {
		return c.containerdOwner(p.cmdline[1:]), nil
	}
	if p.program != kelpProgram || len(p.cmdline) < 2 {
		return nobody, nil
	}
	// kelp has no global flags a node runs with: its subcommand comes first.
	switch sub, args := p.cmdline[1], p.cmdline[2:]; sub {
	case "server", "agent":
		dir, err := c.dataDirOf(p, args)
		if err != nil {
			return nobody, fmt.Errorf("kelp %s (pid %d): %w; stop it yourself if it is this node's", sub, p.pid, err)
		}
		// kelp refuses a relative data dir, so none runs with one.
		if filepath.IsAbs(dir) && c.resolve(filepath.Clean(dir)) == c.dataDir {
			return thisNode, nil
		}
	case "containerd":
		// Until the bundle carried containerd, kelp ran it itself; a node
		// started before an upgrade still does.
		return c.containerdOwner(args), nil
	}
	return nobody, nil
}

// containerdOwner tells whose a containerd with args (after its program
// name) is: kelp starts it with --config <data-dir>/agent/etc/…
// (internal/containerd.Supervise).
func (c classifier) containerdOwner(args []string) owner {
	config := last(flagValues(args, "--config", "-config", "--c", "-c"))
	if config == "" {
		return nobody
	}
	if c.resolve(config) == c.resolve(layout.Agent(c.dataDir).ContainerdConfig) {
		return thisNode
	}
	return otherNode
}

// shimOwner tells whose a runc shim is. A node's containerd runs the shim
// of the bundle staged in its data dir; a shim of another containerd on
// kelp's socket is another node's, and shims of other containerds (the
// machine's own, Docker's) are nobody's.
func (c classifier) shimOwner(p process) owner {
	exe := strings.TrimSuffix(p.exe, deleted)
	if strings.HasPrefix(exe, c.resolve(layout.BundleDir(c.dataDir))+"/") {
		return thisNode
	}
	if len(p.cmdline) > 0 && last(flagValues(p.cmdline[1:], "-address", "--address")) == layout.ContainerdAddress {
		return otherNode
	}
	return nobody
}

// dataDirOf finds the data dir of a kelp server or agent with args (after
// its subcommand) as kelp does (config.ResolveDataDir): --data-dir, else
// KELP_DATA_DIR, else the config file, else the default.
func (c classifier) dataDirOf(p process, args []string) (string, error) {
	return config.ResolveDataDir(last(flagValues(args, "--data-dir", "-data-dir", "--d", "-d")), args, config.Lookup{
		Getenv: func(key string) string {
			v, _ := getenv(p.environ, key)
			return v
		},
		FS:  c.root,
		Cwd: p.cwd,
	})
}

// flagValues returns the values args give a flag spelled one of spellings
// (urfave/cli, like Go's flag package, takes "-name" and "--name"), as
// "--name=value" or "--name value", in order, up to "--".
func flagValues(args []string, spellings ...string) []string {
	var values []string
	for i := 0; i < len(args) && args[i] != "--"; i++ {
		for _, s := range spellings {
			if args[i] == s && i+1 < len(args) {
				i++
				values = append(values, args[i])
				break
			}
			if v, ok := strings.CutPrefix(args[i], s+"="); ok {
				values = append(values, v)
				break
			}
		}
	}
	return values
}

// last is the value that wins when a flag is given more than once.
func last(values []string) string {
	if len(values) == 0 {
		return ""
	}
	return values[len(values)-1]
}

// getenv looks key up in environ as Go's os.LookupEnv does in the process
// that has it: the first definition wins.
func getenv(environ []string, key string) (string, bool) {
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v, true
		}
	}
	return "", false
}
