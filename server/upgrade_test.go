package server_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kelp-dev/kelp/internal/nodepaths"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// TestUpgrade replaces a running node's kelp with a build of another
// version on the same data dir, as an install.sh re-run does: the pods
// keep running in the same containers, and the data dir records the new
// version. Going back to a kelp with an older Kubernetes minor than the one
// recorded is refused with the way out.
func TestUpgrade(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	n.Agent = true
	n.AddImage(testcluster.BuildTestImage(t, testcluster.TestImage))
	next := buildKelp(t, nextVersion)
	n.Start()
	n.WaitReady(startTimeout)
	n.WaitLog("kelp node is running", startTimeout)
	c := n.Client()
	waitNodeReady(t, c)
	manifest := filepath.Join(n.Dir, "workload.yaml")
	if err := os.WriteFile(manifest, []byte(workload), 0o600); err != nil {
		t.Fatal(err)
	}
	waitServiceAccount(t, c, "default")
	kubectl(t, n, "apply", "-f", manifest)
	kubectl(t, n, "wait", "--for=condition=Available", "deployment/web", "--timeout=120s")
	before := containerIDs(t, c)
	paths := kubeletPaths(t, n.DataDir)
	n.Stop()

	n.Bin = next
	n.Start()
	n.WaitReady(startTimeout)
	n.WaitLog("kelp node is running", startTimeout)
	waitNodeReady(t, c)
	kubectl(t, n, "wait", "--for=condition=Available", "deployment/web", "--timeout=120s")
	if after := containerIDs(t, c); !equalMaps(before, after) {
		t.Errorf("the upgrade replaced containers: before %v, after %v", before, after)
	}
	// Its pods stay in their cgroups, their logs in their directory, also
	// on an upgrade from a kelp that chose no paths of a node's own.
	if after, err := nodepaths.Load(n.DataDir); err != nil || after != paths || kubeletPaths(t, n.DataDir) != paths {
		t.Errorf("the node's cgroup root and pod log dir %+v (%v) after the upgrade, were %+v", after, err, paths)
	}
	versions := filepath.Join(n.DataDir, "server", "versions.json")
	if data, err := os.ReadFile(versions); err != nil || !strings.Contains(string(data), nextVersion) || !strings.Contains(string(data), `"kubernetes":"v1.`) {
		t.Errorf("versions.json after the upgrade: %v %s", err, data)
	}
	n.Stop()

	// A kelp of an older Kubernetes minor than the data dir's.
	if err := os.WriteFile(versions, []byte(`{"kelp":"v100.0.0","kubernetes":"v1.99.0"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := n.RunKelp(time.Minute, n.ServerArgs()...)
	if err == nil || !strings.Contains(out, "last run by kelp v100.0.0 with Kubernetes v1.99.0") {
		t.Errorf("a downgrade across Kubernetes minors: %v\n%s", err, tail(out))
	}
}
