package server_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	"github.com/kelp-dev/kelp/internal/fleet"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// fleetWorkload is kept through the upgrades: its pods move between the
// nodes as they are drained.
var fleetWorkload = testcluster.App{Name: "kept", Replicas: 2}.YAML()

// TestFleetUpgrade runs a server (with its node) and an agent, each on a
// kelp installed as install.sh does, and upgrades both from inside the
// cluster with an Upgrade whose binary is on the nodes (airgap): a copy
// of the same kelp with other bytes. Both restart into it by themselves
// (no service manager: kelp execs itself), the server first, and the
// Deployment runs on. Then an Upgrade to a kelp whose agent fails once
// its node runs: the server runs it, the agent's boot guard rolls it
// back at its first failed start (--upgrade-attempts 1; the test starts
// the agent again, as a service manager would), and the rollout is
// Failed, naming the agent and the rollback, with the server upgraded.
func TestFleetUpgrade(t *testing.T) {
	t.Parallel()
	failing := buildKelp(t, failingVersion, failingAgent...)
	lab := testcluster.NewLab(t)
	image := testcluster.BuildTestImage(t, testcluster.TestImage)
	srv := lab.NewNode("server", "10.99.0.2")
	srv.Agent = true
	srv.AddImage(image)
	srvBin := newInstalled(t, srv)
	srv.Start()
	srv.WaitReady(startTimeout)
	srv.WaitLog("kelp node is running", startTimeout)
	agent := lab.NewNode("agent-1", "10.99.0.3")
	agent.AddImage(image)
	agentBin := newInstalled(t, agent)
	agentArgs := []string{"--upgrade-attempts", "1"}
	agent.StartAgent(srv.URL(), srv.TokenFile(), agentArgs...)
	agent.WaitLog("kelp node is running", startTimeout)
	c := srv.Client()
	waitNodesReady(t, c, 2)
	waitServiceAccount(t, c, "default")
	apply(t, srv, fleetWorkload)
	rolloutStatus(t, srv, "deployment/kept", 2*time.Minute)
	dyn := dynamic.NewForConfigOrDie(srv.RestConfig())

	// The new kelp: the same with other bytes, on every node.
	b := append(readFile(t, srvBin.kelp), []byte("\nTestFleetUpgrade\n")...)
	bSum := putOnNodes(t, "kelp-b", b, srv, agent)
	createUpgrade(t, dyn, "to-b", bSum, "kelp-b")
	up := waitUpgrade(t, dyn, "to-b", 4*time.Minute)
	if up.Status.Phase != fleet.PhaseSucceeded {
		t.Fatalf("Upgrade to-b: %s: %+v", up.Status.Phase, up.Status)
	}
	if len(up.Status.Nodes) != 2 || up.Status.Nodes[0].Name != "server" || !up.Status.Nodes[0].Server || up.Status.Nodes[1].Name != "agent-1" {
		t.Errorf("the rollout's nodes: %+v, want the server first, then the agent", up.Status.Nodes)
	}
	for _, n := range up.Status.Nodes {
		if n.State != fleet.StateSucceeded || n.ToVersion == "" || n.FromVersion == "" {
			t.Errorf("node %s: %+v", n.Name, n)
		}
	}
	for _, i := range []installed{srvBin, agentBin} {
		if string(readFile(t, i.kelp)) != string(b) || string(readFile(t, i.previous)) != string(i.original) {
			t.Errorf("%s is not the new kelp, or %s not the one before", i.kelp, i.previous)
		}
	}
	for _, n := range []*testcluster.Node{srv, agent} {
		if !n.Logged("The new kelp is in place; restarting into it") {
			t.Errorf("node %s did not restart into the new kelp", n.Name)
		}
	}
	rolloutStatus(t, srv, "deployment/kept", 2*time.Minute)
	for _, name := range []string{"server", "agent-1"} {
		if node, err := c.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{}); err != nil || node.Spec.Unschedulable {
			t.Errorf("node %s after the upgrade: %v, cordoned %v", name, err, node.Spec.Unschedulable)
		}
	}

	// A kelp whose agent fails: the rollout stops at the agent, which
	// its boot guard rolls back to kelp b.
	cSum := putOnNodes(t, "kelp-c", readFile(t, failing), srv, agent)
	createUpgrade(t, dyn, "to-c", cSum, "kelp-c")
	agent.WaitLog("Rolled back the upgrade", 4*time.Minute)
	err := agent.StopFailed()
	t.Logf("the agent exited after its rollback: %v", err)
	agent.StartAgent(srv.URL(), srv.TokenFile(), agentArgs...)
	up = waitUpgrade(t, dyn, "to-c", 4*time.Minute)
	msg := ""
	for _, cond := range up.Status.Conditions {
		msg = cond.Message
	}
	if up.Status.Phase != fleet.PhaseFailed || !strings.Contains(msg, "node agent-1: the node's boot guard rolled back from kelp "+failingVersion) ||
		!strings.Contains(msg, "fails once its node runs") || !strings.Contains(msg, "upgraded and kept: server") {
		t.Errorf("Upgrade to-c: %s: %s\n%+v", up.Status.Phase, msg, up.Status)
	}
	if string(readFile(t, srvBin.kelp)) != string(readFile(t, failing)) {
		t.Errorf("the server does not run the new kelp after the failed rollout")
	}
	if string(readFile(t, agentBin.kelp)) != string(b) {
		t.Errorf("the agent's kelp is not kelp b after its rollback")
	}
	waitNodesReady(t, c, 2)
}

