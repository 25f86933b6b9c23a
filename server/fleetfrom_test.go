package server_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/crd"
	"github.com/kelp-dev/kelp/internal/fleet"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/testcluster"
	"github.com/kelp-dev/kelp/internal/version"
)

// upgradeFromEnv names the earlier kelp TestFleetUpgradeFromEarlier
// starts the cluster with.
const upgradeFromEnv = "KELP_UPGRADE_FROM"

// fromEarlierWorkload is what the cluster made by the earlier kelp holds
// besides fleetWorkload: a DaemonSet, whose pods no drain evicts, and a
// Deployment whose claim's local volume ties its pod to one node.
var fromEarlierWorkload = haDaemonSet + `---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 16Mi}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: data}
spec:
  replicas: 1
  strategy: {type: Recreate}
  selector: {matchLabels: {app: data}}
  template:
    metadata: {labels: {app: data}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - name: web
        image: ` + testcluster.TestImage + `
        imagePullPolicy: IfNotPresent
        args: [serve]
        volumeMounts: [{name: data, mountPath: /data}]
      volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
`

// TestFleetUpgradeFromEarlier upgrades a cluster made by an earlier kelp
// of an older Kubernetes minor ($KELP_UPGRADE_FROM; scripts/upgrade-check.sh
// fleet builds this tree on Kubernetes v1.36) to the kelp under test, by
// an Upgrade whose binary is a file on the nodes: a server with its node
// (SQLite, Secrets encrypted at rest) and an agent, each installed as
// install.sh does, holding Deployments, a DaemonSet, a claim whose volume
// holds a file, a CRD with objects of it and Secrets. Once the rollout
// has Succeeded, both nodes run the new kelp (the earlier one kept as
// kelp.previous), report its Kubernetes version and run its bundle's
// containerd; everything is there, the Secrets still encrypted; the
// server took its snapshot named for the upgrade; and the DaemonSet's
// pods, which drains leave, are the same pods in the same containers.
// Skipped without $KELP_UPGRADE_FROM: CI builds one kelp only.
func TestFleetUpgradeFromEarlier(t *testing.T) {
	from := os.Getenv(upgradeFromEnv)
	if from == "" {
		t.Skip("set " + upgradeFromEnv + " to a kelp of an older Kubernetes minor (scripts/upgrade-check.sh fleet builds one)")
	}
	to := testcluster.Binary(t)
	fromVersions, toVersions := versionsOf(t, from), versionsOf(t, to)
	fromKube, toKube := fromVersions["kubernetes"], toVersions["kubernetes"]
	if !version.NewerMinor(toKube, fromKube) {
		t.Fatalf("%s=%s runs Kubernetes %s and the kelp under test %s: want an earlier minor to upgrade from", upgradeFromEnv, from, fromKube, toKube)
	}
	lab := testcluster.NewLab(t)
	image := testcluster.BuildTestImage(t, testcluster.TestImage)
	srv := lab.NewNode("server", "10.99.0.2")
	srv.AddImage(image)
	srvBin := newInstalledFrom(t, srv, from)
	agent := lab.NewNode("agent-1", "10.99.0.3")
	agent.AddImage(image)
	agentBin := newInstalledFrom(t, agent, from)
	startServerAndAgent(srv, agent, "--secrets-encryption")
	c := srv.Client()
	ctx := context.Background()
	waitNodesReady(t, c, 2)
	for _, name := range []string{"server", "agent-1"} {
		info := nodeInfo(t, c, name)
		if !strings.HasPrefix(info.KubeletVersion, fromKube) {
			t.Fatalf("node %s runs kubelet %s before the upgrade, want %s", name, info.KubeletVersion, fromKube)
		}
		t.Logf("node %s runs kubelet %s on %s", name, info.KubeletVersion, info.ContainerRuntimeVersion)
	}

	// What the cluster holds.
	waitServiceAccount(t, c, "default")
	apply(t, srv, fleetWorkload+"---"+fromEarlierWorkload)
	secrets := map[string]string{"precious": "plain-sight", "kept": "made by kelp " + fromKube}
	for name, value := range secrets {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string][]byte{"password": []byte(value)}}
		if _, err := c.CoreV1().Secrets("default").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createWidgets(t, srv, "w1", "w2")
	for _, what := range []string{"deployment/kept", "deployment/data", "daemonset/everywhere"} {
		rolloutStatus(t, srv, what, 3*time.Minute)
	}
	greeting := "written on Kubernetes " + fromKube
	kubectl(t, srv, "exec", "deploy/data", "--", "/testapp", "write", "/data/greeting", greeting)
	dataPod := podsOf(t, c, "app=data")
	daemons := podsOf(t, c, "app=everywhere")
	if len(dataPod) != 1 || len(daemons) != 2 {
		t.Fatalf("pods of deployment/data %v and daemonset/everywhere %v, want one and two", dataPod, daemons)
	}
	t.Logf("made by the earlier kelp (Kubernetes %s): deployments kept (2 pods) and data (its claim's volume on node %s holds a file), daemonset everywhere, CRD widgets.kelp.test with 2 objects, 2 Secrets encrypted at rest", fromKube, dataPod[0].Spec.NodeName)
	for _, s := range []string{"precious", "kept"} {
		atRest(t, srv, s)
	}

	// The Upgrade, its binary a file on every node.
	dyn := dynamic.NewForConfigOrDie(srv.RestConfig())
	newKelp := readFile(t, to)
	sum := putOnNodes(t, "kelp-new", newKelp, srv, agent)
	began := time.Now()
	createUpgradeSpec(t, dyn, "to-new", map[string]any{"sha256": sum, "path": "kelp-new", "drainTimeout": "2m", "nodeTimeout": "8m"})
	up := waitUpgrade(t, dyn, "to-new", 20*time.Minute)
	if up.Status.Phase != fleet.PhaseSucceeded {
		t.Fatalf("Upgrade to-new: %s: %+v", up.Status.Phase, up.Status)
	}
	t.Logf("Upgrade to-new Succeeded in %s, target %s", time.Since(began).Round(time.Second), up.Status.Target)
	if len(up.Status.Nodes) != 2 || up.Status.Nodes[0].Name != "server" || up.Status.Nodes[1].Name != "agent-1" {
		t.Errorf("the rollout's nodes: %+v, want the server, then the agent", up.Status.Nodes)
	}
	for _, n := range up.Status.Nodes {
		t.Logf("  node %s: %s, from %s to %s: %s", n.Name, n.State, n.FromVersion, n.ToVersion, n.Message)
		if n.State != fleet.StateSucceeded || !strings.Contains(n.FromVersion, fromKube) || !strings.Contains(n.ToVersion, toKube) {
			t.Errorf("node %s: %+v, want Succeeded from Kubernetes %s to %s", n.Name, n, fromKube, toKube)
		}
	}

	// Both nodes on the new kelp, the earlier one kept.
	for _, i := range []installed{srvBin, agentBin} {
		if string(readFile(t, i.kelp)) != string(newKelp) || string(readFile(t, i.previous)) != string(i.original) {
			t.Errorf("%s is not the new kelp, or %s not the earlier one", i.kelp, i.previous)
		}
	}
	waitNodesReady(t, c, 2)
	for _, name := range []string{"server", "agent-1"} {
		info := nodeInfo(t, c, name)
		check(t, fmt.Sprintf("node %s reports kubelet %s", name, info.KubeletVersion), strings.HasPrefix(info.KubeletVersion, toKube))
		// The new kelp's bundle carries the containerd of its --version.
		runtime := strings.TrimPrefix(strings.TrimPrefix(info.ContainerRuntimeVersion, "containerd://"), "v")
		check(t, fmt.Sprintf("node %s runs %s", name, info.ContainerRuntimeVersion), runtime == strings.TrimPrefix(toVersions["containerd"], "v"))
		node, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		check(t, "node "+name+" uncordoned", err == nil && !node.Spec.Unschedulable)
	}
	recorded, ok, err := version.ReadDataDir(layout.Server(srv.DataDir).Versions)
	check(t, fmt.Sprintf("the server's versions.json names Kubernetes %s (%v %v)", recorded.Kubernetes, ok, err), ok && recorded.Kubernetes == toKube)
	snapshots := preUpgradeSnapshots(t, layout.Server(srv.DataDir).Snapshots)
	check(t, fmt.Sprintf("the server's snapshot before the upgrade %v", snapshots), len(snapshots) == 1 && strings.Contains(snapshots[0], "-server-"))

	// Everything there.
	for name, value := range secrets {
		s, err := c.CoreV1().Secrets("default").Get(ctx, name, metav1.GetOptions{})
		check(t, "Secret "+name+" reads as before", err == nil && string(s.Data["password"]) == value)
		atRest(t, srv, name)
	}
	checkWidgets(t, srv, "w1", "w2")
	for _, what := range []string{"deployment/kept", "deployment/data", "daemonset/everywhere"} {
		rolloutStatus(t, srv, what, 3*time.Minute)
		check(t, what+" rolled out", true)
	}
	claim, err := c.CoreV1().PersistentVolumeClaims("default").Get(ctx, "data", metav1.GetOptions{})
	check(t, "claim data Bound", err == nil && claim.Status.Phase == corev1.ClaimBound)
	got := strings.TrimSpace(kubectl(t, srv, "exec", "deploy/data", "--", "/testapp", "cat", "/data/greeting"))
	after := podsOf(t, c, "app=data")
	check(t, fmt.Sprintf("the file in the claim's volume, read by pod %s of %d on node %s (the drain evicted %s)", after[0].Name, len(after), after[0].Spec.NodeName, dataPod[0].Name), got == greeting && len(after) == 1)

	// Pods the drains leave: the kubelet of the new kelp keeps them.
	kept := map[string]corev1.Pod{}
	for _, p := range podsOf(t, c, "app=everywhere") {
		kept[p.Spec.NodeName] = p
	}
	for _, p := range daemons {
		q := kept[p.Spec.NodeName]
		t.Logf("  daemonset pod on %s: uid %s → %s, container %s → %s", p.Spec.NodeName, p.UID, q.UID, containerOf(t, p), containerOf(t, q))
		check(t, "daemonset pod on "+p.Spec.NodeName+" the same pod in the same container", p.UID == q.UID && containerOf(t, p) == containerOf(t, q))
	}
}

