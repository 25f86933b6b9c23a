package testcluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/machine"
)

// TestLab makes a lab of three nodes and a single node (NewNode) without
// kelp and checks that the lab's nodes reach each other over the lab
// bridge and nothing else, that each node has a cgroup subtree of its own
// that it sees as its root, and that nothing of the nodes is left after
// the test, nor ever was in the machine's own network namespace.
func TestLab(t *testing.T) {
	NeedRoot(t)
	links, mounts := rootLinks(t), rootMounts(t)
	var (
		holders    []int
		cgroupDirs []string // host paths of the nodes' subtrees
		orphan     int      // a process that left its parent behind in a node
	)
	t.Run("three nodes", func(t *testing.T) {
		lab := NewLab(t)
		nodes := []*Node{lab.NewNode("lab-a", "10.99.0.11"), lab.NewNode("lab-b", "10.99.0.12"), lab.NewNode("lab-c", "10.99.0.13")}
		single := NewNode(t)
		holders = append(holders, lab.network.Holder.Pid)
		for _, n := range append(nodes, single) {
			holders = append(holders, n.machine.Holder.Pid)
			for _, h := range n.machine.Cgroups.Hierarchies {
				cgroupDirs = append(cgroupDirs, h.Dir)
			}
		}
		if got := rootLinks(t); !slices.Equal(got, links) {
			t.Errorf("interfaces of the machine's namespace changed from %v to %v", links, got)
		}
		if got := rootMounts(t); !slices.Equal(got, mounts) {
			t.Errorf("mounts of the machine's namespace changed from %v to %v", mounts, got)
		}
		checkHostnames(t, append(nodes, single))
		checkTCP(t, nodes)
		checkUDP(t, nodes)
		checkVXLAN(t, nodes[0], nodes[1])
		checkGateway(t, nodes[0])
		checkCgroups(t, nodes[0], nodes[1])
		// A single node has cgroups of its own too, as tests run at once.
		// Checked against a node that has made no kubepods yet.
		checkCgroups(t, single, nodes[2])
		checkPrivateDirs(t, nodes[0], nodes[1])
		checkPrivateDirs(t, single, nodes[0])
		orphan = startOrphan(t, nodes[2])
	})

	if got := rootLinks(t); !slices.Equal(got, links) {
		t.Errorf("interfaces of the machine's namespace changed from %v to %v", links, got)
	}
	if got := rootMounts(t); !slices.Equal(got, mounts) {
		t.Errorf("mounts of the machine's namespace changed from %v to %v", mounts, got)
	}
	if len(holders) != 5 || len(cgroupDirs) == 0 {
		t.Fatalf("the lab was not made: %d holders, cgroups %v", len(holders), cgroupDirs)
	}
	for _, pid := range append(holders, orphan) {
		if pid != 0 && alive(pid) {
			t.Errorf("process %d is left", pid)
		}
	}
	for _, dir := range cgroupDirs {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s is left: %v", dir, err)
		}
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil {
			continue
		}
		for _, dir := range cgroupDirs {
			if strings.Contains(string(data), "/"+filepath.Base(dir)) && alive(atoi(e.Name())) {
				t.Errorf("process %s is left in %s", e.Name(), dir)
			}
		}
	}
}

