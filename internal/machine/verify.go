package machine

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/kelp-dev/kelp/internal/procstat"
)

// A Machine or Network read back from a record (a state file of the
// hidden `kelp cluster machine|network` commands) is only as good as the
// record: Remove, run as root, kills its holder and every process in its
// cgroups, and removes the cgroups. Verify and Network.Verify accept only
// what Make and NewNetwork could have made, so that a record edited, mixed
// up or forged cannot name the host's processes or cgroups.

// Verify says why m is not a machine that Make made with placement p and
// a cgroup name that name accepts: each of its cgroups must be in a
// hierarchy mounted here, directly below the parent p gives there, and
// one name in all; its holder, while it runs, must be the sleeping
// process of a network and mount namespace other than this process's,
// in the machine's cgroups.
func (m *Machine) Verify(p Placement, name func(string) bool) error {
	if m.Cgroups == nil || len(m.Cgroups.Hierarchies) == 0 {
		return errors.New("no cgroups")
	}
	mounted, err := cgroupMounts()
	if err != nil {
		return err
	}
	base := filepath.Base(m.Cgroups.Hierarchies[0].Dir)
	if !name(base) {
		return fmt.Errorf("cgroup %q is not named as kelp names a machine's", m.Cgroups.Hierarchies[0].Dir)
	}
	for _, h := range m.Cgroups.Hierarchies {
		i := slices.IndexFunc(mounted, func(x Hierarchy) bool {
			return x.Mountpoint == h.Mountpoint && x.V2 == h.V2 && x.Options == h.Options
		})
		if i < 0 {
			return fmt.Errorf("%q is not a cgroup hierarchy mounted here", h.Mountpoint)
		}
		parent, err := p.parent(mounted[i])
		if err != nil {
			return err
		}
		if h.Dir != filepath.Join(parent, base) {
			return fmt.Errorf("cgroup %q is not %s below %s, where kelp places a machine's", h.Dir, base, parent)
		}
	}
	if m.Holder.Pid <= 0 {
		return errors.New("no holder process")
	}
	if !m.Holder.Alive() {
		return nil
	}
	if err := checkHolder(m.Holder.Pid, "mnt", "net"); err != nil {
		return err
	}
	in, err := cgroupsOf(m.Holder.Pid)
	if err != nil {
		return err
	}
	for _, h := range m.Cgroups.Hierarchies {
		key := h.Options
		if h.V2 {
			key = ""
		}
		path, ok := in[key]
		if !ok || !within(filepath.Join(h.Mountpoint, path), h.Dir) {
			return fmt.Errorf("holder %d is not in the machine's cgroup %s", m.Holder.Pid, h.Dir)
		}
	}
	return nil
}

// Verify says why n is not a network NewNetwork made: its holder, while
// it runs, must be the sleeping process of a network namespace other than
// this process's, with n's bridge in it.
func (n *Network) Verify() error {
	if n.Holder.Pid <= 0 {
		return errors.New("no holder process")
	}
	if !n.Holder.Alive() {
		return nil
	}
	if err := checkHolder(n.Holder.Pid, "net"); err != nil {
		return err
	}
	// /proc/PID/net is the network namespace of PID's.
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", n.Holder.Pid))
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if iface, _, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(iface) == n.Bridge {
			return nil
		}
	}
	return fmt.Errorf("holder %d has no interface %q in its network namespace", n.Holder.Pid, n.Bridge)
}

// checkHolder says why pid is not a holder: a process of root's, sleeping
// (holderScript ends in exec sleep), in namespaces of the kinds ns
// ("net", "mnt") other than this process's.
func checkHolder(pid int, ns ...string) error {
	st, err := procstat.Read(pid)
	if err != nil {
		return err
	}
	if st.Comm != "sleep" {
		return fmt.Errorf("process %d is %q, not a holder's sleep", pid, st.Comm)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err
	}
	if !uidRoot(status) {
		return fmt.Errorf("process %d does not run as root, as a holder does", pid)
	}
	for _, kind := range ns {
		own, err := os.Readlink("/proc/self/ns/" + kind)
		if err != nil {
			return err
		}
		its, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, kind))
		if err != nil {
			return err
		}
		if its == own {
			return fmt.Errorf("process %d is in this process's %s namespace, not one of its own", pid, kind)
		}
	}
	return nil
}

// uidRoot says whether the Uid line of a /proc/PID/status says 0 for
// each of the real, effective, saved and file system uids.
func uidRoot(status []byte) bool {
	for _, line := range bytes.Split(status, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte("Uid:")); ok {
			f := strings.Fields(string(rest))
			return len(f) == 4 && f[0] == "0" && f[1] == "0" && f[2] == "0" && f[3] == "0"
		}
	}
	return false
}

// cgroupsOf maps the options of each v1 hierarchy (as in Hierarchy), and
// "" for the v2 one, to pid's cgroup there, as this process's cgroup
// namespace sees it.
func cgroupsOf(pid int) (map[string]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		// 4:memory:/some/path, 1:name=systemd:/ or 0::/path
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		opts := strings.Split(f[1], ",")
		sort.Strings(opts)
		out[strings.Join(opts, ",")] = f[2]
	}
	return out, nil
}

// within says whether path is dir or below it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
