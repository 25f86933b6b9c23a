package testcluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// NodeIP is the address every test node has on its own bridge.
const NodeIP = "10.99.0.2"

// NodeName is the --node-name of every test server.
const NodeName = "kelp-test"

// Node is one kelp machine: a network and mount namespace held open by a
// sleeping process, a data dir, and the kelp processes started in it.
type Node struct {
	t          *testing.T
	Dir        string // scratch space of the test
	DataDir    string
	Kubeconfig string
	// Agent makes Start run a node beside the control plane; the node's
	// containers and mounts are removed with `kelp killall` at cleanup.
	Agent      bool
	holder     *exec.Cmd
	server     *exec.Cmd
	serverDone chan error
	serverLog  string
	logs       []string
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
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
		if err != nil {
			t.Fatalf("find the repository: %v", err)
		}
		path = filepath.Join(strings.TrimSpace(string(out)), "bin", "kelp")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("kelp binary %s: %v (build it with scripts/build.sh or set KELP_BIN)", path, err)
	}
	return path
}

// privateDirs are host paths a node writes to outside its data dir; each
// node gets its own empty copy of them in its mount namespace.
var privateDirs = []string{"/run/kelp", "/run/netns", "/var/lib/kubelet"}

// NewNode makes the namespaces of a node: loopback up and a bridge with
// NodeIP, so kelp finds a node address as on a real machine, and private
// mounts over privateDirs.
func NewNode(t *testing.T) *Node {
	t.Helper()
	NeedRoot(t)
	dir := t.TempDir()
	n := &Node{t: t, Dir: dir, DataDir: filepath.Join(dir, "data"), Kubeconfig: filepath.Join(dir, "kelp.yaml")}
	setup := []string{
		"ip link set lo up",
		"ip link add kelp-lab type bridge",
		"ip addr add " + NodeIP + "/24 dev kelp-lab",
		"ip link set kelp-lab up",
		// A default route into the void, as on a machine whose gateway
		// drops what it cannot deliver: nothing answers at 10.99.0.1.
		"ip route add default via 10.99.0.1 dev kelp-lab",
	}
	for _, d := range privateDirs {
		// The mount point must exist on the host; an empty directory there
		// changes nothing for the host.
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		setup = append(setup, "mount -t tmpfs -o mode=0755 kelp-test "+d)
	}
	n.holder = exec.Command("unshare", "--net", "--mount", "--propagation", "private", "sh", "-c", strings.Join(append(setup,
		"echo ready",
		"exec sleep infinity",
	), " && "))
	n.holder.Stderr = os.Stderr
	out, err := n.holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := start(n.holder); err != nil {
		t.Fatalf("start namespace holder: %v", err)
	}
	t.Cleanup(n.cleanup)
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("set up node namespaces: %q %v", line, err)
	}
	return n
}

