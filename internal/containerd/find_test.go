package containerd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kelp-dev/kelp/internal/layout"
)

// fakeProc writes a process of a fake /proc: its command line, its uids
// and its mount namespace.
func fakeProc(t *testing.T, proc, pid, uids, mountNS string, cmdline ...string) {
	t.Helper()
	dir := filepath.Join(proc, pid)
	if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(strings.Join(cmdline, "\x00")+"\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "status"), []byte("Name:\tcontainerd\nUid:\t"+uids+"\nGid:\t0\t0\t0\t0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(mountNS, filepath.Join(dir, "ns", "mnt")); err != nil {
		t.Fatal(err)
	}
}

// TestFind: the containerd of a data dir is found by its --config, in
// this mount namespace (reached at /run/kelp) or in another (reached
// through its /proc/PID/root); a user's process that poses as it is not.
func TestFind(t *testing.T) {
	proc := t.TempDir()
	const root = "0\t0\t0\t0"
	fakeProc(t, proc, "self", root, "mnt:[1]", "kelp", "crictl")
	fakeProc(t, proc, "100", root, "mnt:[1]", "/var/lib/kelp/data/current/bin/containerd", "--config", layout.Agent("/var/lib/kelp").ContainerdConfig)
	fakeProc(t, proc, "200", root, "mnt:[2]", "/srv/n1/data/current/bin/containerd", "--config="+layout.Agent("/srv/n1").ContainerdConfig)
	fakeProc(t, proc, "300", "1000\t1000\t1000\t1000", "mnt:[3]", "containerd", "--config", layout.Agent("/srv/n2").ContainerdConfig)
	fakeProc(t, proc, "400", root, "mnt:[4]", "kelp", "containerd", "--config", layout.Agent("/srv/old").ContainerdConfig)
	// A node with the data dir in another namespace, and in this one.
	fakeProc(t, proc, "500", root, "mnt:[5]", "containerd", "--config", layout.Agent("/srv/both").ContainerdConfig)
	fakeProc(t, proc, "600", root, "mnt:[1]", "containerd", "--config", layout.Agent("/srv/both").ContainerdConfig)
	// A node of kelp cluster: its data dir is /var/lib/kelp in its mount
	// namespace, a directory of the cluster's in the machine's.
	clusterNode := filepath.Join(t.TempDir(), "clusters", "ci", "server-1", "data")
	config := layout.Agent(clusterNode).ContainerdConfig
	if err := os.MkdirAll(filepath.Dir(config), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	nodeRoot := t.TempDir()
	if err := os.MkdirAll(filepath.Join(nodeRoot, "var", "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(clusterNode, filepath.Join(nodeRoot, "var", "lib", "kelp")); err != nil {
		t.Fatal(err)
	}
	fakeProc(t, proc, "700", root, "mnt:[7]", "containerd", "--config", layout.Agent(layout.DefaultDataDir).ContainerdConfig)
	if err := os.Symlink(nodeRoot, filepath.Join(proc, "700", "root")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dataDir, want string
	}{
		{clusterNode, filepath.Join(proc, "700", "root") + layout.ContainerdAddress},
		{"/var/lib/kelp", layout.ContainerdAddress},
		{"/srv/both", layout.ContainerdAddress},
		{"/srv/n1", filepath.Join(proc, "200", "root") + layout.ContainerdAddress},
		{"/srv/old", filepath.Join(proc, "400", "root") + layout.ContainerdAddress},
	} {
		node, err := find(proc, "self", tc.dataDir)
		if err != nil || node.Address() != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.dataDir, node.Address(), err, tc.want)
		}
	}
	for _, dataDir := range []string{"/srv/n2", "/srv/none"} {
		if _, err := find(proc, "self", dataDir); err == nil || !strings.Contains(err.Error(), "no containerd of a kelp node with data dir "+dataDir+" runs on this machine") {
			t.Errorf("%s: %v", dataDir, err)
		}
	}
}

// TestFindDefault: the default data dir is the node of this mount
// namespace, whatever data dir it runs with, as before data dirs named
// nodes.
func TestFindDefault(t *testing.T) {
	node, err := Find(layout.DefaultDataDir)
	if err != nil || node.Address() != layout.ContainerdAddress {
		t.Errorf("Find(%s) = %q, %v; want %s", layout.DefaultDataDir, node.Address(), err, layout.ContainerdAddress)
	}
}

// TestCtrDataDir: kelp ctr takes a leading --data-dir and talks to that
// node's containerd; before, ctr refused the flag.
func TestCtrDataDir(t *testing.T) {
	dir := t.TempDir()
	err := CtrMain([]string{"ctr", "--data-dir", dir, "version"})
	if err == nil || !strings.Contains(err.Error(), "no containerd of a kelp node with data dir "+dir) {
		t.Errorf("kelp ctr --data-dir of no node: %v", err)
	}
	t.Setenv("KELP_DATA_DIR", dir)
	err = CtrMain([]string{"ctr", "version"})
	if err == nil || !strings.Contains(err.Error(), "no containerd of a kelp node with data dir "+dir) {
		t.Errorf("kelp ctr with KELP_DATA_DIR of no node: %v", err)
	}
}
