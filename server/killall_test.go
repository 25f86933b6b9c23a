package server_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/nodepaths"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// TestKillallLeavesOtherNodes: kelp killall of one node (agent-k) while
// three others run on the machine leaves them, their pods, pod cgroups,
// pod logs and networks alone, and removes agent-k's. agent-k runs in the
// mount, network and cgroup namespaces of the cluster's server (a control
// plane without a node of its own); agent-b in mount and network
// namespaces of its own but the same cgroup namespace, as the bench
// scripts start nodes; agent-c in namespaces of its own, as a test node.
func TestKillallLeavesOtherNodes(t *testing.T) {
	t.Parallel()
	lab := testcluster.NewLab(t)
	image := testcluster.BuildTestImage(t, testcluster.TestImage)
	srv := lab.NewNode("server", "10.99.0.2")
	srv.Start()
	srv.WaitReady(startTimeout)

	agentC := lab.NewNode("agent-c", "10.99.0.4")
	agentC.AddImage(image)
	agentC.StartAgent(srv.URL(), srv.TokenFile())

	// agent-k has an address of its own beside the server's: a node may
	// not ask for a serving certificate for an address of the apiserver.
	if out, err := srv.Run(time.Minute, srv.Command("ip", "addr", "add", "10.99.0.3/24", "dev", "eth0")); err != nil {
		t.Fatalf("agent-k's address: %v\n%s", err, out)
	}
	k := startNodeIn(t, "agent-k", "10.99.0.3", filepath.Join(srv.Dir, "agent-k"), image, srv, srv.Command)
	b := newSharedCgroupNode(t, srv, "agent-b", "10.98.0.2")
	b.node = startNodeIn(t, "agent-b", "10.98.0.2", filepath.Join(srv.Dir, "agent-b"), image, srv, b.command)
	agentC.WaitLog("kelp node is running", startTimeout)
	c := srv.Client()
	waitNodesReady(t, c, 3)
	manifest := filepath.Join(srv.Dir, "everywhere.yaml")
	if err := os.WriteFile(manifest, []byte(haDaemonSet), 0o600); err != nil {
		t.Fatal(err)
	}
	waitServiceAccount(t, c, "default")
	kubectl(t, srv, "apply", "-f", manifest)
	rolloutStatus(t, srv, "daemonset/everywhere", 170*time.Second)

	kPaths, bPaths, cPaths := loadPaths(t, k.dataDir), loadPaths(t, b.node.dataDir), loadPaths(t, agentC.DataDir)
	if kPaths.CgroupRoot == bPaths.CgroupRoot || kPaths.CgroupRoot == "/" {
		t.Fatalf("agent-k and agent-b share a cgroup namespace and use cgroup roots %s and %s, want their own", kPaths.CgroupRoot, bPaths.CgroupRoot)
	}
	t.Logf("cgroup roots and pod log dirs: agent-k %+v, agent-b %+v, agent-c %+v", kPaths, bPaths, cPaths)
	before := map[string]string{}
	for _, node := range []string{"agent-b", "agent-c"} {
		before[node] = containerOf(t, everywherePod(t, c, node))
	}
	// What the others have, each seen from inside its namespaces.
	others := []struct {
		name string
		run  func(...string) (string, error)
		what []string // shell tests that must hold
	}{
		{"agent-b", b.run, []string{
			"ls -d /sys/fs/cgroup/*" + bPaths.CgroupRoot + "/kubepods/burstable",
			"ls " + bPaths.PodLogsDir + "/default_everywhere-*/everywhere/0.log",
			"ip link show cni0", "ip link show kelp.vxlan",
			"test -S " + layout.ContainerdAddress,
		}},
		{"agent-c", func(args ...string) (string, error) {
			return agentC.Run(time.Minute, agentC.Command(args[0], args[1:]...))
		}, []string{
			"ls -d /sys/fs/cgroup/*" + cPaths.CgroupRoot + "/kubepods/burstable",
			"ls " + cPaths.PodLogsDir + "/default_everywhere-*/everywhere/0.log",
			"ip link show cni0", "ip link show kelp.vxlan",
		}},
		{"server", func(args ...string) (string, error) {
			return srv.Run(time.Minute, srv.Command(args[0], args[1:]...))
		}, []string{
			// A server on SQLite keeps its Leases and Events there.
			"test -d " + layout.RAMStore(srv.DataDir),
		}},
	}
	check := func(when string) {
		t.Helper()
		for _, o := range others {
			for _, cond := range o.what {
				if out, err := o.run("sh", "-c", cond); err != nil {
					t.Errorf("%s: %s on %s: %v\n%s", when, cond, o.name, err, out)
				}
			}
		}
	}
	check("before killall")
	// agent-k's own, seen from its namespaces (the server's).
	kHas := []string{
		"ls -d /sys/fs/cgroup/*" + kPaths.CgroupRoot + "/kubepods",
		"ls " + kPaths.PodLogsDir + "/default_everywhere-*/everywhere/0.log",
		"ip link show cni0",
	}
	for _, cond := range kHas {
		if out, err := srv.Run(time.Minute, srv.Command("sh", "-c", cond)); err != nil {
			t.Fatalf("before killall: %s on agent-k: %v\n%s", cond, err, out)
		}
	}

	out, err := srv.RunKelp(time.Minute, "killall", "--data-dir", k.dataDir)
	if err != nil {
		t.Fatalf("killall: %v\n%s", err, out)
	}
	t.Logf("kelp killall of agent-k:\n%s", out)
	for _, cond := range kHas {
		if out, err := srv.Run(time.Minute, srv.Command("sh", "-c", cond)); err == nil {
			t.Errorf("after killall: %s on agent-k still holds:\n%s", cond, out)
		}
	}
	if alive := pidsUnder(k.dataDir); len(alive) > 0 {
		t.Errorf("after killall: processes of agent-k left: %v", alive)
	}
	// Long enough for the other kubelets to sync their QoS cgroups and
	// pods, which fail when their cgroups are gone.
	time.Sleep(20 * time.Second)
	check("after killall")
	for node, id := range before {
		if after := containerOf(t, everywherePod(t, c, node)); after != id {
			t.Errorf("the pod on %s changed across agent-k's killall: %s, was %s", node, after, id)
		}
	}
	if _, err := c.CoreV1().Nodes().Get(context.Background(), "agent-b", metav1.GetOptions{}); err != nil {
		t.Errorf("the server no longer answers: %v", err)
	}
	for _, log := range []string{b.log(), agentC.Log()} {
		if strings.Contains(log, "Failed to update QoS cgroup configuration") {
			t.Error("a kubelet of another node lost its QoS cgroups")
		}
	}
}