// putOnNodes writes the kelp data as name in every node's upgrades
// directory, and returns its sha256.
func putOnNodes(t *testing.T, name string, data []byte, nodes ...*testcluster.Node) string {
	t.Helper()
	for _, n := range nodes {
		dir := layout.Agent(n.DataDir).Upgrades
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func createUpgrade(t *testing.T, dyn dynamic.Interface, name, sum, path string) {
	t.Helper()
	createUpgradeSpec(t, dyn, name, map[string]any{"sha256": sum, "path": path, "drainTimeout": "1m", "nodeTimeout": "4m"})
}

// createUpgradeSpec creates the Upgrade name of spec.
func createUpgradeSpec(t *testing.T, dyn dynamic.Interface, name string, spec map[string]any) {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": fleet.Group + "/" + fleet.Version,
		"kind":       fleet.Kind,
		"metadata":   map[string]any{"name": name},
		"spec":       spec,
	}}
	testcluster.Eventually(t, "create Upgrade "+name, func() (bool, error) {
		_, err := dyn.Resource(fleet.Resource).Create(context.Background(), obj, metav1.CreateOptions{})
		return err == nil, err
	})
}

// waitUpgrade waits until the Upgrade name is Succeeded or Failed,
// logging each change of its phase and its nodes' states.
func waitUpgrade(t *testing.T, dyn dynamic.Interface, name string, timeout time.Duration) *fleet.Upgrade {
	t.Helper()
	var u fleet.Upgrade
	began, last := time.Now(), ""
	testcluster.EventuallyWithin(t, timeout, "Upgrade "+name+" finished", func() (bool, error) {
		obj, err := dyn.Resource(fleet.Resource).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		u = fleet.Upgrade{}
		if err := fromUnstructured(obj, &u); err != nil {
			return false, err
		}
		states := u.Status.Phase
		for _, n := range u.Status.Nodes {
			states += " " + n.Name + "=" + n.State
		}
		if states != last {
			t.Logf("%4.0f s  Upgrade %s: %s", time.Since(began).Seconds(), name, states)
			last = states
		}
		return u.Status.Phase == fleet.PhaseSucceeded || u.Status.Phase == fleet.PhaseFailed, fmt.Errorf("%+v", u.Status)
	})
	return &u
}

func fromUnstructured(obj *unstructured.Unstructured, into any) error {
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, into); err != nil {
		return fmt.Errorf("read %s: %w", obj.GetName(), err)
	}
	return nil
}
