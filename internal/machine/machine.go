package machine

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/procstat"
)

// Spec describes a machine to make.
type Spec struct {
	// Name is the machine's hostname, and part of its cgroups' name.
	Name string
	// Network are shell commands run in the new network namespace, after
	// loopback is up, to set up the machine's own interfaces.
	Network []string
	// Private are host paths the machine gets its own copy of, mounted in
	// its mount namespace: an empty tmpfs, or a bind mount of a host
	// directory where Private maps the path to one.
	Private map[string]string
	// Cgroups says where the machine's cgroup subtrees go; RandomCgroup
	// names them Name plus a random suffix, for machines made by many
	// processes at once, and otherwise exactly CgroupName.
	Cgroups      Placement
	CgroupName   string
	RandomCgroup bool
}

// Machine is a machine made by Make: the process that holds its
// namespaces open, and its cgroups. Its fields are what it takes to find
// it again from another process (Attach).
type Machine struct {
	Name    string   `json:"name"`
	Holder  Process  `json:"holder"`
	Cgroups *Cgroups `json:"cgroups"`
}

// Process names a process so that a pid reused by another process after it
// died is not taken for it: the pid and the time it started.
type Process struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"` // clock ticks after boot, /proc/PID/stat field 22
}

// ProcessOf names the running process pid.
func ProcessOf(pid int) (Process, error) {
	st, err := procstat.Read(pid)
	if err == nil && !st.Alive() {
		err = fmt.Errorf("process %d has exited", pid)
	}
	if err != nil {
		return Process{}, err
	}
	return Process{Pid: pid, Start: st.StartTime}, nil
}

// Alive says whether the process still runs (and is no zombie).
func (p Process) Alive() bool {
	if p.Pid <= 0 {
		return false
	}
	st, err := procstat.Read(p.Pid)
	return err == nil && st.Alive() && st.StartTime == p.Start
}