// checkTCP checks that every node reaches every other over TCP, and is
// seen there with its own address: nothing between them translates.
func checkTCP(t *testing.T, nodes []*Node) {
	t.Helper()
	for _, to := range nodes {
		l, err := to.Listen("tcp", net.JoinHostPort(to.IP, "7000"))
		if err != nil {
			t.Fatalf("listen on %s: %v", to.Name, err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				_, _ = io.WriteString(conn, conn.RemoteAddr().String()+"\n")
				conn.Close()
			}
		}()
		for _, from := range nodes {
			if from == to {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			conn, err := from.DialContext(ctx, "tcp", net.JoinHostPort(to.IP, "7000"))
			cancel()
			if err != nil {
				t.Errorf("TCP from %s to %s: %v", from.Name, to.Name, err)
				continue
			}
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			seen, err := bufio.NewReader(conn).ReadString('\n')
			conn.Close()
			if host, _, _ := net.SplitHostPort(strings.TrimSpace(seen)); err != nil || host != from.IP {
				t.Errorf("TCP from %s to %s: seen as %q (%v), want %s", from.Name, to.Name, seen, err, from.IP)
			}
		}
	}
}

// checkUDP checks that every node reaches every other over UDP, which the
// nodes' VXLAN overlay runs on, and gets an answer back.
func checkUDP(t *testing.T, nodes []*Node) {
	t.Helper()
	for _, to := range nodes {
		var pc net.PacketConn
		err := to.InNetns(func() error {
			var err error
			pc, err = net.ListenPacket("udp", net.JoinHostPort(to.IP, "8472"))
			return err
		})
		if err != nil {
			t.Fatalf("listen on %s: %v", to.Name, err)
		}
		// Closed before the next check, whose VXLAN devices need the port.
		defer pc.Close()
		go func() {
			buf := make([]byte, 64)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo([]byte(from.String()), from)
			}
		}()
		for _, from := range nodes {
			if from == to {
				continue
			}
			conn, err := from.DialContext(context.Background(), "udp", net.JoinHostPort(to.IP, "8472"))
			if err != nil {
				t.Fatalf("UDP socket on %s: %v", from.Name, err)
			}
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 64)
			_, err = conn.Write([]byte("ping"))
			var n int
			if err == nil {
				n, err = conn.Read(buf)
			}
			conn.Close()
			if host, _, _ := net.SplitHostPort(string(buf[:n])); err != nil || host != from.IP {
				t.Errorf("UDP from %s to %s: seen as %q (%v), want %s", from.Name, to.Name, buf[:n], err, from.IP)
			}
		}
	}
}

