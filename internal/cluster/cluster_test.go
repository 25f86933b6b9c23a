package cluster_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// TestClusterCommand drives `kelp cluster` as a user would, on a host that
// is a test node of its own (its network, mount and cgroup namespaces):
// a cluster of a server and two agents, a DaemonSet on all three, pods on
// every node reaching a Service by DNS name, a NodePort on the host's
// loopback, images imported into every node, data kept across stop and
// start, a second cluster beside it that sees nothing of the first, bad
// input, and nothing left behind on the host after delete.
func TestClusterCommand(t *testing.T) {
	host, root, kelp := newHost(t)
	before := viewOf(t, host)
	image := testcluster.BuildTestImage(t, testcluster.TestImage)

	out, err := kelp(nodeFlags("cluster", "create", "ci", "--agents", "2", "--image", image, "--port", "18080:30080", "--wait", "4m")...)
	if err != nil {
		t.Fatalf("kelp cluster create: %v\n%s", err, out)
	}
	t.Log(strings.TrimSpace(out))
	kubectl := func(cluster string, args ...string) string {
		t.Helper()
		out, err := kelp(append([]string{"cluster", "kubectl", cluster}, args...)...)
		if err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
		return out
	}
	apply := func(cluster, manifest string) {
		t.Helper()
		path := filepath.Join(t.TempDir(), "manifest.yaml")
		if err := os.WriteFile(path, []byte(manifest), 0o600); err != nil {
			t.Fatal(err)
		}
		kubectl(cluster, "apply", "-f", path)
	}
	nodes := strings.Fields(kubectl("ci", "get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"))
	if want := []string{"agent-1", "agent-2", "server-1"}; !slices.Equal(nodes, want) {
		t.Fatalf("nodes %v, want %v", nodes, want)
	}

	// A DaemonSet runs on all three nodes, from the image given to create.
	apply("ci", daemonSet("web", testcluster.TestImage)+`---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 8080, nodePort: 30080}]
`)
	waitFor(t, "DaemonSet web ready on 3 nodes", func() string {
		return kubectl("ci", "get", "ds", "web", "-o", "jsonpath={.status.numberReady}")
	}, "3")

	// A pod on each node reaches the Service by its DNS name.
	for _, node := range nodes {
		job := "get-" + node
		apply("ci", podJob(job, node, testcluster.TestImage, "", "get", "http://web.default.svc.cluster.local:8080/", "20s"))
		kubectl("ci", "wait", "--for=condition=complete", "--timeout=120s", "job/"+job)
	}

	// The NodePort answers on the host's loopback.
	answer, err := httpGet(host, "http://127.0.0.1:18080/")
	if err != nil || !strings.HasPrefix(answer, "web-") {
		t.Fatalf("--port 18080:30080 on the host's loopback: %q, %v", answer, err)
	}

	// An image imported after create runs on every node.
	imported := "docker.io/kelp-test/imported:1.0"
	if out, err := kelp("cluster", "image", "import", "ci", testcluster.BuildTestImage(t, imported)); err != nil || strings.Count(out, imported) != 3 {
		t.Fatalf("kelp cluster image import: %v\n%s", err, out)
	}
	apply("ci", daemonSet("imported", imported))
	waitFor(t, "DaemonSet imported ready on 3 nodes", func() string {
		return kubectl("ci", "get", "ds", "imported", "-o", "jsonpath={.status.numberReady}")
	}, "3")

	// A volume's data is kept across stop and start.
	apply("ci", `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Mi}}
---
`+podJob("write", "agent-1", testcluster.TestImage, "data", "write", "/data/kept", "written before stop"))
	kubectl("ci", "wait", "--for=condition=complete", "--timeout=120s", "job/write")
	if out, err := kelp("cluster", "stop", "ci"); err != nil {
		t.Fatalf("kelp cluster stop: %v\n%s", err, out)
	}
	if out, _ := kelp("cluster", "list"); !strings.Contains(out, "stopped") {
		t.Errorf("list after stop:\n%s", out)
	}
	if out, err := kelp("cluster", "start", "ci", "--wait", "4m"); err != nil {
		t.Fatalf("kelp cluster start: %v\n%s", err, out)
	}
	apply("ci", podJob("read", "agent-1", testcluster.TestImage, "data", "cat", "/data/kept"))
	kubectl("ci", "wait", "--for=condition=complete", "--timeout=120s", "job/read")
	if got := kubectl("ci", "logs", "job/read"); !strings.Contains(got, "written before stop") {
		t.Errorf("the volume after stop and start holds %q", got)
	}

	// A cluster made from a saved one has its objects, images and
	// volumes; the one it was saved from runs on.
	if out, err := kelp("cluster", "save", "ci", "prepared"); err != nil {
		t.Fatalf("kelp cluster save: %v\n%s", err, out)
	}
	out, err = kelp("cluster", "create", "fork", "--from", "prepared", "--wait", "4m")
	if err != nil {
		t.Fatalf("kelp cluster create --from: %v\n%s", err, out)
	}
	t.Log(strings.TrimSpace(out))
	for _, cluster := range []string{"ci", "fork"} {
		for _, ds := range []string{"web", "imported"} {
			waitFor(t, "DaemonSet "+ds+" of cluster "+cluster+" ready on 3 nodes", func() string {
				return kubectl(cluster, "get", "ds", ds, "-o", "jsonpath={.status.numberReady}")
			}, "3")
		}
	}
	apply("fork", podJob("read-fork", "agent-1", testcluster.TestImage, "data", "cat", "/data/kept"))
	kubectl("fork", "wait", "--for=condition=complete", "--timeout=120s", "job/read-fork")
	if got := kubectl("fork", "logs", "job/read-fork"); !strings.Contains(got, "written before stop") {
		t.Errorf("the volume in the fork holds %q", got)
	}
	kubectl("fork", "delete", "ds", "web")
	if got := kubectl("ci", "get", "ds", "web", "-o", "name"); strings.TrimSpace(got) != "daemonset.apps/web" {
		t.Errorf("a DaemonSet deleted in the fork is gone in the cluster it was saved from: %q", got)
	}
	if out, err := kelp("cluster", "delete", "fork"); err != nil {
		t.Fatalf("kelp cluster delete fork: %v\n%s", err, out)
	}
	if out, err := kelp("cluster", "snapshots", "delete", "prepared"); err != nil {
		t.Fatalf("kelp cluster snapshots delete: %v\n%s", err, out)
	}

	badInput(t, host, kelp)
	lostRecord(t, host, root, kelp)

	// A second cluster beside it sees nothing of the first.
	if out, err := kelp(nodeFlags("cluster", "create", "other", "--wait", "4m")...); err != nil {
		t.Fatalf("kelp cluster create other: %v\n%s", err, out)
	}
	if got := kubectl("other", "get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"); got != "server-1" {
		t.Errorf("nodes of cluster other: %q", got)
	}
	if got := kubectl("other", "get", "ds", "-A", "-o", "name"); got != "" {
		t.Errorf("cluster other has DaemonSets: %q", got)
	}
	// Both answer on the host, each at its own port.
	for _, cluster := range []string{"ci", "other"} {
		if got := kubectl(cluster, "get", "ns", "default", "-o", "name"); strings.TrimSpace(got) != "namespace/default" {
			t.Errorf("cluster %s: %q", cluster, got)
		}
	}

	if out, err := kelp("cluster", "delete", "ci", "other"); err != nil {
		t.Fatalf("kelp cluster delete: %v\n%s", err, out)
	}
	if after := viewOf(t, host); !slices.Equal(after, before) {
		t.Errorf("the host after delete:\n%s\nbefore create:\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	if pids := host.CgroupProcesses(); len(pids) > 0 {
		t.Errorf("processes left on the host after delete: %v", pids)
	}
	if entries, err := os.ReadDir(root); err != nil || len(entries) > 0 {
		t.Errorf("files left in %s: %v %v", root, entries, err)
	}
}

// newHost makes the machine a test runs kelp cluster on: a test node, its
// clusters under root, and kelp, which runs kelp there. Its clusters are
// deleted when the test ends.
func newHost(t *testing.T) (host *testcluster.Node, root string, kelp func(...string) (string, error)) {
	host = testcluster.NewNode(t)
	root = filepath.Join(host.Dir, "clusters")
	host.Env = []string{"KELP_CLUSTER_ROOT=" + root}
	kelp = func(args ...string) (string, error) {
		t.Helper()
		return host.RunKelp(5*time.Minute, args...)
	}
	t.Cleanup(func() {
		if out, err := kelp("cluster", "delete", "--all"); err != nil {
			t.Errorf("kelp cluster delete --all: %v\n%s", err, out)
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			showClusters(t, root, kelp)
		}
	})
	return host, root, kelp
}

// nodeFlags ends a create's args with the flags every test node gets
// (testcluster.KubeletArgs): a cluster's nodes share the machine's disk
// with every other test and the build cache, whose use is the machine's
// state, not the cluster's: under the kubelet's default 15 % free line,
// nodes refuse every new pod.
func nodeFlags(args ...string) []string {
	return append(append(args, "--"), testcluster.KubeletArgs...)
}

// showClusters logs what a failed test needs to tell why: the pods and
// events of every cluster under root, and its nodes' last log lines.
func showClusters(t *testing.T, root string, kelp func(...string) (string, error)) {
	clusters, _ := os.ReadDir(root)
	for _, c := range clusters {
		for _, args := range [][]string{
			{"get", "nodes", "-o", "wide"},
			{"get", "pods", "-A", "-o", "wide"},
			{"get", "events", "-A", "--sort-by=.lastTimestamp"},
		} {
			out, err := kelp(append([]string{"cluster", "kubectl", c.Name()}, args...)...)
			t.Logf("---- cluster %s: kubectl %s (%v) ----\n%s", c.Name(), strings.Join(args, " "), err, testcluster.LastLines(out, 60))
		}
		logs, _ := filepath.Glob(filepath.Join(root, c.Name(), "nodes", "*", "kelp.log"))
		for _, path := range logs {
			data, _ := os.ReadFile(path)
			t.Logf("---- cluster %s: last lines of %s ----\n%s", c.Name(), path, testcluster.LastLines(string(data), 80))
		}
	}
}

// badInput tries what users get wrong, on a host where cluster ci runs.
func badInput(t *testing.T, host *testcluster.Node, kelp func(...string) (string, error)) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cluster", "create", "ci", "--wait", "0"}, "exists already"},
		{[]string{"cluster", "create", "Bad_Name"}, "cluster name \"Bad_Name\""},
		{[]string{"cluster", "create", "neg", "--agents", "-1"}, "--agents -1"},
		{[]string{"cluster", "create", "two", "--servers", "2", "--datastore", "sqlite"}, "--datastore sqlite takes one server"},
		{[]string{"cluster", "image", "import", "ci", "/etc/hostname"}, "an image tarball is named"},
		{[]string{"cluster", "stop", "nosuch"}, "there is no cluster nosuch"},
	} {
		out, err := kelp(tc.args...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("kelp %v: %v\n%s\nwant an error saying %q", tc.args, err, out, tc.want)
		}
	}
	notImage := filepath.Join(t.TempDir(), "app.tar")
	if err := os.WriteFile(notImage, []byte("no tar at all"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := kelp("cluster", "image", "import", "ci", notImage); err == nil || !strings.Contains(out, "not a tar file") {
		t.Errorf("import of a file that is no tar: %v\n%s", err, out)
	}
	if out, err := kelp("cluster", "delete", "nosuch"); err != nil || !strings.Contains(out, "there is no cluster nosuch") {
		t.Errorf("delete of a cluster that does not exist: %v\n%s", err, out)
	}
	// Not root: what is needed, and why.
	out, err := host.Run(time.Minute, host.CommandAs(65534, 65534, testcluster.Binary(t), "cluster", "create", "user"))
	if err == nil || !strings.Contains(out, "must run as root") {
		t.Errorf("create as nobody: %v\n%s", err, out)
	}
	// A host port in use: nothing is made.
	l, err := host.Listen("tcp", "127.0.0.1:18081")
	if err != nil {
		t.Fatal(err)
	}
	out, err = kelp("cluster", "create", "busy", "--port", "18081:30080")
	l.Close()
	if err == nil || !strings.Contains(out, "port 18081 of the host's loopback is in use") {
		t.Errorf("create with a host port in use: %v\n%s", err, out)
	}
	if out, _ := kelp("cluster", "list"); strings.Contains(out, "busy") {
		t.Errorf("a cluster that could not be made is listed:\n%s", out)
	}
	// Delete while its nodes are still starting: create says so, and
	// nothing of it is left.
	create := host.Command(testcluster.Binary(t), "cluster", "create", "doomed", "--wait", "4m")
	var createOut strings.Builder
	create.Stdout, create.Stderr = &createOut, &createOut
	if err := testcluster.Spawn(create); err != nil {
		t.Fatal(err)
	}
	created := make(chan error, 1)
	go func() { created <- create.Wait() }()
	waitFor(t, "cluster doomed started", func() string {
		out, _ := kelp("cluster", "list")
		if strings.Contains(out, "doomed") {
			return "listed"
		}
		return out
	}, "listed")
	if out, err := kelp("cluster", "delete", "doomed"); err != nil || !strings.Contains(out, "deleted cluster doomed") {
		t.Errorf("delete while starting: %v\n%s", err, out)
	}
	select {
	case err := <-created:
		if err == nil {
			t.Errorf("create of a cluster deleted while it started succeeded:\n%s", createOut.String())
		}
	case <-time.After(2 * time.Minute):
		t.Errorf("create still runs 2 minutes after its cluster was deleted")
	}
}

// lostRecord: a cluster whose directory was removed by hand while it ran
// is still deleted by name: every process in its cgroups, and the cgroups.
func lostRecord(t *testing.T, host *testcluster.Node, root string, kelp func(...string) (string, error)) {
	if out, err := kelp("cluster", "create", "lost", "--wait", "0"); err != nil {
		t.Fatalf("kelp cluster create lost: %v\n%s", err, out)
	}
	if err := os.RemoveAll(filepath.Join(root, "lost")); err != nil {
		t.Fatal(err)
	}
	if out, err := kelp("cluster", "delete", "lost"); err != nil || !strings.Contains(out, "deleted what was left of cluster lost") {
		t.Errorf("delete of a cluster whose record is gone: %v\n%s", err, out)
	}
}

// viewOf is what the host has that a cluster could leave behind:
// interfaces, mounts, nftables tables and cgroups.
func viewOf(t *testing.T, host *testcluster.Node) []string {
	t.Helper()
	var view []string
	out, err := host.Run(time.Minute, host.Command("ip", "-o", "link", "show"))
	if err != nil {
		t.Fatalf("ip link: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			view = append(view, "link "+strings.TrimSuffix(f[1], ":"))
		}
	}
	out, err = host.Run(time.Minute, host.Command("cat", "/proc/self/mountinfo"))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 4 {
			view = append(view, "mount "+f[4])
		}
	}
	err = host.InNetns(func() error {
		conn, err := nftables.New()
		if err != nil {
			return err
		}
		tables, err := conn.ListTables()
		for _, tb := range tables {
			view = append(view, "nftables "+tb.Name)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	out, err = host.Run(time.Minute, host.Command("find", "/sys/fs/cgroup", "-mindepth", "2", "-type", "d", "-name", "kelp-cluster-*"))
	if err != nil {
		t.Fatalf("find cgroups: %v\n%s", err, out)
	}
	for _, dir := range strings.Fields(out) {
		view = append(view, "cgroup "+dir)
	}
	slices.Sort(view)
	return view
}

func httpGet(n *testcluster.Node, url string) (string, error) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return n.DialContext(ctx, network, addr)
	}}}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

