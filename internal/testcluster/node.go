package testcluster

import (
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
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/machine"
)

// NodeIP is the address a node made by NewNode has on its own bridge.
const NodeIP = "10.99.0.2"

// NodeName is the --node-name of a server made by NewNode.
const NodeName = "kelp-test"

// Node is one kelp machine: a network and mount namespace held open by a
// sleeping process, a data dir, and the kelp process started in it.
type Node struct {
	t    *testing.T
	Name string // --node-name
	IP   string // the node's address
	// IP6 is the node's IPv6 address, on a node of NewDualStackNode;
	// empty on others.
	IP6        string
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
	Env []string
	// machine holds the node's namespaces and its own cgroup subtree,
	// which it sees as the root of every hierarchy: the kubelets of nodes
	// running at once would otherwise share kubepods and remove each
	// other's pod cgroups.
	machine *machine.Machine
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
	n.makeMachine(
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

// makeMachine makes the node's machine (see package machine), its cgroups
// below the test's on cgroup v1, its network set up by the shell commands
// network, and registers the node's cleanup. The holder is started by
// Spawn, so the namespaces die with the test binary in any case.
func (n *Node) makeMachine(network ...string) {
	t := n.t
	t.Helper()
	placement, err := machine.BelowCaller()
	if err != nil {
		t.Fatal(err)
	}
	private := map[string]string{}
	for _, d := range privateDirs {
		private[d] = ""
	}
	n.machine, err = machine.Make(machine.Spec{
		Name:         n.Name,
		Network:      network,
		Private:      private,
		Cgroups:      placement,
		CgroupName:   "kelp-test-" + n.Name + "-",
		RandomCgroup: true,
	}, Spawn)
	if err != nil {
		t.Fatalf("node %s: %v", n.Name, err)
	}
	t.Cleanup(n.cleanup)
}

// cleanup kills what the node started, the machine last so the namespaces
// go away with its cgroups, and shows the logs if the test failed.
func (n *Node) cleanup() {
	if n.kelp != nil && n.done != nil {
		_ = n.kelp.Process.Kill()
		<-n.done
	}
	if n.machine.Alive() && (n.Agent || n.joined) {
		// Shims and containers outlive kelp on purpose; killall removes
		// them, their mounts and their cgroups.
		cmd := n.Command(Binary(n.t), "killall", "--data-dir", n.DataDir)
		if out, err := cmd.CombinedOutput(); err != nil {
			n.t.Errorf("kelp killall: %v\n%s", err, out)
		}
	}
	if err := n.machine.Remove(); err != nil {
		n.t.Errorf("node %s: %v", n.Name, err)
	}
	if n.t.Failed() {
		for _, path := range n.logs {
			data, _ := os.ReadFile(path)
			n.t.Logf("---- node %s: last lines of %s ----\n%s", n.Name, path, LastLines(string(data), 150))
		}
	}
}

// Command returns cmd to run inside the node's namespaces, as root.
func (n *Node) Command(name string, args ...string) *exec.Cmd {
	return n.withEnv(n.machine.Command(name, args...))
}

// CommandAs returns cmd to run inside the node's namespaces as uid:gid.
func (n *Node) CommandAs(uid, gid int, name string, args ...string) *exec.Cmd {
	return n.withEnv(n.machine.CommandAs(uid, gid, name, args...))
}

func (n *Node) withEnv(cmd *exec.Cmd) *exec.Cmd {
	if len(n.Env) > 0 {
		cmd.Env = append(cmd.Environ(), n.Env...)
	}
	return cmd
}

// ServerArgs are the flags every test server gets: its own data dir and
// kubeconfig, and no node unless n.Agent.
func (n *Node) ServerArgs(extra ...string) []string {
	args := []string{"server", "--data-dir", n.DataDir, "--write-kubeconfig", n.Kubeconfig, "--node-name", n.Name}
	if n.IP6 != "" {
		args = append(args, "--node-ip", n.nodeIPs())
	}
	if n.Agent {
		args = append(args, KubeletArgs...)
	} else {
		args = append(args, "--disable-agent")
	}
	return append(args, extra...)
}

// KubeletArgs keep the kubelet of a test node from evicting its pods
// when the machine's disk, which every node and the Go build cache share,
// runs below the default 15 % free: that is the machine's state, not the
// node's.
var KubeletArgs = []string{"--kubelet-arg", "eviction-hard=imagefs.available<1%,nodefs.available<1%"}

// AgentArgs are the flags every test agent gets: the server to join with
// the token in tokenFile, its own data dir, n's name and address.
func (n *Node) AgentArgs(serverURL, tokenFile string, extra ...string) []string {
	args := []string{"agent", "--server", serverURL, "--token-file", tokenFile, "--data-dir", n.DataDir, "--node-name", n.Name, "--node-ip", n.nodeIPs()}
	args = append(args, KubeletArgs...)
	return append(args, extra...)
}

// WitnessArgs are the flags every test witness gets: the server to join
// through with the token in tokenFile, its own data dir, n's name and
// address.
func (n *Node) WitnessArgs(serverURL, tokenFile string, extra ...string) []string {
	args := []string{"witness", "--server", serverURL, "--token-file", tokenFile, "--data-dir", n.DataDir, "--node-name", n.Name, "--node-ip", n.IP}
	return append(args, extra...)
}

// nodeIPs is n's --node-ip: its address, and its IPv6 one if it has one.
func (n *Node) nodeIPs() string {
	if n.IP6 == "" {
		return n.IP
	}
	return n.IP + "," + n.IP6
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

// JoinArgs are the flags that join another server to the server running
// on n: its URL and the token it wrote.
func (n *Node) JoinArgs() []string {
	n.t.Helper()
	tok, err := os.ReadFile(n.TokenFile())
	if err != nil {
		n.t.Fatal(err)
	}
	return []string{"--server", n.URL(), "--token", strings.TrimSpace(string(tok))}
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

// StartWitness starts `kelp witness` with WitnessArgs(serverURL,
// tokenFile, extra...) in the background: an etcd member of the cluster
// of the server at serverURL, and nothing else.
func (n *Node) StartWitness(serverURL, tokenFile string, extra ...string) {
	n.t.Helper()
	n.startKelp("witness", n.WitnessArgs(serverURL, tokenFile, extra...))
}

// PID is the process id of the running kelp.
func (n *Node) PID() int {
	n.t.Helper()
	if n.kelp == nil {
		n.t.Fatalf("no kelp is running on node %s", n.Name)
	}
	return n.kelp.Process.Pid
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
			n.t.Fatalf("kelp server on node %s exited before it was ready: %v; its last lines:\n%s", n.Name, err, LastLines(n.Log(), 40))
		case <-ctx.Done():
			n.t.Fatalf("kelp server on node %s not ready after %s: %s", n.Name, timeout, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WaitLog waits until the log of the running kelp contains text.
func (n *Node) WaitLog(text string, timeout time.Duration) {
	n.t.Helper()
	EventuallyWithin(n.t, timeout, fmt.Sprintf("kelp %s on node %s logs %q", n.role, n.Name, text), func() (bool, error) {
		return n.Logged(text), nil
	})
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
// namespace (see machine.Machine.InNetns).
func (n *Node) InNetns(fn func() error) error {
	return n.machine.InNetns(fn)
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
	procs, err := n.machine.Processes()
	if err != nil {
		n.t.Fatal(err)
	}
	return procs
}

// CgroupProcesses are the processes in the node's cgroups other than its
// namespace holder: whatever kelp and what it started left, whichever
// namespaces they made for themselves.
func (n *Node) CgroupProcesses() []int {
	var pids []int
	for _, pid := range n.machine.Cgroups.Pids() {
		if pid != n.machine.Holder.Pid {
			pids = append(pids, pid)
		}
	}
	return pids
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

// LastLines returns the last n lines of log.
func LastLines(log string, n int) string {
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