// checkVXLAN checks that an overlay like kelp's, VXLAN over the node IPs
// on UDP 8472, carries TCP between two nodes across the lab.
func checkVXLAN(t *testing.T, a, b *Node) {
	t.Helper()
	overlayIP := map[*Node]string{a: "10.200.0.1", b: "10.200.0.2"}
	for n, peer := range map[*Node]*Node{a: b, b: a} {
		for _, args := range [][]string{
			{"link", "add", "lab-vxlan", "type", "vxlan", "id", "42", "local", n.IP, "remote", peer.IP, "dstport", "8472", "dev", "eth0"},
			{"addr", "add", overlayIP[n] + "/24", "dev", "lab-vxlan"},
			{"link", "set", "lab-vxlan", "up"},
		} {
			if out, err := n.Run(time.Minute, n.Command("ip", args...)); err != nil {
				t.Fatalf("ip %v in %s: %v\n%s", args, n.Name, err, out)
			}
		}
	}
	l, err := b.Listen("tcp", net.JoinHostPort(overlayIP[b], "7002"))
	if err != nil {
		t.Fatalf("listen on %s: %v", b.Name, err)
	}
	defer l.Close()
	go func() {
		if conn, err := l.Accept(); err == nil {
			_, _ = io.WriteString(conn, "over the overlay\n")
			conn.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := a.DialContext(ctx, "tcp", net.JoinHostPort(overlayIP[b], "7002"))
	if err != nil {
		t.Fatalf("TCP over VXLAN from %s to %s: %v", a.Name, b.Name, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if got, err := bufio.NewReader(conn).ReadString('\n'); err != nil || got != "over the overlay\n" {
		t.Errorf("TCP over VXLAN from %s to %s: got %q, %v", a.Name, b.Name, got, err)
	}
}

// checkGateway checks that the default gateway of the nodes answers
// nothing, as for a node made by NewNode.
func checkGateway(t *testing.T, n *Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if conn, err := n.DialContext(ctx, "tcp", "10.99.0.1:6443"); err == nil {
		conn.Close()
		t.Error("something answers at the gateway 10.99.0.1")
	}
}

// checkCgroups checks that n's processes are in n's cgroup subtree, that n
// sees that subtree as the root, and that cgroups made in n land in its
// subtree and are not seen by other.
func checkCgroups(t *testing.T, n, other *Node) {
	t.Helper()
	sleeper := n.Command("sleep", "300")
	if err := Spawn(sleeper); err != nil {
		t.Fatal(err)
	}
	// Not killed here: cleanup must kill what is left in the node.
	go func() { _ = sleeper.Wait() }()
	pid := sleeper.Process.Pid
	for deadline := time.Now().Add(10 * time.Second); comm(pid) != "sleep"; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%v did not start: %q", sleeper.Args, comm(pid))
		}
	}
	onHost := cgroupsOf(t, strconv.Itoa(pid))
	out, err := n.Run(time.Minute, n.Command("cat", "/proc/self/cgroup"))
	if err != nil {
		t.Fatalf("cat /proc/self/cgroup in %s: %v\n%s", n.Name, err, out)
	}
	inside := parseCgroups(out)
	var script []string
	for _, h := range n.machine.Cgroups.Hierarchies {
		key, want := h.Options, "/"
		if h.V2 {
			key, want = "", "/"+machine.V2Leaf
		}
		if host, _ := filepath.Rel(h.Mountpoint, h.ProcsDir()); onHost[key] != "/"+host {
			t.Errorf("%s: a process of the node is in %q on the host, want /%s", h.Mountpoint, onHost[key], host)
		}
		if inside[key] != want {
			t.Errorf("%s: a process of the node sees itself in %q, want %s", h.Mountpoint, inside[key], want)
		}
		script = append(script, "mkdir -p "+filepath.Join(h.Mountpoint, "kubepods", "pod1"))
	}
	if out, err := n.Run(time.Minute, n.Command("sh", "-c", strings.Join(script, " && "))); err != nil {
		t.Fatalf("make cgroups in %s: %v\n%s", n.Name, err, out)
	}
	for _, h := range n.machine.Cgroups.Hierarchies {
		if _, err := os.Stat(filepath.Join(h.Dir, "kubepods", "pod1")); err != nil {
			t.Errorf("%s: a cgroup made in the node is not in the node's subtree: %v", h.Mountpoint, err)
		}
		if out, err := other.Run(time.Minute, other.Command("ls", filepath.Join(h.Mountpoint, "kubepods"))); err == nil {
			t.Errorf("%s: %s sees the kubepods of %s: %s", h.Mountpoint, other.Name, n.Name, out)
		}
	}
}

// checkPrivateDirs checks that what n writes where a node keeps state
// outside its data dir, its pod logs say, neither other nor the machine
// sees.
func checkPrivateDirs(t *testing.T, n, other *Node) {
	t.Helper()
	dirs := []string{layout.RunDir, layout.NetnsDir, layout.KubeletRoot, layout.PodLogsDir, layout.ContainerLogsDir}
	var files, write, look []string
	for _, d := range dirs {
		f := filepath.Join(d, "kelp-lab-"+n.Name)
		files = append(files, f)
		write = append(write, "echo "+n.Name+" > "+f)
		look = append(look, "! test -e "+f)
	}
	if out, err := n.Run(time.Minute, n.Command("sh", "-c", strings.Join(write, " && "))); err != nil {
		t.Fatalf("write to the private dirs of %s: %v\n%s", n.Name, err, out)
	}
	if out, err := other.Run(time.Minute, other.Command("sh", "-c", strings.Join(look, " && "))); err != nil {
		t.Errorf("%s sees what %s wrote to %v: %v\n%s", other.Name, n.Name, dirs, err, out)
	}
	for _, f := range files {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("the machine sees %s, written in %s", f, n.Name)
			_ = os.Remove(f)
		}
	}
}

// startOrphan starts a process in a pod cgroup of n whose parent exits, as
// a container whose shim died, and returns its pid: only the cleanup of
// n's cgroups finds it.
func startOrphan(t *testing.T, n *Node) int {
	t.Helper()
	script := []string{}
	for _, h := range n.machine.Cgroups.Hierarchies {
		pods := filepath.Join(h.Mountpoint, "kubepods")
		dir := filepath.Join(pods, "pod2")
		script = append(script, "mkdir -p "+dir)
		if strings.Contains(","+h.Options+",", ",cpuset,") {
			// A new v1 cpuset takes no process until it has CPUs and
			// memory nodes; runc copies its parent's, as here.
			for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
				script = append(script,
					fmt.Sprintf("cat %s/%s > %s/%s", h.Mountpoint, file, pods, file),
					fmt.Sprintf("cat %s/%s > %s/%s", pods, file, dir, file))
			}
		}
		script = append(script, "echo $$ > "+filepath.Join(dir, "cgroup.procs"))
	}
	script = append(script, "{ sleep 300 </dev/null >/dev/null 2>&1 & echo $!; }")
	out, err := n.Run(time.Minute, n.Command("sh", "-c", strings.Join(script, " && ")))
	if err != nil {
		t.Fatalf("start an orphan in %s: %v\n%s", n.Name, err, out)
	}
	pid := atoi(strings.TrimSpace(out))
	if !alive(pid) {
		t.Fatalf("orphan %q is not running", out)
	}
	return pid
}

