package containerd

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/kelp-dev/kelp/internal/layout"
)

// A Node is the containerd of a kelp node as this process reaches it.
type Node struct {
	// Root is where the node's file system is seen from here: "" when its
	// containerd runs in this process's mount namespace, else
	// /proc/PID/root of that containerd (a node of kelp cluster, or of a
	// test, has /run/kelp and /var/log/pods of its own).
	Root string
}

// Address is the node's containerd socket, as this process reaches it.
func (n Node) Address() string { return n.Root + layout.ContainerdAddress }

// Path is path of the node's file system (a container's log file) as this
// process reaches it.
func (n Node) Path(path string) string { return n.Root + path }

// Find finds the containerd of the kelp node whose data dir is dataDir
// (absolute) among the machine's processes, in whatever mount namespace
// it runs. Supervise starts it with --config <data-dir>/agent/etc/…: the
// path, or the file it names as seen through the process's root (a node
// of kelp cluster has its data dir mounted at /var/lib/kelp), is that of
// dataDir. Only root's processes count, so that a user's process cannot
// pose as a node.
//
// The default data dir names the node of this mount namespace, whose
// /run/kelp is its own, whatever data dir it runs with: a node given
// --data-dir on its command line alone, or a node of kelp cluster that
// a shell entered (nsenter), is reached as it was before data dirs named
// nodes, never a node of /var/lib/kelp elsewhere on the machine.
func Find(dataDir string) (Node, error) {
	if dataDir == layout.DefaultDataDir {
		return Node{}, nil
	}
	return find("/proc", "self", dataDir)
}

// find is Find on the process table at proc, for the process self.
func find(proc, self, dataDir string) (Node, error) {
	want := []string{layout.Agent(dataDir).ContainerdConfig}
	if real, err := filepath.EvalSymlinks(dataDir); err == nil && real != dataDir {
		want = append(want, layout.Agent(real).ContainerdConfig)
	}
	wantFile, _ := os.Stat(want[0])
	matches := func(dir, config string) bool {
		if slices.Contains(want, config) {
			return true
		}
		if wantFile == nil || !filepath.IsAbs(config) {
			return false
		}
		seen, err := os.Stat(filepath.Join(dir, "root", config))
		return err == nil && os.SameFile(seen, wantFile)
	}
	entries, err := os.ReadDir(proc)
	if err != nil {
		return Node{}, fmt.Errorf("read the process table: %w", err)
	}
	ownNS, err := os.Readlink(filepath.Join(proc, self, "ns", "mnt"))
	if err != nil {
		return Node{}, fmt.Errorf("read this process's mount namespace: %w", err)
	}
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	var elsewhere []Node
	for _, pid := range pids {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		config := configOf(filepath.Join(dir, "cmdline"))
		if config == "" || !rootOwned(filepath.Join(dir, "status")) || !matches(dir, config) {
			continue
		}
		ns, err := os.Readlink(filepath.Join(dir, "ns", "mnt"))
		if err != nil {
			continue // gone, or not ours to look into
		}
		if ns == ownNS {
			return Node{}, nil
		}
		elsewhere = append(elsewhere, Node{Root: filepath.Join(dir, "root")})
	}
	if len(elsewhere) > 0 {
		return elsewhere[0], nil
	}
	return Node{}, fmt.Errorf("no containerd of a kelp node with data dir %s runs on this machine: start the node (kelp server or kelp agent with --data-dir %s), or give the data dir of one that runs", dataDir, dataDir)
}

// configOf is the value of --config in the command line at path; "" if
// it has none.
func configOf(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	args := strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
	for i := 1; i < len(args); i++ {
		if v, ok := strings.CutPrefix(args[i], "--config="); ok {
			return v
		}
		if args[i] == "--config" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// rootOwned tells from /proc/PID/status whether every uid of a process
// is 0.
func rootOwned(path string) bool {
	status, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(status), "\n") {
		if uids, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(uids)
			return len(f) == 4 && !slices.ContainsFunc(f, func(uid string) bool { return uid != "0" })
		}
	}
	return false
}
