package testcluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kelp-dev/kelp/internal/layout"
)

// NodeIP is the address a node made by NewNode has on its own bridge.
const NodeIP = "10.99.0.2"

// NodeName is the --node-name of a server made by NewNode.
const NodeName = "kelp-test"

// Node is one kelp machine: a network and mount namespace held open by a
// sleeping process, a data dir, and the kelp process started in it.
type Node struct {
	t          *testing.T
	Name       string // --node-name
	IP         string // the node's address
	Dir        string // scratch space of the test
	DataDir    string
	Kubeconfig string
	// Agent makes Start run a node beside the control plane; the node's
	// containers and mounts are removed with `kelp killall` at cleanup.
	Agent bool
	// Bin is the kelp binary Start runs; empty: Binary's. An upgrade test
	// sets it to the next version.
	Bin string
	// Env ("KEY=value") is added to the environment of every command made
	// with Command: the kelp that Start runs, RunKelp's too. Tests running
	// in parallel share the test binary's own environment, which t.Setenv
	// refuses to change under them.
	Env    []string
	holder *exec.Cmd
	// cgroups is the node's own cgroup subtree, which it sees as the root
	// of every hierarchy: the kubelets of nodes running at once would
	// otherwise share kubepods and remove each other's pod cgroups.
	cgroups *cgroupTree
	joined  bool // StartAgent ran, so there is a node to killall
	kelp    *exec.Cmd
	role    string // of kelp: "server" or "agent"
	done    chan error
	kelpLog string
	logs    []string
}

// NeedRoot skips a test on a machine where it cannot run: cluster tests
// need root for namespaces; CI runs as root, so they run there.
func NeedRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("cluster tests need root")
	}
}

// Binary is the kelp binary under test.
func Binary(t *testing.T) string {
	t.Helper()
	path := os.Getenv("KELP_BIN")
	if path == "" {
		path = filepath.Join(Repository(t), "bin", "kelp")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("kelp binary %s: %v (build it with scripts/build.sh or set KELP_BIN)", path, err)
	}
	return path
}

// privateDirs are host paths a node writes to outside its data dir; each
// node gets its own empty copy of them in its mount namespace. Pod logs
// too: a kubelet's log housekeeping removes the files of pods it does not
// know, another node's included.
var privateDirs = []string{layout.RunDir, layout.NetnsDir, layout.KubeletRoot, layout.PodLogsDir, layout.ContainerLogsDir}

// NewNode makes a single machine: network, mount and cgroup namespaces,
// loopback up and a bridge with NodeIP, so kelp finds a node address as on
// a real machine, private mounts over privateDirs and the node's own view
// of the cgroups, as for a node of a Lab.
func NewNode(t *testing.T) *Node {
	t.Helper()
	NeedRoot(t)
	n := newNode(t, NodeName, NodeIP)
	n.makeNamespaces(
		"ip link add kelp-lab type bridge",
		"ip addr add "+NodeIP+"/24 dev kelp-lab",
		"ip link set kelp-lab up",
		// A default route into the void, as on a machine whose gateway
		// drops what it cannot deliver: nothing answers at 10.99.0.1.
		"ip route add default via 10.99.0.1 dev kelp-lab",
	)
	return n
}

func newNode(t *testing.T, name, ip string) *Node {
	dir := t.TempDir()
	return &Node{t: t, Name: name, IP: ip, Dir: dir, DataDir: filepath.Join(dir, "data"), Kubeconfig: filepath.Join(dir, "kelp.yaml")}
}