// cgroupsOf maps the hierarchies in /proc/<pid>/cgroup, as the test sees
// it, to the process's cgroup; see parseCgroups.
func cgroupsOf(t *testing.T, pid string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/proc", pid, "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	return parseCgroups(string(data))
}

// parseCgroups maps the hierarchies of a /proc/<pid>/cgroup, by their
// sorted controllers as in hierarchy.options ("" for v2), to the cgroup.
func parseCgroups(data string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(data), "\n") {
		if f := strings.SplitN(line, ":", 3); len(f) == 3 {
			opts := strings.Split(f[1], ",")
			slices.Sort(opts)
			out[strings.Join(opts, ",")] = f[2]
		}
	}
	return out
}

// rootLinks are the interfaces of the test's own network namespace.
func rootLinks(t *testing.T) []string {
	t.Helper()
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range ifaces {
		names = append(names, i.Name)
	}
	slices.Sort(names)
	return names
}

// rootMounts are the mount points of the test's own mount namespace where
// a node mounts something in its own: over privateDirs, systemd's and the
// cgroups. Others are left out, so kelp running on the machine meanwhile
// does not fail the test.
func rootMounts(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var points []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		for _, dir := range slices.Concat(privateDirs, []string{"/run/systemd", "/sys/fs/cgroup"}) {
			if f[4] == dir || strings.HasPrefix(f[4], dir+"/") {
				points = append(points, f[4])
				break
			}
		}
	}
	slices.Sort(points)
	return points
}

// alive says whether pid runs and is not a zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(stat)
	end := strings.LastIndexByte(s, ')')
	return end > 0 && !strings.HasPrefix(strings.TrimSpace(s[end+1:]), "Z")
}

func comm(pid int) string {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(data))
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// checkHostnames checks that each node's hostname is its name, as on
// machines of their own: upstream derives leader election and apiserver
// identities from it.
func checkHostnames(t *testing.T, nodes []*Node) {
	t.Helper()
	for _, n := range nodes {
		out, err := n.Command("cat", "/proc/sys/kernel/hostname").CombinedOutput()
		if got := strings.TrimSpace(string(out)); err != nil || got != n.Name {
			t.Errorf("hostname of node %s: %q, %v; want %q", n.Name, got, err, n.Name)
		}
	}
}

// TestLabDualStack: nodes of NewDualStackNode reach each other over IPv6
// too, seen with their own addresses, and their kelp gets both as
// --node-ip; other nodes of the lab stay IPv4 only.
func TestLabDualStack(t *testing.T) {
	NeedRoot(t)
	lab := NewLab(t)
	a, b := lab.NewDualStackNode("lab-a", "10.99.0.11", "fd99::11"), lab.NewDualStackNode("lab-b", "10.99.0.12", "fd99::12")
	plain := lab.NewNode("lab-c", "10.99.0.13")
	l, err := b.Listen("tcp", net.JoinHostPort(b.IP6, "7000"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if conn, err := l.Accept(); err == nil {
			_, _ = io.WriteString(conn, conn.RemoteAddr().String()+"\n")
			conn.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := a.DialContext(ctx, "tcp", net.JoinHostPort(b.IP6, "7000"))
	if err != nil {
		t.Fatalf("TCP over IPv6 from %s to %s: %v", a.Name, b.Name, err)
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	seen, err := bufio.NewReader(conn).ReadString('\n')
	conn.Close()
	if host, _, _ := net.SplitHostPort(strings.TrimSpace(seen)); err != nil || host != a.IP6 {
		t.Errorf("seen as %q (%v), want %s", seen, err, a.IP6)
	}
	if args := strings.Join(a.AgentArgs("https://10.99.0.12:6443", "/token"), " "); !strings.Contains(args, "--node-ip 10.99.0.11,fd99::11") {
		t.Errorf("agent args %s", args)
	}
	if args := strings.Join(a.ServerArgs(), " "); !strings.Contains(args, "--node-ip 10.99.0.11,fd99::11") {
		t.Errorf("server args %s", args)
	}
	if args := strings.Join(plain.ServerArgs(), " "); strings.Contains(args, "--node-ip") {
		t.Errorf("an IPv4 node's server args %s", args)
	}
	if out, err := plain.Command("ip", "-6", "addr", "show", "dev", "eth0", "scope", "global").CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("an IPv4 node has global IPv6 addresses: %s %v", out, err)
	}
}
