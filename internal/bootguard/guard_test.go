package bootguard

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/version"
)

// node is a data dir and a bin dir with kelp (the new one, a file that
// is never run) and kelp.previous (a script that says it is v0.4.0).
type node struct {
	t                      *testing.T
	dataDir, bin, previous string
}

const previousScript = "#!/bin/sh\necho 'kelp v0.4.0 (abc)'\n"

func newNode(t *testing.T) node {
	dir := t.TempDir()
	n := node{t: t, dataDir: filepath.Join(dir, "data"), bin: filepath.Join(dir, "bin", "kelp"), previous: filepath.Join(dir, "bin", PreviousName)}
	if err := os.MkdirAll(filepath.Dir(n.bin), 0o755); err != nil {
		t.Fatal(err)
	}
	n.write(n.bin, "the new kelp")
	n.write(n.previous, previousScript)
	return n
}

func (n node) write(path, content string) {
	n.t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
		n.t.Fatal(err)
	}
}

func (n node) read(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

func (n node) begin(running version.Ran) (*Guard, error) {
	n.t.Helper()
	return Begin(Config{DataDir: n.dataDir, Role: "server", Running: running, Attempts: 3, Binary: n.bin})
}

// ready starts running and has it become ready.
func (n node) ready(running version.Ran) {
	n.t.Helper()
	g, err := n.begin(running)
	if err != nil {
		n.t.Fatal(err)
	}
	if err := g.Ready(); err != nil {
		n.t.Fatal(err)
	}
	if err := g.Finish(nil); err != nil {
		n.t.Fatal(err)
	}
	g.Close()
}

// fail starts running, which fails before it is ready, and returns what
// the guard made of it.
func (n node) fail(running version.Ran) error {
	n.t.Helper()
	g, err := n.begin(running)
	if err != nil {
		return err
	}
	defer g.Close()
	return g.Finish(errors.New("the apiserver exited"))
}

func TestRollbackAfterFailedStarts(t *testing.T) {
	n := newNode(t)
	n.ready(v1)
	// A stop before it was ready does not count.
	g, err := n.begin(v2)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Finish(nil); err != nil {
		t.Fatal(err)
	}
	g.Close()
	for i := 1; i <= 2; i++ {
		if err := n.fail(v2); err == nil || errors.Is(err, ErrRolledBack) {
			t.Fatalf("failed start %d: %v", i, err)
		}
		if n.read(n.bin) != "the new kelp" {
			t.Fatalf("rolled back after %d starts", i)
		}
	}
	if err := n.fail(v2); !errors.Is(err, ErrRolledBack) {
		t.Fatalf("third failed start: %v, want a rollback", err)
	}
	if n.read(n.bin) != previousScript {
		t.Errorf("kelp is %q after the rollback, want the previous", n.read(n.bin))
	}
	if _, err := os.Stat(n.previous); !os.IsNotExist(err) {
		t.Errorf("kelp.previous is still there: %v", err)
	}
	// The previous kelp starts as one that was ready.
	g, err = n.begin(v1)
	if err != nil {
		t.Fatal(err)
	}
	if g.Upgrade() != nil {
		t.Errorf("the previous kelp is on trial: %+v", g.Upgrade())
	}
	if err := g.Ready(); err != nil {
		t.Fatal(err)
	}
	g.Close()
	// What the rollback did and why stays for the node to report.
	rb, err := LastRollback(n.dataDir)
	if err != nil || rb == nil || rb.To != v2 || !strings.Contains(rb.String(), "because its 3 starts ended before it became ready, the last with: the apiserver exited") ||
		!strings.Contains(rb.String(), "kelp.previous again") {
		t.Errorf("LastRollback = %v, %v", rb, err)
	}
}

func TestRollbackAfterKilledStarts(t *testing.T) {
	n := newNode(t)
	n.ready(v1)
	for i := 1; i <= 3; i++ {
		g, err := n.begin(v2) // and killed: no Finish
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		g.Close()
	}
	if _, err := n.begin(v2); !errors.Is(err, ErrRolledBack) {
		t.Fatalf("fourth start after three killed ones: %v, want a rollback", err)
	}
	if n.read(n.bin) != previousScript {
		t.Errorf("kelp is %q after the rollback, want the previous", n.read(n.bin))
	}
}

func TestReadyIsKept(t *testing.T) {
	n := newNode(t)
	n.ready(v1)
	if err := n.fail(v2); err == nil {
		t.Fatal("want the failure")
	}
	n.ready(v2)
	// Once ready, failures are those of a kelp that was ready, not of an
	// upgrade: never rolled back.
	for i := 0; i < 5; i++ {
		if err := n.fail(v2); errors.Is(err, ErrRolledBack) {
			t.Fatalf("an upgrade that became ready was rolled back")
		}
	}
	if n.read(n.bin) != "the new kelp" {
		t.Errorf("kelp was replaced")
	}
}

func TestRollbackWithoutPrevious(t *testing.T) {
	n := newNode(t)
	if err := os.Remove(n.previous); err != nil {
		t.Fatal(err)
	}
	n.ready(v1)
	var err error
	for i := 0; i < 3; i++ {
		err = n.fail(v2)
	}
	if err == nil || errors.Is(err, ErrRolledBack) || !strings.Contains(err.Error(), "no previous kelp to go back to") {
		t.Errorf("third failed start without kelp.previous: %v", err)
	}
	// Nothing to go back to: the node goes on trying.
	g, err := n.begin(v2)
	if err != nil {
		t.Fatalf("fourth start: %v", err)
	}
	g.Close()
	if n.read(n.bin) != "the new kelp" {
		t.Errorf("kelp was replaced")
	}
}

func TestRollbackPutsBackVersions(t *testing.T) {
	n := newNode(t)
	versions := layout.Server(n.dataDir).Versions
	if err := os.MkdirAll(filepath.Dir(versions), 0o700); err != nil {
		t.Fatal(err)
	}
	// A server of a kelp without the guard: versions.json says what ran.
	if err := version.RecordDataDir(versions, v1); err != nil {
		t.Fatal(err)
	}
	g, err := Begin(Config{DataDir: n.dataDir, Role: "server", Running: v2, Before: &v1, Attempts: 1, Binary: n.bin})
	if err != nil {
		t.Fatal(err)
	}
	if err := version.CheckDataDir(versions, v2); err != nil {
		t.Fatal(err)
	}
	if err := g.Finish(errors.New("the apiserver exited")); !errors.Is(err, ErrRolledBack) {
		t.Fatalf("failed start with --upgrade-attempts 1: %v", err)
	}
	g.Close()
	// Else the earlier kelp would refuse the data dir of a newer minor.
	if err := version.CheckDataDir(versions, v1); err != nil {
		t.Errorf("the earlier kelp after the rollback: %v", err)
	}
}

func TestRollbackCommandNeedsStoppedNode(t *testing.T) {
	n := newNode(t)
	n.ready(v1)
	if err := n.fail(v2); err == nil {
		t.Fatal("want the failure")
	}
	g, err := n.begin(v2)
	if err != nil {
		t.Fatal(err)
	}
	_, err = rollbackStopped(n.dataDir, n.bin)
	if err == nil || !strings.Contains(err.Error(), "in use by another kelp server (pid") {
		t.Errorf("rollback of a running node: %v", err)
	}
	g.Close()
	done, err := rollbackStopped(n.dataDir, n.bin)
	if err != nil {
		t.Fatalf("rollback of the stopped node: %v", err)
	}
	if n.read(n.bin) != previousScript || done.Upgrade.To != v2 {
		t.Errorf("after the rollback kelp is %q, rolled back %+v", n.read(n.bin), done.Upgrade)
	}
	// Nothing on trial any more.
	if _, err := rollbackStopped(n.dataDir, n.bin); err == nil || !strings.Contains(err.Error(), "nothing to roll back") {
		t.Errorf("second rollback: %v", err)
	}
}

func TestPaths(t *testing.T) {
	for _, tc := range []struct{ binary, previous, target string }{
		{"/usr/local/bin/kelp", "/usr/local/bin/kelp.previous", "/usr/local/bin/kelp"},
		{"/usr/local/bin/kelp.previous", "/usr/local/bin/kelp.previous", "/usr/local/bin/kelp"},
		{"/opt/kelp-1.2", "/opt/kelp.previous", "/opt/kelp-1.2"},
	} {
		if p, tg := Paths(tc.binary); p != tc.previous || tg != tc.target {
			t.Errorf("Paths(%s) = %s, %s; want %s, %s", tc.binary, p, tg, tc.previous, tc.target)
		}
	}
}

// An upgrade whose apiserver took a write from a client other than kelp
// during its trial is rolled back without restoring the snapshot taken
// before it, which would undo that write: the datastore stays as it is,
// and the rollback says how to restore the snapshot by hand.
func TestRollbackKeepsWrittenDatastore(t *testing.T) {
	n := newNode(t)
	n.ready(v1)
	db := filepath.Join(layout.Server(n.dataDir).DB, "state.db")
	if err := os.MkdirAll(filepath.Dir(db), 0o700); err != nil {
		t.Fatal(err)
	}
	n.write(db, "written by the new kelp")
	snap := &Snapshot{Name: "pre-upgrade-v0.4.0-v0.5.0-node-1", Path: filepath.Join(n.dataDir, "snapshots", "pre-upgrade-v0.4.0-v0.5.0-node-1"), Datastore: "sqlite"}
	for i := 1; i <= 3; i++ {
		g, err := n.begin(v2)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Update(func(u *Upgrade) { u.Touched, u.Snapshot = true, snap }); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			report := g.WriteWatch()
			if report == nil || report("system:admin from 127.0.0.1:40000", "create configmaps app in default") {
				t.Fatal("the guard does not watch, or wants to hear of more than the first write")
			}
			if g.WriteWatch() != nil {
				t.Error("the guard watches again once it recorded a write")
			}
		}
		err = g.Finish(errors.New("the node did not start"))
		g.Close()
		if (i == 3) != errors.Is(err, ErrRolledBack) {
			t.Fatalf("failed start %d: %v", i, err)
		}
	}
	if n.read(n.bin) != previousScript {
		t.Errorf("kelp is %q after the rollback, want the previous", n.read(n.bin))
	}
	if n.read(db) != "written by the new kelp" {
		t.Errorf("the datastore is %q after the rollback, want it kept", n.read(db))
	}
	rb, err := LastRollback(n.dataDir)
	if err != nil || rb == nil || !strings.Contains(rb.String(), "create configmaps app in default by system:admin") ||
		!strings.Contains(rb.String(), "kelp snapshot restore "+snap.Name) {
		t.Errorf("LastRollback = %v, %v", rb, err)
	}
}

// A guard that is not on trial, or whose kelp became ready, watches no
// writes.
func TestWriteWatchEnds(t *testing.T) {
	n := newNode(t)
	g, err := n.begin(v1)
	if err != nil {
		t.Fatal(err)
	}
	if g.WriteWatch() != nil {
		t.Error("a first start watches writes")
	}
	if err := g.Ready(); err != nil {
		t.Fatal(err)
	}
	g.Close()
	g, err = n.begin(v2)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	report := g.WriteWatch()
	if report == nil {
		t.Fatal("an upgrade on trial watches no writes")
	}
	if err := g.Ready(); err != nil {
		t.Fatal(err)
	}
	if report("alice from 10.0.0.9:5555", "delete pods x in default") {
		t.Error("the guard wants to hear of writes once ready")
	}
}