// check logs what was checked, failing the test when it does not hold.
func check(t *testing.T, what string, ok bool) {
	t.Helper()
	if ok {
		t.Logf("ok   %s", what)
		return
	}
	t.Errorf("FAIL %s", what)
}

// versionsOf reads what kelp binary bin says it is made of (--version):
// each line's first word, and the version after it.
func versionsOf(t *testing.T, bin string) map[string]string {
	t.Helper()
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	versions := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if name, v, ok := strings.Cut(line, " "); ok {
			versions[name] = strings.TrimSpace(v)
		}
	}
	if versions["kubernetes"] == "" || versions["containerd"] == "" {
		t.Fatalf("%s --version names no Kubernetes or containerd version:\n%s", bin, out)
	}
	return versions
}

func nodeInfo(t *testing.T, c kubernetes.Interface, node string) corev1.NodeSystemInfo {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Status.NodeInfo
}

// podsOf are the pods of selector in default, by node.
func podsOf(t *testing.T, c kubernetes.Interface, selector string) []corev1.Pod {
	t.Helper()
	list, err := c.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Spec.NodeName < list.Items[j].Spec.NodeName })
	return list.Items
}

// atRest checks that Secret name is stored encrypted in n's datastore.
func atRest(t *testing.T, n *testcluster.Node, name string) {
	t.Helper()
	out, err := n.RunKelp(time.Minute, "etcdctl", "--data-dir", n.DataDir, "get", "/registry/secrets/default/"+name, "--print-value-only")
	check(t, fmt.Sprintf("Secret %s encrypted at rest (%.30q)", name, out), err == nil && strings.HasPrefix(out, "k8s:enc:"))
}