// makeNamespaces makes the node's cgroup subtree and starts its holder in
// new network, mount, cgroup and UTS namespaces: the node's name as its
// hostname, loopback up, then network (the shell commands that set up the
// node's interfaces), private mounts over privateDirs and the node's view
// of the cgroups. It registers the node's cleanup.
func (n *Node) makeNamespaces(network ...string) {
	t := n.t
	t.Helper()
	var err error
	n.cgroups, err = newCgroupTree(n.Name)
	if err != nil {
		t.Fatalf("node %s: %v", n.Name, err)
	}
	t.Cleanup(n.cleanup)

	dirs := privateDirs
	// Where systemd runs the host, kelp would ask it for the kubelet's and
	// the containers' cgroups, which it makes outside the node's subtree:
	// hiding systemd makes kelp manage cgroups itself, as in a container.
	if _, err := os.Stat("/run/systemd/system"); err == nil {
		dirs = append(slices.Clone(dirs), "/run/systemd")
	}
	// Each node has a hostname of its own, as machines do: upstream
	// derives identities from it (the controller-manager's and the
	// scheduler's leader election, the apiserver's identity lease), and
	// kelp frees the leader leases held under its hostname when it starts.
	setup := append([]string{"echo " + n.Name + " > /proc/sys/kernel/hostname", "ip link set lo up"}, network...)
	setup = append(setup, privateMounts(t, dirs)...)
	setup = append(setup, n.cgroups.mountScript()...)
	// The holder joins the node's cgroups before it makes its cgroup
	// namespace, whose root they become.
	n.holder = joinCgroups(n.cgroups.rootProcs(), "unshare", "--net", "--mount", "--cgroup", "--uts", "--propagation", "private", "sh", "-c", holderScript(setup))
	if err := startHolder(n.holder); err != nil {
		t.Fatalf("set up namespaces of node %s: %v", n.Name, err)
	}
}

// privateMounts are the shell commands that mount an empty tmpfs over each
// of dirs.
func privateMounts(t *testing.T, dirs []string) []string {
	var script []string
	for _, d := range dirs {
		// The mount point must exist on the host; an empty directory there
		// changes nothing for the host.
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		script = append(script, "mount -t tmpfs -o mode=0755 kelp-test "+d)
	}
	return script
}

// holderScript runs setup, then says "ready" and sleeps: the namespaces
// it made live as long as it does.
func holderScript(setup []string) string {
	return strings.Join(append(setup, "echo ready", "exec sleep infinity"), " && ")
}

// startHolder starts a process running holderScript and waits until it is
// ready. Whoever called it kills the process at cleanup, also on error.
func startHolder(holder *exec.Cmd) error {
	var stderr bytes.Buffer
	holder.Stderr = &stderr
	out, err := holder.StdoutPipe()
	if err != nil {
		return err
	}
	if err := Spawn(holder); err != nil {
		return err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		_ = holder.Process.Kill()
		_ = holder.Wait()
		return fmt.Errorf("%q %v: %s", line, err, stderr.String())
	}
	return nil
}

// cleanup kills what the node started, the holder last so the namespaces
// go away, removes the node's cgroups, and shows the logs if the test
// failed.
func (n *Node) cleanup() {
	if n.kelp != nil && n.done != nil {
		_ = n.kelp.Process.Kill()
		<-n.done
	}
	if n.holder != nil && n.holder.Process != nil && n.holder.ProcessState == nil {
		if n.Agent || n.joined {
			// Shims and containers outlive kelp on purpose; killall removes
			// them, their mounts and their cgroups.
			cmd := n.Command(Binary(n.t), "killall", "--data-dir", n.DataDir)
			if out, err := cmd.CombinedOutput(); err != nil {
				n.t.Errorf("kelp killall: %v\n%s", err, out)
			}
		}
		_ = n.holder.Process.Kill()
		_ = n.holder.Wait()
	}
	if err := n.cgroups.remove(); err != nil {
		n.t.Errorf("node %s: %v", n.Name, err)
	}
	if n.t.Failed() {
		for _, path := range n.logs {
			data, _ := os.ReadFile(path)
			lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
			if len(lines) > 150 {
				lines = lines[len(lines)-150:]
			}
			n.t.Logf("---- node %s: last lines of %s ----\n%s", n.Name, path, strings.Join(lines, "\n"))
		}
	}
}

// Command returns cmd to run inside the node's namespaces, as root.
func (n *Node) Command(name string, args ...string) *exec.Cmd {
	return n.command(nil, name, args...)
}