func waitFor(t *testing.T, what string, get func() string, want string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got := get()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %q after 3 minutes", what, got)
		}
		time.Sleep(time.Second)
	}
}

func daemonSet(name, image string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: DaemonSet
metadata: {name: %[1]s}
spec:
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      containers:
      - name: app
        image: %[2]s
        imagePullPolicy: Never
        args: [serve]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
`, name, image)
}

// podJob is a Job of one pod on node that runs testapp with args, with
// the claim (if any) mounted at /data.
func podJob(name, node, image, claim string, args ...string) string {
	volumes := ""
	if claim != "" {
		volumes = fmt.Sprintf(`
        volumeMounts: [{name: data, mountPath: /data}]
      volumes: [{name: data, persistentVolumeClaim: {claimName: %s}}]`, claim)
	}
	return fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata: {name: %s}
spec:
  backoffLimit: 6
  template:
    spec:
      restartPolicy: Never
      nodeSelector: {kubernetes.io/hostname: %s}
      containers:
      - name: job
        image: %s
        imagePullPolicy: Never
        args: [%s]%s
`, name, node, image, `"`+strings.Join(args, `", "`)+`"`, volumes)
}

// TestClusterCommandHA: --servers 3 makes a control plane of three
// servers on embedded etcd, the second and third joined to the first, and
// the kubeconfig reaches it through any of them.
func TestClusterCommandHA(t *testing.T) {
	_, _, kelp := newHost(t)
	if out, err := kelp(nodeFlags("cluster", "create", "ha", "--servers", "3", "--wait", "5m")...); err != nil {
		t.Fatalf("kelp cluster create --servers 3: %v\n%s", err, out)
	}
	out, err := kelp("cluster", "kubectl", "ha", "get", "nodes", "-o", "jsonpath={.items[*].metadata.name}")
	if err != nil || strings.TrimSpace(out) != "server-1 server-2 server-3" {
		t.Fatalf("nodes: %v %q", err, out)
	}
	out, err = kelp("cluster", "exec", "ha", "server-3", "--", testcluster.Binary(t), "etcdctl", "member", "list")
	if err != nil || strings.Count(out, "started") != 3 {
		t.Fatalf("etcd members seen from server-3: %v\n%s", err, out)
	}
	// With server-1 stopped, the API answers through the others. Inside a
	// node, kelp killall needs no flag, and touches no other node.
	if out, err := kelp("cluster", "exec", "ha", "server-1", "--", testcluster.Binary(t), "killall"); err != nil {
		t.Fatalf("stop server-1: %v\n%s", err, out)
	}
	waitFor(t, "the API through server-2 or server-3", func() string {
		out, _ := kelp("cluster", "kubectl", "ha", "get", "--raw", "/readyz")
		return strings.TrimSpace(out)
	}, "ok")
}