// createWidgets creates the CRD widgets.kelp.test and Widgets of names
// in default.
func createWidgets(t *testing.T, n *testcluster.Node, names ...string) {
	t.Helper()
	ctx := context.Background()
	ext := apiextclient.NewForConfigOrDie(n.RestConfig())
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, widgetCRD(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := crd.WaitEstablished(ctx, ext, "widgets.kelp.test", time.Minute); err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(n.RestConfig())
	for i, name := range names {
		w := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "kelp.test/v1", "kind": "Widget",
			"metadata": map[string]any{"name": name},
			"spec":     map[string]any{"size": int64(i + 1)},
		}}
		// Discovery of a new CRD can lag its Established condition.
		testcluster.Eventually(t, "Widget "+name, func() (bool, error) {
			_, err := dyn.Resource(widgets).Namespace("default").Create(ctx, w, metav1.CreateOptions{})
			return err == nil, nil
		})
	}
}

// checkWidgets checks the Widgets createWidgets made.
func checkWidgets(t *testing.T, n *testcluster.Node, names ...string) {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(n.RestConfig())
	for i, name := range names {
		var size int64
		w, err := dyn.Resource(widgets).Namespace("default").Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			size, _, _ = unstructured.NestedInt64(w.Object, "spec", "size")
		}
		check(t, fmt.Sprintf("Widget %s (spec.size %d)", name, size), err == nil && size == int64(i+1))
	}
}