// cleanup kills what the node started, the holder last so the namespaces
// go away, and shows the logs if the test failed.
func (n *Node) cleanup() {
	if n.server != nil && n.serverDone != nil {
		_ = n.server.Process.Kill()
		<-n.serverDone
	}
	if n.Agent {
		// Shims and containers outlive kelp on purpose; killall removes
		// them, their mounts and their cgroups.
		cmd := n.Command(Binary(n.t), "killall", "--data-dir", n.DataDir)
		if out, err := cmd.CombinedOutput(); err != nil {
			n.t.Errorf("kelp killall: %v\n%s", err, out)
		}
	}
	_ = n.holder.Process.Kill()
	_ = n.holder.Wait()
	if n.t.Failed() {
		for _, path := range n.logs {
			data, _ := os.ReadFile(path)
			lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
			if len(lines) > 150 {
				lines = lines[len(lines)-150:]
			}
			n.t.Logf("---- last lines of %s ----\n%s", path, strings.Join(lines, "\n"))
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
	nsenter := append([]string{"--target", strconv.Itoa(n.holder.Process.Pid), "--net", "--mount"}, opts...)
	return exec.Command("nsenter", append(append(nsenter, "--", name), args...)...)
}

// ServerArgs are the flags every test server gets: its own data dir and
// kubeconfig, and no node unless n.Agent.
func (n *Node) ServerArgs(extra ...string) []string {
	args := []string{"server", "--data-dir", n.DataDir, "--write-kubeconfig", n.Kubeconfig, "--node-name", NodeName}
	if !n.Agent {
		args = append(args, "--disable-agent")
	}
	return append(args, extra...)
}

// Kubectl runs kelp's kubectl against the node with args.
func (n *Node) Kubectl(args ...string) (string, error) {
	n.t.Helper()
	return n.RunKelp(time.Minute, append([]string{"kubectl", "--kubeconfig", n.Kubeconfig}, args...)...)
}

// Start starts `kelp server` with ServerArgs(extra...) in the background.
func (n *Node) Start(extra ...string) {
	n.t.Helper()
	if n.server != nil {
		n.t.Fatal("a server is already running on this node")
	}
	logPath := filepath.Join(n.Dir, fmt.Sprintf("kelp-%d.log", len(n.logs)+1))
	logFile, err := os.Create(logPath)
	if err != nil {
		n.t.Fatal(err)
	}
	n.logs = append(n.logs, logPath)
	n.serverLog = logPath
	n.server = n.Command(Binary(n.t), n.ServerArgs(extra...)...)
	n.server.Stdout, n.server.Stderr = logFile, logFile
	if err := start(n.server); err != nil {
		n.t.Fatalf("start kelp server: %v", err)
	}
	n.serverDone = make(chan error, 1)
	go func() {
		n.serverDone <- n.server.Wait()
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
		resp, err := client.Get("https://" + NodeIP + ":6443/readyz")
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
		case err := <-n.serverDone:
			n.serverDone <- err
			n.t.Fatalf("kelp server exited before it was ready: %v", err)
		case <-ctx.Done():
			n.t.Fatalf("kelp server not ready after %s: %s", timeout, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WaitLog waits until the running server's log contains text.
func (n *Node) WaitLog(text string, timeout time.Duration) {
	n.t.Helper()
	deadline := time.Now().Add(timeout)
	for !n.Logged(text) {
		if time.Now().After(deadline) {
			n.t.Fatalf("kelp server did not log %q within %s", text, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Logged says whether the running server's log contains text.
func (n *Node) Logged(text string) bool {
	data, _ := os.ReadFile(n.serverLog)
	return bytes.Contains(data, []byte(text))
}

// Stop sends SIGTERM and waits for a clean exit; it returns how long the
// server took. A server that does not exit in 30 s fails the test.
func (n *Node) Stop() time.Duration {
	n.t.Helper()
	start := time.Now()
	if err := n.server.Process.Signal(syscall.SIGTERM); err != nil {
		n.t.Fatalf("signal kelp server: %v", err)
	}
	select {
	case err := <-n.serverDone:
		n.server, n.serverDone = nil, nil
		if err != nil {
			n.t.Fatalf("kelp server did not exit cleanly: %v", err)
		}
	case <-time.After(30 * time.Second):
		n.t.Fatal("kelp server did not stop within 30 s of SIGTERM")
	}
	return time.Since(start)
}

// RunKelp runs kelp with args inside the node and returns its combined
// output and exit error; it fails the test if kelp runs longer than timeout.
func (n *Node) RunKelp(timeout time.Duration, args ...string) (string, error) {
	n.t.Helper()
	return n.Run(timeout, n.Command(Binary(n.t), args...))
}

// Run runs cmd and returns its combined output and exit error; it fails the
// test if cmd runs longer than timeout.
func (n *Node) Run(timeout time.Duration, cmd *exec.Cmd) (string, error) {
	n.t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := start(cmd); err != nil {
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