// CommandAs returns cmd to run inside the node's namespaces as uid:gid.
// Only root may enter the namespaces, so nsenter drops to the user after.
func (n *Node) CommandAs(uid, gid int, name string, args ...string) *exec.Cmd {
	return n.command([]string{"--setuid", strconv.Itoa(uid), "--setgid", strconv.Itoa(gid)}, name, args...)
}

func (n *Node) command(opts []string, name string, args ...string) *exec.Cmd {
	nsenter := []string{nsenterPath(), "--target", strconv.Itoa(n.holder.Process.Pid), "--net", "--mount", "--cgroup", "--uts"}
	// Entering a cgroup namespace moves no process: the command joins the
	// node's cgroups first, or it would run outside the node's view.
	nsenter = append(append(nsenter, opts...), "--", name)
	cmd := joinCgroups(n.cgroups.procs(), append(nsenter, args...)...)
	if len(n.Env) > 0 {
		cmd.Env = append(cmd.Environ(), n.Env...)
	}
	return cmd
}

// nsenterPath is util-linux's nsenter as the test finds it on its own
// PATH: a command whose environment puts busybox's applets first (the
// install script's tests) would otherwise get busybox's, which has no
// --cgroup.
func nsenterPath() string {
	if path, err := exec.LookPath("nsenter"); err == nil {
		return path
	}
	return "nsenter"
}

// joinCgroups returns a command that moves itself into the cgroups whose
// cgroup.procs files are procs, then runs args.
func joinCgroups(procs []string, args ...string) *exec.Cmd {
	var script []string
	for _, p := range procs {
		script = append(script, "echo $$ > "+p)
	}
	script = append(script, `exec "$@"`)
	return exec.Command("sh", append([]string{"-c", strings.Join(script, " && "), "kelp-test-node"}, args...)...)
}

// ServerArgs are the flags every test server gets: its own data dir and
// kubeconfig, and no node unless n.Agent.
func (n *Node) ServerArgs(extra ...string) []string {
	args := []string{"server", "--data-dir", n.DataDir, "--write-kubeconfig", n.Kubeconfig, "--node-name", n.Name}
	if !n.Agent {
		args = append(args, "--disable-agent")
	}
	return append(args, extra...)
}

// AgentArgs are the flags every test agent gets: the server to join with
// the token in tokenFile, its own data dir, n's name and address.
func (n *Node) AgentArgs(serverURL, tokenFile string, extra ...string) []string {
	args := []string{"agent", "--server", serverURL, "--token-file", tokenFile, "--data-dir", n.DataDir, "--node-name", n.Name, "--node-ip", n.IP}
	return append(args, extra...)
}

// URL is where agents join a server running on n.
func (n *Node) URL() string {
	return "https://" + net.JoinHostPort(n.IP, "6443")
}

// TokenFile is where a server running on n writes the token agents join
// with. The node's mount namespace shares the test's temp dirs, so an
// agent on another node reads it there.
func (n *Node) TokenFile() string {
	return layout.Server(n.DataDir).Token
}

// Kubectl runs kelp's kubectl against the node with args.
func (n *Node) Kubectl(args ...string) (string, error) {
	n.t.Helper()
	return n.RunKelp(time.Minute, append([]string{"kubectl", "--kubeconfig", n.Kubeconfig}, args...)...)
}

// Start starts `kelp server` with ServerArgs(extra...) in the background.
func (n *Node) Start(extra ...string) {
	n.t.Helper()
	n.startKelp("server", n.ServerArgs(extra...))
}

// StartAgent starts `kelp agent` with AgentArgs(serverURL, tokenFile,
// extra...) in the background: n joins the server at serverURL. Its
// containers and mounts are removed with `kelp killall` at cleanup.
func (n *Node) StartAgent(serverURL, tokenFile string, extra ...string) {
	n.t.Helper()
	n.joined = true
	n.startKelp("agent", n.AgentArgs(serverURL, tokenFile, extra...))
}