// containerOf is the container ID and restart count of pod's one container.
func containerOf(t *testing.T, pod corev1.Pod) string {
	t.Helper()
	s := pod.Status.ContainerStatuses[0]
	if s.State.Running == nil {
		t.Errorf("the container of %s on %s does not run: %+v", pod.Name, pod.Spec.NodeName, s.State)
	}
	return fmt.Sprintf("%s restarts=%d", s.ContainerID, s.RestartCount)
}

// loadPaths reads the cgroup root and pod log dir a node's kubelet runs
// with, which the node must have recorded.
func loadPaths(t *testing.T, dataDir string) nodepaths.Paths {
	t.Helper()
	kubelet := kubeletPaths(t, dataDir)
	if p, err := nodepaths.Load(dataDir); err != nil || p != kubelet {
		t.Fatalf("the node of %s recorded %+v (%v), its kubelet runs with %+v", dataDir, p, err, kubelet)
	}
	return kubelet
}

// kubeletPaths reads the cgroup root and pod log dir of the kubelet's
// configuration file in dataDir.
func kubeletPaths(t *testing.T, dataDir string) nodepaths.Paths {
	t.Helper()
	data, err := os.ReadFile(layout.Agent(dataDir).KubeletConfig)
	if err != nil {
		t.Fatal(err)
	}
	kubelet := nodepaths.Legacy() // the kubelet's defaults
	if err := yaml.Unmarshal(data, &kubelet); err != nil {
		t.Fatal(err)
	}
	return kubelet
}

