package cluster

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// inotifyPerNode is how many inotify instances a node takes, with room
// for its pods: a server node's kelp holds 22 (the kubelet's cAdvisor and
// its certificate and configuration watchers, the apiserver's certificate
// reloaders, kelp's airgap and manifest watchers) and its containerd 2,
// counted with `find /proc/PID/fd -lname anon_inode:inotify`.
const inotifyPerNode = 32

// inotifyLimit is where Linux keeps fs.inotify.max_user_instances, below
// procfs.
const inotifyLimit = "sys/fs/inotify/max_user_instances"

// ensureInotify makes room for the inotify instances of nodes more nodes.
// Linux counts instances per user against fs.inotify.max_user_instances,
// 128 by default, and every node runs as root: five nodes beside a
// desktop's own watchers use it up, and a kubelet that gets no instance
// never becomes Ready. When root's processes have too few left, the limit
// is raised (kelp cluster runs as root) and w is told; where it cannot be
// written, the error names the sysctl to run. proc is where procfs is
// mounted.
func ensureInotify(proc string, nodes int, w io.Writer) error {
	limitFile := filepath.Join(proc, inotifyLimit)
	data, err := os.ReadFile(limitFile)
	if err != nil {
		return fmt.Errorf("read fs.inotify.max_user_instances: %w", err)
	}
	limit, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return fmt.Errorf("read fs.inotify.max_user_instances: %q is no number", data)
	}
	used := inotifyInstancesOf(proc, 0)
	need := used + nodes*inotifyPerNode
	if need <= limit {
		return nil
	}
	// Raised to a round figure with room for another cluster of the
	// same size, as kind's docs advise for several clusters.
	raised := (need + nodes*inotifyPerNode + 1023) / 1024 * 1024
	if err := os.WriteFile(limitFile, []byte(strconv.Itoa(raised)), 0o644); err != nil {
		return fmt.Errorf("%d nodes need about %d inotify instances, and root has %d of fs.inotify.max_user_instances=%d left, which could not be raised (%v): run `sysctl -w fs.inotify.max_user_instances=%d` (and put fs.inotify.max_user_instances=%d in /etc/sysctl.d/99-kelp.conf to keep it)",
			nodes, nodes*inotifyPerNode, max(limit-used, 0), limit, err, raised, raised)
	}
	fmt.Fprintf(w, "raised fs.inotify.max_user_instances from %d to %d: root's processes hold %d inotify instances and %d nodes need about %d more (put fs.inotify.max_user_instances=%d in /etc/sysctl.d/99-kelp.conf to keep it after a reboot)\n",
		limit, raised, used, nodes, nodes*inotifyPerNode, raised)
	return nil
}

// inotifyInstancesOf counts the inotify instances that processes of user
// uid hold open, the figure Linux checks against the limit. An instance
// held by several processes (after a fork) counts once for each, so the
// count errs on the safe side.
func inotifyInstancesOf(proc string, uid int) int {
	pids, _ := os.ReadDir(proc)
	n := 0
	for _, p := range pids {
		if _, err := strconv.Atoi(p.Name()); err != nil || !ownedBy(filepath.Join(proc, p.Name()), uid) {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join(proc, p.Name(), "fd"))
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join(proc, p.Name(), "fd", fd.Name()))
			if err == nil && target == "anon_inode:inotify" {
				n++
			}
		}
	}
	return n
}

// ownedBy says whether the process whose procfs directory is dir runs as
// real user uid. A process that ended meanwhile is owned by no one.
func ownedBy(dir string, uid int) bool {
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			return f[1] == strconv.Itoa(uid)
		}
	}
	return false
}