// Kill kills the process, if it still runs, and waits until it is dead.
func (p Process) Kill() error {
	if !p.Alive() {
		return nil
	}
	if err := unix.Kill(p.Pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill process %d: %w", p.Pid, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.Alive() {
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d still runs 10 s after SIGKILL", p.Pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// Tools are the host programs a machine is made and entered with
// (util-linux and iproute2).
var Tools = []string{"unshare", "nsenter", "ip", "mount", "umount", "sh", "sleep"}

// CheckTools says which of Tools this host lacks, and how to get them.
func CheckTools() error {
	var missing []string
	for _, t := range Tools {
		if _, err := exec.LookPath(t); err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("this host lacks %s: install util-linux and iproute2 (apt-get install util-linux iproute2, apk add util-linux iproute2)", strings.Join(missing, ", "))
	}
	// busybox's nsenter cannot enter a cgroup namespace.
	if out, _ := exec.Command(nsenterPath(), "--help").CombinedOutput(); !bytes.Contains(out, []byte("--cgroup")) {
		return errors.New("this host's nsenter cannot enter cgroup namespaces (busybox's?): install util-linux's")
	}
	return nil
}

// Make makes a machine: its cgroup subtrees, and a holder process started
// by start in new network, mount, cgroup and UTS namespaces, which sets
// the hostname, brings loopback up, runs spec.Network, mounts spec.Private
// and the machine's view of the cgroups, and sleeps. The machine lives as
// long as its holder, or until Remove.
func Make(spec Spec, start func(*exec.Cmd) error) (*Machine, error) {
	name := spec.CgroupName
	if name == "" {
		name = spec.Name
	}
	cgroups, err := newCgroupTree(spec.Cgroups, name, spec.RandomCgroup)
	if err != nil {
		return nil, fmt.Errorf("machine %s: %w", spec.Name, err)
	}
	m := &Machine{Name: spec.Name, Cgroups: cgroups}
	private := spec.Private
	// Where systemd runs the host, kelp would ask it for the kubelet's and
	// the containers' cgroups, which it makes outside the machine's
	// subtree: hiding systemd makes kelp manage cgroups itself, as in a
	// container.
	if _, err := os.Stat("/run/systemd/system"); err == nil {
		private = clone(private)
		private["/run/systemd"] = ""
	}
	// The machine's name is its hostname, as machines have: upstream
	// derives identities from it (leader election, the apiserver's
	// identity lease).
	setup := append([]string{"echo " + spec.Name + " > /proc/sys/kernel/hostname", "ip link set lo up"}, spec.Network...)
	mounts, err := privateMounts(private)
	if err != nil {
		_ = cgroups.remove()
		return nil, err
	}
	setup = append(setup, mounts...)
	setup = append(setup, cgroups.mountScript()...)
	// The holder joins the machine's cgroups before it makes its cgroup
	// namespace, whose root they become.
	holder := joinCgroups(cgroups.rootProcs(), "unshare", "--net", "--mount", "--cgroup", "--uts", "--propagation", "private", "sh", "-c", holderScript(setup))
	if err := startHolder(holder, start); err != nil {
		_ = cgroups.remove()
		return nil, fmt.Errorf("set up namespaces of machine %s: %w", spec.Name, err)
	}
	if m.Holder, err = ProcessOf(holder.Process.Pid); err != nil {
		_ = m.Remove()
		return nil, err
	}
	return m, nil
}

func clone(m map[string]string) map[string]string {
	out := make(map[string]string, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	return out
}

// privateMounts are the shell commands that mount, over each private
// path, an empty tmpfs or the host directory it maps to, in a stable order.
// A path that hides the source of another is mounted after it: a cluster
// node's /var/lib/kelp is bound from below the host's /var/lib/kelp,
// where the sources of its kubelet root and pod logs are too.
func privateMounts(private map[string]string) ([]string, error) {
	hides := func(p string) bool {
		for _, src := range private {
			if src != "" && isBelow(src, p) {
				return true
			}
		}
		return false
	}
	var paths, hiding []string
	for p := range private {
		if hides(p) {
			hiding = append(hiding, p)
		} else {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	slices.Sort(hiding)
	// What this order cannot serve: a path below one mounted late, or
	// mapped from below another such path.
	for _, p := range hiding {
		for q, src := range private {
			if q != p && (isBelow(q, p) || src != "" && isBelow(src, p) && hides(q)) {
				return nil, fmt.Errorf("private path %s (from %q) is below %s, which hides sources: map them from directories outside both", q, src, p)
			}
		}
	}
	paths = append(paths, hiding...)
	var script []string
	for _, p := range paths {
		// The mount point must exist on the host; an empty directory there
		// changes nothing for the host.
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, err
		}
		if src := private[p]; src != "" {
			if err := os.MkdirAll(src, 0o755); err != nil {
				return nil, err
			}
			script = append(script, "mount --bind "+shellQuote(src)+" "+p)
		} else {
			script = append(script, "mount -t tmpfs -o mode=0755 kelp-machine "+p)
		}
	}
	return script, nil
}

// isBelow says whether path is dir or below it.
func isBelow(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// holderScript runs setup, then says "ready" and sleeps: the namespaces
// it made live as long as it does.
func holderScript(setup []string) string {
	return strings.Join(append(setup, "echo ready", "exec sleep infinity >/dev/null 2>&1"), " && ")
}

// startHolder starts holder, a process running holderScript, with start
// and waits until it is ready. On error the holder is killed.
func startHolder(holder *exec.Cmd, start func(*exec.Cmd) error) error {
	var stderr bytes.Buffer
	holder.Stderr = &stderr
	out, err := holder.StdoutPipe()
	if err != nil {
		return err
	}
	if err := start(holder); err != nil {
		return err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		_ = holder.Process.Kill()
		_ = holder.Wait()
		return fmt.Errorf("%q %v: %s", line, err, stderr.String())
	}
	// The holder's output is no longer read; it writes nothing more.
	go func() { _ = holder.Wait() }()
	return nil
}

// Detached starts cmd in a session of its own, so it outlives its parent
// and the parent's terminal: for machines that stay after the command that
// made them.
func Detached(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true
	return cmd.Start()
}

// Alive says whether the machine's holder still runs.
func (m *Machine) Alive() bool {
	return m.Holder.Alive()
}

// Command returns cmd to run inside the machine's namespaces, as root.
func (m *Machine) Command(name string, args ...string) *exec.Cmd {
	return m.command(nil, name, args...)
}

// CommandAs returns cmd to run inside the machine's namespaces as uid:gid.
// Only root may enter the namespaces, so nsenter drops to the user after.
func (m *Machine) CommandAs(uid, gid int, name string, args ...string) *exec.Cmd {
	return m.command([]string{"--setuid", strconv.Itoa(uid), "--setgid", strconv.Itoa(gid)}, name, args...)
}

func (m *Machine) command(opts []string, name string, args ...string) *exec.Cmd {
	nsenter := []string{nsenterPath(), "--target", strconv.Itoa(m.Holder.Pid), "--net", "--mount", "--cgroup", "--uts"}
	// Entering a cgroup namespace moves no process: the command joins the
	// machine's cgroups first, or it would run outside the machine's view.
	nsenter = append(append(nsenter, opts...), "--", name)
	return joinCgroups(m.Cgroups.procs(), append(nsenter, args...)...)
}

// nsenterPath is util-linux's nsenter as found on PATH: a command whose
// environment puts busybox's applets first (the install script's tests)
// would otherwise get busybox's, which has no --cgroup.
func nsenterPath() string {
	if path, err := exec.LookPath("nsenter"); err == nil {
		return path
	}
	return "nsenter"
}

// Join returns a command that runs args in c: for a process that belongs
// with machines below c without being one, so that Remove kills it too.
func (c *Cgroups) Join(args ...string) *exec.Cmd {
	return joinCgroups(c.procs(), args...)
}

// joinCgroups returns a command that moves itself into the cgroups whose
// cgroup.procs files are procs, then runs args.
func joinCgroups(procs []string, args ...string) *exec.Cmd {
	var script []string
	for _, p := range procs {
		script = append(script, "echo $$ > "+p)
	}
	script = append(script, `exec "$@"`)
	return exec.Command("sh", append([]string{"-c", strings.Join(script, " && "), "kelp-machine"}, args...)...)
}

// InNetns runs fn on an OS thread moved into the machine's network
// namespace. Sockets keep the namespace they were made in; the thread is
// never unlocked, so Go discards it instead of reusing it elsewhere.
func (m *Machine) InNetns(fn func() error) error {
	return InNetnsOf(m.Holder.Pid, fn)
}

// InNetnsOf runs fn in the network namespace of process pid, as InNetns.
func InNetnsOf(pid int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open machine netns: %w", err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter machine netns: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Processes lists the live processes (not zombies) in the machine's mount
// namespace other than its holder, as "pid command" lines.
func (m *Machine) Processes() ([]string, error) {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", m.Holder.Pid))
	if err != nil {
		return nil, err
	}
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == m.Holder.Pid {
			continue
		}
		if other, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); other != ns {
			continue
		}
		if st, err := procstat.Read(pid); err == nil && st.Alive() {
			out = append(out, fmt.Sprintf("%d %s", pid, st.Comm))
		}
	}
	return out, nil
}

// Remove kills every process of the machine, its holder too, and removes
// its cgroups: the namespaces, their interfaces, nftables and mounts go
// with the last process in them. Whatever the machine ran is in its
// cgroups, also when the holder died before (a kill -9, a crash), so
// nothing is left either way.
func (m *Machine) Remove() error {
	err := m.Holder.Kill()
	if m.Cgroups == nil {
		return err
	}
	return errors.Join(err, m.Cgroups.remove())
}