// startKelp starts kelp with args as n's one kelp process, logging to a
// file of its own that WaitLog and Logged read and cleanup shows.
func (n *Node) startKelp(role string, args []string) {
	n.t.Helper()
	if n.kelp != nil {
		n.t.Fatalf("kelp %s is already running on node %s", n.role, n.Name)
	}
	logPath := filepath.Join(n.Dir, fmt.Sprintf("kelp-%d.log", len(n.logs)+1))
	logFile, err := os.Create(logPath)
	if err != nil {
		n.t.Fatal(err)
	}
	n.logs = append(n.logs, logPath)
	n.kelpLog = logPath
	n.role = role
	n.kelp = n.Command(n.binary(), args...)
	n.kelp.Stdout, n.kelp.Stderr = logFile, logFile
	if err := Spawn(n.kelp); err != nil {
		n.kelp = nil
		logFile.Close()
		n.t.Fatalf("start kelp %s: %v", role, err)
	}
	cmd, done := n.kelp, make(chan error, 1)
	n.done = done
	go func() {
		done <- cmd.Wait()
		logFile.Close()
	}()
}

// WaitReady waits until the apiserver's /readyz answers ok and the server
// says it is ready (the controller-manager and the scheduler run too).
func (n *Node) WaitReady(timeout time.Duration) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{DialContext: n.DialContext, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	last := "no answer"
	for {
		resp, err := client.Get(n.URL() + "/readyz")
		if err == nil {
			body := new(bytes.Buffer)
			_, _ = body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && n.Logged("kelp server is ready") {
				return
			}
			last = resp.Status + ": " + body.String()
		} else {
			last = err.Error()
		}
		select {
		case err := <-n.done:
			n.done <- err
			n.t.Fatalf("kelp server exited before it was ready: %v", err)
		case <-ctx.Done():
			n.t.Fatalf("kelp server not ready after %s: %s", timeout, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WaitLog waits until the log of the running kelp contains text.
func (n *Node) WaitLog(text string, timeout time.Duration) {
	n.t.Helper()
	deadline := time.Now().Add(timeout)
	for !n.Logged(text) {
		if time.Now().After(deadline) {
			n.t.Fatalf("kelp %s on node %s did not log %q within %s", n.role, n.Name, text, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Logged says whether the log of the running kelp contains text.
func (n *Node) Logged(text string) bool {
	return strings.Contains(n.Log(), text)
}

// Log is what the running (or last) kelp has logged so far.
func (n *Node) Log() string {
	data, _ := os.ReadFile(n.kelpLog)
	return string(data)
}

// Stop sends SIGTERM to the running kelp and waits for a clean exit; it
// returns how long kelp took. A kelp that does not exit in 30 s fails the
// test.
func (n *Node) Stop() time.Duration {
	n.t.Helper()
	if n.kelp == nil {
		n.t.Fatalf("no kelp is running on node %s", n.Name)
	}
	start := time.Now()
	if err := n.kelp.Process.Signal(syscall.SIGTERM); err != nil {
		n.t.Fatalf("signal kelp %s: %v", n.role, err)
	}
	select {
	case err := <-n.done:
		n.kelp, n.done = nil, nil
		if err != nil {
			n.t.Fatalf("kelp %s did not exit cleanly: %v", n.role, err)
		}
	case <-time.After(30 * time.Second):
		n.t.Fatalf("kelp %s did not stop within 30 s of SIGTERM", n.role)
	}
	return time.Since(start)
}

// binary is the kelp binary the node runs.
func (n *Node) binary() string {
	if n.Bin != "" {
		return n.Bin
	}
	return Binary(n.t)
}

// StopFailed stops a kelp that may have exited on its own already, such
// as a server that lost its datastore's quorum, and returns its exit
// error, if any, instead of failing the test.
func (n *Node) StopFailed() error {
	n.t.Helper()
	if n.kelp == nil {
		n.t.Fatalf("no kelp is running on node %s", n.Name)
	}
	_ = n.kelp.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-n.done:
		n.kelp, n.done = nil, nil
		return err
	case <-time.After(30 * time.Second):
		n.t.Fatalf("kelp %s did not stop within 30 s of SIGTERM", n.role)
	}
	return nil
}

// RunKelp runs kelp with args inside the node and returns its combined
// output and exit error; it fails the test if kelp runs longer than timeout.
func (n *Node) RunKelp(timeout time.Duration, args ...string) (string, error) {
	n.t.Helper()
	return n.Run(timeout, n.Command(n.binary(), args...))
}

// Run runs cmd and returns its combined output and exit error; it fails the
// test if cmd runs longer than timeout.
func (n *Node) Run(timeout time.Duration, cmd *exec.Cmd) (string, error) {
	n.t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := Spawn(cmd); err != nil {
		n.t.Fatalf("start %v: %v", cmd.Args, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		n.t.Fatalf("%v still running after %s:\n%s", cmd.Args, timeout, out.String())
		return "", nil
	}
}

// DialContext opens a connection from inside the node's network namespace.
func (n *Node) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := n.InNetns(func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// Listen opens a listener inside the node's network namespace.
func (n *Node) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.InNetns(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// InNetns runs fn on an OS thread moved into the node's network
// namespace. Sockets keep the namespace they were made in; the thread is
// never unlocked, so Go discards it instead of reusing it elsewhere.
func (n *Node) InNetns(fn func() error) error {
	return inNetnsOf(n.holder.Process.Pid, fn)
}

func inNetnsOf(pid int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open node netns: %w", err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter node netns: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// RestConfig is the admin kubeconfig of the node, dialing into its netns.
func (n *Node) RestConfig() *rest.Config {
	n.t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", n.Kubeconfig)
	if err != nil {
		n.t.Fatalf("load %s: %v", n.Kubeconfig, err)
	}
	cfg.Dial = n.DialContext
	return cfg
}

// Client is a clientset for the node's apiserver.
func (n *Node) Client() kubernetes.Interface {
	n.t.Helper()
	c, err := kubernetes.NewForConfig(n.RestConfig())
	if err != nil {
		n.t.Fatal(err)
	}
	return c
}

// ExitCode is the exit status in err from Run, or -1.
func ExitCode(err error) int {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	return -1
}

// Processes lists the live processes (not zombies) in the node's mount
// namespace other than the namespace holder, as "pid command" lines.
func (n *Node) Processes() []string {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", n.holder.Process.Pid))
	if err != nil {
		n.t.Fatal(err)
	}
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == n.holder.Process.Pid {
			continue
		}
		if other, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); other != ns {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(stat)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open || strings.HasPrefix(strings.TrimSpace(s[end+1:]), "Z") {
			continue
		}
		out = append(out, fmt.Sprintf("%d %s", pid, s[open+1:end]))
	}
	return out
}

// RunKelpInTerminal runs kelp with args inside the node with a new
// terminal as its stdin, stdout and stderr, and returns what it wrote
// there and its exit error; it fails the test if kelp runs longer than
// timeout.
func (n *Node) RunKelpInTerminal(timeout time.Duration, args ...string) (string, error) {
	n.t.Helper()
	terminal, tty, err := openPTY()
	if err != nil {
		n.t.Fatalf("open a terminal: %v", err)
	}
	defer terminal.Close()
	cmd := n.Command(n.binary(), args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	err = Spawn(cmd)
	tty.Close()
	if err != nil {
		n.t.Fatalf("start %v: %v", cmd.Args, err)
	}
	var out bytes.Buffer
	read := make(chan struct{})
	// The read ends (EIO) once kelp and all it started closed the terminal.
	go func() { _, _ = io.Copy(&out, terminal); close(read) }()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		<-read
		return out.String(), err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		n.t.Fatalf("%v still running after %s", cmd.Args, timeout)
		return "", nil
	}
}

// openPTY opens a pseudo-terminal of 24 lines of 80 columns: the
// terminal's end, which reads what is written to tty, and tty.
func openPTY() (terminal, tty *os.File, err error) {
	terminal, err = os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	fd := int(terminal.Fd())
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err == nil {
		err = unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0)
	}
	if err == nil {
		err = unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: 24, Col: 80})
	}
	if err == nil {
		tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	}
	if err != nil {
		terminal.Close()
		return nil, nil, err
	}
	return terminal, tty, nil
}