// pidsUnder lists the processes whose command line names dir.
func pidsUnder(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if end := strings.LastIndexByte(string(stat), ')'); end < 0 || strings.HasPrefix(strings.TrimSpace(string(stat[end+1:])), "Z") {
			continue
		}
		if strings.Contains(string(cmdline), dir+"\x00") || strings.Contains(string(cmdline), dir+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// extraNode is a kelp agent the test starts itself, in namespaces it
// did not make with testcluster.
type extraNode struct {
	dataDir, logPath string
}

// startNodeIn starts `kelp agent` named name with address ip and dataDir,
// joined to srv, with command (which runs a command in the node's
// namespaces). At cleanup it is killed and its node removed with kelp
// killall.
func startNodeIn(t *testing.T, name, ip, dataDir, image string, srv *testcluster.Node, command func(string, ...string) *exec.Cmd) *extraNode {
	t.Helper()
	n := &extraNode{dataDir: dataDir, logPath: dataDir + ".log"}
	images := layout.Agent(dataDir).ImagesDir
	data, err := os.ReadFile(image)
	if err == nil {
		err = os.MkdirAll(images, 0o700)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(images, filepath.Base(image)), data, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(n.logPath)
	if err != nil {
		t.Fatal(err)
	}
	bin := testcluster.Binary(t)
	args := append([]string{"agent", "--server", srv.URL(), "--token-file", srv.TokenFile(), "--data-dir", dataDir, "--node-name", name, "--node-ip", ip}, testcluster.KubeletArgs...)
	cmd := command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := testcluster.Spawn(cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logFile.Close(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if out, err := command(bin, "killall", "--data-dir", dataDir).CombinedOutput(); err != nil {
			t.Errorf("kelp killall of %s: %v\n%s", name, err, out)
		}
		if t.Failed() {
			data, _ := os.ReadFile(n.logPath)
			lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
			if len(lines) > 150 {
				lines = lines[len(lines)-150:]
			}
			t.Logf("---- node %s: last lines of its log ----\n%s", name, strings.Join(lines, "\n"))
		}
	})
	deadline := time.Now().Add(startTimeout)
	for {
		data, _ := os.ReadFile(n.logPath)
		if strings.Contains(string(data), "kelp node is running") {
			return n
		}
		select {
		case <-done:
			t.Fatalf("kelp agent %s exited:\n%s", name, data)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("kelp agent %s not running after %s:\n%s", name, startTimeout, data)
		}
	}
}

// sharedCgroupNode is a machine in mount, network and UTS namespaces of
// its own, made from inside srv's: in srv's cgroup namespace and cgroups,
// with private mounts over the directories a node writes to outside its
// data dir, and a veth to srv's network namespace, which routes for it.
type sharedCgroupNode struct {
	srv    *testcluster.Node
	holder *exec.Cmd
	node   *extraNode
}

func newSharedCgroupNode(t *testing.T, srv *testcluster.Node, name, ip string) *sharedCgroupNode {
	t.Helper()
	setup := []string{"echo " + name + " > /proc/sys/kernel/hostname", "ip link set lo up"}
	for _, d := range []string{layout.RunDir, layout.NetnsDir, layout.KubeletRoot, layout.PodLogsDir, layout.ContainerLogsDir} {
		setup = append(setup, "mount -t tmpfs -o mode=0755 kelp-test "+d)
	}
	setup = append(setup, "echo ready", "exec sleep infinity")
	n := &sharedCgroupNode{srv: srv, holder: srv.Command("unshare", "--net", "--mount", "--uts", "--propagation", "private", "sh", "-c", strings.Join(setup, " && "))}
	out, err := n.holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := testcluster.Spawn(n.holder); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.holder.Process.Kill()
		_ = n.holder.Wait()
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("set up node %s: %q %v", name, line, err)
	}
	// The holder is sh -c, which execs sleep: its pid is the machine's.
	pid := strconv.Itoa(n.holder.Process.Pid)
	gateway := strings.TrimSuffix(ip, ".2") + ".1"
	for _, cmd := range []*exec.Cmd{
		srv.Command("ip", "link", "add", "veth-"+name, "type", "veth", "peer", "name", "eth0", "netns", pid),
		srv.Command("ip", "addr", "add", gateway+"/24", "dev", "veth-"+name),
		srv.Command("ip", "link", "set", "veth-"+name, "up"),
		n.command("ip", "addr", "add", ip+"/24", "dev", "eth0"),
		n.command("ip", "link", "set", "eth0", "up"),
		n.command("ip", "route", "add", "default", "via", gateway, "dev", "eth0"),
	} {
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("wire node %s: %v: %v\n%s", name, cmd.Args, err, out)
		}
	}
	return n
}

// command runs name in the node's namespaces and cgroups.
func (n *sharedCgroupNode) command(name string, args ...string) *exec.Cmd {
	pid := strconv.Itoa(n.holder.Process.Pid)
	return n.srv.Command("nsenter", append([]string{"--target", pid, "--net", "--mount", "--uts", "--", name}, args...)...)
}

func (n *sharedCgroupNode) run(args ...string) (string, error) {
	out, err := n.command(args[0], args[1:]...).CombinedOutput()
	return string(out), err
}

func (n *sharedCgroupNode) log() string {
	data, _ := os.ReadFile(n.node.logPath)
	return string(data)
}
