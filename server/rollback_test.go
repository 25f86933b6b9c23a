package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// TestUpgradeRollback upgrades a server on SQLite, and one on embedded
// etcd, as install.sh does (kelp.previous
// beside kelp), to a kelp that fails once its apiserver has run on the
// datastore. The service manager's restarts are the test's: after three
// starts the new kelp rolls the node back by itself, restoring the snapshot
// it took before the upgrade, and the previous kelp runs again with the
// same data. Then the same by hand: one failed start and `kelp upgrade
// rollback`, which is refused while a kelp runs.
func TestUpgradeRollback(t *testing.T) {
	t.Parallel()
	failing := buildKelp(t, failingVersion, failingServer...)
	// One after the other: each is a server's start, three times over.
	t.Run("sqlite", func(t *testing.T) { testUpgradeRollback(t, failing, "state.db") })
	t.Run("etcd", func(t *testing.T) { testUpgradeRollback(t, failing, "etcd", "--cluster-init") })
}

// testUpgradeRollback runs TestUpgradeRollback on a server with flags,
// whose datastore is db in its db directory.
func testUpgradeRollback(t *testing.T, failing, db string, flags ...string) {
	n := testcluster.NewNode(t)
	b := newInstalled(t, n)
	n.Start(flags...)
	n.WaitReady(startTimeout)
	c := n.Client()
	ctx := context.Background()
	kept := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before-the-upgrade", Namespace: "default"}, Data: map[string]string{"kept": "yes"}}
	if _, err := c.CoreV1().ConfigMaps("default").Create(ctx, kept, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Running: nothing to roll back, and no rollback while it runs.
	if out, err := n.RunKelp(time.Minute, "upgrade", "rollback", "--data-dir", n.DataDir); err == nil || !strings.Contains(out, "in use by another kelp server (pid") {
		t.Errorf("kelp upgrade rollback while the server runs: %v\n%s", err, out)
	}
	n.Stop()

	// The service manager: the file at kelp, started again as it exits.
	start := func() string {
		t.Helper()
		out, err := n.RunKelp(3*time.Minute, n.ServerArgs(flags...)...)
		if err == nil {
			t.Fatalf("the failing kelp exited 0:\n%s", tail(out))
		}
		return out
	}
	b.install(failing)
	var all string
	for i := 1; i <= 3; i++ {
		out := start()
		all += out
		if !strings.Contains(out, "fails once its apiserver runs") {
			t.Fatalf("start %d of the failing kelp did not fail as built to:\n%s", i, tail(out))
		}
		if rolled := strings.Contains(out, "Rolled back the upgrade"); rolled != (i == 3) {
			t.Fatalf("start %d of 3: rolled back %v:\n%s", i, rolled, tail(out))
		}
	}
	for _, want := range []string{"Took a snapshot before the upgrade", "from the snapshot taken before the upgrade, pre-upgrade-", "the kelp that was kelp.previous again"} {
		if !strings.Contains(all, want) {
			t.Errorf("the three starts did not log %q:\n%s", want, tail(all))
		}
	}
	b.checkRolledBack()
	snapshots := filepath.Join(n.DataDir, "server", "db", "snapshots")
	names := preUpgradeSnapshots(t, snapshots)
	if len(names) != 1 || !strings.Contains(names[0], "-"+failingVersion+"-"+n.Name+"-") {
		t.Errorf("snapshots named for the upgrade in %s: %v, want one of kelp %s", snapshots, names, failingVersion)
	}
	if backups, _ := filepath.Glob(filepath.Join(n.DataDir, "server", "db", db+".before-restore-*")); len(backups) == 0 {
		t.Errorf("no %s the failing kelp used was kept beside the restored one", db)
	}
	startAndCheck := func() {
		t.Helper()
		n.Start(flags...)
		n.WaitReady(startTimeout)
		got, err := c.CoreV1().ConfigMaps("default").Get(ctx, kept.Name, metav1.GetOptions{})
		if err != nil || got.Data["kept"] != "yes" {
			t.Fatalf("the data after the rollback: %v %v", err, got)
		}
	}
	startAndCheck()
	n.Stop()

	// By hand: one failed start, then kelp upgrade rollback on the
	// stopped node.
	b.install(failing)
	if out := start(); strings.Contains(out, "Rolled back") {
		t.Fatalf("rolled back after one start:\n%s", tail(out))
	}
	out, err := n.RunKelp(time.Minute, "upgrade", "rollback", "--data-dir", n.DataDir)
	if err != nil || !strings.Contains(out, "from the snapshot taken before the upgrade") || !strings.Contains(out, "rolled the node of") {
		t.Fatalf("kelp upgrade rollback: %v\n%s", err, out)
	}
	b.checkRolledBack()
	startAndCheck()
	// The one snapshot per upgrade tried.
	if names := preUpgradeSnapshots(t, snapshots); len(names) != 2 {
		t.Errorf("snapshots named for the upgrades: %v, want two", names)
	}
}

// TestAgentUpgradeRollback upgrades an agent, as install.sh does, to a
// kelp that fails once its node runs: after three starts the new kelp puts
// kelp.previous back, and the agent runs the earlier kelp again.
func TestAgentUpgradeRollback(t *testing.T) {
	t.Parallel()
	failing := buildKelp(t, failingVersion, failingAgent...)
	lab := testcluster.NewLab(t)
	srv := lab.NewNode("server", "10.99.0.2")
	srv.Start()
	srv.WaitReady(startTimeout)
	a := lab.NewNode("agent-1", "10.99.0.3")
	b := newInstalled(t, a)
	a.StartAgent(srv.URL(), srv.TokenFile())
	a.WaitLog("kelp node is running", startTimeout)
	waitNodesReady(t, srv.Client(), 1)
	a.Stop()

	b.install(failing)
	for i := 1; i <= 3; i++ {
		out, err := a.RunKelp(3*time.Minute, a.AgentArgs(srv.URL(), srv.TokenFile())...)
		if err == nil || !strings.Contains(out, "fails once its node runs") {
			t.Fatalf("start %d of the failing kelp did not fail as built to: %v\n%s", i, err, tail(out))
		}
		if rolled := strings.Contains(out, "Rolled back the upgrade"); rolled != (i == 3) {
			t.Fatalf("start %d of 3: rolled back %v:\n%s", i, rolled, tail(out))
		}
		if i < 3 {
			continue
		}
		_, line, _ := strings.Cut(out, "Rolled back the upgrade")
		line, _, _ = strings.Cut(line, "\n")
		if strings.Contains(line, "datastore") || !strings.Contains(line, "the kelp that was kelp.previous again") {
			t.Errorf("the agent's rollback: %s", line)
		}
	}
	b.checkRolledBack()
	a.StartAgent(srv.URL(), srv.TokenFile())
	a.WaitLog("kelp node is running", startTimeout)
}

// TestUpgradeRollbackRefusedFlag upgrades a server to a kelp that no
// longer takes one of the flags it runs with: each start ends before the
// server runs, and is counted all the same; the third rolls back, leaving
// the datastore as it was, and the earlier kelp runs with the same flags.
func TestUpgradeRollbackRefusedFlag(t *testing.T) {
	t.Parallel()
	failing := buildKelp(t, failingVersion, failingServer...)
	n := testcluster.NewNode(t)
	b := newInstalled(t, n)
	flag := "--service-node-port-range=30000-32767"
	n.Start(flag)
	n.WaitReady(startTimeout)
	n.Stop()

	b.install(failing)
	for i := 1; i <= 3; i++ {
		out, err := n.RunKelp(time.Minute, n.ServerArgs(flag)...)
		if err == nil || !strings.Contains(out, "flag provided but not defined: -service-node-port-range") {
			t.Fatalf("start %d of the kelp without the flag: %v\n%s", i, err, tail(out))
		}
		if rolled := strings.Contains(out, "Rolled back the upgrade"); rolled != (i == 3) {
			t.Fatalf("start %d of 3: rolled back %v:\n%s", i, rolled, tail(out))
		}
		if i == 3 && !strings.Contains(out, "the new kelp had not opened the datastore") {
			t.Errorf("the rollback touched the datastore:\n%s", tail(out))
		}
	}
	b.checkRolledBack()
	n.Start(flag)
	n.WaitReady(startTimeout)
}

// installed is a kelp installed as install.sh installs it, in a bin
// directory of its own that a node runs it from.
type installed struct {
	t              *testing.T
	kelp, previous string
	original       []byte // the kelp installed first
}

// newInstalled installs the kelp under test for node n.
func newInstalled(t *testing.T, n *testcluster.Node) installed {
	t.Helper()
	return newInstalledFrom(t, n, testcluster.Binary(t))
}

// newInstalledFrom installs the kelp file from for node n.
func newInstalledFrom(t *testing.T, n *testcluster.Node, from string) installed {
	t.Helper()
	bin := filepath.Join(n.Dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	b := installed{t: t, kelp: filepath.Join(bin, "kelp"), previous: filepath.Join(bin, "kelp.previous")}
	copyBinary(t, from, b.kelp)
	b.original = readFile(t, b.kelp)
	n.Bin = b.kelp
	return b
}

// install puts next in place as install.sh does: the kelp there stays as
// kelp.previous, and next comes in with one rename.
func (b installed) install(next string) {
	b.t.Helper()
	if err := os.Link(b.kelp, b.previous+".new"); err != nil {
		b.t.Fatal(err)
	}
	if err := os.Rename(b.previous+".new", b.previous); err != nil {
		b.t.Fatal(err)
	}
	copyBinary(b.t, next, b.kelp+".new")
	if err := os.Rename(b.kelp+".new", b.kelp); err != nil {
		b.t.Fatal(err)
	}
}

// checkRolledBack checks that kelp is the one installed first again, and
// kelp.previous is gone into its place.
func (b installed) checkRolledBack() {
	b.t.Helper()
	if !bytes.Equal(readFile(b.t, b.kelp), b.original) {
		b.t.Errorf("%s is not the previous kelp after the rollback", b.kelp)
	}
	if _, err := os.Stat(b.previous); !os.IsNotExist(err) {
		b.t.Errorf("%s after the rollback: %v, want it moved into place", b.previous, err)
	}
}

// preUpgradeSnapshots are the complete snapshots named for an upgrade in
// dir: each has its sidecar.
func preUpgradeSnapshots(t *testing.T, dir string) []string {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(dir, "pre-upgrade-*.json"))
	var names []string
	for _, p := range paths {
		var meta struct{ Name string }
		if err := json.Unmarshal(readFile(t, p), &meta); err != nil || meta.Name+".json" != filepath.Base(p) {
			t.Errorf("sidecar %s: %v", p, err)
		}
		names = append(names, meta.Name)
	}
	return names
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func copyBinary(t *testing.T, from, to string) {
	t.Helper()
	if err := os.WriteFile(to, readFile(t, from), 0o755); err != nil {
		t.Fatal(err)
	}
}
